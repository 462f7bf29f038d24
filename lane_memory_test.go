package broker

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// TestDefaultLaneMemory says what the default lane costs a subscriber: an
// empty lane nothing beyond a small ring (lanes grow as they fill), a full
// one DefaultLaneSize messages parked for their retries, each a lane item
// plus its timer. It fills a default lane with parked messages (a handler
// that always fails, a long backoff) and pins the bytes per parked message
// beyond its payload.
func TestDefaultLaneMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory distorts heap figures")
	}
	const n = DefaultLaneSize
	b, err := New(WithLogger(discard), WithQueueSize(DefaultQueueSize), WithRetryPolicy(RetryPolicy{Backoff: ConstantBackoff(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // dead-letters them with reason shutdown at once
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = b.Close(ctx)
	}()
	if _, err := b.Subscribe("t", "down", func(context.Context, Message) error { return errors.New("down") },
		LaneSize(n)); err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{ID: "m-" + strconv.Itoa(i), Topic: "t", Payload: make([]byte, 64)}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, m := range msgs {
		if err := b.Publish(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	for b.Stats().Topics["t"].Subscribers["down"].Parked < n {
		runtime.Gosched()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(msgs)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	t.Logf("%.0f bytes per parked message beyond its payload: %.1f MiB for a full default lane of %d",
		per, per*n/(1<<20), n)
	if per > 768 {
		t.Errorf("%.0f bytes per parked message, want at most 768", per)
	}
}

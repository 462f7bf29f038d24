package broker

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"unsafe"
)

// TestAllocations pins the hot path's allocations: Publish of a message
// without Headers allocates nothing, and a delivery on the success path,
// with or without the default dedup store (a fixed table), allocates one
// thing: the handler's own empty Headers map (48 bytes), which is what the
// design costs — a handler may write to its Headers without a nil check and
// keep them, so the map cannot be shared or reused. (A message with Headers
// costs each handler call its own copy of them instead.)
func TestAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = "m-" + strconv.Itoa(i)
	}
	tests := []struct {
		name   string
		opts   []Option
		subs   int
		wanted float64
	}{
		{"publish, no subscriber", nil, 0, 0},
		{"publish and deliver, dedup off", []Option{WithIdempotencyStore(nil)}, 1, 1},
		{"publish and deliver to 4, dedup off", []Option{WithIdempotencyStore(nil)}, 4, 4},
		{"publish and deliver, default dedup", nil, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(append([]Option{WithLogger(discard)}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(context.Background())
			done := make(chan struct{}, 1024)
			for i := range tt.subs {
				if _, err := b.Subscribe("t", "s"+strconv.Itoa(i), func(context.Context, Message) error {
					done <- struct{}{}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			payload := make([]byte, 64)
			ctx := context.Background()
			i := 0
			publish := func() {
				if err := b.Publish(ctx, Message{ID: ids[i], Topic: "t", Payload: payload}); err != nil {
					t.Fatal(err)
				}
				i++
				for range tt.subs {
					<-done
				}
			}
			publish() // warm up: the topic and its dispatcher are created once
			if got := testing.AllocsPerRun(1000, publish); got > tt.wanted {
				t.Errorf("%.2f allocations per message, want at most %v", got, tt.wanted)
			}
		})
	}
}

// An envelope is copied into every queue a message passes through: it is
// kept at two cache lines on 64-bit platforms.
func TestEnvelopeSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("64-bit platforms only")
	}
	if got := unsafe.Sizeof(envelope{}); got != 128 {
		t.Errorf("envelope is %d bytes, want 128", got)
	}
}

// TestQueuedMessageOverhead pins the memory a queued message costs beyond
// its payload: 100,000 messages queued behind a blocked subscriber (in its
// lane; the topic queue keeps its default size).
func TestQueuedMessageOverhead(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory distorts heap figures")
	}
	const n = 100_000
	b, err := New(WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	if _, err := b.Subscribe("t", "blocked", func(context.Context, Message) error {
		<-release
		return nil
	}, LaneSize(n)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		close(release)
		_ = b.Close(context.Background())
	}()
	msgs := make([]Message, n) // IDs and payloads exist before measuring
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
	for b.Stats().Topics["t"].Subscribers["blocked"].Queued < n-1 {
		runtime.Gosched()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(msgs) // measured: the queue's own memory, not msgs freed
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	t.Logf("%.0f bytes per queued message beyond its payload", per)
	if per > 256 {
		t.Errorf("%.0f bytes per queued message, want at most 256", per)
	}
}

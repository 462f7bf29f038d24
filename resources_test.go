package broker

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Resources follow what is live: publishing to many distinct topic names
// (a name per tenant, per user) leaves no goroutine behind once they are
// drained, and memory stays within a bound however many names were used;
// so does subscribing and unsubscribing under many names.
func TestTopicsAndNamesAreReclaimed(t *testing.T) {
	n := 100_000
	if raceEnabled || testing.Short() {
		n = 10_000
	}
	b := newTestBroker(t)
	heapBefore := heapInUse()
	base := runtime.NumGoroutine()
	ctx := context.Background()
	for i := range n {
		require.NoError(t, b.Publish(ctx, Message{ID: "m", Topic: fmt.Sprint("tenant-", i)}))
	}
	waitGoroutines(t, base)
	for i := range 1000 { // subscribe and unsubscribe under 1,000 names on 1,000 topics
		topic := fmt.Sprint("tenant-", i)
		s, err := b.Subscribe(topic, fmt.Sprint("sub-", i), func(context.Context, Message) error { return nil })
		require.NoError(t, err)
		require.NoError(t, b.Publish(ctx, Message{ID: "x", Topic: topic}))
		require.NoError(t, s.Unsubscribe(ctx))
	}
	for i := range n {
		require.NoError(t, b.Publish(ctx, Message{ID: "m", Topic: fmt.Sprint("other-", i)}))
	}
	waitGoroutines(t, base)
	for deadline := time.Now().Add(10 * time.Second); len(b.liveTopics()) > 0; time.Sleep(time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "every topic retires")
	}
	st := b.Stats()
	assert.LessOrEqual(t, len(st.Topics), MaxGoneTopics+1, "counters of gone topics are bounded")
	assert.Equal(t, uint64(2*n+1000-MaxGoneTopics), st.ForgottenTopics+uint64(MaxGoneTopics-len(st.Topics)), "every topic beyond the bound is counted as forgotten")
	grown := heapInUse() - heapBefore
	t.Logf("%d topic names, then 1,000 subscribe/unsubscribe, then %d more: %d goroutines (baseline %d), heap grew %d KiB",
		n, n, runtime.NumGoroutine(), base, grown>>10)
	assert.Less(t, grown, int64(16<<20), "heap within 16 MiB whatever the number of names")
}

// A name subscribed and unsubscribed many times on one topic keeps its
// counters; many names keep at most MaxGoneSubscribers.
func TestSubscriberCountersAreBounded(t *testing.T) {
	b := newTestBroker(t)
	ctx := context.Background()
	keep, err := b.Subscribe("t", "keep", func(context.Context, Message) error { return nil })
	require.NoError(t, err)
	for i := range 1000 {
		s, err := b.Subscribe("t", fmt.Sprint("s", i), func(context.Context, Message) error { return nil })
		require.NoError(t, err)
		require.NoError(t, b.Publish(ctx, Message{ID: fmt.Sprint("m", i), Topic: "t"}))
		require.NoError(t, s.Unsubscribe(ctx))
	}
	for deadline := time.Now().Add(10 * time.Second); b.Stats().Topics["t"].Subscribers["keep"].Delivered < 1000; {
		require.True(t, time.Now().Before(deadline), "keep got the thousand messages")
		time.Sleep(time.Millisecond)
	}
	ts := b.Stats().Topics["t"]
	assert.Len(t, ts.Subscribers, MaxGoneSubscribers+1, "the active one and the last gone ones")
	assert.Equal(t, uint64(1000-MaxGoneSubscribers), ts.ForgottenSubscribers)
	last := ts.Subscribers["s999"]
	assert.Equal(t, uint64(1), last.Delivered, "a recently gone name keeps its counters")
	assert.Equal(t, uint64(1000), ts.Subscribers["keep"].Delivered)
	require.NoError(t, keep.Unsubscribe(ctx))
}

// A topic that retired comes back with its counters when published to
// again, and a Publish racing its retirement is never lost.
func TestRetiredTopicComesBack(t *testing.T) {
	b := newTestBroker(t)
	ctx := context.Background()
	retired := func() {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
			if _, live := b.topics.Load("t"); !live {
				return
			}
			require.True(t, time.Now().Before(deadline), "topic t retires")
		}
	}
	for round := range 200 {
		require.NoError(t, b.Publish(ctx, Message{ID: fmt.Sprint("m", round), Topic: "t"}))
		if round%2 == 0 {
			retired()
		}
	}
	retired()
	ts := b.Stats().Topics["t"]
	assert.Equal(t, uint64(200), ts.Published)
	assert.Equal(t, uint64(200), ts.Unrouted)
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// waitGoroutines waits (at most 10 s) for the goroutine count to fall back
// to base.
func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, baseline %d", runtime.NumGoroutine(), base)
		}
		time.Sleep(time.Millisecond)
	}
}

// While a topic retires and comes back, Stats see it live or gone, never
// missing and never counted twice: its Published only grows, up to what
// was accepted.
func TestStatsSeeARetiringTopicOnce(t *testing.T) {
	b := newTestBroker(t)
	ctx := context.Background()
	require.NoError(t, b.Publish(ctx, Message{ID: "m0", Topic: "t"}))
	var accepted atomic.Uint64
	accepted.Store(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i < 2000; i++ {
			if b.Publish(ctx, Message{ID: fmt.Sprint("m", i), Topic: "t"}) != nil {
				return
			}
			accepted.Add(1)
			if i%10 == 0 {
				time.Sleep(50 * time.Microsecond) // let it retire now and then
			}
		}
	}()
	last := uint64(0)
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		ts, ok := b.Stats().Topics["t"]
		max := accepted.Load() // read after: a Publish returned is counted here or pending (one at most)
		require.True(t, ok, "the topic is in Stats, live or gone")
		require.GreaterOrEqual(t, ts.Published, last, "Published never goes back")
		require.LessOrEqual(t, ts.Published, max+1, "Published never counts a message twice")
		last = ts.Published
	}
}

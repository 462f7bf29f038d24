package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// Keyless messages have a consumer of their own per subscriber, which hands
// out many at a time: they run up to Concurrency at once whatever the
// partitions, and a retry holds none of the others (SPEC I1: a keyless
// message is ordered only by dispatch) unless the subscriber is Ordered.

// TestKeylessMessagesRunConcurrently: on a topic of one partition,
// Concurrency(4) runs four keyless messages at once.
func TestKeylessMessagesRunConcurrently(t *testing.T) {
	r := newRig(t, embedded(t, ""), false, nil)
	var running, most atomic.Int32
	four := make(chan struct{})
	var once sync.Once
	c := &calls{}
	r.subscribe(t, "wide", "s", c.handler("", func(context.Context, broker.Message) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == 4 {
			once.Do(func() { close(four) })
		}
		select { // the first four wait for each other
		case <-four:
		case <-time.After(2 * time.Second):
		}
		return nil
	}), broker.Concurrency(4))
	for i := range 8 {
		r.publish(t, broker.Message{ID: fmt.Sprintf("m-%d", i), Topic: "wide"})
	}
	waitFor(t, "every message handled", func() bool { return len(c.snapshot()) == 8 })
	if m := most.Load(); m != 4 {
		t.Errorf("at most %d handlers ran at once; want 4", m)
	}
}

// TestKeylessRetryHoldsNothing: with Concurrency 1, a keyless message
// waiting out its retry's delay does not hold the ones published after it.
func TestKeylessRetryHoldsNothing(t *testing.T) {
	r := newRig(t, embedded(t, ""), false, nil,
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(500 * time.Millisecond)}))
	c := &calls{}
	r.subscribe(t, "free", "s", c.handler("", func(_ context.Context, m broker.Message) error {
		if m.ID == "m-0" && m.Attempt == 1 {
			return errors.New("not yet")
		}
		return nil
	}))
	for i := range 6 {
		r.publish(t, broker.Message{ID: fmt.Sprintf("m-%d", i), Topic: "free"})
	}
	waitFor(t, "every message delivered", func() bool { return subStats(r.b, "free", "s").Delivered == 6 })
	var order []string
	for _, cl := range c.snapshot() {
		order = append(order, fmt.Sprintf("%s#%d", cl.msg.ID, cl.msg.Attempt))
	}
	if order[len(order)-1] != "m-0#2" {
		t.Errorf("start order %v; want m-0's retry last (it waits 500 ms, holding nothing)", order)
	}
}

// TestOrderedKeylessAcrossPartitions: Ordered keeps keyless messages in
// publish order through retries, one at a time, on a topic of four
// partitions with Concurrency(4).
func TestOrderedKeylessAcrossPartitions(t *testing.T) {
	r := newRig(t, embedded(t, ""), false, []natsjs.TransportOption{natsjs.WithPartitions(4)})
	c := &calls{}
	r.subscribe(t, "fifo", "s", c.handler("", func(_ context.Context, m broker.Message) error {
		time.Sleep(5 * time.Millisecond)
		if m.ID == "m-0" && m.Attempt == 1 {
			return errors.New("not yet")
		}
		return nil
	}), broker.Ordered(), broker.Concurrency(4))
	want := []string{"m-0#1", "m-0#2"}
	for i := range 6 {
		r.publish(t, broker.Message{ID: fmt.Sprintf("m-%d", i), Topic: "fifo"})
		if i > 0 {
			want = append(want, fmt.Sprintf("m-%d#1", i))
		}
	}
	waitFor(t, "every message delivered", func() bool { return subStats(r.b, "fifo", "s").Delivered == 6 })
	all := c.snapshot()
	var order []string
	for i, cl := range all {
		order = append(order, fmt.Sprintf("%s#%d", cl.msg.ID, cl.msg.Attempt))
		if i > 0 && cl.at.Before(all[i-1].end) {
			t.Errorf("%s started before %s ended", order[i], order[i-1])
		}
	}
	if !slices.Equal(order, want) {
		t.Errorf("start order %v; want %v", order, want)
	}
}

// TestOneIDAtATime: two copies of one ID (publish-side dedup off) handed
// out at once to a subscriber with Concurrency(4) never run at once; with
// the broker's idempotency store the second is then deduplicated.
func TestOneIDAtATime(t *testing.T) {
	for _, noDedup := range []bool{true, false} {
		t.Run(fmt.Sprintf("noDedup=%v", noDedup), func(t *testing.T) {
			r := newRig(t, embedded(t, ""), noDedup, []natsjs.TransportOption{natsjs.WithPublishDedupWindow(0)})
			var running atomic.Int32
			var overlap atomic.Bool
			c := &calls{}
			r.subscribe(t, "twice", "s", c.handler("", func(context.Context, broker.Message) error {
				if running.Add(1) > 1 {
					overlap.Store(true)
				}
				time.Sleep(100 * time.Millisecond)
				running.Add(-1)
				return nil
			}), broker.Concurrency(4))
			r.publish(t, broker.Message{ID: "x", Topic: "twice"})
			r.publish(t, broker.Message{ID: "x", Topic: "twice"})
			waitFor(t, "both copies ended", func() bool {
				ss := subStats(r.b, "twice", "s")
				return ss.Delivered+ss.Deduplicated == 2
			})
			if overlap.Load() {
				t.Error("the two copies of x ran at once")
			}
			if ss := subStats(r.b, "twice", "s"); !noDedup && ss.Deduplicated != 1 {
				t.Errorf("Deduplicated %d; want 1 with the idempotency store", ss.Deduplicated)
			}
		})
	}
}

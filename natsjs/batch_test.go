package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// TestPublishBatch: a batch larger than the window in flight, keyed and
// keyless, through the broker's PublishBatch: every message stored and
// delivered once, each Key in batch order, counted as published.
func TestPublishBatch(t *testing.T) {
	r := newRig(t, embedded(t, ""), false, []natsjs.TransportOption{natsjs.WithPartitions(2)})
	c := &calls{}
	r.subscribe(t, "many", "s", c.handler("", nil), broker.Concurrency(4))
	const n = 700 // more than natsjs's window of 256
	msgs := make([]broker.Message, n)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("m-%03d", i), Topic: "many"}
		if i%2 == 0 {
			msgs[i].Key = fmt.Sprintf("k-%d", i%6)
		}
	}
	if err := r.b.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
	if st := r.b.Stats().Topics["many"]; st.Published != n {
		t.Errorf("Published %d; want %d", st.Published, n)
	}
	waitFor(t, "every message delivered", func() bool { return subStats(r.b, "many", "s").Delivered == n })
	byID := map[string]int{}
	last := map[string]string{}
	for _, cl := range c.snapshot() {
		byID[cl.msg.ID]++
		if k := cl.msg.Key; k != "" {
			if cl.msg.ID < last[k] {
				t.Errorf("%s (key %s) started after %s", cl.msg.ID, k, last[k])
			}
			last[k] = cl.msg.ID
		}
	}
	if len(byID) != n {
		t.Errorf("%d distinct messages handled; want %d", len(byID), n)
	}
}

// TestPublishBatchFullStream: a stream at its limit refuses the messages
// of a batch that do not fit with ErrQueueFull, after the publish timeout
// (at once without one), counted as rejected; the others are stored.
func TestPublishBatchFullStream(t *testing.T) {
	conn := embedded(t, "")
	for i, timeout := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(fmt.Sprintf("timeout=%v", timeout), func(t *testing.T) {
			r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithQueueSize(5)}, broker.WithPublishTimeout(timeout))
			topic := fmt.Sprintf("batch-full-%d", i)
			release := make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			r.subscribe(t, topic, "slow", func(ctx context.Context, m broker.Message) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			})
			msgs := make([]broker.Message, 8)
			for k := range msgs {
				msgs[k] = broker.Message{ID: fmt.Sprintf("m-%d", k), Topic: topic}
			}
			start := time.Now()
			err := r.b.PublishBatch(t.Context(), msgs)
			took := time.Since(start)
			var be *broker.BatchError
			if !errors.As(err, &be) || !errors.Is(err, broker.ErrQueueFull) {
				t.Fatalf("PublishBatch into a stream of 5: %v; want a *BatchError with ErrQueueFull", err)
			}
			stored, full := 0, 0
			for _, e := range be.Errs {
				switch {
				case e == nil:
					stored++
				case errors.Is(e, broker.ErrQueueFull):
					full++
				default:
					t.Errorf("unexpected error: %v", e)
				}
			}
			if stored != 5 || full != 3 {
				t.Errorf("%d stored, %d refused as full; want 5 and 3", stored, full)
			}
			if took < timeout {
				t.Errorf("returned after %v, before the publish timeout %v", took, timeout)
			}
			if st := r.b.Stats().Topics[topic]; st.Published != 5 || st.Rejected != 3 {
				t.Errorf("topic stats %+v; want Published 5, Rejected 3", st)
			}
		})
	}
}

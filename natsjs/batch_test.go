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
			msgs := stuckTopic(t, r, topic, 8)
			start := time.Now()
			err := r.b.PublishBatch(t.Context(), msgs)
			took := time.Since(start)
			if !errors.Is(err, broker.ErrQueueFull) {
				t.Fatalf("PublishBatch into a stream of 5: %v; want a *BatchError with ErrQueueFull", err)
			}
			stored, full, others := outcomes(t, err)
			for _, e := range others {
				t.Errorf("unexpected error: %v", e)
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

// TestPublishBatchAfterCtxEnded: as Publish with a ctx that has ended
// stores nothing, PublishBatch sends nothing once ctx ended: no message it
// reports refused is stored.
func TestPublishBatchAfterCtxEnded(t *testing.T) {
	r := newRig(t, embedded(t, ""), true, nil)
	c := &calls{}
	r.subscribe(t, "cx", "s", c.handler("", nil))
	r.publish(t, broker.Message{ID: "first", Topic: "cx"}) // the topic's stream is known
	waitFor(t, "first delivered", func() bool { return subStats(r.b, "cx", "s").Delivered == 1 })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := r.b.Publish(ctx, broker.Message{ID: "single", Topic: "cx"}); err == nil {
		t.Fatalf("Publish with a done ctx: nil")
	}
	msgs := make([]broker.Message, 20)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("b-%02d", i), Topic: "cx"}
	}
	err := r.b.PublishBatch(ctx, msgs)
	var be *broker.BatchError
	refused := map[string]error{}
	if errors.As(err, &be) {
		for i, e := range be.Errs {
			if e != nil {
				refused[msgs[i].ID] = e
			}
		}
	}
	time.Sleep(2 * time.Second) // let whatever was stored be delivered
	handled := map[string]bool{}
	for _, cl := range c.snapshot() {
		handled[cl.msg.ID] = true
	}
	if handled["single"] {
		t.Errorf("Publish's refused message was delivered")
	}
	both := 0
	for id, e := range refused {
		if handled[id] {
			both++
			if both == 1 {
				t.Logf("e.g. %s: %v", id, e)
			}
		}
	}
	stored := 0
	for _, m := range msgs {
		if handled[m.ID] {
			stored++
		}
	}
	t.Logf("PublishBatch with a done ctx: %d of 20 reported refused, %d stored and delivered; topic stats %+v",
		len(refused), stored, r.b.Stats().Topics["cx"])
	if both > 0 {
		t.Errorf("%d messages reported refused (counted Rejected) were stored and delivered", both)
	}
}

// TestPublishBatchFullWaitsOnce: every message of a batch that a full
// stream refused is ErrQueueFull and counted Rejected (none reported
// "stored or not" because the batch took long), and the batch waits for
// room about one publish timeout in all, not one per refused message.
func TestPublishBatchFullWaitsOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // of the caller's context; 0: none
	}{
		{"no deadline", 0},
		// The publish timeout, not the caller's longer deadline, bounds the
		// wait for room (it used to run to the caller's deadline, most
		// refusals then reading "context deadline exceeded").
		{"a longer deadline", 8 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, embedded(t, ""), true, []natsjs.TransportOption{natsjs.WithQueueSize(5)}, broker.WithPublishTimeout(time.Second))
			msgs := stuckTopic(t, r, "full", 16)
			ctx := t.Context()
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			start := time.Now()
			err := r.b.PublishBatch(ctx, msgs)
			took := time.Since(start)
			stored, full, others := outcomes(t, err)
			for _, e := range others {
				t.Logf("other: %v", e)
			}
			st := r.b.Stats().Topics["full"]
			t.Logf("took %v: %d stored, %d ErrQueueFull, %d other; Published %d Rejected %d", took.Round(time.Millisecond), stored, full, len(others), st.Published, st.Rejected)
			if stored != 5 || full != 11 || st.Rejected != 11 {
				t.Errorf("want 5 stored, 11 ErrQueueFull, Rejected 11")
			}
			if took < time.Second || took > 5*time.Second {
				t.Errorf("took %v; want about the publish timeout, 1 s, for the batch", took)
			}
		})
	}
}

// stuckTopic subscribes "slow" to topic with a handler that waits until
// the test ends (so the stream fills up), and returns n messages for it,
// m-00 to m-<n-1>.
func stuckTopic(t *testing.T, r *rig, topic string, n int) []broker.Message {
	t.Helper()
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
	msgs := make([]broker.Message, n)
	for k := range msgs {
		msgs[k] = broker.Message{ID: fmt.Sprintf("m-%02d", k), Topic: topic}
	}
	return msgs
}

// outcomes counts a PublishBatch's *BatchError by message: stored,
// refused as full, and the other errors.
func outcomes(t *testing.T, err error) (stored, full int, others []error) {
	t.Helper()
	var be *broker.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("PublishBatch: %v; want a *BatchError", err)
	}
	for _, e := range be.Errs {
		switch {
		case e == nil:
			stored++
		case errors.Is(e, broker.ErrQueueFull):
			full++
		default:
			others = append(others, e)
		}
	}
	return stored, full, others
}

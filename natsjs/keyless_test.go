package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go/jetstream"
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

// TestKeylessQueueKeptAlive: a subscriber with Concurrency 1 whose
// handler takes 150 ms, AckWait 500 ms, MaxRetries 0, no KV dedup; 20
// keyless messages published at once, pulled 8 at first (then topped up
// by about 6 at a time, the queue's limit), so the last of each pull waits
// about a second for its turn, twice the AckWait: the loop keeps them
// alive, so each runs once and is delivered (none delivered again by the
// server, counted beyond the policy and dead-lettered).
func TestKeylessQueueKeptAlive(t *testing.T) {
	r := newRig(t, embedded(t, ""), true, []natsjs.TransportOption{natsjs.WithAckWait(500 * time.Millisecond)},
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	c := &calls{}
	r.subscribe(t, "slowq", "s", c.handler("", func(context.Context, broker.Message) error {
		time.Sleep(150 * time.Millisecond)
		return nil
	}))
	msgs := make([]broker.Message, 20)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("m-%02d", i), Topic: "slowq"}
	}
	if err := r.b.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all delivered", func() bool { return subStats(r.b, "slowq", "s").Delivered >= 20 })
	time.Sleep(2 * time.Second) // copies still on their way
	ss := subStats(r.b, "slowq", "s")
	runs := map[string]int{}
	for _, cl := range c.snapshot() {
		runs[cl.msg.ID]++
	}
	twice := 0
	for _, n := range runs {
		if n > 1 {
			twice++
		}
	}
	dls, _ := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: "slowq"})
	t.Logf("runs %d (%d messages twice), Delivered %d, DeadLettered %d, dead letters %d, Routed %d",
		len(c.snapshot()), twice, ss.Delivered, ss.DeadLettered, len(dls), ss.Routed)
	for i, dl := range dls {
		if i < 2 {
			t.Logf("dead letter %s attempt %d reason %s: %s", dl.Message.ID, dl.Attempts, dl.Reason, dl.Error)
		}
	}
	if twice > 0 || ss.DeadLettered > 0 {
		t.Errorf("messages waiting in the inbox were delivered again by the server: %d ran twice, %d dead-lettered after being delivered", twice, ss.DeadLettered)
	}
}

// TestOrderedMustAgree: processes subscribed under one name must agree on
// Ordered (it is the keyless messages' consumer's): a Subscribe that does
// not is refused, either way, until RemoveSubscriber starts the name again.
func TestOrderedMustAgree(t *testing.T) {
	conn := embedded(t, "")
	a, b := newRig(t, conn, false, nil), newRig(t, conn, false, nil)
	nop := func(context.Context, broker.Message) error { return nil }
	a.subscribe(t, "ord", "s", nop, broker.Ordered())
	if _, err := b.b.Subscribe("ord", "s", nop); !errors.Is(err, broker.ErrInvalidOption) {
		t.Errorf("an unordered Subscribe beside an Ordered one: %v; want ErrInvalidOption", err)
	}
	b.subscribe(t, "ord", "s", nop, broker.Ordered()) // agreeing is fine
	infos, err := a.tr.ConsumerInfo(t.Context(), "ord", "s")
	if err != nil {
		t.Fatal(err)
	}
	if u := infos[len(infos)-1]; u.Config.MaxAckPending != 1 {
		t.Errorf("the keyless consumer has MaxAckPending %d; want 1 (Ordered)", u.Config.MaxAckPending)
	}
	a.subscribe(t, "free", "s", nop)
	if _, err := b.b.Subscribe("free", "s", nop, broker.Ordered()); !errors.Is(err, broker.ErrInvalidOption) {
		t.Errorf("an Ordered Subscribe beside an unordered one: %v; want ErrInvalidOption", err)
	}
}

// TestKeylessRedriveHoldsNoPartition: a redriven keyless message goes to
// the subscriber's keyless consumer, not to a partition's, so its retries
// hold up no keyed message.
func TestKeylessRedriveHoldsNoPartition(t *testing.T) {
	r := newRig(t, embedded(t, ""), false, nil,
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	var fail atomic.Bool
	fail.Store(true)
	c := &calls{}
	r.subscribe(t, "rd", "s", c.handler("", func(_ context.Context, m broker.Message) error {
		if m.ID == "free" && fail.Load() {
			return errors.New("down")
		}
		return nil
	}))
	r.publish(t, broker.Message{ID: "free", Topic: "rd"})
	waitFor(t, "the dead letter", func() bool { return subStats(r.b, "rd", "s").DeadLettered == 1 })
	dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: "rd"})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %v, %v", dls, err)
	}
	before, err := r.tr.ConsumerInfo(t.Context(), "rd", "s")
	if err != nil {
		t.Fatal(err)
	}
	fail.Store(false)
	if n, err := r.b.Redrive(t.Context(), dls[0].ID); n != 1 || err != nil {
		t.Fatalf("Redrive = %d, %v", n, err)
	}
	waitFor(t, "the redelivery", func() bool { return subStats(r.b, "rd", "s").Delivered == 1 })
	after, err := r.tr.ConsumerInfo(t.Context(), "rd", "s")
	if err != nil {
		t.Fatal(err)
	}
	last := len(after) - 1
	if got := after[last].Delivered.Stream - before[last].Delivered.Stream; got != 1 {
		t.Errorf("the keyless consumer delivered %d more; want the redriven copy", got)
	}
	if after[0].Delivered.Consumer != before[0].Delivered.Consumer {
		t.Errorf("partition 0's consumer delivered the redriven copy")
	}
}

// TestKeylessNeedsTheKeylessConsumer backs the README's upgrade note: a
// topic's stream keeps a message only for the consumers it matches
// (interest retention), so with only a partition's consumer (what a
// version before keyless consumers made), a keyless message is dropped
// while a keyed one is kept.
func TestKeylessNeedsTheKeylessConsumer(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, true, nil)
	r.publish(t, broker.Message{ID: "first", Topic: "old"}) // creates the stream; nobody subscribed: dropped
	js := conn.JetStream()
	stream := r.tr.StreamName("old")
	names, err := r.tr.ConsumerNames(t.Context(), "old", "s")
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	subjects := info.CachedInfo().Config.Subjects // "<prefix>.<topic>.>"
	prefix := strings.TrimSuffix(subjects[0], ">")
	if _, err := js.CreateConsumer(t.Context(), stream, jetstream.ConsumerConfig{
		Durable: names[0], AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: prefix + "m.0",
	}); err != nil {
		t.Fatal(err)
	}
	r.publish(t, broker.Message{ID: "keyed", Topic: "old", Key: "k"})
	r.publish(t, broker.Message{ID: "keyless", Topic: "old"})
	if n := r.streamMsgs(t, "old"); n != 1 {
		t.Errorf("the stream holds %d messages; want 1 (the keyed one; the keyless one had no consumer)", n)
	}
}

// TestKeylessQueueDrainsAtAStop: the keyless queue holds about a second of
// work (the handlers' average time decides), so an Unsubscribe with a
// deadline of two seconds runs every message queued in the process. A
// message queued and handed back unstarted at the deadline would have used
// its only attempt (MaxRetries 0) and be dead-lettered without running, as
// 64 queued messages of 50 ms did.
func TestKeylessQueueDrainsAtAStop(t *testing.T) {
	r := newRig(t, embedded(t, ""), true, nil, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	var mu sync.Mutex
	ran := map[string]int{}
	h := func(ctx context.Context, m broker.Message) error {
		mu.Lock()
		ran[m.ID]++
		mu.Unlock()
		select {
		case <-time.After(50 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	sub := r.subscribe(t, "q", "s", h)
	msgs := make([]broker.Message, 60)
	for i := range msgs {
		msgs[i] = broker.Message{ID: fmt.Sprintf("m-%03d", i), Topic: "q"}
	}
	if err := r.b.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ten runs", func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) >= 10 })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	err := sub.Unsubscribe(ctx)
	cancel()
	ss := subStats(r.b, "q", "s")
	t.Logf("Unsubscribe: %v; Delivered %d, DeadLettered %d", err, ss.Delivered, ss.DeadLettered)
	if err != nil || ss.DeadLettered != 0 {
		t.Errorf("Unsubscribe = %v, %d dead-lettered; want nil and none (the queue drained before the deadline)", err, ss.DeadLettered)
	}
	r.subscribe(t, "q", "s", h) // the rest, from the server
	waitFor(t, "every message delivered", func() bool { return subStats(r.b, "q", "s").Delivered == 60 })
	if dl := subStats(r.b, "q", "s").DeadLettered; dl != 0 {
		t.Errorf("%d dead-lettered; want none", dl)
	}
}

package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// These tests run the subscriber options that act in the process over
// JetStream: the core's breaker, retry budget and rate limit, with a
// delivery held in the process (kept alive) while they make it wait.

// breakerLog records breaker transitions.
type breakerLog struct {
	broker.NopObserver
	mu     sync.Mutex
	events []string
}

func (o *breakerLog) BreakerChanged(e broker.BreakerEvent) {
	o.mu.Lock()
	o.events = append(o.events, fmt.Sprintf("%s→%s", e.From, e.To))
	o.mu.Unlock()
}

func (o *breakerLog) path() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.events...)
}

// TestBreakerOverJetStream: the breaker trips after its failures; while it
// is open nothing runs and what the process holds is kept alive past
// several AckWaits, so it uses up no attempt; at half open one probe runs,
// and its success closes the breaker.
func TestBreakerOverJetStream(t *testing.T) {
	conn := embedded(t, "")
	const ackWait = 200 * time.Millisecond
	log := &breakerLog{}
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithAckWait(ackWait)}, broker.WithObserver(log),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 5, Backoff: broker.ConstantBackoff(10 * time.Millisecond)}))
	c := &calls{}
	var failing atomic.Bool
	failing.Store(true)
	r.subscribe(t, "brk", "s", c.handler("a", func(context.Context, broker.Message) error {
		if failing.Load() {
			return fmt.Errorf("down")
		}
		return nil
	}), broker.CircuitBreaker(broker.BreakerPolicy{Failures: 2, OpenFor: time.Second}))
	r.publish(t, broker.Message{ID: "m1", Topic: "brk"})
	r.publish(t, broker.Message{ID: "m2", Topic: "brk"})
	waitFor(t, "the breaker to open", func() bool { return subStats(r.b, "brk", "s").Breaker == broker.BreakerOpen })
	failing.Store(false)
	time.Sleep(4 * ackWait) // open for 1 s: nothing runs, the held retries stay here
	if n := len(c.snapshot()); n != 2 {
		t.Fatalf("%d calls while open; want the 2 that tripped it", n)
	}
	waitFor(t, "both delivered", func() bool { return subStats(r.b, "brk", "s").Delivered == 2 })
	if got, want := fmt.Sprint(log.path()), "[closed→open open→half_open half_open→closed]"; got != want {
		t.Errorf("transitions %s; want %s", got, want)
	}
	for _, id := range []string{"m1", "m2"} {
		if got := fmt.Sprint(c.attempts(id)); got != "[1 2]" {
			t.Errorf("%s ran at attempts %s; want [1 2]: held while open, it uses up none", id, got)
		}
	}
	if st := subStats(r.b, "brk", "s").Breaker; st != broker.BreakerClosed {
		t.Errorf("breaker %q; want closed", st)
	}
}

// TestRetryBudgetOverJetStream: a retry the budget has no room for is
// dead-lettered with reason "budget", and the message is terminated.
func TestRetryBudgetOverJetStream(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	r.subscribe(t, "bud", "s", func(context.Context, broker.Message) error { return fmt.Errorf("down") },
		broker.RetryBudget(broker.RetryBudgetPolicy{Ratio: 0, Window: time.Minute, MinPerSecond: 1.0 / 60}))
	r.publish(t, broker.Message{ID: "m", Topic: "bud"})
	waitFor(t, "the dead letter", func() bool { return subStats(r.b, "bud", "s").DeadLettered == 1 })
	dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: "bud"})
	if err != nil || len(dls) != 1 {
		t.Fatalf("List: %v, %d dead letters; want 1", err, len(dls))
	}
	if dls[0].Reason != broker.ReasonBudget || dls[0].Attempts != 2 {
		t.Errorf("dead letter reason %q after %d attempts; want budget after 2", dls[0].Reason, dls[0].Attempts)
	}
	waitFor(t, "the message terminated", func() bool {
		pending, ackPending := r.backlog(t, "bud", "s")
		return pending == 0 && ackPending == 0
	})
}

// TestRateLimitOverJetStream: the rate limit spaces the handlers' starts.
func TestRateLimitOverJetStream(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, true, nil)
	c := &calls{}
	r.subscribe(t, "rate", "s", c.handler("a", nil), broker.RateLimit(20, 1), broker.Concurrency(2))
	const n = 5
	for i := range n {
		r.publish(t, broker.Message{ID: fmt.Sprint(i), Topic: "rate"})
	}
	waitFor(t, "every delivery", func() bool { return subStats(r.b, "rate", "s").Delivered == n })
	all := c.snapshot()
	first, last := all[0].at, all[0].at
	for _, cl := range all {
		if cl.at.Before(first) {
			first = cl.at
		}
		if cl.at.After(last) {
			last = cl.at
		}
	}
	if span := last.Sub(first); span < (n-1)*50*time.Millisecond-time.Millisecond {
		t.Errorf("%d starts within %v; want at least %v at 20 a second", n, span, (n-1)*50*time.Millisecond)
	}
}

// TestWebhookSetupOverJetStream: the README's webhook subscription
// subscribes over JetStream but for its WhenLaneFull, which is refused
// with what to use instead, and delivers.
func TestWebhookSetupOverJetStream(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	opts := []broker.SubscribeOption{
		broker.HandlerTimeout(2 * time.Second),
		broker.CircuitBreaker(broker.BreakerPolicy{Failures: 5, OpenFor: time.Second, MaxOpenFor: time.Minute}),
		broker.RetryBudget(broker.DefaultRetryBudget()),
		broker.RateLimit(100, 10),
	}
	_, err := r.b.Subscribe("orders", "webhook", func(context.Context, broker.Message) error { return nil },
		append(opts, broker.WhenLaneFull(broker.DeadLetterOldest))...)
	if !errors.Is(err, broker.ErrInvalidOption) || !strings.Contains(err.Error(), "WithQueueSize") {
		t.Fatalf("Subscribe with WhenLaneFull: %v; want ErrInvalidOption naming WithQueueSize", err)
	}
	c := &calls{}
	r.subscribe(t, "orders", "webhook", c.handler("a", nil), opts...)
	r.publish(t, broker.Message{ID: "o1", Topic: "orders"})
	waitFor(t, "the delivery", func() bool { return subStats(r.b, "orders", "webhook").Delivered == 1 })
	if ss := subStats(r.b, "orders", "webhook"); ss.Breaker != broker.BreakerClosed || ss.RetryBudgetLeft == 0 {
		t.Errorf("breaker %q, budget left %d; want closed and some", ss.Breaker, ss.RetryBudgetLeft)
	}
}

// TestBreakerHeldAtAStopUsesOneAttempt: a delivery held by an open breaker
// when a Close's deadline passes is handed back unstarted; the server
// counted that delivery, so the next process runs it at the attempt after.
func TestBreakerHeldAtAStopUsesOneAttempt(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil)
	c := &calls{}
	r.subscribe(t, "held", "s", c.handler("a", func(context.Context, broker.Message) error { return fmt.Errorf("down") }),
		broker.CircuitBreaker(broker.BreakerPolicy{Failures: 1, OpenFor: time.Minute}))
	r.publish(t, broker.Message{ID: "m", Topic: "held"})
	waitFor(t, "the breaker to open", func() bool { return subStats(r.b, "held", "s").Breaker == broker.BreakerOpen })
	waitFor(t, "the retry held", func() bool { return subStats(r.b, "held", "s").InFlight == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := r.b.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close took %v with a delivery held by the open breaker", took)
	}
	if got := fmt.Sprint(c.attempts("m")); got != "[1]" {
		t.Fatalf("attempts %s before the stop; want [1]", got)
	}
	next := newRig(t, conn, false, nil)
	c2 := &calls{}
	next.subscribe(t, "held", "s", c2.handler("b", nil))
	waitFor(t, "the delivery", func() bool { return subStats(next.b, "held", "s").Delivered == 1 })
	if got := fmt.Sprint(c2.attempts("m")); got != "[3]" {
		t.Errorf("attempts %s in the next process; want [3]: attempt 2 was held and handed back", got)
	}
}

// TestHandlerTimeoutOverJetStream: an attempt past its HandlerTimeout
// fails with code "timeout", as in memory.
func TestHandlerTimeoutOverJetStream(t *testing.T) {
	conn := embedded(t, "")
	r := newRig(t, conn, false, nil, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	r.subscribe(t, "slow", "s", func(ctx context.Context, _ broker.Message) error {
		<-ctx.Done()
		return ctx.Err()
	}, broker.HandlerTimeout(100*time.Millisecond))
	r.publish(t, broker.Message{ID: "m", Topic: "slow"})
	waitFor(t, "the dead letter", func() bool { return subStats(r.b, "slow", "s").DeadLettered == 1 })
	dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: "slow"})
	if err != nil || len(dls) != 1 {
		t.Fatalf("List: %v, %d dead letters; want 1", err, len(dls))
	}
	if dls[0].ErrorCode != broker.CodeTimeout || dls[0].Reason != broker.ReasonExhausted {
		t.Errorf("dead letter code %q reason %q; want timeout, exhausted", dls[0].ErrorCode, dls[0].Reason)
	}
}

// TestBreakerOverJetStreamKeyed: a keyed message's retry held by the open
// breaker blocks its partition's loop as a long handler does, kept alive
// past several AckWaits: it runs at the attempt it came with, and the
// partition's next message after it.
func TestBreakerOverJetStreamKeyed(t *testing.T) {
	conn := embedded(t, "")
	const ackWait = 200 * time.Millisecond
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithAckWait(ackWait)},
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 5, Backoff: broker.ConstantBackoff(10 * time.Millisecond)}))
	c := &calls{}
	var failing atomic.Bool
	failing.Store(true)
	r.subscribe(t, "brkk", "s", c.handler("a", func(context.Context, broker.Message) error {
		if failing.Load() {
			return fmt.Errorf("down")
		}
		return nil
	}), broker.CircuitBreaker(broker.BreakerPolicy{Failures: 1, OpenFor: time.Second}))
	r.publish(t, broker.Message{ID: "m1", Key: "k", Topic: "brkk"})
	r.publish(t, broker.Message{ID: "m2", Key: "k", Topic: "brkk"})
	waitFor(t, "the breaker to open", func() bool { return subStats(r.b, "brkk", "s").Breaker == broker.BreakerOpen })
	failing.Store(false)
	waitFor(t, "both delivered", func() bool { return subStats(r.b, "brkk", "s").Delivered == 2 })
	if got := fmt.Sprint(c.attempts("m1"), c.attempts("m2")); got != "[1 2] [1]" {
		t.Errorf("attempts m1, m2: %s; want [1 2] [1]", got)
	}
	if all := c.snapshot(); len(all) != 3 || all[2].msg.ID != "m2" {
		t.Errorf("calls %d, last %q; want 3, m2 last (key order)", len(all), all[len(all)-1].msg.ID)
	}
}

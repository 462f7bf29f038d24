// Command orders runs the design article's worked example on the broker:
// an order.created event fanned out to billing, inventory and notification.
// Inventory fails once and succeeds on its retry, notification rejects one
// message permanently (it lands in the dead-letter store and is redriven
// after a "fix"), a duplicate publish is suppressed, and the final Stats are
// printed.
//
//	go run ./examples/orders
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// printer prints every attempt and dead letter as it happens.
type printer struct {
	broker.NopObserver
	mu    sync.Mutex
	start time.Time
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Printf("%6.1fms  "+format+"\n", append([]any{float64(time.Since(p.start).Microseconds()) / 1000}, args...)...)
}

func (p *printer) Attempted(e broker.AttemptEvent) {
	if e.Outcome == broker.OutcomeDeduplicated {
		p.printf("%-12s %-5s duplicate skipped (already delivered)", e.Subscriber, e.MessageID)
		return
	}
	code := e.ErrorCode
	if code == "" {
		code = "-"
	}
	p.printf("%-12s %-5s attempt=%d outcome=%s error_code=%s", e.Subscriber, e.MessageID, e.Attempt, e.Outcome, code)
}

func (p *printer) DeadLettered(e broker.DeadLetterEvent) {
	p.printf("%-12s %-5s -> dead letter %s (reason=%s)", e.DeadLetter.Subscriber, e.DeadLetter.Message.ID, e.DeadLetter.ID, e.DeadLetter.Reason)
}

// badEmail is a handler error with its own code; Permanent keeps it from
// being retried.
type badEmail struct{ addr string }

func (e badEmail) Error() string     { return "invalid email address " + e.addr }
func (e badEmail) ErrorCode() string { return "invalid_email" }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	obs := &printer{start: time.Now()}
	b, err := broker.New(
		broker.WithObserver(obs),
		broker.WithLogger(slog.New(slog.DiscardHandler)), // the observer prints instead
		broker.WithRetryPolicy(broker.RetryPolicy{
			MaxRetries: 2,
			Backoff:    broker.ExponentialBackoff(20*time.Millisecond, 200*time.Millisecond),
		}),
	)
	if err != nil {
		return err
	}

	// billing always succeeds.
	if _, err := b.Subscribe("order.created", "billing", func(ctx context.Context, m broker.Message) error {
		return nil
	}); err != nil {
		return err
	}
	// inventory fails the first attempt of m-1 (a transient timeout).
	if _, err := b.Subscribe("order.created", "inventory", func(ctx context.Context, m broker.Message) error {
		if m.ID == "m-1" && m.Attempt == 1 {
			return errors.New("temporary timeout talking to the stock service")
		}
		return nil
	}); err != nil {
		return err
	}
	// notification rejects m-2's address until it is fixed.
	var fixed atomic.Bool
	if _, err := b.Subscribe("order.created", "notification", func(ctx context.Context, m broker.Message) error {
		if m.ID == "m-2" && !fixed.Load() {
			return broker.Permanent(badEmail{"bob@"})
		}
		return nil
	}); err != nil {
		return err
	}

	fmt.Println("publishing m-1, m-2, m-3")
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		if err := b.Publish(ctx, broker.Message{ID: id, Topic: "order.created", Payload: []byte("order " + id)}); err != nil {
			return err
		}
	}
	// Wait until m-1 is done at inventory (it needs a retry), then publish
	// its duplicate: every subscriber has delivered it and skips it.
	for b.Stats().Topics["order.created"].Subscribers["inventory"].Delivered < 3 ||
		b.Stats().Topics["order.created"].Subscribers["notification"].DeadLettered < 1 {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("\npublishing m-1 again (a duplicate)")
	if err := b.Publish(ctx, broker.Message{ID: "m-1", Topic: "order.created"}); err != nil {
		return err
	}
	for b.Stats().Topics["order.created"].Subscribers["notification"].Deduplicated < 1 {
		time.Sleep(time.Millisecond)
	}

	dls, err := b.DeadLetters().List(ctx, broker.DeadLetterFilter{})
	if err != nil {
		return err
	}
	fmt.Println("\ndead letters:")
	for _, dl := range dls {
		fmt.Printf("  id=%s topic=%s message_id=%s subscriber=%s attempt=%d error_code=%s retryable=%v reason=%s error=%q\n",
			dl.ID, dl.Message.Topic, dl.Message.ID, dl.Subscriber, dl.Attempts, dl.ErrorCode, dl.Retryable, dl.Reason, dl.Error)
	}

	fmt.Println("\nfixing the address and redriving (only notification sees m-2 again):")
	fixed.Store(true)
	ids := make([]string, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	n, err := b.Redrive(ctx, ids...)
	if err != nil {
		return err
	}
	fmt.Printf("redriven: %d\n", n)

	closeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := b.Close(closeCtx); err != nil {
		return err
	}

	fmt.Println("\nfinal stats:")
	ts := b.Stats().Topics["order.created"]
	fmt.Printf("  order.created: published=%d rejected=%d unrouted=%d queued=%d\n", ts.Published, ts.Rejected, ts.Unrouted, ts.Queued)
	names := make([]string, 0, len(ts.Subscribers))
	for name := range ts.Subscribers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := ts.Subscribers[name]
		fmt.Printf("  %-12s routed=%d delivered=%d deduplicated=%d dead_lettered=%d attempts=%d retries=%d backlog=%d\n",
			name, s.Routed, s.Delivered, s.Deduplicated, s.DeadLettered, s.Attempts, s.Retries, s.Backlog())
	}
	left, err := b.DeadLetters().Len(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("  dead letters left in the store: %d\n", left)
	return nil
}

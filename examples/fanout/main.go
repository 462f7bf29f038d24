// Command fanout fans an order event out to billing, inventory and
// notification with the broker's defaults, as a newcomer would first write
// it, mistakes included:
//
//   - one event is published before anyone subscribed: it is counted
//     Unrouted, and the log says so with the hint;
//
//   - inventory is flaky (every third order fails its first two attempts,
//     a blip of its stock service): the default retry policy (5 retries,
//     3.1 to 6.2 s of backoff in all) rides it out;
//
//   - notification writes to m.Headers without a nil check: every handler
//     gets its own map;
//
//   - an order ID is reused as the message ID for its next status: the
//     second event is skipped as a duplicate, and the log says why.
//
//     go run ./examples/fanout
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/inproc/broker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	// The default log level (Info), without timestamps so the output reads
	// the same on every run.
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	b, err := broker.New(broker.WithLogger(log)) // every other setting is the default
	if err != nil {
		return err
	}

	// Mistake 1: publish before subscribing.
	if err := b.Publish(ctx, broker.Message{ID: "order-1000/created", Topic: "order.created"}); err != nil {
		return err
	}
	for b.Stats().Topics["order.created"].Unrouted < 1 {
		time.Sleep(time.Millisecond)
	}

	flaky := func(m broker.Message) bool {
		var i int
		fmt.Sscanf(m.ID, "order-%d", &i)
		return i%3 == 0 && m.Attempt <= 2
	}
	handlers := map[string]broker.Handler{
		"billing": func(context.Context, broker.Message) error { return nil },
		"inventory": func(_ context.Context, m broker.Message) error {
			if flaky(m) {
				return errors.New("stock service timed out")
			}
			return nil
		},
		"notification": func(_ context.Context, m broker.Message) error {
			m.Headers["x-notified-by"] = "notification" // no nil check needed
			return nil
		},
	}
	for _, name := range []string{"billing", "inventory", "notification"} {
		if _, err := b.Subscribe("order.created", name, handlers[name], broker.Concurrency(4)); err != nil {
			return err
		}
	}

	start := time.Now()
	const orders = 200
	for i := range orders {
		id := fmt.Sprintf("order-%d", 1001+i)
		if err := b.Publish(ctx, broker.Message{ID: id, Topic: "order.created", Payload: []byte(id)}); err != nil {
			return err
		}
	}
	// Mistake 2: the order's ID reused as the message ID of its next event.
	if err := b.Publish(ctx, broker.Message{ID: "order-1001", Topic: "order.created", Payload: []byte("order-1001 paid")}); err != nil {
		return err
	}

	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Close(closeCtx); err != nil { // delivers what is queued, retries included
		return err
	}
	fmt.Printf("\n%d orders fanned out in under %d s\n", orders, int(time.Since(start).Seconds())+1)
	ts := b.Stats().Topics["order.created"]
	fmt.Printf("order.created: published=%d unrouted=%d\n", ts.Published, ts.Unrouted)
	for _, name := range []string{"billing", "inventory", "notification"} {
		s := ts.Subscribers[name]
		fmt.Printf("  %-12s delivered=%d deduplicated=%d dead_lettered=%d retries=%d\n",
			name, s.Delivered, s.Deduplicated, s.DeadLettered, s.Retries)
	}
	return nil
}

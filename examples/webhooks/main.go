// Command webhooks pushes each business event to three partners' webhooks;
// one partner ("analytics") hangs for a while (-down, 3 s by default; try
// -down 10s), then recovers. With the defaults plus a HandlerTimeout and a
// circuit breaker:
//
//   - the healthy partners never notice: their latency stays that of their
//     own handler;
//
//   - the breaker trips after Failures × HandlerTimeout ÷ Concurrency
//     (5 × 500 ms ÷ 8, about 0.3 s), so no attempt is burnt while the
//     partner is down; it probes after 1, 2, 4, then every 5 s, so the
//     recovery is noticed within 5 s;
//
//   - whatever still ran out of retries is a dead letter, which one
//     RedriveMatching call sends back once the partner is up.
//
//     go run ./examples/webhooks
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/inproc/broker"
)

func main() {
	down := flag.Duration("down", 3*time.Second, "how long the analytics partner hangs")
	flag.Parse()
	if err := run(*down); err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
}

// transitions prints the breaker's transitions.
type transitions struct {
	broker.NopObserver
	start time.Time
}

func (o transitions) BreakerChanged(e broker.BreakerEvent) {
	fmt.Printf("  %5.1fs  %s breaker %s → %s\n", e.At.Sub(o.start).Seconds(), e.Subscriber, e.From, e.To)
}

func run(down time.Duration) error {
	ctx := context.Background()
	start := time.Now()
	b, err := broker.New(broker.WithLogger(slog.New(slog.DiscardHandler)), broker.WithObserver(transitions{start: start}))
	if err != nil {
		return err
	}
	var mu sync.Mutex
	worst := map[string]time.Duration{}
	var firstAfter time.Duration // analytics' first delivery after its recovery
	recovered := start.Add(down)
	partner := func(name string) broker.Handler {
		return func(ctx context.Context, m broker.Message) error {
			if name == "analytics" && time.Now().Before(recovered) {
				<-ctx.Done() // hangs until HandlerTimeout
				return ctx.Err()
			}
			time.Sleep(2 * time.Millisecond) // the HTTP call
			mu.Lock()
			defer mu.Unlock()
			worst[name] = max(worst[name], time.Since(m.PublishedAt))
			if name == "analytics" && firstAfter == 0 {
				firstAfter = time.Since(recovered)
			}
			return nil
		}
	}
	names := []string{"crm", "analytics", "billing"}
	for _, name := range names {
		if _, err := b.Subscribe("invoice.paid", name, partner(name),
			broker.Concurrency(8), broker.HandlerTimeout(500*time.Millisecond),
			broker.CircuitBreaker(broker.BreakerPolicy{})); err != nil {
			return err
		}
	}

	fmt.Printf("100 events a second for 2 s; analytics hangs for the first %v\n", down)
	const events = 200
	for i := range events {
		if err := b.Publish(ctx, broker.Message{ID: fmt.Sprint("invoice-", i), Topic: "invoice.paid"}); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	ss := func(name string) broker.SubscriberStats { return b.Stats().Topics["invoice.paid"].Subscribers[name] }
	for ss("analytics").Backlog() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	fmt.Printf("\nafter %.1f s:\n", time.Since(start).Seconds())
	for _, name := range names {
		s := ss(name)
		fmt.Printf("  %-9s delivered=%d dead_lettered=%d attempts=%d worst latency %v\n",
			name, s.Delivered, s.DeadLettered, s.Attempts, worst[name].Round(time.Millisecond))
	}
	fmt.Printf("  analytics' first delivery came %.1f s after it recovered\n", firstAfter.Seconds())
	mu.Unlock()

	n, err := b.RedriveMatching(ctx, broker.DeadLetterFilter{Subscriber: "analytics"})
	if err != nil {
		return err
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Close(closeCtx); err != nil {
		return err
	}
	fmt.Printf("  RedriveMatching(analytics): %d redriven; analytics delivered %d of %d in all\n", n, ss("analytics").Delivered, events)
	return nil
}

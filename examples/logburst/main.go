// Command logburst absorbs a burst of 10,000 log lines into a slower
// cleaner, twice:
//
//  1. with the defaults (WhenLaneFull Block): the topic queue (1,024) and
//     the cleaner's lane (8,192) take most of the burst; the producer is
//     then slowed to the cleaner's pace (each Publish waits for room, up to
//     the publish timeout), and no line is refused or lost;
//
//  2. with a cleaner that sheds instead (a lane of 1,000 and
//     WhenLaneFull(DeadLetterNewest)): the producer never waits, what does
//     not fit becomes a dead letter with reason "overflow" (logged 10 a
//     second, then counted in a summary line), and once the burst is over
//     RedriveMatching sends every one of them back.
//
//     go run ./examples/logburst
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

const lines = 10_000

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "logburst:", err)
		os.Exit(1)
	}
}

// countingHandler counts the broker's log records by message.
type countingHandler struct{ deadLettered, summaries, suppressed atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *countingHandler) WithGroup(string) slog.Handler            { return h }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Message == "broker: dead-lettered":
		h.deadLettered.Add(1)
	case strings.HasPrefix(r.Message, "broker: more dead letters"):
		h.summaries.Add(1)
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "suppressed" {
				h.suppressed.Add(a.Value.Int64())
			}
			return true
		})
	}
	return nil
}

// clean is the slow cleaner: 1 ms a line, 8 at a time (about 7,000 lines
// a second, slower than the producer).
func clean(cleaned *atomic.Int64) broker.Handler {
	return func(context.Context, broker.Message) error {
		time.Sleep(time.Millisecond)
		cleaned.Add(1)
		return nil
	}
}

// burst publishes the lines as fast as it can and reports how the producer
// fared.
func burst(b *broker.Broker, topic string) {
	ctx := context.Background()
	start := time.Now()
	var longest time.Duration
	refused := 0
	blockedOn := ""
	for i := range lines {
		t := time.Now()
		err := b.Publish(ctx, broker.Message{ID: fmt.Sprint("line-", i), Topic: topic, Payload: []byte("GET /index.html 200")})
		longest = max(longest, time.Since(t))
		if errors.Is(err, broker.ErrQueueFull) {
			refused++
		}
		if i == lines-1 {
			blockedOn = b.Stats().Topics[topic].BlockedOn
		}
	}
	fmt.Printf("  producer: %d lines in %.2f s, longest Publish %v, refused %d", lines, time.Since(start).Seconds(), longest.Round(time.Millisecond), refused)
	if blockedOn != "" {
		fmt.Printf(", held by %q's full lane at the end", blockedOn)
	}
	fmt.Println()
}

func run() error {
	ctx := context.Background()
	logs := &countingHandler{}
	b, err := broker.New(broker.WithLogger(slog.New(logs)))
	if err != nil {
		return err
	}

	fmt.Println("1. the defaults: Block")
	var cleaned atomic.Int64
	if _, err := b.Subscribe("logs", "cleaner", clean(&cleaned), broker.Concurrency(8)); err != nil {
		return err
	}
	start := time.Now()
	burst(b, "logs")
	for cleaned.Load() < lines {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("  cleaner: %d lines cleaned %.1f s after the burst began, none dead-lettered\n", cleaned.Load(), time.Since(start).Seconds())

	fmt.Println("\n2. a cleaner that sheds: LaneSize(1000), WhenLaneFull(DeadLetterNewest)")
	var shedCleaned atomic.Int64
	if _, err := b.Subscribe("logs.shed", "cleaner", clean(&shedCleaned), broker.Concurrency(8),
		broker.LaneSize(1000), broker.WhenLaneFull(broker.DeadLetterNewest)); err != nil {
		return err
	}
	burst(b, "logs.shed")
	ss := func() broker.SubscriberStats { return b.Stats().Topics["logs.shed"].Subscribers["cleaner"] }
	for ss().Backlog() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("  cleaner: %d cleaned, %d dead-lettered (overflow)\n", shedCleaned.Load(), ss().DeadLettered)
	n, err := b.RedriveMatching(ctx, broker.DeadLetterFilter{Topic: "logs.shed", Reason: broker.ReasonOverflow})
	if err != nil {
		return err
	}
	for shedCleaned.Load() < lines {
		time.Sleep(10 * time.Millisecond)
	}
	left, _ := b.DeadLetters().Len(ctx)
	fmt.Printf("  RedriveMatching(reason overflow): %d redriven; %d cleaned in all, %d dead letters left\n", n, shedCleaned.Load(), left)
	if err := b.Close(ctx); err != nil {
		return err
	}
	fmt.Printf("  the log: %d dead-letter lines, and %d summary lines counting the other %d\n",
		logs.deadLettered.Load(), logs.summaries.Load(), logs.suppressed.Load())
	return nil
}

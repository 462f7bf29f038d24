package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// A broker whose dead letters and dedup records live in JetStream, on a
// server embedded in the process.
func Example() {
	dir, err := os.MkdirTemp("", "natsjs-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	conn, err := natsjs.Embedded(dir) // no port: in-process only
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	dlq, err := natsjs.NewDeadLetterStore(ctx, conn.JetStream())
	if err != nil {
		fmt.Println(err)
		return
	}
	dedup, err := natsjs.NewIdempotencyStore(ctx, conn.JetStream())
	if err != nil {
		fmt.Println(err)
		return
	}

	b, err := broker.New(broker.WithDeadLetterStore(dlq), broker.WithIdempotencyStore(dedup),
		broker.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = b.Subscribe("orders", "billing", func(ctx context.Context, m broker.Message) error {
		return broker.Permanent(errors.New("card declined"))
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Publish(ctx, broker.Message{ID: "order-1", Topic: "orders", Payload: []byte(`{"total":42}`)}); err != nil {
		fmt.Println(err)
		return
	}
	// Close delivers what is queued: the dead letter is in the stream when
	// it returns, and stays there across restarts of the server.
	if err := b.Close(ctx); err != nil {
		fmt.Println(err)
		return
	}

	dls, err := dlq.List(ctx, broker.DeadLetterFilter{Topic: "orders"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, dl := range dls {
		fmt.Printf("%s at %s: %s (%s, %d attempt)\n", dl.Message.ID, dl.Subscriber, dl.Error, dl.Reason, dl.Attempts)
	}
	// Output:
	// order-1 at billing: permanent: card declined (permanent, 1 attempt)
}

// A broker whose messages are kept by a NATS server embedded in the
// process, in files under a directory: the one-line change from
// broker.New.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "natsjs-open")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	quiet := broker.WithLogger(slog.New(slog.DiscardHandler))
	cfg := natsjs.Config{Logger: slog.New(slog.DiscardHandler)}
	ctx := context.Background()

	b, err := natsjs.Open(dir, cfg, quiet) // was: broker.New(quiet)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make(chan broker.Message)
	if _, err := b.Subscribe("orders", "billing", func(_ context.Context, m broker.Message) error {
		got <- m
		return nil
	}); err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Publish(ctx, broker.Message{ID: "order-1", Topic: "orders", Payload: []byte(`{"total":42}`)}); err != nil {
		fmt.Println(err)
		return
	}
	m := <-got
	fmt.Printf("%s: %s (attempt %d)\n", m.ID, m.Payload, m.Attempt)
	if err := b.Close(ctx); err != nil { // also shuts the embedded server down
		fmt.Println(err)
	}
	// Output:
	// order-1: {"total":42} (attempt 1)
}

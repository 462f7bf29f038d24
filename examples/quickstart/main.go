// Command quickstart is the program at the top of the README: an order
// event fanned out to two subscribers, one retried, one dead-lettered, a
// duplicate skipped, and Close accounting for everything.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/inproc/broker"
)

func main() {
	b, err := broker.New(broker.WithRetryPolicy(broker.RetryPolicy{
		MaxRetries: 3,                                             // retries after the first attempt
		Backoff:    broker.ConstantBackoff(10 * time.Millisecond), // the default backs off from 200 ms
	}))
	if err != nil {
		log.Fatal(err)
	}

	// billing meets a transient failure at order-2's first attempt: retried.
	_, err = b.Subscribe("order.created", "billing", func(ctx context.Context, m broker.Message) error {
		if m.ID == "order-2" && m.Attempt == 1 {
			return errors.New("payment service unavailable")
		}
		fmt.Printf("billing: charged %s on attempt %d\n", m.ID, m.Attempt)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// email cannot send without an address: Permanent means never retry.
	_, err = b.Subscribe("order.created", "email", func(ctx context.Context, m broker.Message) error {
		if len(m.Payload) == 0 {
			return broker.Permanent(errors.New("no email address"))
		}
		fmt.Printf("email: sent confirmation of %s to %s\n", m.ID, m.Payload)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	for _, m := range []broker.Message{
		{ID: "order-1", Topic: "order.created", Payload: []byte("ann@example.com")},
		{ID: "order-2", Topic: "order.created"},                                     // no address
		{ID: "order-1", Topic: "order.created", Payload: []byte("ann@example.com")}, // a duplicate
	} {
		// nil means queued, not handled; ErrQueueFull means back off.
		if err := b.Publish(ctx, m); err != nil {
			log.Fatal(err)
		}
	}

	// Close delivers everything queued, retries included, then stops.
	if err := b.Close(ctx); err != nil {
		log.Fatal(err)
	}
	dls, err := b.DeadLetters().List(ctx, broker.DeadLetterFilter{})
	if err != nil {
		log.Fatal(err)
	}
	for _, dl := range dls {
		fmt.Printf("dead letter: %s at %s, reason %s: %s\n", dl.Message.ID, dl.Subscriber, dl.Reason, dl.Error)
	}
	for _, name := range []string{"billing", "email"} {
		s := b.Stats().Topics["order.created"].Subscribers[name]
		fmt.Printf("%s: delivered %d, deduplicated %d, dead-lettered %d, retries %d\n",
			name, s.Delivered, s.Deduplicated, s.DeadLettered, s.Retries)
	}
}

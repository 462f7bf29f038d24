package natsjs_test

import (
	"context"
	"testing"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// The stores treat a nil ctx as context.Background(), as every method of
// the core package does (it panicked before).
func TestStoresTreatANilContextAsBackground(t *testing.T) {
	conn := embedded(t, "")
	var nilCtx context.Context
	dlq, err := natsjs.NewDeadLetterStore(t.Context(), conn.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	dl := broker.DeadLetter{ID: "dl-1", Message: broker.Message{ID: "m", Topic: "t"}, Subscriber: "s", Reason: broker.ReasonPermanent}
	if err := dlq.Put(nilCtx, dl); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if _, ok, err := dlq.Get(nilCtx, "dl-1"); !ok || err != nil {
		t.Fatalf("Get = %v, %v", ok, err)
	}
	if list, err := dlq.List(nilCtx, broker.DeadLetterFilter{}); len(list) != 1 || err != nil {
		t.Fatalf("List = %d, %v", len(list), err)
	}
	if list, err := dlq.ListNewest(nilCtx, broker.DeadLetterQuery{}); len(list) != 1 || err != nil {
		t.Fatalf("ListNewest(nil): %d, %v", len(list), err)
	}
	if n, err := dlq.Len(nilCtx); n != 1 || err != nil {
		t.Fatalf("Len = %d, %v", n, err)
	}
	if err := dlq.Delete(nilCtx, "dl-1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	dedup, err := natsjs.NewIdempotencyStore(t.Context(), conn.JetStream())
	if err != nil {
		t.Fatal(err)
	}
	k := broker.DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "m"}
	if err := dedup.Record(nilCtx, k); err != nil {
		t.Fatalf("Record: %v", err)
	}
	if seen, err := dedup.Seen(nilCtx, k); !seen || err != nil {
		t.Fatalf("Seen = %v, %v", seen, err)
	}
}

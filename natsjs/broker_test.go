package natsjs_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// quiet keeps the broker's logs (a warning per dead letter) out of the test output.
var quiet = broker.WithLogger(slog.New(slog.DiscardHandler))

// stores opens both stores on conn, with their default names.
func stores(t *testing.T, conn *natsjs.Conn) (*natsjs.DeadLetterStore, *natsjs.IdempotencyStore) {
	t.Helper()
	dlq, err := natsjs.NewDeadLetterStore(t.Context(), conn.JetStream())
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	dedup, err := natsjs.NewIdempotencyStore(t.Context(), conn.JetStream())
	if err != nil {
		t.Fatalf("NewIdempotencyStore: %v", err)
	}
	return dlq, dedup
}

func newBroker(t *testing.T, dlq broker.DeadLetterStore, dedup broker.IdempotencyStore) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.WithDeadLetterStore(dlq), broker.WithIdempotencyStore(dedup), quiet)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	t.Cleanup(func() { closeBroker(t, b) })
	return b
}

func closeBroker(t *testing.T, b *broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Errorf("broker Close: %v", err)
	}
}

func receive(t *testing.T, ch <-chan broker.Message, what string) broker.Message {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out after 10s waiting for %s", what)
		return broker.Message{}
	}
}

func subStats(b *broker.Broker, topic, sub string) broker.SubscriberStats {
	return b.Stats().Topics[topic].Subscribers[sub]
}

// TestBrokerDeadLetterSurvivesRestart: a failing handler's dead letter lands
// in the stream, is still there after the broker and the embedded server are
// closed and reopened on the same directory, and Redrive delivers it from
// there; the dedup record of a delivered message survives too.
func TestBrokerDeadLetterSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	bad := broker.Message{
		ID: "order-1", Topic: "orders", Key: "customer-7",
		Payload: []byte(`{"total": 42}`), Headers: map[string]string{"traceparent": "00-abc-def-01"},
	}
	good := broker.Message{ID: "order-2", Topic: "orders", Payload: []byte("ok")}

	// First life: the handler declines order-1 for good and delivers order-2.
	conn1, err := natsjs.Embedded(dir)
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	dlq1, dedup1 := stores(t, conn1)
	b1, err := broker.New(broker.WithDeadLetterStore(dlq1), broker.WithIdempotencyStore(dedup1), quiet)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	delivered1 := make(chan broker.Message, 10)
	if _, err := b1.Subscribe("orders", "billing", func(_ context.Context, m broker.Message) error {
		if m.ID == bad.ID {
			return broker.Permanent(errors.New("card declined"))
		}
		delivered1 <- m
		return nil
	}); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	for _, m := range []broker.Message{bad, good} {
		if err := b1.Publish(ctx, m); err != nil {
			t.Fatalf("Publish(%s): %v", m.ID, err)
		}
	}
	if m := receive(t, delivered1, "order-2"); m.ID != good.ID {
		t.Fatalf("delivered %q, want %q", m.ID, good.ID)
	}
	closeBroker(t, b1) // delivers what is queued: the dead letter is stored when Close returns
	if st := subStats(b1, "orders", "billing"); st.DeadLettered != 1 || st.DeadLetterErrors != 0 {
		t.Fatalf("stats after Close: %+v; want 1 dead letter, stored", st)
	}
	closeConn(t, conn1)

	// Second life, same directory.
	conn2 := embedded(t, dir)
	dlq2, dedup2 := stores(t, conn2)
	list, err := dlq2.List(ctx, broker.DeadLetterFilter{Topic: "orders", Subscriber: "billing"})
	if err != nil || len(list) != 1 {
		t.Fatalf("List after restart = %d dead letters, %v; want 1", len(list), err)
	}
	dl := list[0]
	if dl.Message.ID != bad.ID || dl.Message.Key != bad.Key || !bytes.Equal(dl.Message.Payload, bad.Payload) ||
		!maps.Equal(dl.Message.Headers, bad.Headers) || dl.Message.PublishedAt.IsZero() {
		t.Errorf("dead letter message = %+v, want %+v with PublishedAt", dl.Message, bad)
	}
	if dl.Subscriber != "billing" || dl.ErrorCode != "permanent" || dl.Reason != broker.ReasonPermanent ||
		dl.Attempts != 1 || dl.Retryable || dl.Error == "" || dl.FailedAt.IsZero() {
		t.Errorf("dead letter = %+v; want subscriber billing, code and reason permanent, 1 attempt, not retryable", dl)
	}
	if ok, err := dedup2.Seen(ctx, broker.DeliveryKey{Topic: "orders", Subscriber: "billing", MessageID: good.ID}); err != nil || !ok {
		t.Errorf("Seen(order-2) after restart = %v, %v; want true (delivered before the restart)", ok, err)
	}

	b2 := newBroker(t, dlq2, dedup2)
	delivered2 := make(chan broker.Message, 10)
	if _, err := b2.Subscribe("orders", "billing", func(_ context.Context, m broker.Message) error {
		delivered2 <- m
		return nil
	}); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	// A copy of order-2 is a duplicate: the record survived the restart.
	if err := b2.Publish(ctx, good); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	waitFor(t, "order-2 deduplicated", func() bool { return subStats(b2, "orders", "billing").Deduplicated == 1 })

	n, err := b2.Redrive(ctx, dl.ID)
	if n != 1 || err != nil {
		t.Fatalf("Redrive(%q) = %d, %v; want 1, nil", dl.ID, n, err)
	}
	m := receive(t, delivered2, "the redriven order-1")
	if m.ID != bad.ID || !bytes.Equal(m.Payload, bad.Payload) || !maps.Equal(m.Headers, bad.Headers) || m.Attempt != 1 {
		t.Errorf("redriven message = %+v, want order-1 at attempt 1 with its payload and headers", m)
	}
	if n, err := dlq2.Len(ctx); n != 0 || err != nil {
		t.Errorf("dead letters after Redrive = %d, %v; want 0 (a redriven dead letter leaves the store)", n, err)
	}
	waitFor(t, "order-1 recorded as delivered", func() bool {
		ok, err := dedup2.Seen(ctx, broker.DeliveryKey{Topic: "orders", Subscriber: "billing", MessageID: bad.ID})
		return err == nil && ok
	})
	select {
	case m := <-delivered2:
		t.Errorf("unexpected delivery of %q (order-2 should have been deduplicated)", m.ID)
	default:
	}
}

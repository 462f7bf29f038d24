package brokerotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestForSubscriberRecordsAsTheTelemetry: the Observer ForSubscriber
// returns records exactly the measurements the Telemetry's own hooks do for
// the same events (names, attributes, values, histogram buckets and sums),
// for every outcome and for dead letters.
func TestForSubscriberRecordsAsTheTelemetry(t *testing.T) {
	published := time.Now().Add(-time.Hour)
	attempt := func(outcome broker.Outcome, code string) broker.AttemptEvent {
		return broker.AttemptEvent{Topic: "orders", Subscriber: "billing", MessageID: "m1", Attempt: 1,
			Start: published.Add(2 * time.Second), Duration: 250 * time.Millisecond, ErrorCode: code,
			Outcome: outcome, PublishedAt: published}
	}
	deadLetter := func(reason, code string) broker.DeadLetterEvent {
		return broker.DeadLetterEvent{DeadLetter: broker.DeadLetter{
			Message:    broker.Message{ID: "m1", Topic: "orders", PublishedAt: published},
			Subscriber: "billing", Reason: reason, ErrorCode: code, FailedAt: published.Add(90 * time.Second),
		}}
	}
	attempts := []broker.AttemptEvent{
		attempt(broker.OutcomeDelivered, ""),
		attempt(broker.OutcomeDelivered, ""),
		attempt(broker.OutcomeRetry, broker.CodeError),
		attempt(broker.OutcomeRetry, "card_declined"),
		attempt(broker.OutcomeRetry, ""),
		attempt(broker.OutcomeDeadLettered, broker.CodePermanent), // counted by DeadLettered
		{Topic: "orders", Subscriber: "billing", MessageID: "m1", Outcome: broker.OutcomeDeduplicated, PublishedAt: published},
		{Topic: "orders", Subscriber: "billing", MessageID: "m2", Attempt: 1, Outcome: broker.OutcomeDelivered}, // not published through the broker
	}
	deadLetters := []broker.DeadLetterEvent{
		deadLetter("exhausted", broker.CodeError),
		deadLetter("permanent", broker.CodePermanent),
		deadLetter("exhausted", "card_declined"),
		deadLetter("unsubscribed", ""),
	}

	feed := func(o broker.Observer) {
		for _, ev := range attempts {
			o.Attempted(ev)
		}
		for _, ev := range deadLetters {
			o.DeadLettered(ev)
		}
	}
	root := newEnv(t, brokerotel.Options{})
	feed(root.tel)
	scoped := newEnv(t, brokerotel.Options{})
	hooks := scoped.tel.ForSubscriber("orders", "billing")
	require.NotNil(t, hooks)
	feed(hooks)

	want := reduce(t, root.collect(t))
	for _, name := range []string{"inproc.broker.delivery.retries", "inproc.broker.delivered.messages",
		"inproc.broker.deduplicated.messages", "inproc.broker.dead_lettered.messages", "inproc.broker.end_to_end.duration"} {
		require.NotEmpty(t, want[name], "the root records %s", name) // the comparison below is not vacuous
	}
	assert.Equal(t, want, reduce(t, scoped.collect(t)))
}

// reduced is one data point without its times: a sum's value, or a
// histogram's count, sum and bucket counts.
type reduced struct {
	value   int64
	count   uint64
	sum     float64
	buckets string
}

// reduce returns every data point of ms by metric name and encoded
// attribute set.
func reduce(t *testing.T, ms map[string]metricdata.Metrics) map[string]map[string]reduced {
	t.Helper()
	out := make(map[string]map[string]reduced)
	enc := attribute.DefaultEncoder()
	for name, m := range ms {
		ps := make(map[string]reduced)
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				ps[p.Attributes.Encoded(enc)] = reduced{value: p.Value}
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				ps[p.Attributes.Encoded(enc)] = reduced{count: p.Count, sum: p.Sum, buckets: fmt.Sprint(p.BucketCounts)}
			}
		default:
			t.Fatalf("metric %s: unexpected data %T", name, m.Data)
		}
		if len(ps) > 0 {
			out[name] = ps
		}
	}
	return out
}

// TestForSubscriberUnderABroker: under a broker, with every outcome, the
// counters still equal Stats and carry the subscriber's attributes (the
// broker sends the subscriber's events to the Observer ForSubscriber
// returned).
func TestForSubscriberUnderABroker(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: func(int) time.Duration { return time.Millisecond }}))
	errBad := errors.New("bad")
	_, err := b.Subscribe("orders", "billing", func(_ context.Context, m broker.Message) error {
		if m.ID == "bad" {
			return errBad
		}
		return nil
	})
	require.NoError(t, err)
	for _, id := range []string{"ok", "ok", "bad"} { // the second "ok" is a duplicate
		require.NoError(t, b.Publish(context.Background(), broker.Message{ID: id, Topic: "orders"}))
	}
	closeBroker(t, b)

	st := b.Stats().Topics["orders"].Subscribers["billing"]
	require.Equal(t, uint64(1), st.Delivered)
	require.Equal(t, uint64(1), st.Deduplicated)
	require.Equal(t, uint64(1), st.DeadLettered)
	ms := e.collect(t)
	sub := []attribute.KeyValue{
		attribute.String("messaging.system", "inproc.broker"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", "orders"),
		attribute.String("messaging.destination.subscription.name", "billing"),
	}
	with := func(kv ...attribute.KeyValue) []attribute.KeyValue {
		return append(append([]attribute.KeyValue{}, sub...), kv...)
	}
	assert.Equal(t, float64(st.Delivered), value(t, ms, "inproc.broker.delivered.messages", sub...))
	assert.Equal(t, float64(st.Deduplicated), value(t, ms, "inproc.broker.deduplicated.messages", sub...))
	assert.Equal(t, float64(st.Retries), value(t, ms, "inproc.broker.delivery.retries", with(attribute.String("error.type", "error"))...))
	assert.Equal(t, float64(st.DeadLettered), value(t, ms, "inproc.broker.dead_lettered.messages",
		with(attribute.String("inproc.broker.reason", "exhausted"), attribute.String("error.type", "error"))...))
	assert.Equal(t, float64(st.Delivered+st.DeadLettered), total(t, ms, "inproc.broker.end_to_end.duration"))
}

package brokerotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestDeadLetterMarkedInTrace: a dead letter leaves a "dead_letter
// <topic>" span in its message's trace, a child of the publish span, with
// the reason, the dead letter's ID (to find and redrive it), error.type
// and status Error.
func TestDeadLetterMarkedInTrace(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)}))
	_, err := b.Subscribe("orders", "billing", func(context.Context, broker.Message) error { return errors.New("boom") })
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	closeBroker(t, b)

	dls, err := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	publish := e.one(t, "publish orders")
	mark := e.one(t, "dead_letter orders")
	assert.Equal(t, publish.SpanContext().TraceID(), mark.SpanContext().TraceID(), "in the message's trace")
	assert.Equal(t, publish.SpanContext().SpanID(), mark.Parent().SpanID())
	a := attrs(mark.Attributes())
	assert.Equal(t, broker.ReasonExhausted, a["inproc.broker.reason"])
	assert.Equal(t, dls[0].ID, a["inproc.broker.dead_letter.id"])
	assert.Equal(t, "error", a["error.type"])
	assert.Equal(t, "billing", a["messaging.destination.subscription.name"])
	assert.Equal(t, codes.Error, mark.Status().Code)
	assert.Len(t, e.ended("process orders"), 2, "the two attempts stay process spans")
}

// TestPublishOperationDuration: with PublishDuration,
// messaging.client.operation.duration records each publish, a refused one
// with error.type queue_full; without it, nothing.
func TestPublishOperationDuration(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := newEnv(t, brokerotel.Options{PublishDuration: on})
		b := e.broker(t, broker.WithQueueSize(1), broker.WithPublishTimeout(20*time.Millisecond))
		release := make(chan struct{})
		_, err := b.Subscribe("orders", "stuck", func(context.Context, broker.Message) error {
			<-release
			return nil
		})
		require.NoError(t, err)
		var refused error
		for i := 0; refused == nil && i < 10; i++ {
			refused = b.Publish(context.Background(), broker.Message{ID: string(rune('a' + i)), Topic: "orders"})
		}
		require.ErrorIs(t, refused, broker.ErrQueueFull)
		close(release)
		closeBroker(t, b)

		m, ok := e.collect(t)["messaging.client.operation.duration"]
		if !on {
			assert.False(t, ok && len(m.Data.(metricdata.Histogram[float64]).DataPoints) > 0, "recorded without PublishDuration")
			continue
		}
		require.True(t, ok)
		var refusedPoint *metricdata.HistogramDataPoint[float64]
		var total uint64
		for i, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			total += dp.Count
			if v, ok := dp.Attributes.Value("error.type"); ok && v.AsString() == "queue_full" {
				refusedPoint = &m.Data.(metricdata.Histogram[float64]).DataPoints[i]
			}
		}
		require.NotNil(t, refusedPoint, "a refused publish carries error.type")
		assert.Equal(t, uint64(1), refusedPoint.Count)
		assert.GreaterOrEqual(t, refusedPoint.Sum, 0.02, "it waited out the 20 ms timeout")
		assert.Equal(t, uint64(b.Stats().Topics["orders"].Published+1), total)
	}
}

// TestRefusedPublishSpan: through Telemetry.Publish the publish span
// covers the whole Publish, and a publish refused with ErrQueueFull ends
// it with status Error, error.type queue_full and the error recorded; an
// accepted one stays Unset.
func TestRefusedPublishSpan(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t, broker.WithQueueSize(1), broker.WithPublishTimeout(5*time.Millisecond))
	release := make(chan struct{})
	_, err := b.Subscribe("orders", "stuck", func(context.Context, broker.Message) error {
		<-release
		return nil
	})
	require.NoError(t, err)
	var refused error
	id := ""
	for i := 0; refused == nil && i < 10; i++ {
		id = fmt.Sprintf("m%d", i)
		refused = e.tel.Publish(context.Background(), b, broker.Message{ID: id, Topic: "orders"})
	}
	require.ErrorIs(t, refused, broker.ErrQueueFull)
	close(release)
	closeBroker(t, b)

	spans := e.ended("publish orders")
	require.NotEmpty(t, spans)
	for _, s := range spans {
		a := attrs(s.Attributes())
		if a["messaging.message.id"] != id {
			assert.Equal(t, codes.Unset, s.Status().Code, "accepted %v", a["messaging.message.id"])
			assert.NotContains(t, a, "error.type")
			continue
		}
		assert.Equal(t, codes.Error, s.Status().Code)
		assert.Equal(t, "queue_full", a["error.type"])
		require.Len(t, s.Events(), 1)
		assert.Equal(t, "exception", s.Events()[0].Name)
		assert.GreaterOrEqual(t, s.EndTime().Sub(s.StartTime()), 5*time.Millisecond, "the span covers the wait for room")
	}
	require.Error(t, e.tel.Publish(context.Background(), nil, broker.Message{}))
}

// TestDuplicateMarkedInTrace: a message skipped as a duplicate leaves a
// "deduplicate <topic>" span in its trace, a child of its publish span.
func TestDuplicateMarkedInTrace(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t)
	h, got := capture()
	_, err := b.Subscribe("orders", "billing", h)
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	receive(t, got)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	closeBroker(t, b)
	require.EqualValues(t, 1, b.Stats().Topics["orders"].Subscribers["billing"].Deduplicated)

	publishes := e.ended("publish orders")
	require.Len(t, publishes, 2)
	mark := e.one(t, "deduplicate orders")
	assert.Equal(t, publishes[1].SpanContext().TraceID(), mark.SpanContext().TraceID(), "in the duplicate's trace")
	assert.Equal(t, publishes[1].SpanContext().SpanID(), mark.Parent().SpanID())
	a := attrs(mark.Attributes())
	assert.Equal(t, "deduplicated", a["inproc.broker.state"])
	assert.Equal(t, "m1", a["messaging.message.id"])
	assert.Equal(t, "billing", a["messaging.destination.subscription.name"])
	assert.Len(t, e.ended("process orders"), 1, "the handler ran once")
}

// TestRedrivenDeliveryMarked: the process span of a redriven dead letter's
// attempt carries inproc.broker.redriven=true; a first delivery's does not.
func TestRedrivenDeliveryMarked(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t)
	var calls atomic.Int32
	done := make(chan struct{}, 2)
	_, err := b.Subscribe("orders", "billing", func(context.Context, broker.Message) error {
		defer func() { done <- struct{}{} }()
		if calls.Add(1) == 1 {
			return broker.Permanent(errors.New("bad data"))
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	receive(t, done)
	var dls []broker.DeadLetter
	require.Eventually(t, func() bool {
		dls, err = b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
		return err == nil && len(dls) == 1
	}, wait, time.Millisecond)
	n, err := b.Redrive(context.Background(), dls[0].ID)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	receive(t, done)
	closeBroker(t, b)

	spans := e.ended("process orders")
	require.Len(t, spans, 2)
	assert.NotContains(t, attrs(spans[0].Attributes()), "inproc.broker.redriven")
	assert.Equal(t, true, attrs(spans[1].Attributes())["inproc.broker.redriven"])
	assert.Equal(t, codes.Unset, spans[1].Status().Code)
}

// TestDeadLetterMarksLastAttempt: the process span of the attempt that
// made a dead letter carries a "dead_letter" event with the reason and the
// dead letter's ID; earlier attempts' spans do not; and every span started
// is ended, also where the Telemetry's Observer is not wired (then no
// marker) and when a stop cuts the attempt short.
func TestDeadLetterMarksLastAttempt(t *testing.T) {
	boom := func(context.Context, broker.Message) error { return errors.New("boom") }
	for _, tt := range []struct {
		name     string
		observer bool
		retries  int
		handler  broker.Handler
		reason   string // "" for no marker
		attempts int
	}{
		{"exhausted", true, 2, boom, broker.ReasonExhausted, 3},
		{"permanent", true, 2, func(context.Context, broker.Message) error { return broker.Permanent(errors.New("bad")) }, broker.ReasonPermanent, 1},
		{"panic", true, 0, func(context.Context, broker.Message) error { panic("oops") }, broker.ReasonExhausted, 1},
		{"middleware without observer", false, 1, boom, "", 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, brokerotel.Options{})
			opts := []broker.Option{broker.WithLogger(slog.New(slog.DiscardHandler)),
				broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: tt.retries, Backoff: broker.ConstantBackoff(0)})}
			if tt.observer {
				opts = append(opts, e.tel.Options()...)
			} else {
				opts = append(opts, broker.WithMiddleware(e.tel.Middleware))
			}
			if tt.retries == 0 {
				opts = append(opts, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
			}
			b := newBroker(t, opts...)
			_, err := b.Subscribe("orders", "billing", tt.handler)
			require.NoError(t, err)
			require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
			closeBroker(t, b)

			dls, err := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			assert.Len(t, e.spans.Started(), len(e.spans.Ended()), "every span ended")
			spans := e.ended("process orders")
			require.Len(t, spans, tt.attempts)
			marks := func(i int) (out []map[string]any) {
				for _, ev := range spans[i].Events() {
					if ev.Name == "dead_letter" {
						out = append(out, attrs(ev.Attributes))
					}
				}
				return out
			}
			for i := range tt.attempts - 1 {
				assert.Empty(t, marks(i), "attempt %d", i+1)
			}
			last := marks(tt.attempts - 1)
			if tt.reason == "" {
				assert.Empty(t, last)
				return
			}
			require.Len(t, last, 1)
			assert.Equal(t, map[string]any{"inproc.broker.reason": tt.reason, "inproc.broker.dead_letter.id": dls[0].ID}, last[0])
			assert.Equal(t, codes.Error, spans[tt.attempts-1].Status().Code)
			assert.False(t, spans[tt.attempts-1].EndTime().After(dls[0].FailedAt), "the span lasts the attempt, not the store's Put")
		})
	}
}

// TestStopEndsParkedSpans: a handler that fails after a stop cancelled
// its context, and one the stop abandons, leave no span open.
func TestStopEndsParkedSpans(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b, err := broker.New(append(e.tel.Options(), broker.WithLogger(slog.New(slog.DiscardHandler)))...)
	require.NoError(t, err)
	started := make(chan struct{}, 1)
	_, err = b.Subscribe("orders", "billing", func(ctx context.Context, _ broker.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	receive(t, started)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Error(t, b.Close(ctx), "cut short")
	dls, err := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, broker.ReasonShutdown, dls[0].Reason)
	assert.Len(t, e.spans.Started(), len(e.spans.Ended()), "every span ended")
	e.one(t, "dead_letter orders")
}

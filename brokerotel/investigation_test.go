package brokerotel_test

import (
	"context"
	"errors"
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

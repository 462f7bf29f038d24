package brokerotel

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestForSubscriberHoldsTheSets: a subscriber's hooks hold the sets t's
// cache has for it (the ones its Middleware uses); beyond the cache's
// bound they hold sets built for it once.
func TestForSubscriberHoldsTheSets(t *testing.T) {
	tel, err := New(Options{TracerProvider: noop.NewTracerProvider(), MeterProvider: sdkmetric.NewMeterProvider()})
	require.NoError(t, err)
	h, ok := tel.ForSubscriber("orders", "billing").(*subscriberHooks)
	require.True(t, ok)
	assert.Same(t, tel.sets.subs[subKey{"orders", "billing"}], h.ss)

	for i := len(tel.sets.subs); i < maxCachedSets; i++ {
		tel.sets.subscriber("orders", fmt.Sprint("sub", i))
	}
	h, ok = tel.ForSubscriber("orders", "late").(*subscriberHooks)
	require.True(t, ok)
	assert.NotContains(t, tel.sets.subs, subKey{"orders", "late"}, "beyond the bound")
	require.NotNil(t, h.ss)
	assert.Equal(t, "orders", h.ss.topic)
	assert.Equal(t, "late", h.ss.name)
}

// TestBrokerUsesForSubscriber: a broker given t.Options() sends a
// subscriber's events to the hooks ForSubscriber made when it subscribed.
// The test swaps the subscriber's cached sets for another subscriber's
// after Subscribe: the hooks, holding the sets they were made with, still
// record its deliveries under its own name, where t's own hooks (looking
// the sets up on each event) would record them under the other's.
func TestBrokerUsesForSubscriber(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	tel, err := New(Options{TracerProvider: noop.NewTracerProvider(), MeterProvider: mp})
	require.NoError(t, err)
	b, err := broker.New(append(tel.Options(), broker.WithLogger(slog.New(slog.DiscardHandler)))...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closed := false
	t.Cleanup(func() {
		if !closed {
			assert.NoError(t, b.Close(ctx))
		}
	})
	_, err = b.Subscribe("orders", "billing", func(context.Context, broker.Message) error { return nil })
	require.NoError(t, err)

	tel.sets.mu.Lock()
	tel.sets.subs[subKey{"orders", "billing"}] = newSubSets("orders", "impostor")
	tel.sets.mu.Unlock()
	require.NoError(t, b.Publish(ctx, broker.Message{ID: "m1", Topic: "orders"}))
	require.NoError(t, b.Close(ctx)) // every observer call has returned
	closed = true

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	subscribers := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != MetricDelivered {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok)
			for _, p := range sum.DataPoints {
				name, _ := p.Attributes.Value(semconv.MessagingDestinationSubscriptionNameKey)
				subscribers[name.AsString()] += p.Value
			}
		}
	}
	assert.Equal(t, map[string]int64{"billing": 1}, subscribers)
}

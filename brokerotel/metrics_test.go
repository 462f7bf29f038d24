package brokerotel_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Attributes of the metrics.
var (
	system      = attribute.String("messaging.system", "inproc.broker")
	opPublish   = attribute.String("messaging.operation.name", "publish")
	typeSend    = attribute.String("messaging.operation.type", "send")
	opProcess   = attribute.String("messaging.operation.name", "process")
	typeProcess = attribute.String("messaging.operation.type", "process")
)

func dest(topic string) attribute.KeyValue {
	return attribute.String("messaging.destination.name", topic)
}

func subscription(name string) attribute.KeyValue {
	return attribute.String("messaging.destination.subscription.name", name)
}

func errorType(code string) attribute.KeyValue { return attribute.String("error.type", code) }

func TestMetrics(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)}))
	_, err := b.Subscribe("orders", "billing", func(_ context.Context, msg broker.Message) error {
		switch {
		case msg.ID == "flaky" && msg.Attempt == 1:
			return codedErr("card_declined")
		case msg.ID == "bad":
			return broker.Permanent(errors.New("bad input"))
		}
		return nil
	})
	require.NoError(t, err)
	ids := []string{"ok", "flaky", "bad", "ok"} // the second "ok" is a duplicate
	for _, id := range ids {
		require.NoError(t, b.Publish(context.Background(), broker.Message{ID: id, Topic: "orders"}))
	}
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "lost", Topic: "nobody"}))
	closeBroker(t, b)
	ms := e.collect(t)

	base := []attribute.KeyValue{system, opProcess, typeProcess, dest("orders"), subscription("billing")}
	with := func(kv ...attribute.KeyValue) []attribute.KeyValue {
		return append(append([]attribute.KeyValue{}, base...), kv...)
	}
	tests := []struct {
		metric, unit string
		attrs        []attribute.KeyValue
		want         float64
	}{
		{"messaging.client.sent.messages", "{message}", []attribute.KeyValue{system, opPublish, typeSend, dest("orders")}, 4},
		{"messaging.client.sent.messages", "{message}", []attribute.KeyValue{system, opPublish, typeSend, dest("nobody")}, 1},
		{"messaging.client.consumed.messages", "{message}", base, 4}, // ok, flaky twice, bad
		{"messaging.process.duration", "s", base, 2},                 // ok, flaky's second
		{"messaging.process.duration", "s", with(errorType("card_declined")), 1},
		{"messaging.process.duration", "s", with(errorType("permanent")), 1},
		{brokerotel.MetricRetries, "{retry}", with(errorType("card_declined")), 1},
		{brokerotel.MetricDelivered, "{message}", base, 2},
		{brokerotel.MetricDeadLettered, "{message}", with(brokerotel.ReasonKey.String("permanent"), errorType("permanent")), 1},
		{brokerotel.MetricDeduplicated, "{message}", base, 1},
		{brokerotel.MetricUnrouted, "{message}", []attribute.KeyValue{system, dest("nobody")}, 1},
		{brokerotel.MetricEndToEnd, "s", with(brokerotel.StateKey.String("delivered")), 2},
		{brokerotel.MetricEndToEnd, "s", with(brokerotel.StateKey.String("dead_lettered")), 1},
	}
	for _, tt := range tests {
		set := attribute.NewSet(tt.attrs...)
		t.Run(tt.metric+"{"+set.Encoded(attribute.DefaultEncoder())+"}", func(t *testing.T) {
			assert.Equal(t, tt.want, value(t, ms, tt.metric, tt.attrs...))
			assert.Equal(t, tt.unit, ms[tt.metric].Unit)
			assert.NotEmpty(t, ms[tt.metric].Description)
		})
	}

	t.Run("histogram buckets", func(t *testing.T) {
		h, ok := ms["messaging.process.duration"].Data.(metricdata.Histogram[float64])
		require.True(t, ok)
		require.NotEmpty(t, h.DataPoints)
		assert.Equal(t, []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
			0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10},
			h.DataPoints[0].Bounds, "the conventions' buckets, finer below 5 ms")
	})

	t.Run("counters match Stats", func(t *testing.T) {
		st := b.Stats()
		topic, sub := st.Topics["orders"], st.Topics["orders"].Subscribers["billing"]
		for _, c := range []struct {
			metric string
			want   uint64
		}{
			{"messaging.client.sent.messages", topic.Published + st.Topics["nobody"].Published},
			{"messaging.client.consumed.messages", sub.Attempts},
			{"messaging.process.duration", sub.Attempts},
			{brokerotel.MetricRetries, sub.Retries},
			{brokerotel.MetricDelivered, sub.Delivered},
			{brokerotel.MetricDeadLettered, sub.DeadLettered},
			{brokerotel.MetricDeduplicated, sub.Deduplicated},
			{brokerotel.MetricUnrouted, st.Topics["nobody"].Unrouted},
		} {
			assert.EqualValues(t, c.want, total(t, ms, c.metric), c.metric)
		}
	})

	t.Run("no message ID in any attribute", func(t *testing.T) {
		for name, m := range ms {
			for _, p := range points(t, m) {
				assert.NotContains(t, p.attrs, "messaging.message.id", name)
				for k, v := range p.attrs {
					for _, id := range append(ids, "lost") {
						assert.NotEqual(t, id, v, "%s: attribute %s", name, k)
					}
				}
			}
		}
	})
}

// blocked returns a broker whose topic "orders" is full: its one subscriber
// "billing" is stuck in its handler until release is called (at cleanup at
// the latest), its lane of one is full and the topic queue of one too. At
// least one publish was refused ("canceled"); accepted says how many were
// not.
func blocked(t *testing.T, e *env) (b *broker.Broker, release func(), accepted int) {
	t.Helper()
	b = e.broker(t, broker.WithQueueSize(1))
	ch := make(chan struct{})
	release = sync.OnceFunc(func() { close(ch) })
	t.Cleanup(release) // runs before the broker's Close (cleanups are LIFO)
	_, err := b.Subscribe("orders", "billing", func(context.Context, broker.Message) error {
		<-ch
		return nil
	})
	require.NoError(t, err)

	// Publish with a context that has ended: accepted while there is room,
	// refused at once when the queue is full. Go on until the broker is
	// stuck, then once more, which must be refused.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	publish := func() error {
		err := b.Publish(canceled, broker.Message{ID: fmt.Sprintf("m%d", accepted), Topic: "orders"})
		if err == nil {
			accepted++
		}
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		st := b.Stats().Topics["orders"]
		// Stuck: one in the handler, one in the lane, one held by the
		// dispatcher waiting for room in the lane (BlockedOn), one queued.
		if sub := st.Subscribers["billing"]; st.Queued == 1 && st.BlockedOn == "billing" && sub.Queued == 1 && sub.InFlight == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the broker never got stuck: %+v", st)
		if err := publish(); err != nil {
			require.ErrorIs(t, err, context.Canceled)
			time.Sleep(time.Millisecond) // polling real goroutines
		}
	}
	require.ErrorIs(t, publish(), context.Canceled)
	return b, release, accepted
}

func TestRejectedPublish(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b, release, accepted := blocked(t, e)
	release()
	closeBroker(t, b)
	ms := e.collect(t)

	st := b.Stats().Topics["orders"]
	require.NotZero(t, st.Rejected)
	assert.EqualValues(t, st.Rejected, value(t, ms, "messaging.client.sent.messages", system, opPublish, typeSend, dest("orders"), errorType("canceled")))
	assert.EqualValues(t, st.Published, value(t, ms, "messaging.client.sent.messages", system, opPublish, typeSend, dest("orders")))
	assert.EqualValues(t, accepted, st.Published)
}

func TestObserveStats(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b, release, _ := blocked(t, e)
	reg, err := e.tel.ObserveStats(b)
	require.NoError(t, err)

	ms := e.collect(t)
	topic := []attribute.KeyValue{system, dest("orders")}
	sub := []attribute.KeyValue{system, dest("orders"), subscription("billing")}
	for _, c := range []struct {
		metric, unit string
		attrs        []attribute.KeyValue
		want         float64
	}{
		{brokerotel.MetricTopicQueueSize, "{message}", topic, 1},
		{brokerotel.MetricTopicQueueCapacity, "{message}", topic, 1},
		{brokerotel.MetricSubscriberQueueSize, "{message}", sub, 1},
		{brokerotel.MetricSubscriberQueueCapacity, "{message}", sub, 1},
		{brokerotel.MetricSubscriberInflight, "{message}", sub, 1},
		{brokerotel.MetricDeadLetterStoreSize, "{message}", []attribute.KeyValue{system}, 0},
		{brokerotel.MetricDeadLetterEvictions, "{message}", []attribute.KeyValue{system}, 0},
	} {
		got, ok := lookup(t, ms, c.metric, c.attrs...)
		assert.True(t, ok, "%s: no data point with the attributes %v", c.metric, c.attrs) // a want of 0 must still be reported
		assert.Equal(t, c.want, got, c.metric)
		assert.Equal(t, c.unit, ms[c.metric].Unit, c.metric)
	}
	for _, name := range []string{brokerotel.MetricTopicQueueOldestAge, brokerotel.MetricSubscriberQueueOldest} {
		assert.Equal(t, "s", ms[name].Unit)
		assert.Positive(t, total(t, ms, name), "%s: something waits", name)
	}

	release()
	closeBroker(t, b)
	ms = e.collect(t) // Stats work after Close: the queues are empty now
	size, ok := lookup(t, ms, brokerotel.MetricTopicQueueSize, topic...)
	assert.True(t, ok, "the topic is still reported after Close")
	assert.Zero(t, size)
	assert.NotContains(t, ms, brokerotel.MetricSubscriberQueueSize, "no active subscriber left to report")

	require.NoError(t, reg.Unregister())
	ms = e.collect(t)
	assert.NotContains(t, ms, brokerotel.MetricTopicQueueSize, "nothing reported after Unregister")
}

// lenStore is a dead-letter store whose Len fails: with an error, a
// panic, runtime.Goexit or a negative count, as fails says.
type lenStore struct {
	*broker.MemoryDeadLetterStore
	fails string
}

func (s lenStore) Len(context.Context) (int, error) {
	switch s.fails {
	case "panic":
		panic("Len bug")
	case "goexit":
		runtime.Goexit()
	case "negative":
		return -3, nil
	}
	return 0, errors.New("store unavailable")
}

// A dead-letter store whose Len fails, panics, calls runtime.Goexit or
// answers a negative count loses only the store-size measurement: the
// collection succeeds (the next one too) with the other Stats metrics.
func TestObserveStatsStoreLenFailure(t *testing.T) {
	for _, fails := range []string{"error", "panic", "goexit", "negative"} {
		t.Run(fails, func(t *testing.T) {
			e := newEnv(t, brokerotel.Options{})
			b := e.broker(t, broker.WithDeadLetterStore(lenStore{broker.NewMemoryDeadLetterStore(0, nil), fails}))
			require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m-1", Topic: "orders"}))
			reg, err := e.tel.ObserveStats(b)
			require.NoError(t, err)
			defer func() { require.NoError(t, reg.Unregister()) }()
			for range 2 {
				ms := e.collect(t)
				assert.NotContains(t, ms, brokerotel.MetricDeadLetterStoreSize, "store size reported though Len failed")
				_, ok := lookup(t, ms, brokerotel.MetricTopicQueueSize, system, dest("orders"))
				assert.True(t, ok, "the other Stats metrics are still reported")
			}
		})
	}
}

package brokerotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait is how long a test waits for something asynchronous (generous: the
// machine is shared and noisy).
const wait = 10 * time.Second

// env is a Telemetry over SDK providers that record everything.
type env struct {
	tel    *brokerotel.Telemetry
	tp     *sdktrace.TracerProvider
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

func newEnv(t *testing.T, o brokerotel.Options) *env {
	t.Helper()
	e := &env{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		require.NoError(t, e.tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
	o.TracerProvider, o.MeterProvider = e.tp, mp
	tel, err := brokerotel.New(o)
	require.NoError(t, err)
	e.tel = tel
	return e
}

// broker returns a broker with the Telemetry plugged in, closed at cleanup.
func (e *env) broker(t *testing.T, opts ...broker.Option) *broker.Broker {
	t.Helper()
	opts = append(append(e.tel.Options(), broker.WithLogger(slog.New(slog.DiscardHandler))), opts...)
	return newBroker(t, opts...)
}

func newBroker(t *testing.T, opts ...broker.Option) *broker.Broker {
	t.Helper()
	b, err := broker.New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { closeBroker(t, b) })
	return b
}

// closeBroker drains b: every handler, middleware and observer call has
// returned when it does.
func closeBroker(t *testing.T, b *broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	require.NoError(t, b.Close(ctx))
}

// receive waits for a value from ch.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("nothing received in %v", wait)
		panic("unreachable")
	}
}

// ended returns the ended spans named name, by start time.
func (e *env) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	return out
}

// one returns the only ended span named name.
func (e *env) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := e.ended(name)
	require.Len(t, s, 1, "spans named %q", name)
	return s[0]
}

// attrs returns kvs as a map of plain values.
func attrs(kvs []attribute.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// collect reads every metric.
func (e *env) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(context.Background(), &rm))
	out := make(map[string]metricdata.Metrics)
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, brokerotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// point is one data point, reduced: its attributes and its value (a sum, a
// gauge, or a histogram's count).
type point struct {
	attrs map[string]any
	set   attribute.Set
	value float64
}

// points returns m's data points.
func points(t *testing.T, m metricdata.Metrics) []point {
	t.Helper()
	var out []point
	add := func(set attribute.Set, v float64) {
		out = append(out, point{attrs: attrs(set.ToSlice()), set: set, value: v})
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Value))
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, float64(p.Count))
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	return out
}

// value returns the value of m's data point with exactly the attributes kv
// (0 if there is none).
func value(t *testing.T, ms map[string]metricdata.Metrics, name string, kv ...attribute.KeyValue) float64 {
	t.Helper()
	v, _ := lookup(t, ms, name, kv...)
	return v
}

// lookup is value, and whether the data point exists.
func lookup(t *testing.T, ms map[string]metricdata.Metrics, name string, kv ...attribute.KeyValue) (float64, bool) {
	t.Helper()
	m, ok := ms[name]
	require.True(t, ok, "metric %s not reported", name)
	want := attribute.NewSet(kv...)
	for _, p := range points(t, m) {
		if p.set.Equals(&want) {
			return p.value, true
		}
	}
	return 0, false
}

// total returns the sum of m's data points.
func total(t *testing.T, ms map[string]metricdata.Metrics, name string) float64 {
	t.Helper()
	m, ok := ms[name]
	require.True(t, ok, "metric %s not reported", name)
	var sum float64
	for _, p := range points(t, m) {
		sum += p.value
	}
	return sum
}

// codedErr is an error with its own code.
type codedErr string

func (e codedErr) Error() string     { return fmt.Sprintf("coded error %s", string(e)) }
func (e codedErr) ErrorCode() string { return string(e) }

package brokerprom_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

var discard = slog.New(slog.DiscardHandler)

// newWatched returns a collector and the broker it observes and watches;
// the broker is closed when the test (or bubble) ends.
func newWatched(t *testing.T, copts []brokerprom.Option, bopts ...broker.Option) (*brokerprom.Collector, *broker.Broker) {
	t.Helper()
	c, err := brokerprom.New(copts...)
	require.NoError(t, err)
	base := []broker.Option{broker.WithLogger(discard), broker.WithObserver(c)}
	b, err := broker.New(append(base, bopts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	require.NoError(t, c.Watch(b))
	return c, b
}

func publish(t *testing.T, b *broker.Broker, topic string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.NoError(t, b.Publish(context.Background(), broker.Message{ID: id, Topic: topic}))
	}
}

// gather registers c with a fresh pedantic registry (which checks that
// what Collect sends matches Describe) and gathers it.
func gather(t *testing.T, c prometheus.Collector) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	return mfs
}

// value returns the value of the series of family name whose labels
// include want: a counter's or gauge's value, a histogram's sample count.
// ok is false when there is no such series.
func value(mfs []*dto.MetricFamily, name string, want map[string]string) (v float64, ok bool) {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// sum adds the values of every series of family name whose labels include
// want.
func sum(mfs []*dto.MetricFamily, name string, want map[string]string) float64 {
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// series counts the series of family names that start with prefix and
// carry label topic=topic ("" for any).
func series(mfs []*dto.MetricFamily, prefix, topic string) int {
	n := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			if topic == "" || hasLabels(m, map[string]string{"topic": topic}) {
				n++
			}
		}
	}
	return n
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	found := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			found++
		}
	}
	return found == len(want)
}

// knownState builds, in a synctest bubble (fake time), a broker in a state
// every metric can be predicted from:
//
//   - topic "orders", subscribers "audit" (delivers everything, 10 ms per
//     call) and "billing" (a breaker and a retry budget; "bad" fails
//     permanently, "flaky" fails its first attempt, "hold-*" block until
//     release is closed), with lanes of 8;
//   - orders gets ok-1, bad, flaky, ok-1 again (a duplicate), then hold-1,
//     hold-2, hold-3: billing runs hold-1 and queues the other two;
//   - topic "nobody" gets one message with no subscriber (unrouted);
//   - topic "slow" (subscriber "stuck", lane of 1, blocks) gets s-1 (in
//     flight), s-2 (its lane), s-3 and s-4 (the topic queue of 2, its
//     dispatcher waiting for room in stuck's lane), and s-5 is rejected;
//   - then 2 s of fake time pass.
//
// It returns release: closing it lets the blocked handlers finish.
func knownState(t *testing.T, copts ...brokerprom.Option) (*brokerprom.Collector, *broker.Broker, chan struct{}) {
	t.Helper()
	c, b := newWatched(t, copts,
		broker.WithQueueSize(2),
		broker.WithPublishTimeout(0),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)}))
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	_, err := b.Subscribe("orders", "audit", func(context.Context, broker.Message) error {
		time.Sleep(10 * time.Millisecond)
		return nil
	}, broker.LaneSize(8))
	require.NoError(t, err)
	_, err = b.Subscribe("orders", "billing", func(_ context.Context, m broker.Message) error {
		switch {
		case m.ID == "bad":
			return broker.Permanent(errors.New("bad input"))
		case m.ID == "flaky" && m.Attempt == 1:
			return errors.New("flaky")
		case strings.HasPrefix(m.ID, "hold-"):
			<-release
		}
		return nil
	}, broker.LaneSize(8), broker.CircuitBreaker(broker.BreakerPolicy{}), broker.RetryBudget(broker.DefaultRetryBudget()))
	require.NoError(t, err)
	_, err = b.Subscribe("slow", "stuck", func(context.Context, broker.Message) error {
		<-release
		return nil
	}, broker.LaneSize(1))
	require.NoError(t, err)

	// One at a time, letting the broker do all it can in between: the
	// topic queues hold 2.
	for _, m := range []struct{ topic, id string }{
		{"orders", "ok-1"}, {"orders", "bad"}, {"orders", "flaky"}, {"orders", "ok-1"},
		{"orders", "hold-1"}, {"orders", "hold-2"}, {"orders", "hold-3"},
		{"nobody", "n-1"},
		{"slow", "s-1"}, {"slow", "s-2"}, {"slow", "s-3"}, {"slow", "s-4"},
	} {
		publish(t, b, m.topic, m.id)
		synctest.Wait()
	}
	err = b.Publish(context.Background(), broker.Message{ID: "s-5", Topic: "slow"})
	require.ErrorIs(t, err, broker.ErrQueueFull)
	time.Sleep(2 * time.Second)
	synctest.Wait()
	return c, b, release
}

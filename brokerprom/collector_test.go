package brokerprom_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/known_state.prom from what the collector exports")

// smallBuckets keep the golden file readable.
var smallBuckets = []brokerprom.Option{
	brokerprom.WithHandlerBuckets([]float64{0.005, 0.05}),
	brokerprom.WithEndToEndBuckets([]float64{0.025, 1}),
	brokerprom.WithPublishBuckets([]float64{0.001, 1}),
	brokerprom.WithPublishDuration(),
}

// TestCollectKnownState compares the whole exposition of a broker in a
// known state (see knownState, whose comment says where each number comes
// from) with testdata/known_state.prom.
func TestCollectKnownState(t *testing.T) {
	golden := filepath.Join("testdata", "known_state.prom")
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := knownState(t, smallBuckets...)
		if *update {
			var buf bytes.Buffer
			enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, mf := range gather(t, c) {
				require.NoError(t, enc.Encode(mf))
			}
			require.NoError(t, os.WriteFile(golden, buf.Bytes(), 0o644))
		}
		want, err := os.ReadFile(golden)
		require.NoError(t, err)
		require.NoError(t, testutil.CollectAndCompare(c, bytes.NewReader(want)))
	})
}

// TestKnownStateValues checks, independently of the golden file, the
// numbers knownState makes and the broker's conservation law on the
// exported metrics.
func TestKnownStateValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := knownState(t)
		mfs := gather(t, c)
		billing := map[string]string{"topic": "orders", "subscriber": "billing"}
		stuck := map[string]string{"topic": "slow", "subscriber": "stuck"}
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"broker_published_messages_total", map[string]string{"topic": "orders"}, 7},
			{"broker_rejected_messages_total", map[string]string{"topic": "slow"}, 1},
			{"broker_unrouted_messages_total", map[string]string{"topic": "nobody"}, 1},
			{"broker_topic_queue_size", map[string]string{"topic": "slow"}, 2},
			{"broker_topic_queue_capacity", map[string]string{"topic": "slow"}, 2},
			{"broker_topic_queue_oldest_message_age_seconds", map[string]string{"topic": "slow"}, 2},
			{"broker_routed_messages_total", billing, 7},
			{"broker_delivered_messages_total", billing, 2},
			{"broker_deduplicated_messages_total", billing, 1},
			{"broker_dead_lettered_messages_total", billing, 1},
			{"broker_delivery_attempts_total", billing, 4},
			{"broker_delivery_retries_total", billing, 1},
			{"broker_subscriber_queue_size", billing, 2},
			{"broker_subscriber_inflight", billing, 1},
			{"broker_subscriber_queue_capacity", billing, 8},
			{"broker_subscriber_queue_oldest_message_age_seconds", billing, 2},
			{"broker_subscriber_breaker_state", map[string]string{"topic": "orders", "subscriber": "billing", "state": "closed"}, 1},
			{"broker_subscriber_breaker_state", map[string]string{"topic": "orders", "subscriber": "billing", "state": "open"}, 0},
			{"broker_subscriber_blocking", stuck, 1},
			{"broker_subscriber_blocked_seconds_total", stuck, 2},
			{"broker_dead_letter_store_size", nil, 1},
			{"broker_handler_duration_seconds", map[string]string{"topic": "orders", "subscriber": "billing", "outcome": "retry"}, 1},
			{"broker_end_to_end_duration_seconds", map[string]string{"topic": "orders", "subscriber": "audit", "state": "delivered"}, 6},
		} {
			got, ok := value(mfs, tc.name, tc.labels)
			if assert.True(t, ok, "%s%v missing", tc.name, tc.labels) {
				assert.Equal(t, tc.want, got, "%s%v", tc.name, tc.labels)
			}
		}
		_, ok := value(mfs, "broker_subscriber_breaker_state", map[string]string{"subscriber": "audit"})
		assert.False(t, ok, "a subscriber without a breaker has no breaker_state series")
		_, ok = value(mfs, "broker_subscriber_retry_budget_left", map[string]string{"subscriber": "audit"})
		assert.False(t, ok, "a subscriber without a budget has no retry_budget_left series")
		assertConservation(t, mfs)
	})
}

// assertConservation checks, for every subscriber in mfs, that
// routed = delivered + deduplicated + dead_lettered + queued + in flight,
// and that the histograms saw what the counters counted.
func assertConservation(t *testing.T, mfs []*dto.MetricFamily) {
	t.Helper()
	subs := 0
	for _, mf := range mfs {
		if mf.GetName() != "broker_routed_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			subs++
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			v := func(name string, extra ...string) float64 {
				want := map[string]string{"topic": l["topic"], "subscriber": l["subscriber"]}
				for i := 0; i < len(extra); i += 2 {
					want[extra[i]] = extra[i+1]
				}
				return sum(mfs, name, want)
			}
			routed := m.GetCounter().GetValue()
			finished := v("broker_delivered_messages_total") + v("broker_deduplicated_messages_total") +
				v("broker_dead_lettered_messages_total") + v("broker_subscriber_queue_size") + v("broker_subscriber_inflight")
			assert.Equal(t, routed, finished, "routed vs delivered+deduplicated+dead_lettered+queued+inflight of %v", l)
			assert.Equal(t, v("broker_delivery_attempts_total"), v("broker_handler_duration_seconds"),
				"handler_duration_seconds count vs attempts of %v", l)
			assert.Equal(t, v("broker_delivered_messages_total"), v("broker_end_to_end_duration_seconds", "state", "delivered"),
				"end_to_end{state=delivered} count vs delivered of %v", l)
			assert.Equal(t, v("broker_dead_lettered_messages_total"), v("broker_end_to_end_duration_seconds", "state", "dead_lettered"),
				"end_to_end{state=dead_lettered} count vs dead_lettered of %v", l)
		}
	}
	assert.NotZero(t, subs, "no subscriber exported")
}

func TestLint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := knownState(t)
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		assert.Empty(t, problems)
		// Every metric the collector describes is in this state, so the
		// lint saw them all.
		assert.Len(t, gather(t, c), len(describedNames(c)))
	})
}

// TestHistogramBuckets checks that each observation lands in the bucket of
// its duration, using fake time: handler calls of 3 ms, 70 ms and 700 ms
// (the last one's message waited 73 ms in the lane first), and a message
// whose first attempt failed after 70 ms, delivered 1 s after publication.
// The classic histograms (the default) and the native ones (which keep
// the classic buckets too) agree.
func TestHistogramBuckets(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []brokerprom.Option
	}{
		{"classic", nil},
		{"native", []brokerprom.Option{brokerprom.WithNativeHistograms(1.1)}},
	} {
		t.Run(tc.name, func(t *testing.T) { testHistogramBuckets(t, tc.opts) })
	}
}

func testHistogramBuckets(t *testing.T, opts []brokerprom.Option) {
	synctest.Test(t, func(t *testing.T) {
		c, b := newWatched(t, opts, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(time.Second - 70*time.Millisecond)}))
		_, err := b.Subscribe("t", "s", func(_ context.Context, m broker.Message) error {
			switch m.ID {
			case "fast":
				time.Sleep(3 * time.Millisecond)
			case "mid":
				time.Sleep(70 * time.Millisecond)
			case "slow":
				time.Sleep(700 * time.Millisecond)
			case "retried":
				if m.Attempt == 1 {
					time.Sleep(70 * time.Millisecond)
					return errors.New("again")
				}
			}
			return nil
		})
		require.NoError(t, err)
		publish(t, b, "t", "fast", "mid", "slow")
		synctest.Wait()
		time.Sleep(time.Hour)
		publish(t, b, "t", "retried")
		time.Sleep(time.Hour)
		synctest.Wait()

		h := histogram(t, c, "broker_handler_duration_seconds", "outcome", "delivered")
		assert.Equal(t, uint64(4), h.GetSampleCount())
		assert.InDelta(t, 0.003+0.070+0.700+0, h.GetSampleSum(), 1e-9)
		assert.Equal(t, map[float64]uint64{0.005: 2, 0.075: 3, 0.75: 4, 10: 4}, cumulative(h, 0.005, 0.075, 0.75, 10))
		h = histogram(t, c, "broker_handler_duration_seconds", "outcome", "retry")
		assert.Equal(t, map[float64]uint64{0.05: 0, 0.075: 1}, cumulative(h, 0.05, 0.075))

		e := histogram(t, c, "broker_end_to_end_duration_seconds", "state", "delivered")
		// fast 3 ms, mid 73 ms, slow 773 ms, retried 70 ms + 930 ms = 1 s.
		assert.Equal(t, uint64(4), e.GetSampleCount())
		assert.InDelta(t, 0.003+0.073+0.773+1, e.GetSampleSum(), 1e-9)
		assert.Equal(t, map[float64]uint64{0.005: 1, 0.1: 2, 1: 4}, cumulative(e, 0.005, 0.1, 1))
	})
}

func histogram(t *testing.T, c prometheus.Collector, name string, label, v string) *dto.Histogram {
	t.Helper()
	for _, mf := range gather(t, c) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, map[string]string{label: v}) {
				return m.GetHistogram()
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, v)
	return nil
}

// cumulative returns the cumulative counts of h's buckets with the given
// upper bounds.
func cumulative(h *dto.Histogram, bounds ...float64) map[float64]uint64 {
	out := map[float64]uint64{}
	for _, bk := range h.GetBucket() {
		for _, ub := range bounds {
			if math.Abs(bk.GetUpperBound()-ub) < 1e-12 {
				out[ub] = bk.GetCumulativeCount()
			}
		}
	}
	return out
}

// TestEndToEndFromTheEvent: a delivered message's end-to-end latency runs
// from its publication to the handler's return as the event tells it
// (Start + Duration), not to when the hook reads a clock; an event without
// Start falls back to the clock.
func TestEndToEndFromTheEvent(t *testing.T) {
	c, err := brokerprom.New()
	require.NoError(t, err)
	published := time.Now().Add(-time.Hour)
	c.Attempted(broker.AttemptEvent{Topic: "t", Subscriber: "s", Attempt: 1, Outcome: broker.OutcomeDelivered,
		PublishedAt: published, Start: published.Add(2 * time.Second), Duration: time.Second})
	e := histogram(t, c, "broker_end_to_end_duration_seconds", "state", "delivered")
	assert.Equal(t, uint64(1), e.GetSampleCount())
	assert.InDelta(t, 3, e.GetSampleSum(), 1e-9)

	c.Attempted(broker.AttemptEvent{Topic: "t", Subscriber: "s", Attempt: 1, Outcome: broker.OutcomeDelivered,
		PublishedAt: published, Duration: time.Second})
	e = histogram(t, c, "broker_end_to_end_duration_seconds", "state", "delivered")
	assert.InDelta(t, 3+3600, e.GetSampleSum(), 5, "no Start: the clock")
}

package brokerprom

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpperDuration: the bucket "le b" ends at the longest duration whose
// Seconds() is at most b, so a classic histogram puts a duration where
// client_golang's, observing its Seconds(), would.
func TestUpperDuration(t *testing.T) {
	for _, b := range []float64{1e-9, 1.5e-9, 0.005, 0.075, 0.1, 0.3, 1, 2.5, 7.5, 600, 1e6, 1e10, 1e300} {
		u := upperDuration(b)
		assert.LessOrEqual(t, u.Seconds(), b, "bound %v", b)
		if u < math.MaxInt64 {
			assert.Greater(t, (u + 1).Seconds(), b, "bound %v: %v is in the bucket too", b, u+1)
		}
	}
	assert.Equal(t, 5*time.Millisecond, upperDuration(0.005))
	assert.Equal(t, time.Duration(math.MaxInt64), upperDuration(1e300))
}

// TestClassicEdges: a duration equal to a bound is in that bucket, one
// nanosecond more is in the next, anything above every bound counts only
// in the total; count and sum are exported with the buckets.
func TestClassicEdges(t *testing.T) {
	v := newDurationVec("ns", "d_seconds", "help", nil, []float64{0.001, 0.01}, labelOutcome, 0)
	h := v.with("t", "s", "delivered")
	for _, d := range []time.Duration{0, time.Millisecond, time.Millisecond + 1, 10 * time.Millisecond, time.Second} {
		h.observe(d)
	}
	m := collectOne(t, v)
	assert.Equal(t, uint64(5), m.GetSampleCount())
	assert.InDelta(t, 0.001+0.001000001+0.01+1, m.GetSampleSum(), 1e-12)
	require.Len(t, m.GetBucket(), 2)
	assert.Equal(t, uint64(2), m.GetBucket()[0].GetCumulativeCount())
	assert.Equal(t, uint64(4), m.GetBucket()[1].GetCumulativeCount())
	assert.NotNil(t, m.GetCreatedTimestamp())

	assert.Same(t, h, v.with("t", "s", "delivered"), "with returns the existing series")
	v.delete("t", "s", "delivered")
	assert.Equal(t, 0, testutil.CollectAndCount(v))
}

// TestClassicConcurrent: observations from many goroutines, with scrapes
// between them, are all counted once (run with -race).
func TestClassicConcurrent(t *testing.T) {
	v := newDurationVec("ns", "d_seconds", "help", nil, DefaultHandlerBuckets(), labelOutcome, 0)
	h := v.with("t", "s", "delivered")
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				h.observe(time.Duration(g*each+i) * time.Microsecond)
			}
		})
	}
	for range 10 {
		m := collectOne(t, v)
		last := m.GetBucket()[len(m.GetBucket())-1].GetCumulativeCount()
		assert.LessOrEqual(t, last, m.GetSampleCount())
	}
	wg.Wait()
	m := collectOne(t, v)
	assert.Equal(t, uint64(goroutines*each), m.GetSampleCount())
	n := float64(goroutines * each)
	assert.InDelta(t, (n-1)*n/2*1e-6, m.GetSampleSum(), 1e-6)
}

func collectOne(t *testing.T, c prometheus.Collector) *dto.Histogram {
	t.Helper()
	ch := make(chan prometheus.Metric, 8)
	c.Collect(ch)
	close(ch)
	var out []*dto.Histogram
	for m := range ch {
		var pb dto.Metric
		require.NoError(t, m.Write(&pb))
		out = append(out, pb.GetHistogram())
	}
	require.Len(t, out, 1)
	return out[0]
}

// BenchmarkHistogram is one observation of a series, from one goroutine
// (as from a subscriber's worker): the cost a delivered message pays twice. "classic" is this
// package's, "client_golang" the library's histogram with the same
// buckets, "native" the one WithNativeHistograms(1.1) uses.
func BenchmarkHistogram(b *testing.B) {
	bounds := DefaultHandlerBuckets()
	for _, tc := range []struct {
		name string
		h    durations
	}{
		{"classic", newDurationVec("ns", "d_seconds", "help", nil, bounds, labelOutcome, 0).with("t", "s", "delivered")},
		{"client_golang", seconds{prometheus.NewHistogram(prometheus.HistogramOpts{Name: "d_seconds", Help: "help", Buckets: bounds})}},
		{"native", newDurationVec("ns", "d_seconds", "help", nil, bounds, labelOutcome, 1.1).with("t", "s", "delivered")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				tc.h.observe(300 * time.Nanosecond)
			}
		})
	}
}

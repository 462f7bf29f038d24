package brokerprom

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// This file is the two histograms' families: by default a plain classic
// histogram per series, which the hooks observe into with two atomic
// additions and no lock, exported at scrape time as const histograms; with
// WithNativeHistograms, client_golang's HistogramVec.
//
// Why not client_golang's histogram always: its Observe keeps a hot and a
// cold copy of every count, so that a scrape reads a consistent snapshot,
// and costs four atomic operations (48–51 ns here, against 18–20 ns for
// this plain one: BenchmarkHistogram). The broker calls two observations
// per delivered message on the worker's path: W1 with the collector
// attached is 8.5% faster with these (p=0.002, 10 alternating rounds of
// BenchmarkW1), which brings it to about the 1.5× of W1 without it that
// the collector must stay within (README.md). What a scrape of one of these may
// show is a sum one observation behind its count, never a count that
// disagrees with its buckets.

// durations is one histogram series, which a hook observes durations into.
type durations interface{ observe(time.Duration) }

// durationVec is a histogram family: a series per (topic, subscriber,
// outcome or state) label values.
type durationVec interface {
	prometheus.Collector
	// with returns the series of the label values, created if need be.
	with(topic, subscriber, label string) durations
	// delete forgets the series of the label values.
	delete(topic, subscriber, label string)
}

// newDurationVec returns the family with the given descriptor and bucket
// upper bounds, in seconds (checked by checkBuckets): a native one (classic
// buckets too) when nativeFactor > 1, else a classicVec.
func newDurationVec(ns, name, help string, cl prometheus.Labels, bounds []float64, label string, nativeFactor float64) durationVec {
	labels := []string{labelTopic, labelSubscriber, label}
	if nativeFactor > 1 {
		return nativeVec{prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:                   ns,
			Name:                        name,
			Help:                        help,
			ConstLabels:                 cl,
			Buckets:                     bounds,
			NativeHistogramBucketFactor: nativeFactor,
		}, labels)}
	}
	v := &classicVec{
		desc:     prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, cl),
		bounds:   bounds,
		upper:    make([]time.Duration, len(bounds)),
		children: make(map[[3]string]*histogram),
	}
	for i, b := range bounds {
		v.upper[i] = upperDuration(b)
	}
	return v
}

// upperDuration is the longest duration d whose d.Seconds() is at most b
// (finite, > 0): the bucket "le b" holds exactly the durations up to it.
func upperDuration(b float64) time.Duration {
	if b*1e9 >= math.MaxInt64 {
		return math.MaxInt64
	}
	u := time.Duration(b * 1e9)
	for u > 0 && u.Seconds() > b {
		u--
	}
	for u < math.MaxInt64 && (u+1).Seconds() <= b {
		u++
	}
	return u
}

// classicVec is a family of classic histograms exported as const metrics.
// mu guards children; a hook holds its series and observes without it.
type classicVec struct {
	desc   *prometheus.Desc
	bounds []float64       // upper bounds in seconds, as exported
	upper  []time.Duration // the same as durations (upperDuration)

	mu       sync.Mutex
	children map[[3]string]*histogram
}

// histogram is one classic histogram series. counts[i] counts the
// durations in bucket i alone (not cumulative), counts[len(upper)] those
// above every bound; the count is their sum, so the two always agree.
type histogram struct {
	upper   []time.Duration
	counts  []atomic.Uint64
	sumBits atomic.Uint64 // math.Float64bits of the sum, in seconds
	created time.Time
}

func (h *histogram) observe(d time.Duration) {
	i := 0
	for i < len(h.upper) && d > h.upper[i] {
		i++
	}
	h.counts[i].Add(1)
	for s := d.Seconds(); ; {
		old := h.sumBits.Load()
		if h.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+s)) {
			return
		}
	}
}

func (v *classicVec) with(topic, subscriber, label string) durations {
	k := [3]string{topic, subscriber, label}
	v.mu.Lock()
	defer v.mu.Unlock()
	h := v.children[k]
	if h == nil {
		h = &histogram{upper: v.upper, counts: make([]atomic.Uint64, len(v.upper)+1), created: time.Now()}
		v.children[k] = h
	}
	return h
}

func (v *classicVec) delete(topic, subscriber, label string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.children, [3]string{topic, subscriber, label})
}

func (v *classicVec) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect sends a const histogram per series: its buckets made cumulative
// from one read of each count.
func (v *classicVec) Collect(ch chan<- prometheus.Metric) {
	type child struct {
		k [3]string
		h *histogram
	}
	v.mu.Lock()
	children := make([]child, 0, len(v.children))
	for k, h := range v.children {
		children = append(children, child{k, h})
	}
	v.mu.Unlock()
	for _, c := range children {
		k, h := c.k, c.h
		buckets := make(map[float64]uint64, len(v.bounds))
		var n uint64
		for i, b := range v.bounds {
			n += h.counts[i].Load()
			buckets[b] = n
		}
		n += h.counts[len(v.bounds)].Load()
		sum := math.Float64frombits(h.sumBits.Load())
		ch <- prometheus.MustNewConstHistogramWithCreatedTimestamp(v.desc, n, sum, buckets, h.created, k[0], k[1], k[2])
	}
}

// nativeVec is client_golang's HistogramVec as a durationVec.
type nativeVec struct{ *prometheus.HistogramVec }

func (v nativeVec) with(topic, subscriber, label string) durations {
	return seconds{v.WithLabelValues(topic, subscriber, label)}
}

func (v nativeVec) delete(topic, subscriber, label string) {
	v.DeleteLabelValues(topic, subscriber, label)
}

// seconds observes durations into a client_golang histogram, in seconds.
type seconds struct{ o prometheus.Observer }

func (s seconds) observe(d time.Duration) { s.o.Observe(d.Seconds()) }

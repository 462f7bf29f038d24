package brokerprom_test

import (
	"math"
	"regexp"
	"testing"

	"github.com/inproc/broker/brokerprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  brokerprom.Option
	}{
		{"nil option", nil},
		{"empty namespace", brokerprom.WithNamespace("")},
		{"namespace with a dash", brokerprom.WithNamespace("my-broker")},
		{"namespace with a colon", brokerprom.WithNamespace("a:b")},
		{"namespace starting with a digit", brokerprom.WithNamespace("1broker")},
		{"const label clashing with topic", brokerprom.WithConstLabels(prometheus.Labels{"topic": "x"})},
		{"const label clashing with state", brokerprom.WithConstLabels(prometheus.Labels{"state": "x"})},
		{"reserved const label", brokerprom.WithConstLabels(prometheus.Labels{"__name__": "x"})},
		{"invalid const label name", brokerprom.WithConstLabels(prometheus.Labels{"a b": "x"})},
		{"const label value not UTF-8", brokerprom.WithConstLabels(prometheus.Labels{"broker": "\xff"})},
		{"no handler buckets", brokerprom.WithHandlerBuckets(nil)},
		{"decreasing handler buckets", brokerprom.WithHandlerBuckets([]float64{1, 0.5})},
		{"repeated handler bucket", brokerprom.WithHandlerBuckets([]float64{1, 1})},
		{"zero end-to-end bucket", brokerprom.WithEndToEndBuckets([]float64{0, 1})},
		{"negative end-to-end bucket", brokerprom.WithEndToEndBuckets([]float64{-1})},
		{"NaN bucket", brokerprom.WithEndToEndBuckets([]float64{math.NaN()})},
		{"infinite bucket", brokerprom.WithHandlerBuckets([]float64{1, math.Inf(1)})},
		{"native factor 1", brokerprom.WithNativeHistograms(1)},
		{"native factor NaN", brokerprom.WithNativeHistograms(math.NaN())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := brokerprom.New(tc.opt)
			require.ErrorIs(t, err, brokerprom.ErrInvalidOption)
			assert.Regexp(t, "^brokerprom: ", err.Error())
			assert.Nil(t, c)
		})
	}
}

func TestOptionsApply(t *testing.T) {
	c, err := brokerprom.New(
		brokerprom.WithNamespace("inproc_broker"),
		brokerprom.WithConstLabels(prometheus.Labels{"broker": "orders"}),
		brokerprom.WithHandlerBuckets([]float64{0.1, 1}),
		brokerprom.WithEndToEndBuckets([]float64{1, 60}),
		brokerprom.WithNativeHistograms(1.1),
	)
	require.NoError(t, err)
	names := describedNames(c)
	require.NotEmpty(t, names)
	for name := range names {
		assert.Regexp(t, "^inproc_broker_", name)
	}
	// The const label is on every descriptor.
	ch := make(chan *prometheus.Desc, 64)
	c.Describe(ch)
	close(ch)
	for d := range ch {
		assert.Contains(t, d.String(), `broker="orders"`)
	}
	// Registration checks the descriptors.
	require.NoError(t, prometheus.NewPedanticRegistry().Register(c))
}

func TestWatchNil(t *testing.T) {
	c, err := brokerprom.New()
	require.NoError(t, err)
	err = c.Watch(nil)
	require.ErrorIs(t, err, brokerprom.ErrNilBroker)
	// Unwatched, it exports no Stats metric and no error.
	assert.Empty(t, gather(t, c))
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// describedNames returns the names of every metric c describes.
func describedNames(c prometheus.Collector) map[string]bool {
	ch := make(chan *prometheus.Desc, 128) // more than the collector has
	c.Describe(ch)
	close(ch)
	names := map[string]bool{}
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

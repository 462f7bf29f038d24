package brokerprom_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerprom"
	"github.com/stretchr/testify/assert"
)

// TestDefaultBucketsResolveSubMillisecond: an in-process handler of
// 200 µs and one of 2 ms land in different buckets below 5 ms (with the
// conventions' buckets alone, both fell in the first), and the
// conventions' bounds are all still there.
func TestDefaultBucketsResolveSubMillisecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, b := newWatched(t, nil)
		_, err := b.Subscribe("t", "s", func(_ context.Context, m broker.Message) error {
			if m.ID == "quick" {
				time.Sleep(200 * time.Microsecond)
			} else {
				time.Sleep(2 * time.Millisecond)
			}
			return nil
		})
		assert.NoError(t, err)
		publish(t, b, "t", "quick", "slower")
		time.Sleep(time.Second)
		synctest.Wait()
		h := histogram(t, c, "broker_handler_duration_seconds", "outcome", "delivered")
		assert.Equal(t, map[float64]uint64{0.00025: 1, 0.0025: 2, 0.005: 2}, cumulative(h, 0.00025, 0.0025, 0.005))
		e := histogram(t, c, "broker_end_to_end_duration_seconds", "state", "delivered")
		assert.Equal(t, map[float64]uint64{0.0005: 1, 0.005: 2}, cumulative(e, 0.0005, 0.005))
	})
	for _, b := range []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10} {
		assert.Contains(t, brokerprom.DefaultHandlerBuckets(), b)
	}
	assert.Less(t, brokerprom.DefaultHandlerBuckets()[0], 0.001)
	assert.Less(t, brokerprom.DefaultEndToEndBuckets()[0], 0.001)
}

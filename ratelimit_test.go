package broker

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallestRate is just above the smallest rate RateLimit accepts.
const smallestRate = float64(time.Second) / math.MaxInt64 * 1.01

// The smallest accepted rate still limits: one token every 290 years lets
// the burst through and holds the next attempts, even the ones whose wait
// is longer than a Duration (before, such a wait wrapped negative and the
// attempt ran at once).
func TestRateLimitTinyRateLimits(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got), RateLimit(smallestRate, 1), Concurrency(3))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 3)
		time.Sleep(time.Hour)
		idle()
		assert.Equal(t, 1, got.len(), "the burst of 1 runs, the rest wait for their tokens")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, 2, ss.InFlight, "waiting for a token")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
}

// Reservations far ahead at the smallest rate clamp to the longest
// Duration instead of wrapping to a negative wait.
func TestTokenBucketWaitClamps(t *testing.T) {
	require.NoError(t, RateLimit(smallestRate, 1)(&subConfig{}))
	tb := newTokenBucket(smallestRate, 1)
	now := time.Now()
	assert.Zero(t, tb.reserve(now))
	assert.Positive(t, tb.reserve(now), "one interval ahead fits")
	for range 3 {
		assert.Equal(t, time.Duration(math.MaxInt64), tb.reserve(now))
	}
}

// A rate whose token interval does not fit a time.Duration, an infinity or
// NaN is refused: before, 1e-11 was accepted and its wait wrapped negative,
// letting every attempt through at once.
func TestRateLimitRefusesRatesThatDoNotFit(t *testing.T) {
	b := newTestBroker(t)
	h := func(context.Context, Message) error { return nil }
	for _, rate := range []float64{1e-11, math.SmallestNonzeroFloat64, float64(time.Second) / math.MaxInt64, math.Inf(1), math.Inf(-1), math.NaN(), -1} {
		_, err := b.Subscribe("t", "s", h, RateLimit(rate, 1))
		assert.ErrorIs(t, err, ErrInvalidOption, "rate %v", rate)
	}
	for _, rate := range []float64{1e-9, 1, 1e12, math.MaxFloat64} {
		sub, err := b.Subscribe("t", "s", h, RateLimit(rate, 1))
		require.NoError(t, err, "rate %v", rate)
		require.NoError(t, sub.Unsubscribe(context.Background()))
	}
}

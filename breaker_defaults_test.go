package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBreakerDefaultsNoticeARecoverySoon: with the default BreakerPolicy,
// a dependency that recovers after a long outage is noticed within
// DefaultBreakerMaxOpenFor (the longest open interval), whatever the
// outage's length. (With a one-minute cap, a 20 s outage kept the
// subscriber dark 11 s after the recovery.)
func TestBreakerDefaultsNoticeARecoverySoon(t *testing.T) {
	for _, outage := range []time.Duration{10 * time.Second, 20 * time.Second, 2 * time.Minute} {
		t.Run(fmt.Sprint("outage ", outage), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1000, Backoff: ConstantBackoff(100 * time.Millisecond)}))
				start := time.Now()
				recovered := start.Add(outage)
				var mu sync.Mutex
				var firstOK time.Time
				_, err := b.Subscribe("t", "s", func(context.Context, Message) error {
					now := time.Now()
					if now.Before(recovered) {
						return errors.New("partner down")
					}
					mu.Lock()
					defer mu.Unlock()
					if firstOK.IsZero() {
						firstOK = now
					}
					return nil
				}, CircuitBreaker(BreakerPolicy{}))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				settle(t, b)
				mu.Lock()
				dark := firstOK.Sub(recovered)
				mu.Unlock()
				t.Logf("outage %v: delivered %v after the recovery", outage, dark)
				assert.LessOrEqual(t, dark, 5*time.Second, "noticed within 5 s")
				assert.Equal(t, uint64(1), subStats(t, b, "t", "s").Delivered)
			})
		})
	}
}

package broker

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests run the options the in-memory lane has over a transport (the
// fake one of transport_test.go): the same delivery engine and the same
// breaker and rate-limit code, a delivery held in the process meanwhile.

// LaneSize and WhenLaneFull are refused with what to use instead; their
// defaults are accepted.
func TestTransportLaneOptionsSayWhatToUse(t *testing.T) {
	b := newTransportBroker(t, newFakeTransport())
	for _, opt := range []SubscribeOption{LaneSize(8), WhenLaneFull(DeadLetterOldest)} {
		_, err := b.Subscribe("t", "s", okHandler(&calls{}), opt)
		require.ErrorIs(t, err, ErrInvalidOption)
		assert.Contains(t, err.Error(), "stream limits (natsjs: WithQueueSize)")
	}
	_, err := b.Subscribe("t", "s", okHandler(&calls{}), LaneSize(b.cfg.laneSize), WhenLaneFull(Block))
	require.NoError(t, err)
}

// The breaker over a transport trips after its failures, holds the next
// delivery in the process (kept alive, no attempt) while open, lets one
// probe through at half open, and closes on its success; the held delivery
// runs at the attempt number it came with.
func TestTransportBreakerPausesAndProbes(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		tr.every = 100 * time.Millisecond
		log := &breakerLog{}
		b := newTransportBroker(t, tr, WithObserver(log),
			WithRetryPolicy(RetryPolicy{MaxRetries: 5, Backoff: ConstantBackoff(10 * time.Millisecond)}))
		var failing atomic.Bool
		failing.Store(true)
		c := &calls{}
		_, err := b.Subscribe("t", "s", recording(c, func(Message) error {
			if failing.Load() {
				return errBoom
			}
			return nil
		}), CircuitBreaker(BreakerPolicy{Failures: 2, OpenFor: time.Second}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 2)
		time.Sleep(100 * time.Millisecond) // m-0#1, m-1#1 failed: open; m-0#2 held
		idle()
		assert.Equal(t, []string{"closed→open"}, log.path())
		assert.Equal(t, BreakerOpen, subStats(t, b, "t", "s").Breaker)
		failing.Store(false)
		time.Sleep(500 * time.Millisecond)
		idle()
		assert.Equal(t, 2, c.len(), "no attempt while open")
		assert.Positive(t, countPrefix(tr.log(), "alive m-"), "a held delivery is kept alive")

		time.Sleep(time.Second)
		settleTransport(t, b, "t", "s")
		assert.Equal(t, []string{"closed→open", "open→half_open", "half_open→closed"}, log.path())
		assert.Equal(t, []int{1, 2}, c.attempts("m-0"), "held, it ran at the attempt it came with")
		assert.Equal(t, []int{1, 2}, c.attempts("m-1"))
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, BreakerClosed, ss.Breaker)
		assert.Equal(t, uint64(2), ss.Delivered)
	})
}

// A failed probe opens the breaker again, for twice as long.
func TestTransportBreakerFailedProbeReopens(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		log := &breakerLog{}
		b := newTransportBroker(t, tr, WithObserver(log),
			WithRetryPolicy(RetryPolicy{MaxRetries: 9, Backoff: ConstantBackoff(10 * time.Millisecond)}))
		c := &calls{}
		_, err := b.Subscribe("t", "s", recording(c, func(Message) error { return errBoom }),
			CircuitBreaker(BreakerPolicy{Failures: 1, OpenFor: time.Second, MaxOpenFor: 10 * time.Second}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 1)
		time.Sleep(1500 * time.Millisecond) // attempt 1 fails, open 1 s, the probe (attempt 2) fails: open 2 s
		idle()
		assert.Equal(t, []string{"closed→open", "open→half_open", "half_open→open"}, log.path())
		assert.Equal(t, 2, c.len())
		time.Sleep(1400 * time.Millisecond) // t = 2.9 s
		idle()
		assert.Equal(t, 2, c.len(), "open for 2 s after a failed probe")
		time.Sleep(200 * time.Millisecond) // t = 3.1 s
		idle()
		assert.Equal(t, 3, c.len())
	})
}

// A stop at once hands a delivery held by the open breaker back unstarted,
// by the stop's deadline.
func TestTransportBreakerHeldAtAStop(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		c := &calls{}
		sub, err := b.Subscribe("t", "s", recording(c, func(Message) error { return errBoom }),
			CircuitBreaker(BreakerPolicy{Failures: 1, OpenFor: time.Minute}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 1)
		time.Sleep(100 * time.Millisecond)
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		require.NoError(t, sub.Unsubscribe(ctx))
		assert.Less(t, time.Since(start), time.Second)
		assert.Equal(t, 1, c.len())
		assert.Contains(t, tr.log(), "retry m-0#2 0s")
	})
}

// Over a transport the retry budget dead-letters a retry it has no room
// for, reason "budget", and the transport terminates the message.
func TestTransportRetryBudget(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		_, err := b.Subscribe("t", "s", recording(&calls{}, func(Message) error { return errBoom }),
			RetryBudget(RetryBudgetPolicy{Ratio: 0, Window: time.Minute, MinPerSecond: 1.0 / 60}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 1)
		settleTransport(t, b, "t", "s")
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, ReasonBudget, dls[0].Reason)
		assert.Equal(t, 2, dls[0].Attempts, "the budget's one retry, then none")
		assert.Equal(t, []string{"retry m-0#1 10ms", "term m-0#2 budget"}, tr.log())
		assert.Equal(t, 0, subStats(t, b, "t", "s").RetryBudgetLeft)
	})
}

// The rate limit over a transport spaces the attempts; a delivery waiting
// for its token is kept alive.
func TestTransportRateLimitHolds(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		tr.every = 40 * time.Millisecond
		b := newTransportBroker(t, tr)
		var st stamps
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { st.add(); return nil },
			RateLimit(10, 1), Concurrency(2))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 4)
		settleTransport(t, b, "t", "s")
		gaps := st.gaps()
		require.Len(t, gaps, 3)
		for _, g := range gaps {
			assert.GreaterOrEqual(t, g, 100*time.Millisecond)
		}
		assert.Positive(t, countPrefix(tr.log(), "alive "), "held for its token, kept alive")
	})
}

// HandlerTimeout and Concurrency over a transport: a handler past its
// deadline fails with code "timeout"; Concurrency(3) runs three at once.
func TestTransportTimeoutAndConcurrency(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var mu sync.Mutex
		running, most := 0, 0
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			defer func() { mu.Lock(); running--; mu.Unlock() }()
			<-ctx.Done()
			return ctx.Err()
		}, HandlerTimeout(50*time.Millisecond), Concurrency(3))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 6)
		settleTransport(t, b, "t", "s")
		assert.Equal(t, 3, most)
		dls := deadLetters(t, b)
		require.Len(t, dls, 6)
		for _, dl := range dls {
			assert.Equal(t, CodeTimeout, dl.ErrorCode)
		}
	})
}

// settleTransport lets fake time pass until the subscriber's Stats have
// nothing queued or in flight.
func settleTransport(t *testing.T, b *Broker, topic, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Hour)
	for {
		idle()
		ss := subStats(t, b, topic, name)
		if ss.Queued == 0 && ss.InFlight == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d queued, %d in flight after an hour", ss.Queued, ss.InFlight)
		}
		time.Sleep(time.Millisecond)
	}
}

// countPrefix counts the lines that start with prefix.
func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

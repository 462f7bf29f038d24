package brokerprom

import (
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSubscriberHooksFollowDeletion: a subscriber's hooks keep its series
// until a scrape deletes them (the broker forgot the subscriber), then
// look them up again, so a subscriber of that name subscribed again is
// still observed.
func TestSubscriberHooksFollowDeletion(t *testing.T) {
	c, err := New()
	require.NoError(t, err)
	h, ok := c.ForSubscriber("t", "s").(*subscriberHooks)
	require.True(t, ok)
	ev := broker.AttemptEvent{Topic: "t", Subscriber: "s", Attempt: 1, Outcome: broker.OutcomeDelivered,
		Start: time.Now(), Duration: time.Millisecond, PublishedAt: time.Now()}
	h.Attempted(ev)
	first := h.s.Load()
	require.NotNil(t, first)
	assert.Same(t, first, c.series[seriesKey{"t", "s"}])
	h.Attempted(ev)
	assert.Same(t, first, h.s.Load(), "kept between events")

	c.prune(broker.Stats{}, c.epoch.Add(1)) // a scrape whose Stats no longer have t/s
	assert.True(t, first.deleted.Load())
	assert.Empty(t, c.series)
	assert.Zero(t, testutil.CollectAndCount(c.handler))

	h.Attempted(ev)
	again := h.s.Load()
	assert.NotSame(t, first, again)
	assert.Same(t, again, c.series[seriesKey{"t", "s"}])
	assert.Equal(t, 3, testutil.CollectAndCount(c.handler), "the subscriber's series exist again")
}

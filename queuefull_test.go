package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQueueFullNamesTheSubscriberHoldingTheTopic: when a subscriber's full
// lane holds the topic (Stats' BlockedOn), ErrQueueFull's text names it, so
// the producer's log says whom to look at.
func TestQueueFullNamesTheSubscriberHoldingTheTopic(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(4), WithPublishTimeout(100*time.Millisecond))
		release := make(chan struct{})
		defer close(release)
		_, err := b.Subscribe("orders", "healthy", func(context.Context, Message) error { return nil })
		require.NoError(t, err)
		_, err = b.Subscribe("orders", "webhook", blockUntil(release))
		require.NoError(t, err)
		var full error
		for i := range 100 {
			if err := b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "orders"}); err != nil {
				full = err
				break
			}
			idle()
		}
		require.ErrorIs(t, full, ErrQueueFull)
		t.Log(full)
		assert.Contains(t, full.Error(), `subscriber "webhook" holds it, its lane of 4 is full`)
		assert.Equal(t, "webhook", b.Stats().Topics["orders"].BlockedOn)
	})
}

package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On an idle topic (its dispatcher asleep, its queue empty, its last
// message stepInGap ago or more) Publish routes
// its message itself: when it returns, every subscriber with room has it,
// one goroutine hand-off from the worker's handler.
func TestPublishOnAnIdleTopicRoutesItself(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		release := make(chan struct{})
		for _, name := range []string{"a", "b"} {
			_, err := b.Subscribe("t", name, blockUntil(release))
			require.NoError(t, err)
		}
		for i := range 3 {
			time.Sleep(stepInGap) // the topic is idle: its last message came stepInGap ago,
			idle()                // the dispatcher sleeps, the queue is empty
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint(i), Topic: "t"}))
			st := b.Stats().Topics["t"]
			assert.Zero(t, st.Queued, "message %d routed by its Publish", i)
			for _, name := range []string{"a", "b"} {
				assert.EqualValues(t, i+1, st.Subscribers[name].Routed, "subscriber %s has message %d when Publish returns", name, i)
			}
		}
		close(release)
		settle(t, b)
		requireConserved(t, b.Stats())
	})
}

// A publisher stepping in never waits for room in a lane: a full lane
// (Block) leaves the rest of its batch to the dispatcher, which waits
// (BlockedOn), while Publish returns at once; every message then reaches
// every subscriber, in order.
func TestPublisherSteppingInNeverWaits(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		release := make(chan struct{})
		var slow, fast calls
		_, err := b.Subscribe("t", "slow", recording(&slow, func(Message) error { <-release; return nil }), LaneSize(2))
		require.NoError(t, err)
		_, err = b.Subscribe("t", "fast", okHandler(&fast))
		require.NoError(t, err)
		const n = 10
		for i := range n {
			time.Sleep(stepInGap)
			idle()
			// A Publish that waited for the slow lane would never return:
			// the bubble would deadlock.
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint(i), Topic: "t"}))
		}
		idle()
		st := b.Stats().Topics["t"]
		assert.Equal(t, "slow", st.BlockedOn, "the dispatcher took over the batch the publisher could not finish")
		assert.Positive(t, st.Queued)
		close(release)
		settle(t, b)
		want := make([]string, n)
		for i := range want {
			want[i] = fmt.Sprint(i)
		}
		assert.Equal(t, want, slow.ids())
		assert.Equal(t, want, fast.ids())
		requireConserved(t, b.Stats())
	})
}

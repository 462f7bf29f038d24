package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDefaultLaneReadyCap: the default lane takes at most DefaultQueueSize
// messages ready to run, so a subscriber that is only slow holds up its
// topic after the queue and that many, while LaneSize(n) lets all n wait
// ready. (Parked retries may use the whole DefaultLaneSize:
// TestFailingSubscriberCostsItsNeighbourNothing parks thousands.)
func TestDefaultLaneReadyCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []SubscribeOption
		lane int // ready messages the lane takes
	}{
		{"default lane", nil, DefaultQueueSize},
		{"LaneSize(4096)", []SubscribeOption{LaneSize(4096)}, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// Each Publish waits for room (fake time), so the dispatcher
				// fills the lane before the queue reports full.
				b, err := New(WithPublishTimeout(time.Second), WithIdempotencyStore(nil))
				require.NoError(t, err)
				release := make(chan struct{})
				started := make(chan struct{}, 1)
				_, err = b.Subscribe("t", "slow", func(ctx context.Context, m Message) error {
					select {
					case started <- struct{}{}:
					default:
					}
					<-release
					return nil
				}, tc.opts...)
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "first", Topic: "t"}))
				<-started // the one running message no longer counts against the lane
				accepted := 1
				for i := 0; ; i++ {
					err := b.Publish(context.Background(), Message{ID: fmt.Sprint(i), Topic: "t"})
					if errors.Is(err, ErrQueueFull) {
						break
					}
					require.NoError(t, err)
					accepted++
					require.Less(t, accepted, DefaultQueueSize+DefaultLaneSize+2, "never full")
				}
				// One running, the lane's ready messages, the topic queue, and
				// the one the dispatcher holds while it waits for room.
				want := 1 + tc.lane + DefaultQueueSize + 1
				require.InDelta(t, want, accepted, 1, "%s: accepted before ErrQueueFull", tc.name)
				close(release)
				require.NoError(t, b.Close(context.Background()))
			})
		})
	}
}

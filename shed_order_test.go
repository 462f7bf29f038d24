package broker

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A shed copy of an ID already delivered at the subscriber ends
// deduplicated, not as an overflow dead letter: redriving every dead letter
// then runs the ID's handler no second time (the article's check 3).
// Before, each shed copy became a dead letter and redrive ran it again.
func TestShedDuplicateIsDeduplicated(t *testing.T) {
	for _, policy := range []FullLanePolicy{DeadLetterNewest, DeadLetterOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t)
				var got calls
				release := make(chan struct{})
				_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
					if m.ID == "block" {
						<-release
					}
					return nil
				}), LaneSize(2), WhenLaneFull(policy))
				require.NoError(t, err)
				pub := func(id string) {
					t.Helper()
					require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
					idle()
				}
				pub("charge-42")
				pub("block")
				for range 5 { // each finds the lane full: it (or the copy before it) is shed
					pub("charge-42")
				}
				pub("other-1")
				pub("other-2")
				close(release)
				settle(t, b)
				dls := deadLetters(t, b)
				ids := make([]string, 0, len(dls))
				for _, dl := range dls {
					ids = append(ids, dl.ID)
					assert.NotEqual(t, "charge-42", dl.Message.ID, "a delivered ID shed again is not a dead letter")
				}
				_, err = b.Redrive(context.Background(), ids...)
				require.NoError(t, err)
				settle(t, b)
				assert.Len(t, got.attempts("charge-42"), 1, "the side effect happens once")
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, uint64(5), ss.Deduplicated)
				requireConserved(t, b.Stats())
			})
		})
	}
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// putDeadLetters stores one dead letter per spec "id subscriber reason"
// on topic t, oldest first.
func putDeadLetters(t *testing.T, b *Broker, specs ...[3]string) {
	t.Helper()
	for _, sp := range specs {
		require.NoError(t, b.DeadLetters().Put(context.Background(), DeadLetter{
			ID: sp[0], Message: Message{ID: "m-" + sp[0], Topic: "t"}, Subscriber: sp[1],
			Attempts: 1, ErrorCode: CodeError, Error: "boom", Retryable: true, Reason: sp[2],
		}))
	}
}

func storedIDs(t *testing.T, b *Broker) []string {
	t.Helper()
	var ids []string
	for _, dl := range deadLetters(t, b) {
		ids = append(ids, dl.ID)
	}
	return ids
}

// TestRedriveMatching: RedriveMatching redrives exactly what the filter
// matches (Reason included, exact), oldest first and at most Limit, each to
// its own subscriber, and reports the rest as Redrive does, summarised.
func TestRedriveMatching(t *testing.T) {
	fixture := [][3]string{
		{"d1", "s", ReasonOverflow}, {"d2", "s", ReasonPermanent}, {"d3", "s", ReasonOverflow},
		{"d4", "other", ReasonOverflow}, {"d5", "s", ReasonOverflow}, {"d6", "gone", ReasonOverflow},
	}
	for _, tt := range []struct {
		name     string
		f        DeadLetterFilter
		redriven []string // message IDs handled, in order
		left     []string
		errIs    []error
	}{
		{"reason and subscriber", DeadLetterFilter{Subscriber: "s", Reason: ReasonOverflow},
			[]string{"m-d1", "m-d3", "m-d5"}, []string{"d2", "d4", "d6"}, nil},
		{"reason prefix matches nothing", DeadLetterFilter{Reason: "over"},
			nil, []string{"d1", "d2", "d3", "d4", "d5", "d6"}, nil},
		{"limit takes the oldest", DeadLetterFilter{Reason: ReasonOverflow, Limit: 2},
			[]string{"m-d1", "m-d3"}, []string{"d2", "d4", "d5", "d6"}, nil},
		{"a failure is reported, the rest redriven", DeadLetterFilter{Reason: ReasonOverflow},
			[]string{"m-d1", "m-d3", "m-d4", "m-d5"}, []string{"d2", "d6"}, []error{ErrSubscriberNotFound}},
		{"negative limit", DeadLetterFilter{Limit: -1},
			nil, []string{"d1", "d2", "d3", "d4", "d5", "d6"}, []error{ErrInvalidOption}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t)
				var got calls
				for _, name := range []string{"s", "other"} {
					_, err := b.Subscribe("t", name, okHandler(&got))
					require.NoError(t, err)
				}
				putDeadLetters(t, b, fixture...)
				n, err := b.RedriveMatching(context.Background(), tt.f)
				idle()
				t.Logf("RedriveMatching(%+v) = %d, %v", tt.f, n, err)
				assert.Equal(t, len(tt.redriven), n)
				ids := got.ids()
				slices.Sort(ids) // two subscribers run concurrently
				assert.Equal(t, tt.redriven, ids)
				assert.Equal(t, tt.left, storedIDs(t, b))
				if tt.errIs == nil {
					assert.NoError(t, err)
				}
				for _, target := range tt.errIs {
					assert.ErrorIs(t, err, target)
				}
				if errors.Is(err, ErrSubscriberNotFound) {
					assert.ErrorContains(t, err, "1 of 5 dead letters failed", "the summary counts the failures")
				}
			})
		})
	}
}

// TestRedriveMatchingIsASnapshot: a subscriber still failing what is
// redriven puts new dead letters while RedriveMatching runs; the call
// redrives what matched when it was called, and ends.
func TestRedriveMatchingIsASnapshot(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
		require.NoError(t, err)
		publishN(t, b, "t", "m", 5)
		idle()
		before := storedIDs(t, b)
		require.Len(t, before, 5)
		n, err := b.RedriveMatching(context.Background(), DeadLetterFilter{Topic: "t"})
		require.NoError(t, err)
		assert.Equal(t, 5, n)
		idle()
		after := storedIDs(t, b)
		assert.Len(t, after, 5, "each failed again once")
		for _, id := range after {
			assert.NotContains(t, before, id, "the redriven dead letters left the store; new ones came")
		}
		assert.Equal(t, uint64(10), subStats(t, b, "t", "s").DeadLettered)
	})
}

// TestRedriveMatchingStopsWithItsContext: when ctx ends while a redrive
// waits for room, RedriveMatching stops, says so, and leaves the rest in
// the store.
func TestRedriveMatchingStopsWithItsContext(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithPublishTimeout(time.Hour))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", blockUntil(release), LaneSize(1))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "busy", Topic: "t"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "queued", Topic: "t"}))
		idle() // busy runs, queued fills the lane
		putDeadLetters(t, b, [3]string{"d1", "s", ReasonOverflow}, [3]string{"d2", "s", ReasonOverflow}, [3]string{"d3", "s", ReasonOverflow})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		n, err := b.RedriveMatching(ctx, DeadLetterFilter{Reason: ReasonOverflow})
		t.Logf("RedriveMatching = %d, %v", n, err)
		assert.Equal(t, 0, n)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "2 of 3 not tried")
		assert.Equal(t, []string{"d1", "d2", "d3"}, storedIDs(t, b), "nothing accepted, nothing deleted")
		close(release)
	})
}

// TestTransportRedriveMatching: over a transport, RedriveMatching hands
// each match to the transport's Redrive and deletes it once accepted.
func TestTransportRedriveMatching(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr)
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		putDeadLetters(t, b, [3]string{"d1", "s", ReasonOverflow}, [3]string{"d2", "s", ReasonExhausted}, [3]string{"d3", "s", ReasonOverflow})
		n, err := b.RedriveMatching(context.Background(), DeadLetterFilter{Reason: ReasonOverflow})
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		idle()
		assert.Equal(t, []string{"m-d1", "m-d3"}, got.ids())
		assert.Equal(t, []string{"ack m-d1#1", "ack m-d3#1"}, tr.log())
		assert.Equal(t, []string{"d2"}, storedIDs(t, b))
		var redriven []string
		for _, dl := range tr.redrives {
			redriven = append(redriven, fmt.Sprintf("%s %s", dl.ID, dl.Reason))
		}
		assert.Equal(t, []string{"d1 overflow", "d3 overflow"}, redriven)
	})
}

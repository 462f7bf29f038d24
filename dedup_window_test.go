package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The default store keeps an ID's earliest and latest delivered publish
// dates: a copy published within the window of either is a duplicate.
// Before, each Record moved the ID's one date forward, so the older
// delivery was forgotten without a count.
func TestMemoryIdempotencyStoreKeepsEarliestAndLatest(t *testing.T) {
	const m = int64(time.Minute)
	s := NewMemoryIdempotencyStore(5*time.Minute, 100)
	salt, h := s.salt("t", "s"), s.hashID("x")
	at := func(d int64) slot { return s.slotFor(salt, h, 100*m+d) }
	s.record(at(1 * m))
	s.record(at(7 * m)) // 6 minutes later: not a duplicate, delivered
	tests := []struct {
		name string
		d    int64
		want bool
	}{
		{"the older copy, near the earliest", 0, true},
		{"between, near the earliest", 4 * m, true},
		{"near the latest", 11 * m, true},
		{"beyond the latest", 12 * m, false},
		{"before the earliest", -4*m - 1, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, s.seen(at(tt.d)), tt.name)
	}
	s.record(at(20 * m)) // a third date moves the latest
	assert.True(t, s.seen(at(0)), "the earliest is kept")
	assert.True(t, s.seen(at(24*m)))
	assert.False(t, s.seen(at(8*m)), "the middle date is gone")
	s.record(at(-10 * m)) // an older one moves the earliest
	assert.True(t, s.seen(at(-14*m)))
	assert.True(t, s.seen(at(24*m)))
	assert.Equal(t, int64(2), s.filled.Load(), "two entries for the ID")
}

// The sequence through the broker: copy A gets RetryAfter(30m),
// copy B (1 minute later) is delivered, copy D (6 minutes after B) is
// delivered too; A's retry at 30 minutes is B's duplicate and does not run.
func TestOlderCopyStaysDuplicateAfterANewerDelivery(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(0)}))
		var got calls
		_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
			if m.Payload != nil && string(m.Payload) == "A" {
				return RetryAfter(errBoom, 30*time.Minute)
			}
			return nil
		}))
		require.NoError(t, err)
		pub := func(payload string) {
			t.Helper()
			require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t", Payload: []byte(payload)}))
			idle()
		}
		pub("A")
		time.Sleep(time.Minute)
		pub("B")
		time.Sleep(6 * time.Minute)
		pub("D")
		time.Sleep(30 * time.Minute) // A's retry is due
		idle()
		assert.Len(t, got.all(), 3, "A once, then B and D; A's retry is a duplicate")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(2), ss.Delivered)
		assert.Equal(t, uint64(1), ss.Deduplicated)
		assert.Zero(t, b.Stats().Dedup.ForgottenEarly)
	})
}

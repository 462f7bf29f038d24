package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemoryIdempotencyStore(t *testing.T) {
	bubble(t, func(t *testing.T) {
		ctx := context.Background()
		s := NewMemoryIdempotencyStore(time.Minute, 1000)
		k := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "m"}
		seen, err := s.Seen(ctx, k)
		require.NoError(t, err)
		assert.False(t, seen)
		require.NoError(t, s.Record(ctx, k))
		seen, _ = s.Seen(ctx, k)
		assert.True(t, seen)
		for _, other := range []DeliveryKey{
			{Topic: "t", Subscriber: "other", MessageID: "m"},
			{Topic: "u", Subscriber: "s", MessageID: "m"},
			{Topic: "t", Subscriber: "s", MessageID: "n"},
		} {
			seen, _ = s.Seen(ctx, other)
			assert.False(t, seen, "%+v", other)
		}
		time.Sleep(59 * time.Second)
		seen, _ = s.Seen(ctx, k)
		assert.True(t, seen, "inside the window")
		require.NoError(t, s.Record(ctx, k)) // recorded again: the window restarts
		time.Sleep(30 * time.Second)
		seen, _ = s.Seen(ctx, k)
		assert.True(t, seen, "the second record restarted the window")
		time.Sleep(31 * time.Second)
		seen, _ = s.Seen(ctx, k)
		assert.False(t, seen, "after the window")
	})
}

func TestMemoryIdempotencyStoreIsBounded(t *testing.T) {
	tests := []struct{ max, wantCap, record int }{{1, 8, 20}, {3, 8, 100}, {100, 100, 1000}, {1000, 1000, 5000}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			ctx := context.Background()
			s := NewMemoryIdempotencyStore(time.Hour, tt.max)
			require.Equal(t, tt.wantCap, s.Cap())
			for i := range tt.record {
				require.NoError(t, s.Record(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: fmt.Sprint(i)}))
				require.LessOrEqual(t, s.Len(), s.Cap())
			}
			last := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: fmt.Sprint(tt.record - 1)}
			seen, _ := s.Seen(ctx, last)
			assert.True(t, seen, "the newest entry is kept")
			first := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "0"}
			seen, _ = s.Seen(ctx, first)
			assert.False(t, seen, "the oldest entry was forgotten")
		})
	}
}

func TestMemoryIdempotencyStoreRetention(t *testing.T) {
	// Filled to half its bound, the table keeps nearly everything.
	ctx := context.Background()
	s := NewMemoryIdempotencyStore(time.Hour, 10_000)
	for i := range 5_000 {
		require.NoError(t, s.Record(ctx, DeliveryKey{MessageID: fmt.Sprint(i)}))
	}
	kept := 0
	for i := range 5_000 {
		if seen, _ := s.Seen(ctx, DeliveryKey{MessageID: fmt.Sprint(i)}); seen {
			kept++
		}
	}
	assert.Greater(t, kept, 4_995, "kept %d of 5000", kept)
	assert.Equal(t, kept, s.Len())
}

func TestMemoryIdempotencyStoreForgetsExpired(t *testing.T) {
	bubble(t, func(t *testing.T) {
		ctx := context.Background()
		s := NewMemoryIdempotencyStore(time.Second, 1_000_000)
		for i := range 10_000 {
			require.NoError(t, s.Record(ctx, DeliveryKey{MessageID: fmt.Sprint(i)}))
		}
		assert.Equal(t, 10_000, s.Len())
		time.Sleep(time.Second)
		seen, _ := s.Seen(ctx, DeliveryKey{MessageID: "0"})
		assert.False(t, seen, "expired")
		assert.Zero(t, s.Len())
	})
}

func TestIdempotencyStoreFailureStillDelivers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(brokenIdem{}))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 2)
		idle()
		assert.Equal(t, 2, got.len(), "a failing dedup store never loses a message")
	})
}

// brokenIdem fails every call.
type brokenIdem struct{}

func (brokenIdem) Seen(context.Context, DeliveryKey) (bool, error) { return false, errBoom }
func (brokenIdem) Record(context.Context, DeliveryKey) error       { return errBoom }

// The broker's hashed fast path and the store's public methods agree.
func TestMemoryIdempotencyStoreFastPathAgrees(t *testing.T) {
	bubble(t, func(t *testing.T) {
		store := NewMemoryIdempotencyStore(time.Minute, 1000)
		ctx := context.Background()
		require.NoError(t, store.Record(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "recorded-outside"}))
		b := newTestBroker(t, WithIdempotencyStore(store))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 1)
		require.NoError(t, b.Publish(ctx, Message{ID: "recorded-outside", Topic: "t"}))
		idle()
		assert.Equal(t, []string{"m-0"}, got.ids())
		seen, err := store.Seen(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "m-0"})
		require.NoError(t, err)
		assert.True(t, seen, "recorded by the broker, visible through Seen")
		seen, _ = store.Seen(ctx, DeliveryKey{Topic: "t", Subscriber: "other", MessageID: "m-0"})
		assert.False(t, seen)
	})
}

// A worker reuses a delivery's record time for the next lookup only when no
// time can have passed in between: here a message that waits out a long
// backoff (and ends without a record) sits between a delivery and its
// duplicate, and the duplicate, past the window, runs again.
func TestDedupWindowAfterALongBackoff(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(NewMemoryIdempotencyStore(time.Minute, 100)),
			WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(2 * time.Minute)}))
		var got calls
		_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
			if m.ID == "x" {
				return errBoom
			}
			return nil
		}))
		require.NoError(t, err)
		time.Sleep(time.Second) // the store's clock is not at its epoch
		for _, id := range []string{"m", "x", "m"} {
			require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
		}
		settle(t, b)
		assert.Equal(t, []string{"m", "x", "x", "m"}, got.ids(), "the duplicate came after the window")
	})
}

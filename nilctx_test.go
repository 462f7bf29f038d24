package broker

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A nil ctx counts as context.Background() in every broker method and every
// method of the built-in stores (the package doc says so once). Before, the
// dead-letter store's methods panicked on ctx.Err().
func TestNilContextIsBackground(t *testing.T) {
	bubble(t, func(t *testing.T) { nilContextIsBackground(t) })
}

func nilContextIsBackground(t *testing.T) {
	var nilCtx context.Context
	b := newTestBroker(t)
	failing := true
	sub, err := b.Subscribe("t", "s", func(context.Context, Message) error {
		if failing {
			return Permanent(errBoom)
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.Publish(nilCtx, Message{ID: "a", Topic: "t"}))
	require.NoError(t, b.PublishBatch(nilCtx, []Message{{ID: "b", Topic: "t"}}))
	idle()

	store := b.DeadLetters()
	dls, err := store.List(nilCtx, DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dls, 2)
	_, ok, err := store.Get(nilCtx, dls[0].ID)
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, store.Delete(nilCtx, dls[0].ID))
	failing = false
	n, err := b.Redrive(nilCtx, dls[1].ID)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	idle()
	require.NoError(t, sub.Unsubscribe(nilCtx))
	require.NoError(t, b.Close(nilCtx))

	own := NewMemoryDeadLetterStore(1, nil)
	require.NoError(t, own.Put(nilCtx, DeadLetter{ID: "x"}))
	require.NoError(t, own.Put(nilCtx, DeadLetter{ID: "y"})) // evicts x, logging with ctx
	n, err = own.Len(nilCtx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	newest, err := own.ListNewest(nilCtx, DeadLetterQuery{})
	require.NoError(t, err)
	assert.Len(t, newest, 1)
	newest, err = ListNewest(nilCtx, own, DeadLetterQuery{})
	require.NoError(t, err)
	assert.Len(t, newest, 1)

	dedup := NewMemoryIdempotencyStore(0, 0)
	k := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "m"}
	require.NoError(t, dedup.Record(nilCtx, k))
	seen, err := dedup.Seen(nilCtx, k)
	require.NoError(t, err)
	assert.True(t, seen)
}

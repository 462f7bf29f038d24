package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Over a transport, a dead letter the store fails until the stop stays
// with the transport (handed back), counted once: queued there, not also
// dead-lettered (before, Stats counted it both ways).
func TestTransportStoreDownAtStopCountsOnce(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := newFakeTransport()
		b := newTransportBroker(t, tr, WithDeadLetterStore(failingStore{NewMemoryDeadLetterStore(100, discard)}))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		time.Sleep(time.Second)
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = b.Close(ctx)
		ss := b.Stats().Topics["t"].Subscribers["s"]
		t.Logf("told %v stats %+v", tr.log(), ss)
		assert.Equal(t, uint64(1), ss.Routed)
		requireConserved(t, b.Stats())
	})
}

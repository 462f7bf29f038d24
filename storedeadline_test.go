package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backendDownStore is a dead-letter store whose backend never answers: its
// Put waits for its ctx, as a network client does.
type backendDownStore struct {
	*MemoryDeadLetterStore
	mu        sync.Mutex
	doneEarly int // Puts whose ctx had ended before the stop
	stopped   bool
	causes    []error
}

func (s *backendDownStore) Put(ctx context.Context, dl DeadLetter) error {
	s.mu.Lock()
	if ctx.Err() != nil && !s.stopped {
		s.doneEarly++
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.causes = append(s.causes, context.Cause(ctx))
	s.mu.Unlock()
	return ctx.Err()
}

// A stop whose ctx ends while the store's Put waits for its backend (or
// its ctx) returns by its deadline, ctx plus ShutdownGrace: Put's ctx ends
// one grace later, and the dead letters it could not store count as lost.
// Before, Put got context.Background() and Close never returned.
func TestStopEndsAPutThatHonoursItsContext(t *testing.T) {
	for _, viaClose := range []bool{true, false} {
		t.Run(fmt.Sprintf("close=%v", viaClose), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				store := &backendDownStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil)}
				b := newTestBroker(t, WithDeadLetterStore(store))
				sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
				require.NoError(t, err)
				publishN(t, b, "t", "m", 3) // m-0 waits in Put; m-1 and m-2 queue behind it
				time.Sleep(time.Hour)       // the broker runs: Put's ctx does not end
				idle()
				store.mu.Lock()
				store.stopped = true
				assert.Zero(t, store.doneEarly, "Put's ctx ended while the broker ran")
				store.mu.Unlock()

				stop, sentinel := sub.Unsubscribe, ErrUnsubscribed
				if viaClose {
					stop, sentinel = b.Close, ErrClosed
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				start := time.Now()
				var de *DrainError
				require.ErrorAs(t, stop(ctx), &de)
				took := time.Since(start)
				assert.LessOrEqual(t, took, time.Second+ShutdownGrace, "returned by the stop's deadline")
				assert.Equal(t, 3, de.Lost, "no dead letter could be stored")
				time.Sleep(ShutdownGrace) // the Puts return one grace after the stop's deadline
				idle()
				store.mu.Lock()
				defer store.mu.Unlock()
				require.NotEmpty(t, store.causes)
				for _, c := range store.causes {
					assert.ErrorIs(t, c, sentinel, "Put's ctx says which stop ended it")
				}
			})
		})
	}
}

// downDedup is an idempotency store whose backend never answers: Seen and
// Record wait for their ctx.
type downDedup struct{}

func (downDedup) Seen(ctx context.Context, _ DeliveryKey) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

func (downDedup) Record(ctx context.Context, _ DeliveryKey) error {
	<-ctx.Done()
	return ctx.Err()
}

// The idempotency store's calls get the same ctx as Put: a stop whose
// messages wait in a Seen that honours its ctx returns soon after its
// deadline (what could not be finished by then counts as lost). Before,
// Seen got context.Background() and Close never returned.
func TestStopEndsASeenThatHonoursItsContext(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(downDedup{}))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 2) // m-0 waits in Seen, m-1 queues
		time.Sleep(time.Hour)
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		var de *DrainError
		require.ErrorAs(t, b.Close(ctx), &de)
		assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace)
		assert.Zero(t, got.len(), "no attempt after the deadline")
		assert.Equal(t, 2, de.DeadLettered, "both messages ended at the stop")
		assert.Equal(t, 2, de.Lost, "after the stores' ctx ended: the memory store refuses a done ctx too")
		requireConserved(t, b.Stats())
		time.Sleep(ShutdownGrace) // the stores' ctx ends: the abandoned Seen returns
		idle()
	})
}

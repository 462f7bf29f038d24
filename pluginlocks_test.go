package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mutexStore is a dead-letter store that guards every method with one
// mutex and holds it through a Put that waits for release (a store with a
// slow backend and a naive lock).
type mutexStore struct {
	*MemoryDeadLetterStore
	mu       sync.Mutex
	putting  chan struct{} // closed when the first Put holds mu
	evicting chan struct{} // closed when Evicted is called
	release  chan struct{}
	once     [2]sync.Once
}

func (s *mutexStore) Put(ctx context.Context, dl DeadLetter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.once[0].Do(func() { close(s.putting) })
	<-s.release
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

func (s *mutexStore) Evicted() uint64 {
	s.once[1].Do(func() { close(s.evicting) })
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.MemoryDeadLetterStore.Evicted()
}

// Stats waiting on a store's Evicted holds no lock that Publish or
// Subscribe needs: both return at once, on topics new to the broker (which
// take the lock Stats used to hold while calling the store). Before,
// Publish to a new topic waited for the store's Put, past its ctx.
func TestStatsWaitingOnTheStoreStallsNothing(t *testing.T) {
	store := &mutexStore{
		MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil),
		putting:               make(chan struct{}), evicting: make(chan struct{}), release: make(chan struct{}),
	}
	b := newTestBroker(t, WithDeadLetterStore(store))
	_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
	<-store.putting
	statsDone := make(chan Stats)
	go func() { statsDone <- b.Stats() }()
	<-store.evicting

	done := make(chan error, 2)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		done <- b.Publish(ctx, Message{ID: "n", Topic: "new"})
	}()
	go func() {
		_, err := b.Subscribe("other", "s", func(context.Context, Message) error { return nil })
		done <- err
	}()
	waiting := 2
	for waiting > 0 {
		select {
		case err := <-done:
			assert.NoError(t, err)
			waiting--
			continue
		case <-time.After(5 * time.Second):
			t.Error("Publish or Subscribe waited for Stats, which waits for the store")
		}
		break
	}
	close(store.release)
	st := <-statsDone
	assert.Zero(t, st.DeadLetterEvicted)
	for range waiting {
		<-done // when it failed, the calls end once the store is released
	}
}

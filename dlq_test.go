package broker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func dl(id, topic, sub, code string) DeadLetter {
	return DeadLetter{ID: id, Message: Message{ID: "m-" + id, Topic: topic}, Subscriber: sub, ErrorCode: code,
		Reason: ReasonExhausted, FailedAt: time.Unix(1, 0)}
}

// testDeadLetterStore is the behaviour every DeadLetterStore must have.
func testDeadLetterStore(t *testing.T, newStore func() DeadLetterStore) {
	ctx := context.Background()
	fill := func(t *testing.T) DeadLetterStore {
		s := newStore()
		for _, d := range []DeadLetter{
			dl("1", "orders", "billing", "timeout"),
			dl("2", "orders", "inventory", "invalid"),
			dl("3", "users", "billing", "timeout"),
			dl("4", "orders", "billing", "panic"),
		} {
			require.NoError(t, s.Put(ctx, d))
		}
		return s
	}
	ids := func(dls []DeadLetter) []string {
		var out []string
		for _, d := range dls {
			out = append(out, d.ID)
		}
		return out
	}

	t.Run("list filters oldest first", func(t *testing.T) {
		s := fill(t)
		tests := []struct {
			f    DeadLetterFilter
			want []string
		}{
			{DeadLetterFilter{}, []string{"1", "2", "3", "4"}},
			{DeadLetterFilter{Topic: "orders"}, []string{"1", "2", "4"}},
			{DeadLetterFilter{Subscriber: "billing"}, []string{"1", "3", "4"}},
			{DeadLetterFilter{ErrorCode: "timeout"}, []string{"1", "3"}},
			{DeadLetterFilter{Topic: "orders", Subscriber: "billing", ErrorCode: "panic"}, []string{"4"}},
			{DeadLetterFilter{Topic: "nope"}, nil},
			{DeadLetterFilter{Limit: 2}, []string{"1", "2"}},
			{DeadLetterFilter{Subscriber: "billing", Limit: 2}, []string{"1", "3"}},
		}
		for _, tt := range tests {
			got, err := s.List(ctx, tt.f)
			require.NoError(t, err)
			assert.Equal(t, tt.want, ids(got), "filter %+v", tt.f)
		}
		_, err := s.List(ctx, DeadLetterFilter{Limit: -1})
		assert.ErrorIs(t, err, ErrInvalidOption)
	})
	t.Run("get delete len", func(t *testing.T) {
		s := fill(t)
		got, ok, err := s.Get(ctx, "2")
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, dl("2", "orders", "inventory", "invalid"), got)
		_, ok, err = s.Get(ctx, "nope")
		require.NoError(t, err)
		assert.False(t, ok)
		require.NoError(t, s.Delete(ctx, "2", "nope", "4"))
		n, err := s.Len(ctx)
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		all, err := s.List(ctx, DeadLetterFilter{})
		require.NoError(t, err)
		assert.Equal(t, []string{"1", "3"}, ids(all))
	})
	t.Run("put replaces same ID", func(t *testing.T) {
		s := fill(t)
		require.NoError(t, s.Put(ctx, dl("1", "orders", "billing", "changed")))
		n, err := s.Len(ctx)
		require.NoError(t, err)
		assert.Equal(t, 4, n)
		got, _, err := s.Get(ctx, "1")
		require.NoError(t, err)
		assert.Equal(t, "changed", got.ErrorCode)
	})
	t.Run("cancelled context", func(t *testing.T) {
		s := fill(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		assert.Error(t, s.Put(cctx, dl("9", "t", "s", "c")))
		_, err := s.List(cctx, DeadLetterFilter{})
		assert.Error(t, err)
	})
}

func TestMemoryDeadLetterStore(t *testing.T) {
	testDeadLetterStore(t, func() DeadLetterStore { return NewMemoryDeadLetterStore(0, nil) })
}

func TestMemoryDeadLetterStoreEvictsOldest(t *testing.T) {
	var buf bytes.Buffer
	s := NewMemoryDeadLetterStore(3, slog.New(slog.NewTextHandler(&buf, nil)))
	ctx := context.Background()
	for i := range 5 {
		require.NoError(t, s.Put(ctx, dl(fmt.Sprint(i), "t", "s", "c")))
	}
	n, err := s.Len(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, n, "never grows past its capacity")
	assert.Equal(t, uint64(2), s.Evicted())
	all, err := s.List(ctx, DeadLetterFilter{})
	require.NoError(t, err)
	assert.Equal(t, "2", all[0].ID, "oldest evicted first")
	logs := buf.String()
	assert.Contains(t, logs, "evicted oldest")
	assert.Contains(t, logs, "dead_letter_id=0")
	assert.Contains(t, logs, "dead_letter_id=1")
	assert.Contains(t, logs, "message_id=m-0")
	assert.Equal(t, DefaultDeadLetterCapacity, NewMemoryDeadLetterStore(-1, nil).Capacity())
	assert.ErrorIs(t, s.Put(ctx, DeadLetter{}), ErrInvalidOption, "a dead letter needs an ID")
}

func TestBrokerReportsEvictions(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithDeadLetterStore(NewMemoryDeadLetterStore(2, discard)), WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return errBoom })
		require.NoError(t, err)
		publishN(t, b, "t", "m", 5)
		idle()
		st := b.Stats()
		assert.Equal(t, uint64(3), st.DeadLetterEvicted)
		assert.Equal(t, uint64(5), st.Topics["t"].Subscribers["s"].DeadLettered)
	})
}

// A dead letter the store refuses is retried with backoff while the broker
// runs: a store that recovers gets it, and nothing is counted as lost.
func TestDeadLetterPutIsRetried(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var buf lockedBuffer
		store := &flakyStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), fails: 5}
		b := newTestBroker(t, WithDeadLetterStore(store), WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}),
			WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return errBoom })
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		settle(t, b)
		assert.Equal(t, 10*time.Millisecond*(1+2+4+8+16), time.Since(start), "five retries, backing off")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(1), ss.DeadLettered)
		assert.Zero(t, ss.DeadLetterErrors)
		require.Len(t, deadLetters(t, b), 1)
		assert.Contains(t, buf.String(), "retrying")
		requireConserved(t, b.Stats())
	})
}

// flakyStore refuses the first fails Puts.
type flakyStore struct {
	*MemoryDeadLetterStore
	mu    sync.Mutex
	fails int
}

func (s *flakyStore) Put(ctx context.Context, dl DeadLetter) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails > 0 {
		s.fails--
		return errBoom
	}
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

// failingStore refuses every Put.
type failingStore struct{ *MemoryDeadLetterStore }

func (failingStore) Put(context.Context, DeadLetter) error { return errBoom }

// A dead letter the store keeps refusing is given up only at Close's (or
// Unsubscribe's) deadline: counted in DeadLettered and DeadLetterErrors,
// logged at Error level with every field, reported to the Observer with
// the error, and returned as lost in the stop's DrainError.
func TestDeadLetterStoreErrorsAreCountedAndLogged(t *testing.T) {
	for _, stop := range []string{"Close", "Unsubscribe"} {
		t.Run(stop, func(t *testing.T) { testDeadLetterStoreErrors(t, stop) })
	}
}

func testDeadLetterStoreErrors(t *testing.T, stop string) {
	bubble(t, func(t *testing.T) {
		var buf bytes.Buffer
		var mu = new(syncMutex)
		logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu.Mutex}, nil))
		var events []DeadLetterEvent
		obs := &funcObserver{deadLettered: func(e DeadLetterEvent) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}}
		b := newTestBroker(t, WithDeadLetterStore(failingStore{NewMemoryDeadLetterStore(0, nil)}),
			WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}), WithLogger(logger), WithObserver(obs))
		sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return errBoom })
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Key: "k1"}))
		time.Sleep(time.Minute)
		idle()
		ss := subStats(t, b, "t", "s")
		assert.Zero(t, ss.DeadLettered, "still retrying the Put while the broker runs")
		assert.Equal(t, 1, ss.InFlight)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var stopErr error
		reason := ReasonShutdown
		if stop == "Close" {
			stopErr = b.Close(ctx)
		} else {
			stopErr, reason = sub.Unsubscribe(ctx), ReasonUnsubscribed
		}
		var de *DrainError
		require.ErrorAs(t, stopErr, &de, "the message was lost: the stop must say so")
		assert.Equal(t, DrainError{Reason: reason, Lost: 1, Err: context.DeadlineExceeded}, *de,
			"no %s dead letter: the message was dead-lettered (exhausted), its Put given up", reason)
		assert.ErrorIs(t, stopErr, context.DeadlineExceeded)
		assert.Contains(t, stopErr.Error(), "1 dead letters lost")
		ss = subStats(t, b, "t", "s")
		assert.Equal(t, uint64(1), ss.DeadLettered)
		assert.Equal(t, uint64(1), ss.DeadLetterErrors)
		requireConserved(t, b.Stats())
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, events, 1)
		assert.ErrorIs(t, events[0].StoreErr, errBoom)
		for _, want := range []string{"level=ERROR", "store_error=boom", "message_id=m", "key=k1", "subscriber=s", "error_code=error", "reason=exhausted", "published_at="} {
			assert.Contains(t, buf.String(), want)
		}
	})
}

// refusingStore refuses every Put for good (ErrDeadLetterRefused), and
// counts the calls.
type refusingStore struct {
	*MemoryDeadLetterStore
	puts atomic.Int64
}

func (s *refusingStore) Put(context.Context, DeadLetter) error {
	s.puts.Add(1)
	return fmt.Errorf("%w: too large", ErrDeadLetterRefused)
}

// A Put refused for good is not retried: the worker goes on at once, the
// dead letter is counted as an error and logged with every field.
func TestDeadLetterRefusedForGoodIsNotRetried(t *testing.T) {
	bubble(t, func(t *testing.T) {
		store := &refusingStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil)}
		b := newTestBroker(t, WithDeadLetterStore(store))
		c := &calls{}
		_, err := b.Subscribe("t", "s", recording(c, func(m Message) error {
			if m.ID == "bad" {
				return Permanent(errBoom)
			}
			return nil
		}))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t", Key: "k"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "next", Topic: "t", Key: "k"}))
		settle(t, b)
		assert.Equal(t, int64(1), store.puts.Load(), "not retried")
		assert.Equal(t, []string{"bad", "next"}, c.ids(), "the key was not held")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(1), ss.DeadLettered)
		assert.Equal(t, uint64(1), ss.DeadLetterErrors)
		requireConserved(t, b.Stats())
		assert.NoError(t, b.Close(context.Background()), "a loss before the stop is not the stop's (DrainError.Lost)")
	})
}

// The store against a model (a slice in Put order): puts of new and
// existing IDs, deletes, evictions and the ring's compaction, checked after
// every operation through List, Get and Len.
func TestMemoryDeadLetterStoreAgainstModel(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		capacity := 1 + rng.IntN(100)
		s := NewMemoryDeadLetterStore(capacity, discard)
		var model []DeadLetter
		remove := func(id string) {
			for i, dl := range model {
				if dl.ID == id {
					model = append(model[:i], model[i+1:]...)
					return
				}
			}
		}
		evicted := uint64(0)
		for step := range 3000 {
			id := fmt.Sprint("dl-", rng.IntN(3*capacity))
			switch op := rng.IntN(10); {
			case op < 6: // put (new or replacing)
				dl := DeadLetter{ID: id, Subscriber: fmt.Sprint(step), Message: Message{Topic: "t"}}
				require.NoError(t, s.Put(ctx, dl))
				found := false
				for _, m := range model {
					found = found || m.ID == id
				}
				remove(id)
				if !found && len(model) == capacity {
					model, evicted = model[1:], evicted+1
				}
				model = append(model, dl)
			default: // delete, sometimes many at once
				ids := []string{id}
				if op == 9 {
					for range rng.IntN(capacity) {
						ids = append(ids, fmt.Sprint("dl-", rng.IntN(3*capacity)))
					}
				}
				require.NoError(t, s.Delete(ctx, ids...))
				for _, id := range ids {
					remove(id)
				}
			}
			got, err := s.List(ctx, DeadLetterFilter{})
			require.NoError(t, err)
			if len(model) == 0 {
				require.Empty(t, got, "seed %d step %d", seed, step)
			} else {
				require.Equal(t, model, got, "seed %d step %d", seed, step)
			}
			n, _ := s.Len(ctx)
			require.Equal(t, len(model), n)
			if len(model) > 0 {
				want := model[rng.IntN(len(model))]
				dl, ok, _ := s.Get(ctx, want.ID)
				require.True(t, ok)
				require.Equal(t, want, dl)
			}
			require.LessOrEqual(t, s.ring.Len(), 2*capacity+65, "holes are dropped")
		}
		require.Equal(t, evicted, s.Evicted())
	}
}

// BenchmarkMemoryDeadLetterStorePutFull is a Put into a full default-sized
// store, as under a subscriber that fails or sheds every message: a new
// ID, and the oldest dead letter evicted.
func BenchmarkMemoryDeadLetterStorePutFull(b *testing.B) {
	s := NewMemoryDeadLetterStore(DefaultDeadLetterCapacity, nil)
	ctx := context.Background()
	msg := Message{ID: "m", Topic: "t", Payload: make([]byte, 64), PublishedAt: time.Now()}
	ids := make([]string, 4*DefaultDeadLetterCapacity)
	for i := range ids {
		ids[i] = fmt.Sprint("dl-", i)
	}
	i := 0
	for b.Loop() {
		if err := s.Put(ctx, DeadLetter{ID: ids[i%len(ids)], Message: msg, Subscriber: "s", Reason: ReasonOverflow}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stops that meet (found by a randomized black-box test): Close and an
// Unsubscribe of one subscription, in either order or at once, and a
// Redrive waiting for room while its subscriber stops at once. Whatever
// returns last, nothing of the subscription happens after a stop returned
// (no dead letter, no event, nothing in flight), and each DrainError counts
// exactly the dead letters with its reason.

// stopRig is one subscription of four messages of one key, whose handlers
// take 20 ms or end with their context, and counts its events.
type stopRig struct {
	b      *Broker
	sub    *Subscription
	events atomic.Int64 // Attempted and DeadLettered
}

// slowPutStore stores each dead letter after d (a remote store).
type slowPutStore struct {
	*MemoryDeadLetterStore
	d time.Duration
}

func (s slowPutStore) Put(ctx context.Context, dl DeadLetter) error {
	time.Sleep(s.d)
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

func newStopRig(t *testing.T, opts ...Option) *stopRig {
	r := &stopRig{}
	obs := &funcObserver{
		attempted:    func(AttemptEvent) { r.events.Add(1) },
		deadLettered: func(DeadLetterEvent) { r.events.Add(1) },
	}
	var err error
	r.b, err = New(append([]Option{WithLogger(discard), WithObserver(obs)}, opts...)...)
	require.NoError(t, err)
	r.sub, err = r.b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
			return nil
		}
	})
	require.NoError(t, err)
	for _, id := range []string{"a", "b", "c", "d"} {
		require.NoError(t, r.b.Publish(context.Background(), Message{ID: id, Topic: "t", Key: "k"}))
	}
	return r
}

// quiet checks that the subscription is done: nothing in flight or
// queued, and no event after now.
func (r *stopRig) quiet(t *testing.T, who string) {
	t.Helper()
	ss := r.b.Stats().Topics["t"].Subscribers["s"]
	assert.Zero(t, ss.InFlight+ss.Queued, "%s returned with messages in flight or queued", who)
	n := r.events.Load()
	time.Sleep(time.Second)
	idle()
	assert.Equal(t, n, r.events.Load(), "events after %s returned", who)
}

// within5ms starts stop with a context of 5 ms and returns what it will
// return.
func within5ms(stop func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		done <- stop(ctx)
	}()
	return done
}

func TestCloseAndUnsubscribeTogether(t *testing.T) {
	t.Run("Unsubscribe at once, then Close", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			// The Unsubscribe's dead letters take 10 ms each to store: Close
			// returns only after them.
			r := newStopRig(t, WithDeadLetterStore(slowPutStore{NewMemoryDeadLetterStore(0, nil), 10 * time.Millisecond}))
			idle()
			done := within5ms(r.sub.Unsubscribe)
			idle() // Unsubscribe waits for its deadline
			require.NoError(t, r.b.Close(context.Background()), "Close waited for the Unsubscribe begun before it")
			r.quiet(t, "Close")
			var de *DrainError
			require.ErrorAs(t, <-done, &de)
			assert.Equal(t, ReasonUnsubscribed, de.Reason)
			assert.Equal(t, 4, de.DeadLettered)
			requireConserved(t, r.b.Stats())
		})
	})
	t.Run("Close at once, then Unsubscribe", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			// Close's dead letters take 10 ms each to store: the Unsubscribe
			// returns only after them.
			r := newStopRig(t, WithDeadLetterStore(slowPutStore{NewMemoryDeadLetterStore(0, nil), 10 * time.Millisecond}))
			idle()
			done := within5ms(r.b.Close)
			idle() // Close waits for its deadline
			// Close's deadline passes while it waits: Close dead-letters the
			// subscription's messages, and Unsubscribe returns after that.
			require.NoError(t, r.sub.Unsubscribe(context.Background()), "nothing dead-lettered with its reason")
			r.quiet(t, "Unsubscribe")
			var de *DrainError
			require.ErrorAs(t, <-done, &de)
			assert.Equal(t, DrainError{Reason: ReasonShutdown, DeadLettered: 4, Err: context.DeadlineExceeded}, *de)
			requireConserved(t, r.b.Stats())
		})
	})
	t.Run("at the same time", func(t *testing.T) {
		for i := range 100 {
			for _, mode := range []struct{ closeFirst, storeDown bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
				closeFirst := mode.closeFirst
				bubble(t, func(t *testing.T) {
					var opts []Option
					if mode.storeDown { // every dead letter of the stops is lost, once
						opts = append(opts, WithDeadLetterStore(&downStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil)}))
					}
					r := newStopRig(t, opts...)
					short, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
					defer cancel()
					unsubCtx, closeCtx := short, context.Background()
					if closeFirst {
						unsubCtx, closeCtx = context.Background(), short
					}
					unsubbed := make(chan error, 1)
					go func() { unsubbed <- r.sub.Unsubscribe(unsubCtx) }()
					closeErr := r.b.Close(closeCtx)
					ss := r.b.Stats().Topics["t"].Subscribers["s"]
					if ss.InFlight+ss.Queued != 0 {
						t.Errorf("run %d: Close returned %v with %d in flight, %d queued", i, closeErr, ss.InFlight, ss.Queued)
					}
					unsubErr := <-unsubbed
					n := r.events.Load()
					time.Sleep(time.Second)
					idle()
					if r.events.Load() != n {
						t.Errorf("run %d: events after both stops returned", i)
					}
					var counted, lost int // Close's shutdown dead letters and the Unsubscribe's own
					var de *DrainError
					if errors.As(closeErr, &de) {
						counted += de.DeadLettered
						lost += de.Lost
					}
					if errors.As(unsubErr, &de) && de.Reason == ReasonUnsubscribed { // else Close's result
						counted += de.DeadLettered
						lost += de.Lost
					}
					ss = r.b.Stats().Topics["t"].Subscribers["s"]
					if uint64(counted) != ss.DeadLettered {
						t.Errorf("run %d: the stops counted %d dead letters (Close: %v; Unsubscribe: %v), Stats %d", i, counted, closeErr, unsubErr, ss.DeadLettered)
					}
					if uint64(lost) != ss.DeadLetterErrors {
						t.Errorf("run %d: the stops counted %d lost (Close: %v; Unsubscribe: %v), Stats %d", i, lost, closeErr, unsubErr, ss.DeadLetterErrors)
					}
					requireConserved(t, r.b.Stats())
				})
			}
		}
	})
}

// A Redrive waiting for room in a full lane when its subscriber stops at
// once leaves the dead letter in the store and says the subscriber stopped
// (before: the redriven copy was dead-lettered again on Redrive's
// goroutine, uncounted in the Unsubscribe's DrainError, and Redrive could
// return an error wrapping nil).
func TestRedriveWhileItsSubscriberStopsAtOnce(t *testing.T) {
	for i := range 50 {
		bubble(t, func(t *testing.T) {
			b := newTestBroker(t, WithPublishTimeout(time.Second))
			slow := func(ctx context.Context, m Message) error {
				if m.ID == "bad" {
					return Permanent(errors.New("bad"))
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(100 * time.Millisecond):
					return nil
				}
			}
			_, err := b.Subscribe("t", "blocker", func(ctx context.Context, m Message) error {
				if m.ID == "bad" {
					return nil
				}
				return slow(ctx, m)
			}, LaneSize(1))
			require.NoError(t, err)
			sub, err := b.Subscribe("t", "s", slow, LaneSize(1))
			require.NoError(t, err)
			require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
			idle()
			dls := deadLetters(t, b)
			require.Len(t, dls, 1)
			publishN(t, b, "t", "m", 3)
			idle() // m-0 runs at both, m-1 fills both lanes, the dispatcher waits on blocker with m-2
			var n int
			var rerr error
			redriven := make(chan struct{})
			go func() {
				defer close(redriven)
				n, rerr = b.Redrive(context.Background(), dls[0].ID)
			}()
			idle() // Redrive waits for room in s's lane
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			uerr := sub.Unsubscribe(ctx)
			cancel()
			<-redriven
			if n == 0 {
				require.ErrorIs(t, rerr, ErrSubscriberNotFound, fmt.Sprint("run ", i))
				_, kept, err := b.DeadLetters().Get(context.Background(), dls[0].ID)
				require.NoError(t, err)
				assert.True(t, kept, "the dead letter stays in the store")
			}
			unsubscribed := 0
			for _, dl := range deadLetters(t, b) {
				if dl.Reason == ReasonUnsubscribed {
					unsubscribed++
				}
			}
			var de *DrainError
			require.ErrorAs(t, uerr, &de)
			assert.Equal(t, unsubscribed, de.DeadLettered, "run %d: every unsubscribed dead letter counted", i)
		})
	}
}

// A retry found delivered when it comes back (another copy of its ID ran
// meanwhile) is deduplicated: its Attempted event has Attempt 0, as every
// deduplicated one.
func TestDeduplicatedRetryEventHasAttemptZero(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var events []AttemptEvent
		obs := &funcObserver{attempted: func(e AttemptEvent) { events = append(events, e) }}
		b := newTestBroker(t, WithObserver(obs),
			WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(time.Second)}))
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			if string(m.Payload) == "fail" && m.Attempt == 1 {
				return errors.New("fail once")
			}
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t", Payload: []byte("fail")}))
		idle() // x parks for its retry, holding nothing (keyless)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t"}))
		idle() // the copy is delivered
		time.Sleep(2 * time.Second)
		idle() // the retry comes back: x is delivered already
		var got []string
		for _, e := range events {
			got = append(got, fmt.Sprintf("%s#%d", e.Outcome, e.Attempt))
		}
		assert.Equal(t, []string{"retry#1", "delivered#1", "deduplicated#0"}, got)
	})
}

package broker

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// This file tests the stop's one deadline: whatever plugged-in code does,
// Close and Unsubscribe return by their ctx plus ShutdownGrace (most of it
// for the handlers, the rest for the dead letters of what the stop
// abandoned), with what they gave up on counted once in the *DrainError.

// stuckStore is a dead-letter store whose Put never returns until release
// is closed, whatever its ctx says.
type stuckStore struct {
	*MemoryDeadLetterStore
	release <-chan struct{}
}

func (s stuckStore) Put(context.Context, DeadLetter) error {
	<-s.release
	return errBoom
}

// stuckDedup is an idempotency store whose Seen never returns until
// release is closed.
type stuckDedup struct{ release <-chan struct{} }

func (d stuckDedup) Seen(context.Context, DeliveryKey) (bool, error) {
	<-d.release
	return false, nil
}

func (d stuckDedup) Record(context.Context, DeliveryKey) error { return nil }

// stuckRecord is an idempotency store whose Record never returns until
// release is closed.
type stuckRecord struct{ release <-chan struct{} }

func (stuckRecord) Seen(context.Context, DeliveryKey) (bool, error) { return false, nil }

func (d stuckRecord) Record(context.Context, DeliveryKey) error {
	<-d.release
	return nil
}

// runningWorkers is how many worker goroutines of s still run (abandoned
// ones included: each drops itself when it returns).
func runningWorkers(s *Subscription) int {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return len(s.ws)
}

// stuckObserver's Attempted never returns until release is closed.
type stuckObserver struct {
	NopObserver
	release <-chan struct{}
}

func (o stuckObserver) Attempted(AttemptEvent) { <-o.release }

// Each plugged-in call below never returns (it ignores its ctx) while the
// broker runs: one message is stuck in it, two more wait behind it. The
// stop returns by its deadline, counts the stuck call as abandoned, and
// accounts for all three messages; once the call returns, nothing is
// counted twice.
func TestStopEndsByItsDeadlineWhateverPluginsDo(t *testing.T) {
	plugs := []struct {
		name    string
		opts    func(release chan struct{}) []Option
		sub     func(release chan struct{}) []SubscribeOption
		handler Handler
		// The DrainError's counts: calls given up on (the stuck one at the
		// grace; at the deadline, the stop's two calls to end m-1 and m-2,
		// then m-0, stuck in the same store), dead letters with the stop's
		// reason, and those no store took.
		abandoned, dead, lost int
	}{
		{"dead-letter store Put", func(r chan struct{}) []Option {
			return []Option{WithDeadLetterStore(stuckStore{NewMemoryDeadLetterStore(0, nil), r})}
		}, nil, func(context.Context, Message) error { return Permanent(errBoom) }, 3, 3, 3},
		{"idempotency store Seen", func(r chan struct{}) []Option {
			return []Option{WithIdempotencyStore(stuckDedup{r})}
		}, nil, func(context.Context, Message) error { return nil }, 3, 3, 3},
		// m-0's handler returned, but its delivery never ended (Record
		// did not return): it is dead-lettered with the others.
		{"idempotency store Record", func(r chan struct{}) []Option {
			return []Option{WithIdempotencyStore(stuckRecord{r})}
		}, nil, func(context.Context, Message) error { return nil }, 1, 3, 0},
		// m-0 was delivered: its worker is stuck in the event after.
		{"observer hook", func(r chan struct{}) []Option {
			return []Option{WithObserver(stuckObserver{release: r})}
		}, nil, func(context.Context, Message) error { return nil }, 1, 2, 0},
		{"middleware", nil, func(r chan struct{}) []SubscribeOption {
			return []SubscribeOption{WithSubscriberMiddleware(func(_ SubscriberInfo, next Handler) Handler {
				return func(ctx context.Context, m Message) error {
					<-r
					return next(ctx, m)
				}
			})}
		}, func(context.Context, Message) error { return nil }, 1, 3, 0},
	}
	for _, p := range plugs {
		for _, viaClose := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/close=%v", p.name, viaClose), func(t *testing.T) {
				bubble(t, func(t *testing.T) {
					release := make(chan struct{})
					var opts []Option
					if p.opts != nil {
						opts = p.opts(release)
					}
					var subOpts []SubscribeOption
					if p.sub != nil {
						subOpts = p.sub(release)
					}
					var lines logLines
					b := newTestBroker(t, append(opts, WithLogger(slog.New(&lines)))...)
					sub, err := b.Subscribe("t", "s", p.handler, subOpts...)
					require.NoError(t, err)
					publishN(t, b, "t", "m", 1)
					idle()
					for _, id := range []string{"m-1", "m-2"} { // in the lane, behind m-0
						require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
					}
					time.Sleep(time.Hour) // the call is stuck while the broker runs
					idle()

					stop := sub.Unsubscribe
					if viaClose {
						stop = b.Close
					}
					start := time.Now()
					de := stopWithin(t, time.Second, stop)
					assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace, "returned by the stop's deadline")
					assert.Equal(t, p.abandoned, de.Abandoned, "each call given up on, once")
					assert.Equal(t, p.dead, de.DeadLettered, "every message not delivered ended at the stop")
					assert.Equal(t, p.lost, de.Lost)
					assert.Len(t, lines.matching("WARN", "had not returned in the handlers' part of ShutdownGrace", "subscriber=s", "message_id=m-0"), 1, "the grace's abandonment, logged")
					if p.lost > 0 {
						assert.NotEmpty(t, lines.matching("ERROR", "deadline passed", "subscriber=s"), "the deadline's, logged")
					}
					st := subStats(t, b, "t", "s")
					assert.Equal(t, uint64(3), st.Delivered+st.DeadLettered+st.Deduplicated, "each message ended once: %+v", st)
					assert.Equal(t, 1, runningWorkers(sub), "the abandoned worker runs until its call returns")

					close(release) // the abandoned call returns: it is ignored
					idle()
					assert.Zero(t, runningWorkers(sub), "the worker dropped itself when it returned")
					st = subStats(t, b, "t", "s")
					assert.Equal(t, uint64(3), st.Delivered+st.DeadLettered+st.Deduplicated, "nothing counted twice: %+v", st)
					requireConserved(t, b.Stats())
					if !viaClose {
						require.NoError(t, b.Close(context.Background()))
					}
				})
			})
		}
	}
}

// When Close's ctx ends first, Close cuts the subscription off and owns
// its counts; an Unsubscribe called then returns once Close has ended it,
// by Close's deadline, with nothing of its own: the abandoned calls and
// the dead letters no store took count once, in Close's DrainError.
func TestCloseCutsOffFirstThenUnsubscribeCountsInCloseOnly(t *testing.T) {
	bubble(t, func(t *testing.T) {
		release := make(chan struct{})
		b := newTestBroker(t, WithDeadLetterStore(stuckStore{NewMemoryDeadLetterStore(0, nil), release}))
		sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
		require.NoError(t, err)
		publishN(t, b, "t", "m", 3) // m-0 stuck in Put, m-1 and m-2 behind it in the worker's batch
		idle()
		start := time.Now()
		closed := make(chan *DrainError, 1)
		go func() { closed <- stopWithin(t, time.Second, b.Close) }()
		time.Sleep(time.Second + ShutdownGrace/10) // Close's ctx ended: it cut the subscription off
		require.NoError(t, sub.Unsubscribe(context.Background()), "Close's counts, not the Unsubscribe's")
		assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace, "returned by Close's deadline")
		de := <-closed
		assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace)
		// Abandoned: the worker (at the handlers' part of the grace), then
		// the cutter of its batch, stuck in m-0's Put again (at the
		// deadline), and the lane's cutter too if the worker took m-0
		// alone (m-1 and m-2 still queued when the stop cut the lane).
		assert.Contains(t, []int{2, 3}, de.Abandoned)
		de.Abandoned = 0
		assert.Equal(t, DrainError{Reason: ReasonShutdown, DeadLettered: 3, Lost: 3, Err: context.DeadlineExceeded}, *de)
		close(release)
		idle()
		st := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(3), st.DeadLettered, "each message ended once: %+v", st)
		assert.Equal(t, uint64(3), st.DeadLetterErrors)
		requireConserved(t, b.Stats())
	})
}

// When an Unsubscribe's ctx ends first, it owns the subscription's counts,
// and a Close without a deadline called meanwhile returns once that
// Unsubscribe has ended it (by its deadline), though the handler it
// abandoned never returns; Close counts nothing of it.
func TestUnsubscribeCutsOffFirstThenCloseWaitsForIt(t *testing.T) {
	bubble(t, func(t *testing.T) {
		release := make(chan struct{})
		b := newTestBroker(t)
		sub, err := b.Subscribe("t", "s", func(context.Context, Message) error {
			<-release // ignores its context
			return nil
		})
		require.NoError(t, err)
		publishN(t, b, "t", "m", 2) // m-0 runs, m-1 waits
		idle()
		start := time.Now()
		unsubbed := make(chan *DrainError, 1)
		go func() { unsubbed <- stopWithin(t, time.Second, sub.Unsubscribe) }()
		time.Sleep(time.Second + ShutdownGrace/10) // the Unsubscribe cut the subscription off
		require.NoError(t, b.Close(context.Background()), "the Unsubscribe's counts, not Close's")
		assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace, "returned by the Unsubscribe's deadline")
		de := <-unsubbed
		assert.Equal(t, DrainError{Reason: ReasonUnsubscribed, DeadLettered: 2, Abandoned: 1, Err: context.DeadlineExceeded}, *de)
		close(release)
		idle()
		requireConserved(t, b.Stats())
	})
}

// A stop that abandoned a call says so, though every message was
// delivered: the one message's worker is stuck in the Observer's event
// after its delivery.
func TestStopThatOnlyAbandonedSaysSo(t *testing.T) {
	for _, viaClose := range []bool{true, false} {
		t.Run(fmt.Sprintf("close=%v", viaClose), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				release := make(chan struct{})
				b := newTestBroker(t, WithObserver(stuckObserver{release: release}))
				sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return nil })
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1)
				idle()
				stop, reason := sub.Unsubscribe, ReasonUnsubscribed
				if viaClose {
					stop, reason = b.Close, ReasonShutdown
				}
				de := stopWithin(t, time.Second, stop)
				assert.Equal(t, DrainError{Reason: reason, Abandoned: 1, Err: context.DeadlineExceeded}, *de)
				close(release)
				idle()
				if !viaClose {
					require.NoError(t, b.Close(context.Background()))
				}
			})
		})
	}
}

// countingSlowStore stores each dead letter after d (an honest, slow
// remote store) and counts the Puts.
type countingSlowStore struct {
	*MemoryDeadLetterStore
	d    time.Duration
	puts *atomic.Int64
}

func (s countingSlowStore) Put(ctx context.Context, dl DeadLetter) error {
	time.Sleep(s.d)
	s.puts.Add(1)
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

// Messages still in the topic queue when a stop's ctx ends are the stop's:
// Close counts every one of them in its DrainError (stored, or lost at its
// deadline), and no dead letter of theirs is written after it returned but
// the one a Put given up on was storing. (The dispatcher used to
// dead-letter them itself, one Put at a time, uncounted, after Close.)
func TestCloseCountsTheQueuedMessagesItCutOff(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var puts atomic.Int64
		b := newTestBroker(t, WithQueueSize(64),
			WithDeadLetterStore(countingSlowStore{NewMemoryDeadLetterStore(0, nil), 10 * time.Millisecond, &puts}))
		_, err := b.Subscribe("t", "s", blockUntilCancelled, LaneSize(1))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 60) // m-0 runs, m-1 in the lane, the rest in the topic queue
		idle()
		start := time.Now()
		de := stopWithin(t, time.Second, b.Close)
		assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace, "returned by its deadline")
		atClose := puts.Load()
		require.NotNil(t, de)
		assert.Equal(t, 60, de.DeadLettered, "every message Close cut off is in its DrainError")
		// Each stored before Close returned or counted lost; the Put given
		// up on at the deadline may land at that same instant (it is lost
		// to the stop, and the store has it).
		assert.GreaterOrEqual(t, int(atClose)+de.Lost, 60, "each stored before Close returned, or counted lost")
		assert.LessOrEqual(t, int(atClose)+de.Lost, 61, "only the Put given up on at the deadline counts both ways")
		time.Sleep(10 * time.Second)
		idle()
		assert.LessOrEqual(t, puts.Load(), atClose+1, "no dead letter after Close returned but the Put it gave up on")
	})
}

// gateStore's Put does not return while stuck, until release is closed.
type gateStore struct {
	*MemoryDeadLetterStore
	release <-chan struct{}
	stuck   atomic.Bool
}

func (s *gateStore) Put(ctx context.Context, dl DeadLetter) error {
	if s.stuck.Load() {
		<-s.release
	}
	return s.MemoryDeadLetterStore.Put(ctx, dl)
}

// A shedder stuck in a Put at a stop's deadline is given up on like a
// cutter: counted abandoned, its message lost, nothing left in flight.
func TestStopGivesUpOnAStuckShedder(t *testing.T) {
	for _, viaClose := range []bool{true, false} {
		t.Run(map[bool]string{true: "close", false: "unsubscribe"}[viaClose], func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				release := make(chan struct{})
				store := &gateStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), release: release}
				b := newTestBroker(t, WithDeadLetterStore(store))
				sub, err := b.Subscribe("t", "s", blockUntilCancelled, LaneSize(1), WhenLaneFull(DeadLetterNewest))
				require.NoError(t, err)
				store.stuck.Store(true)
				publishN(t, b, "t", "m", 3) // m-0 runs, m-1 waits in the lane, m-2 is shed: the shedder's Put does not return
				idle()
				start := time.Now()
				stop := sub.Unsubscribe
				if viaClose {
					stop = b.Close
				}
				de := stopWithin(t, time.Second, stop)
				assert.LessOrEqual(t, time.Since(start), time.Second+ShutdownGrace)
				st := subStats(t, b, "t", "s")
				// m-0's handler returns when cancelled, and its worker's Put
				// sticks: abandoned at the handlers' part of the grace, m-0
				// goes to a cutter; m-0's and m-1's cutters and the shedder
				// are stuck in Put at the deadline.
				assert.Equal(t, 4, de.Abandoned, "the worker, two cutters and the shedder, given up on")
				assert.Equal(t, 3, de.Lost, "m-0, m-1 and the shed m-2")
				assert.Zero(t, st.InFlight, "nothing in flight once the stop returned")
				requireConserved(t, b.Stats())
				close(release)
				idle()
				requireConserved(t, b.Stats())
				if !viaClose {
					require.NoError(t, b.Close(context.Background()))
				}
			})
		})
	}
}

// A cutter whose dead-letter event hook does not return stops counting its
// message as in flight when the dead letter is counted, before the hook:
// a stop that gives up on it leaves nothing in flight, and conservation
// holds.
func TestCutterHookStuckKeepsConservation(t *testing.T) {
	bubble(t, func(t *testing.T) {
		release := make(chan struct{})
		obs := &funcObserver{deadLettered: func(DeadLetterEvent) { <-release }}
		b := newTestBroker(t, WithObserver(obs))
		_, err := b.Subscribe("t", "s", blockUntilCancelled)
		require.NoError(t, err)
		publishN(t, b, "t", "m", 3)
		idle()
		stopWithin(t, 10*time.Millisecond, b.Close)
		st := subStats(t, b, "t", "s")
		assert.Zero(t, st.InFlight, "nothing in flight once Close returned")
		assert.Equal(t, st.Routed, st.Delivered+st.Deduplicated+st.DeadLettered+uint64(st.Queued+st.InFlight), "%+v", st)
		close(release)
		idle()
		requireConserved(t, b.Stats())
	})
}

// A cutter ended by runtime.Goexit (in a dead letter's event hook) hands
// the messages it had not ended to another: every message a stop cut off
// is dead-lettered and counted.
func TestCutterGoexitHandsOverTheRest(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var once atomic.Bool
		obs := &funcObserver{deadLettered: func(e DeadLetterEvent) {
			if e.DeadLetter.Message.ID != "m-0" && once.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
		}}
		b := newTestBroker(t, WithObserver(obs))
		_, err := b.Subscribe("t", "s", blockUntilCancelled)
		require.NoError(t, err)
		publishN(t, b, "t", "m", 1)
		idle()
		for i := 1; i < 4; i++ { // queued behind m-0: one cutter takes the three
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
		}
		idle()
		de := stopWithin(t, 10*time.Millisecond, b.Close)
		idle()
		require.NotNil(t, de)
		assert.Equal(t, 4, de.DeadLettered)
		ss := subStats(t, b, "t", "s")
		assert.EqualValues(t, 4, ss.DeadLettered)
		assert.Zero(t, ss.InFlight)
		assert.Len(t, deadLetters(t, b), 4)
		requireConserved(t, b.Stats())
	})
}

// A shedder an Unsubscribe gave up on, still stuck in Put, is not waited
// for again: a later Close without a deadline returns.
func TestCloseAfterUnsubscribeGaveUpOnAStuckShedder(t *testing.T) {
	bubble(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		store := &gateStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil), release: release}
		b := newTestBroker(t, WithDeadLetterStore(store))
		sub, err := b.Subscribe("t", "s", blockUntilCancelled, LaneSize(1), WhenLaneFull(DeadLetterNewest))
		require.NoError(t, err)
		store.stuck.Store(true)
		publishN(t, b, "t", "m", 3) // m-2 is shed: the shedder's Put does not return
		idle()
		de := stopWithin(t, time.Second, sub.Unsubscribe)
		require.Equal(t, 4, de.Abandoned, "the worker, two cutters and the shedder, given up on")
		closed := make(chan error, 1)
		go func() { closed <- b.Close(context.Background()) }()
		time.Sleep(time.Minute)
		select {
		case err := <-closed:
			assert.NoError(t, err, "the stuck shedder was the Unsubscribe's to count")
		default:
			t.Fatal("Close waits for a shedder an Unsubscribe gave up on")
		}
		requireConserved(t, b.Stats())
	})
}

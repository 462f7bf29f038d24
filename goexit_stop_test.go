package broker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockingDeadLetterEvent is an Observer whose attempt event for a dead
// letter blocks until release is closed.
type blockingDeadLetterEvent struct {
	NopObserver
	release chan struct{}
}

func (o *blockingDeadLetterEvent) Attempted(e AttemptEvent) {
	if e.Outcome == OutcomeDeadLettered {
		<-o.release // outlives the stop's deadline
	}
}

// TestGoexitThenAbandonedHook: a handler that calls runtime.Goexit when a
// stop cancels it has its message dead-lettered by the worker's deferred
// recovery; when the Observer hook of that dead letter outlives the stop's
// deadline, the stop abandons the worker there, and the worker, once the
// hook returns, records nothing more and starts no replacement (before, it
// ended the message a second time and closed the subscription's done
// channel twice: a crash).
func TestGoexitThenAbandonedHook(t *testing.T) {
	bubble(t, func(t *testing.T) {
		o := &blockingDeadLetterEvent{release: make(chan struct{})}
		b := newTestBroker(t, WithObserver(o))
		_, err := b.Subscribe("t", "s", func(ctx context.Context, _ Message) error {
			<-ctx.Done()
			runtime.Goexit()
			return nil
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "a", Topic: "t"}))
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		var de *DrainError
		require.ErrorAs(t, b.Close(ctx), &de)
		assert.Equal(t, 1, de.Abandoned, "the hook the stop gave up on")
		close(o.release)
		idle()
		time.Sleep(time.Second) // anything the worker still did would show now
		idle()
		st := b.Stats().Topics["t"].Subscribers["s"]
		assert.Equal(t, st.Routed, st.Delivered+st.Deduplicated+st.DeadLettered+uint64(st.Queued+st.InFlight), "conservation: %+v", st)
		assert.Equal(t, uint64(1), st.DeadLettered, "%+v", st)
	})
}

// An Observer hook that calls runtime.Goexit after its message ended (the
// delivered attempt's event, a dead letter's event) ends the worker, not
// the message a second time: the message is handed back ended, the next
// one runs, and conservation holds.
func TestGoexitInAnEventAfterTheMessageEnded(t *testing.T) {
	tests := []struct {
		name    string
		fail    bool
		observe func(o *funcObserver, exit func())
	}{
		{"delivered", false, func(o *funcObserver, exit func()) {
			o.attempted = func(e AttemptEvent) {
				if e.Outcome == OutcomeDelivered {
					exit()
				}
			}
		}},
		{"dead-lettered", true, func(o *funcObserver, exit func()) {
			o.deadLettered = func(DeadLetterEvent) { exit() }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var once atomic.Bool
				obs := &funcObserver{}
				tc.observe(obs, func() {
					if once.CompareAndSwap(false, true) {
						runtime.Goexit()
					}
				})
				b := newTestBroker(t, WithObserver(obs), WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
				var c calls
				_, err := b.Subscribe("t", "s", recording(&c, func(Message) error {
					if tc.fail {
						return errors.New("boom")
					}
					return nil
				}), Ordered())
				require.NoError(t, err)
				publishN(t, b, "t", "m", 2)
				settle(t, b)
				requireConserved(t, b.Stats())
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, []string{"m-0", "m-1"}, c.ids(), "each message runs once, in order")
				assert.EqualValues(t, 2, ss.Attempts)
				if tc.fail {
					assert.EqualValues(t, 2, ss.DeadLettered)
				} else {
					assert.EqualValues(t, 2, ss.Delivered)
				}
			})
		})
	}
}

// A Goexit in the event of a failed attempt that will be retried parks the
// message as decided: the attempt counts once, and a hook that does it on
// every retry event costs no message (each worker it ends is replaced).
func TestGoexitInARetryEvent(t *testing.T) {
	for _, always := range []bool{false, true} {
		t.Run(fmt.Sprint("always=", always), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var n atomic.Int32
				obs := &funcObserver{attempted: func(e AttemptEvent) {
					if e.Outcome == OutcomeRetry && (always || n.Add(1) == 1) {
						runtime.Goexit()
					}
				}}
				b := newTestBroker(t, WithObserver(obs))
				var c calls
				var fails atomic.Int32
				_, err := b.Subscribe("t", "s", recording(&c, func(m Message) error {
					if m.ID == "m-0" && fails.Add(1) == 1 {
						return errors.New("boom")
					}
					return nil
				}), Ordered())
				require.NoError(t, err)
				publishN(t, b, "t", "m", 3)
				settle(t, b)
				ss := subStats(t, b, "t", "s")
				assert.EqualValues(t, 3, ss.Delivered, "every message delivered")
				assert.EqualValues(t, 1, ss.Retries, "one failed attempt, one retry")
				assert.EqualValues(t, 4, ss.Attempts, "m-0 twice, m-1, m-2")
				requireConserved(t, b.Stats())
			})
		})
	}
}

// A shed copy of an ID already delivered ends deduplicated once, even when
// the deduplicated event's hook calls runtime.Goexit (the shedder that
// replaces the one it ended does not count it again).
func TestShedderGoexitInADeduplicatedEvent(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var once atomic.Bool
		obs := &funcObserver{attempted: func(e AttemptEvent) {
			if e.Outcome == OutcomeDeduplicated && once.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
		}}
		b := newTestBroker(t, WithObserver(obs), WithQueueSize(100), WithPublishTimeout(0))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			if m.ID != "d" {
				<-release
			}
			return nil
		}, LaneSize(1), WhenLaneFull(DeadLetterNewest))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "d", Topic: "t"}))
		idle()
		for _, id := range []string{"blocker", "waits", "d"} { // d is shed: a duplicate
			require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
			idle()
		}
		close(release)
		settle(t, b)
		assert.EqualValues(t, 1, subStats(t, b, "t", "s").Deduplicated)
		requireConserved(t, b.Stats())
	})
}

// A message whose retry was decided just as a stop at once stopped its
// lane is dead-lettered by the stop's reason (an orphan); a Goexit in that
// dead letter's Put or event hook costs no message: it is stored and
// counted once, and nothing stays in flight.
func TestGoexitInAnOrphansDeadLetter(t *testing.T) {
	for _, where := range []string{"Put", "event"} {
		t.Run(where, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var once atomic.Bool
				obs := &funcObserver{
					attempted: func(e AttemptEvent) {
						if e.Outcome == OutcomeRetry {
							time.Sleep(20 * time.Millisecond) // the stop's ctx ends meanwhile: the lane stops
						}
					},
					deadLettered: func(DeadLetterEvent) {
						if where == "event" && once.CompareAndSwap(false, true) {
							runtime.Goexit()
						}
					},
				}
				opts := []Option{WithObserver(obs)}
				if where == "Put" {
					opts = append(opts, WithDeadLetterStore(&goexitOnceStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, discard)}))
				}
				b := newTestBroker(t, opts...)
				_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return errors.New("boom") })
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1)
				de := stopWithin(t, 10*time.Millisecond, b.Close)
				idle()
				require.NotNil(t, de)
				assert.Equal(t, 1, de.DeadLettered, "%+v", de)
				ss := subStats(t, b, "t", "s")
				assert.EqualValues(t, 1, ss.DeadLettered, "%+v", ss)
				assert.Zero(t, ss.InFlight, "%+v", ss)
				assert.Len(t, deadLetters(t, b), 1)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// A worker ended by runtime.Goexit hands the rest of its batch to a new
// worker; a stop that looks for running workers meanwhile sees the old
// one or the new one, never neither: Close returns once the rest ran.
func TestGoexitReplacementSeenByTheStop(t *testing.T) {
	bubble(t, func(t *testing.T) {
		inHook, closed := make(chan struct{}), make(chan struct{})
		testHookReplace = func() {
			close(inHook)
			select { // Close returns meanwhile only if it does not see the worker
			case <-closed:
			case <-time.After(time.Second):
			}
		}
		defer func() { testHookReplace = nil }()
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			switch m.ID {
			case "x":
				<-release
			case "a":
				runtime.Goexit()
			}
			return nil
		})
		require.NoError(t, err)
		for _, id := range []string{"x", "a", "b"} { // a and b wait behind x: one batch
			require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
			idle()
		}
		close(release)
		<-inHook
		require.NoError(t, b.Close(context.Background()))
		ss := subStats(t, b, "t", "s")
		close(closed)
		assert.EqualValues(t, 2, ss.Delivered, "x and b delivered when Close returns: %+v", ss)
		assert.EqualValues(t, 1, ss.DeadLettered, "a, as a panic: %+v", ss)
		idle()
		requireConserved(t, b.Stats())
	})
}

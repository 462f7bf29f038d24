package broker

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests for defects an independent review found in the first
// version; each failed before its fix.

// A dispatcher blocked on another subscriber's full lane still holds a
// routing snapshot with a subscriber that has since unsubscribed gracefully:
// the message must simply not be routed to it, not be dead-lettered.
func TestGracefulUnsubscribeLeavesNoDeadLetter(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(1))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "a", blockUntil(release), LaneSize(1))
		require.NoError(t, err)
		var got calls
		s, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		for i := range 3 { // a: one running, one in its lane, the dispatcher waits on a with m-2
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprintf("m-%d", i), Topic: "t"}))
			idle()
		}
		unsubscribed := make(chan error, 1)
		go func() { unsubscribed <- s.Unsubscribe(context.Background()) }()
		idle()
		select {
		case err := <-unsubscribed:
			t.Fatalf("Unsubscribe returned (%v) while m-2, accepted before it, was not routed to s", err)
		default:
		}
		close(release) // the dispatcher goes on: m-2 reaches s, which delivers it
		require.NoError(t, <-unsubscribed)
		idle()
		assert.Empty(t, deadLetters(t, b))
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(3), ss.Routed, "every message accepted before the call")
		assert.Equal(t, ss.Routed, ss.Delivered)
		requireConserved(t, b.Stats())
	})
}

// Workers waiting for another worker to finish the same ID must not start
// the handler once Close has stopped the subscription.
func TestNoHandlerStartsAfterAbort(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		var runs atomic.Int32
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			runs.Add(1)
			return blockUntilCancelled(ctx, m)
		}, Concurrency(4))
		require.NoError(t, err)
		for i := range 20 { // one ID, many keys: several workers wait for the first
			require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t", Key: fmt.Sprint("k", i)}))
		}
		idle()
		de := stopWithin(t, time.Second, b.Close)
		assert.Equal(t, 20, de.DeadLettered)
		assert.Equal(t, int32(1), runs.Load(), "only the first delivery ran")
	})
}

// A duplicate of a delivered message that Close cuts off is deduplicated,
// not dead-lettered (a redrive would run it twice).
func TestAbortedDuplicateIsDeduplicated(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			if m.ID == "block" {
				return blockUntilCancelled(ctx, m)
			}
			return nil
		})
		require.NoError(t, err)
		for _, id := range []string{"m", "block", "m"} {
			require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
		}
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.Error(t, b.Close(ctx))
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, "block", dls[0].Message.ID)
		assert.Equal(t, uint64(1), subStats(t, b, "t", "s").Deduplicated)
	})
}

// A retry cut off by Close while it waits out its backoff gives one attempt
// event, and the dead letter keeps that attempt's failure.
func TestRetryCutOffInBackoff(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var log eventLog
		b := newTestBroker(t, WithObserver(&log), WithRetryPolicy(RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(10 * time.Second)}))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return codedError{"db"} })
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.Error(t, b.Close(ctx))
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, 1, dls[0].Attempts)
		assert.Equal(t, 1, dls[0].Message.Attempt)
		assert.Equal(t, "db", dls[0].ErrorCode)
		assert.Equal(t, ReasonShutdown, dls[0].Reason)
		attempts := 0
		for _, e := range log.events {
			if len(e) > 7 && e[:7] == "attempt" {
				attempts++
			}
		}
		assert.Equal(t, 1, attempts, "one event per attempt: %v", log.events)
		assert.Equal(t, uint64(1), subStats(t, b, "t", "s").Attempts)
	})
}

// Redrive and Close meet in each order, and with Redrive waiting for room
// in a full lane when Close's deadline ends: every dead letter is either
// still in the store (not accepted) or was accepted and then ended (here,
// dead-lettered again with reason "shutdown"), and Close's DrainError counts
// exactly the shutdown dead letters.
func TestRedriveDuringClose(t *testing.T) {
	for _, order := range []string{"redrive first", "close first", "redrive waiting for room"} {
		t.Run(order, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}), WithPublishTimeout(time.Hour))
				var fail atomic.Bool
				fail.Store(true)
				_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
					if fail.Load() {
						return errBoom
					}
					return blockUntilCancelled(ctx, m)
				}, LaneSize(1))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 3)
				idle()
				fail.Store(false)
				var ids []string
				for _, dl := range deadLetters(t, b) {
					ids = append(ids, dl.ID)
				}
				require.Len(t, ids, 3)
				var accepted int
				var redriveErr error
				done := make(chan struct{})
				redrive := func() {
					defer close(done)
					accepted, redriveErr = b.Redrive(context.Background(), ids...)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				switch order {
				case "redrive first":
					go redrive()
					idle() // m-0 runs, m-1 in the lane, Redrive waits for room with m-2
					err = b.Close(ctx)
				case "close first":
					closed := make(chan error, 1)
					go func() { closed <- b.Close(ctx) }()
					idle()
					go redrive()
					err = <-closed
				case "redrive waiting for room":
					go redrive()
					idle()
					require.Equal(t, 1, subStats(t, b, "t", "s").Queued, "Redrive waits for room")
					err = b.Close(ctx) // its deadline ends while Redrive waits
				}
				<-done
				left := map[string]bool{}
				shutdown := 0
				for _, dl := range deadLetters(t, b) {
					if dl.Reason == ReasonShutdown {
						shutdown++
					} else {
						left[dl.ID] = true
					}
				}
				assert.Equal(t, 3, accepted+len(left), "every dead letter accepted or still stored (%v)", redriveErr)
				assert.Equal(t, accepted, shutdown, "each accepted one ended as a shutdown dead letter")
				if order == "close first" {
					assert.Zero(t, accepted)
					assert.ErrorIs(t, redriveErr, ErrClosed)
				} else {
					// Two fit before Close; the third waits for room until
					// Close closes the lane: refused, it stays in the store.
					assert.Equal(t, 2, accepted)
					assert.ErrorIs(t, redriveErr, ErrClosed)
				}
				if shutdown > 0 {
					var de *DrainError
					require.ErrorAs(t, err, &de)
					assert.Equal(t, shutdown, de.DeadLettered)
				} else {
					assert.NoError(t, err)
				}
				requireConserved(t, b.Stats())
			})
		})
	}
}

// Every message accepted before Unsubscribe is owed to the leaving
// subscription. When its ctx ends while some of them still wait behind
// another subscriber's full lane (in the dispatcher's batch, or still in
// the topic queue), Unsubscribe dead-letters them with reason
// "unsubscribed" before it returns, and its DrainError counts every one:
// none is lost, none ends twice, and none goes to a later subscription of
// the name.
func TestOwedMessagesBehindABlockedDispatcher(t *testing.T) {
	tests := []struct {
		name      string
		joinLate  bool // s subscribes while the dispatcher waits mid-batch
		before    int  // published before s's Unsubscribe (after s joined, if late)
		owed, ran int
	}{
		{name: "in the batch", before: 6, owed: 6, ran: 1},
		{name: "in the batch and the queue", before: 9, owed: 9, ran: 1},
		{name: "joined while the dispatcher waits", joinLate: true, before: 2, owed: 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithQueueSize(8))
				release := make(chan struct{})
				_, err := b.Subscribe("t", "a", blockUntil(release), LaneSize(1))
				require.NoError(t, err)
				var ran calls
				subscribeS := func() *Subscription {
					s, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
						ran.add(m)
						<-ctx.Done()
						return ctx.Err()
					}, LaneSize(1))
					require.NoError(t, err)
					return s
				}
				var s *Subscription
				if tc.joinLate {
					publishN(t, b, "t", "early", 6) // a runs 1, holds 1; the dispatcher waits with the 3rd
					idle()
					s = subscribeS()
				} else {
					s = subscribeS()
				}
				for i := range tc.before {
					require.NoError(t, b.Publish(context.Background(), Message{Topic: "t", ID: fmt.Sprintf("m-%d", i)}))
					if i == 5 {
						idle() // the dispatcher took a batch of 6; the rest stay in the queue
					}
				}
				idle()
				de := stopWithin(t, time.Second, s.Unsubscribe)
				assert.Equal(t, tc.owed, de.DeadLettered)
				assert.Equal(t, tc.ran, ran.len())
				forS := func() int {
					n := 0
					for _, dl := range deadLetters(t, b) {
						if dl.Subscriber == "s" {
							n++
							assert.Equal(t, ReasonUnsubscribed, dl.Reason)
						}
					}
					return n
				}
				assert.Equal(t, tc.owed, forS(), "in the store when Unsubscribe returned")
				var again calls
				_, err = b.Subscribe("t", "s", okHandler(&again))
				require.NoError(t, err)
				close(release)
				settle(t, b)
				assert.Equal(t, tc.owed, forS(), "and no more later")
				assert.Zero(t, again.len(), "the new subscription of the name got none of them")
				assert.Equal(t, uint64(tc.owed), subStats(t, b, "t", "s").Routed)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// A subscriber that joins while the dispatcher waits mid-batch gets the rest
// of that batch: those messages were still queued in the topic.
func TestJoinerMidBatchGetsTheRest(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(8))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "a", blockUntil(release), LaneSize(1))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 6) // a: m-0 running, m-1 in lane, dispatcher waits with m-2
		idle()
		queued := b.Stats().Topics["t"].Queued
		var late calls
		_, err = b.Subscribe("t", "late", okHandler(&late))
		require.NoError(t, err)
		close(release)
		settle(t, b)
		assert.Equal(t, queued, late.len(), "a late joiner gets what was still queued in the topic, the message the dispatcher was waiting with included")
	})
}

// A "forever" window must not overflow now+window (which remembered nothing).
func TestHugeDedupWindow(t *testing.T) {
	st := NewMemoryIdempotencyStore(math.MaxInt64, 100)
	k := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "x"}
	require.NoError(t, st.Record(context.Background(), k))
	seen, _ := st.Seen(context.Background(), k)
	assert.True(t, seen, "recorded key must be seen within an unbounded window")

	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(NewMemoryIdempotencyStore(math.MaxInt64, 100)))
		var c calls
		_, err := b.Subscribe("t", "s", okHandler(&c))
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		for range 3 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: "dup", Topic: "t"}))
		}
		settle(t, b)
		assert.Equal(t, 1, c.len(), "handler runs for one ID")
	})
}

// The window is in publish time: a delivery that takes longer than the
// window does not end it early or stretch it. Copies published during it,
// within the window of the first, are duplicates; one published after the
// window is not, though it arrives right after the slow delivery.
func TestSlowDeliveryIsRemembered(t *testing.T) {
	tests := []struct {
		name  string
		after time.Duration // when the copy is published, after the first
		runs  int
	}{
		{"with it", 0, 1},
		{"within the window", 900 * time.Millisecond, 1},
		{"after the window", 1100 * time.Millisecond, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithIdempotencyStore(NewMemoryIdempotencyStore(time.Second, 100)))
				var c calls
				_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
					c.add(m)
					time.Sleep(2 * time.Second)
					return nil
				})
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "dup", Topic: "t"}))
				time.Sleep(tt.after)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "dup", Topic: "t"}))
				settle(t, b)
				assert.Equal(t, tt.runs, c.len(), "the copy arrives when the 2 s delivery ends")
			})
		})
	}
}

// attemptsSeen collects the attempt numbers a user can see: in observer
// events, dead letters and log records.
type attemptsSeen struct {
	NopObserver
	mu   sync.Mutex
	seen []int
}

func (a *attemptsSeen) add(n int) {
	a.mu.Lock()
	a.seen = append(a.seen, n)
	a.mu.Unlock()
}

func (a *attemptsSeen) Attempted(e AttemptEvent)                 { a.add(e.Attempt) }
func (a *attemptsSeen) DeadLettered(e DeadLetterEvent)           { a.add(e.DeadLetter.Message.Attempt) }
func (a *attemptsSeen) Enabled(context.Context, slog.Level) bool { return true }
func (a *attemptsSeen) WithAttrs([]slog.Attr) slog.Handler       { return a }
func (a *attemptsSeen) WithGroup(string) slog.Handler            { return a }
func (a *attemptsSeen) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(at slog.Attr) bool {
		if at.Key == "attempt" {
			a.add(int(at.Value.Int64()))
		}
		return true
	})
	return nil
}

// A redriven dead letter is marked in its queued Attempt; cut off by Close
// before its first attempt (queued in the lane, or waiting in Redrive for
// room), the mark must show nowhere: not in the dead letter, an event or a
// log record.
func TestRedriveMarkNeverShows(t *testing.T) {
	bubble(t, func(t *testing.T) {
		seen := &attemptsSeen{}
		b, err := New(WithLogger(slog.New(seen)), WithObserver(seen), WithPublishTimeout(time.Second),
			WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		require.NoError(t, err)
		_, err = b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			if m.ID == "block" {
				return blockUntilCancelled(ctx, m)
			}
			return Permanent(errBoom)
		}, LaneSize(2))
		require.NoError(t, err)
		publishN(t, b, "t", "r", 3)
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 3)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "block", Topic: "t"}))
		idle()
		redriven := make(chan struct{})
		go func() { // two fill the lane, the third waits for room
			defer close(redriven)
			_, _ = b.Redrive(context.Background(), dls[0].ID, dls[1].ID, dls[2].ID)
		}()
		idle()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var de *DrainError
		require.ErrorAs(t, b.Close(ctx), &de)
		<-redriven
		for _, dl := range deadLetters(t, b) {
			assert.GreaterOrEqual(t, dl.Message.Attempt, 0, dl.Message.ID)
			assert.GreaterOrEqual(t, dl.Attempts, 0, dl.Message.ID)
		}
		seen.mu.Lock()
		defer seen.mu.Unlock()
		require.NotEmpty(t, seen.seen)
		for _, n := range seen.seen {
			assert.GreaterOrEqual(t, n, 0)
		}
		requireConserved(t, b.Stats())
	})
}

// Owed messages that Unsubscribe took from the dispatcher (no other
// subscriber being owed them) are routed to the leaving subscriber and
// dead-lettered there, never counted Unrouted.
func TestClaimedOwedAreNotUnrouted(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(8))
		release := make(chan struct{})
		a, err := b.Subscribe("t", "a", blockUntil(release), LaneSize(1))
		require.NoError(t, err)
		s, err := b.Subscribe("t", "s", blockUntilCancelled, LaneSize(1))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 6) // the dispatcher waits on a's lane with m-2
		idle()
		aDone := make(chan error, 1)
		go func() { aDone <- a.Unsubscribe(context.Background()) }() // a is owed m-0..m-5
		idle()
		for i := 6; i < 8; i++ { // owed to s only
			require.NoError(t, b.Publish(context.Background(), Message{Topic: "t", ID: fmt.Sprintf("m-%d", i)}))
		}
		idle()
		de := stopWithin(t, time.Second, s.Unsubscribe)
		assert.Equal(t, 8, de.DeadLettered)
		close(release)
		require.NoError(t, <-aDone)
		settle(t, b)
		forS := 0
		for _, dl := range deadLetters(t, b) {
			if dl.Subscriber == "s" {
				forS++
			}
		}
		assert.Equal(t, 8, forS)
		ts := b.Stats().Topics["t"]
		assert.Zero(t, ts.Unrouted, "m-6 and m-7 were routed to s (dead-lettered there), not unrouted")
		requireConserved(t, b.Stats())
	})
}

// The dispatcher waits for room in the leaving subscriber's own lane, room
// appears and it pushes the message, and before it takes routeMu again
// Unsubscribe reaches its deadline: the message is dead-lettered once (from
// the lane), not a second time by the claim. The hook widens the window
// between the push and routeMu (a preemption there has the same effect).
func TestPushedThenClaimedEndsOnce(t *testing.T) {
	testHookWaited = func() { time.Sleep(time.Millisecond) }
	t.Cleanup(func() { testHookWaited = nil })
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(8))
		s, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
				return nil
			}
		}, LaneSize(1))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 4) // m-0 runs, m-1 in the lane, the dispatcher waits on s with m-2
		idle()
		de := stopWithin(t, 10*time.Millisecond+500*time.Microsecond, s.Unsubscribe)
		settle(t, b)
		byID := map[string]int{}
		for _, dl := range deadLetters(t, b) {
			byID[dl.Message.ID]++
		}
		for id, n := range byID {
			assert.Equal(t, 1, n, "%s dead-lettered %d times", id, n)
		}
		assert.Equal(t, 3, de.DeadLettered, "m-1 (cancelled), m-2, m-3")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(4), ss.Routed)
		requireConserved(t, b.Stats())
	})
}

// One subscriber, its own lane full, a backlog in the topic queue,
// Unsubscribe at its deadline: every owed message dead-lettered once,
// counted, none Unrouted.
func TestUnsubscribeDeadlineOwnLaneFull(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(8))
		s, err := b.Subscribe("t", "s", blockUntilCancelled, LaneSize(1))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 6) // m-0 runs, m-1 in the lane, the dispatcher waits on s with m-2
		idle()
		for i := 6; i < 9; i++ { // in the topic queue
			require.NoError(t, b.Publish(context.Background(), Message{Topic: "t", ID: fmt.Sprintf("m-%d", i)}))
		}
		idle()
		de := stopWithin(t, time.Second, s.Unsubscribe)
		settle(t, b)
		byID := map[string]int{}
		for _, dl := range deadLetters(t, b) {
			byID[dl.Message.ID]++
		}
		assert.Len(t, byID, 9)
		for id, n := range byID {
			assert.Equal(t, 1, n, "%s dead-lettered %d times", id, n)
		}
		assert.Equal(t, 9, de.DeadLettered)
		assert.Zero(t, b.Stats().Topics["t"].Unrouted, "every message was routed to s")
		requireConserved(t, b.Stats())
	})
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// This file tests SPEC.md "Isolation and overload": parking, the full-lane
// policies, the circuit breaker, the retry budget and the rate limit. Every
// test runs in a synctest bubble: minutes of fake time, no sleeps.

// publishAt publishes n messages to topic at rate per second (in ticks of
// 10 ms), with IDs "<prefix>-<i>" and Key key(i) (nil: none). It fails the
// test on any Publish error.
func publishAt(t *testing.T, b *Broker, topic, prefix string, n, rate int, key func(int) string) {
	t.Helper()
	perTick := max(rate/100, 1)
	for i := range n {
		m := Message{ID: fmt.Sprintf("%s-%d", prefix, i), Topic: topic}
		if key != nil {
			m.Key = key(i)
		}
		require.NoError(t, b.Publish(context.Background(), m), "publisher saw an error")
		if (i+1)%perTick == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// dlObserver counts dead letters by reason and attempts.
type dlObserver struct {
	NopObserver
	mu      sync.Mutex
	reasons map[string]int
	tries   map[int]int // dead letters by Attempts
}

func (o *dlObserver) DeadLettered(e DeadLetterEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.reasons == nil {
		o.reasons, o.tries = map[string]int{}, map[int]int{}
	}
	o.reasons[e.DeadLetter.Reason]++
	o.tries[e.DeadLetter.Attempts]++
}

// The failing-neighbour scenario, defaults everywhere: one subscriber
// always fails, the other is healthy; the healthy one gets every message
// within a second of its publication and the publishers see no error.
func TestFailingSubscriberCostsItsNeighbourNothing(t *testing.T) {
	for _, rate := range []int{100, 1000} {
		t.Run(fmt.Sprintf("%d per second", rate), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var obs dlObserver
				b, err := New(WithLogger(discard), WithObserver(&obs)) // default sizes and retry policy
				require.NoError(t, err)
				defer b.Close(context.Background())
				var worst atomic.Int64
				var healthy atomic.Int64
				_, err = b.Subscribe("orders", "healthy", func(_ context.Context, m Message) error {
					lat := int64(time.Since(m.PublishedAt))
					for {
						w := worst.Load()
						if lat <= w || worst.CompareAndSwap(w, lat) {
							break
						}
					}
					healthy.Add(1)
					return nil
				})
				require.NoError(t, err)
				_, err = b.Subscribe("orders", "webhook", func(context.Context, Message) error {
					return errors.New("webhook timed out")
				})
				require.NoError(t, err)

				n := 60 * rate
				publishAt(t, b, "orders", "m", n, rate, nil)
				settle(t, b)

				assert.Equal(t, int64(n), healthy.Load())
				assert.LessOrEqual(t, time.Duration(worst.Load()), time.Second, "worst publish-to-handled latency of the healthy subscriber")
				st := b.Stats().Topics["orders"]
				assert.Zero(t, st.Rejected)
				w := st.Subscribers["webhook"]
				assert.Equal(t, uint64(n), w.DeadLettered)
				assert.Equal(t, uint64((DefaultMaxRetries+1)*n), w.Attempts, "exactly MaxRetries+1 attempts each")
				obs.mu.Lock()
				assert.Equal(t, map[string]int{ReasonExhausted: n}, obs.reasons)
				assert.Equal(t, map[int]int{DefaultMaxRetries + 1: n}, obs.tries)
				obs.mu.Unlock()
				assert.Zero(t, st.Subscribers["healthy"].BlockedFor, "the healthy lane never filled")
				assert.Zero(t, w.BlockedFor, "the failing lane never filled: parked messages are bounded by rate × backoff")
				requireConserved(t, b.Stats())
			})
		})
	}
}

// One key of ten always fails, at Concurrency(4): the other keys flow at
// the offered rate, and each key's first attempts keep publish order. The
// policy is short (2 retries from 50 ms): the failing key's messages run
// one after the other, and under the default policy (about 4.7 s each) its
// 1,200 would take longer than settle's hour.
func TestFailingKeyCostsOtherKeysNothing(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b, err := New(WithLogger(discard), WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: ExponentialBackoff(50*time.Millisecond, 5*time.Second)}))
		require.NoError(t, err)
		defer b.Close(context.Background())
		var mu sync.Mutex
		var healthyOnTime int
		firsts := map[string][]int{} // key → sequence numbers of first attempts, in start order
		_, err = b.Subscribe("t", "s", func(_ context.Context, m Message) error {
			var seq int
			_, _ = fmt.Sscanf(m.ID, "m-%d", &seq)
			mu.Lock()
			if m.Attempt == 1 {
				firsts[m.Key] = append(firsts[m.Key], seq)
			}
			if m.Key != "k0" && time.Since(m.PublishedAt) <= time.Second {
				healthyOnTime++
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // 4 workers: 800/s at most
			if m.Key == "k0" {
				return errors.New("tenant k0's backend is down")
			}
			return nil
		}, Concurrency(4))
		require.NoError(t, err)
		const rate, seconds = 200, 60
		n := rate * seconds
		publishAt(t, b, "t", "m", n, rate, func(i int) string { return fmt.Sprint("k", i%10) })
		settle(t, b)
		mu.Lock()
		defer mu.Unlock()
		healthy := n * 9 / 10
		assert.GreaterOrEqual(t, float64(healthyOnTime), 0.95*float64(healthy),
			"healthy keys delivered within a second of publication: %d of %d", healthyOnTime, healthy)
		for k, seqs := range firsts {
			for i := 1; i < len(seqs); i++ {
				if seqs[i] < seqs[i-1] {
					t.Fatalf("key %s: first attempt of m-%d started after m-%d", k, seqs[i], seqs[i-1])
				}
			}
		}
		assert.Len(t, firsts["k0"], n/10, "every message of the failing key was attempted")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(n/10), ss.DeadLettered)
		requireConserved(t, b.Stats())
	})
}

// Keyless messages at Concurrency 1: without Ordered a retry does not hold
// the messages behind it; with Ordered the next message never starts before
// the failing one ended.
func TestKeylessRetryHoldsOnlyWhenOrdered(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(time.Second)}))
				var got calls
				opts := []SubscribeOption{}
				if ordered {
					opts = append(opts, Ordered())
				}
				_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
					if m.ID == "m-0" && m.Attempt < 3 {
						return errBoom
					}
					return nil
				}), opts...)
				require.NoError(t, err)
				publishN(t, b, "t", "m", 3)
				settle(t, b)
				type call struct {
					id      string
					attempt int
				}
				var seq []call
				for _, m := range got.all() {
					seq = append(seq, call{m.ID, m.Attempt})
				}
				if ordered {
					assert.Equal(t, []call{{"m-0", 1}, {"m-0", 2}, {"m-0", 3}, {"m-1", 1}, {"m-2", 1}}, seq)
				} else {
					assert.Equal(t, []call{{"m-0", 1}, {"m-1", 1}, {"m-2", 1}, {"m-0", 2}, {"m-0", 3}}, seq)
				}
			})
		})
	}
}

// With random failures and backoffs across thousands of messages, two
// messages of one Key never run at once, nor two of one ID, and each Key's
// messages start in publish order, each after the previous one ended.
func TestKeysAndIDsNeverRunConcurrently(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithIdempotencyStore(nil), // duplicates run, so IDs meet
					WithRetryPolicy(RetryPolicy{MaxRetries: 3, Backoff: ExponentialBackoff(time.Millisecond, 20*time.Millisecond)}))
				var mu sync.Mutex
				runningKeys := map[string]int{} // key → seq running
				runningIDs := map[string]bool{} // ID running
				lastEnded := map[string]int{}   // key → seq of the last message that ended
				lastStarted := map[string]int{} // key → seq of the last first attempt
				var violations []string
				rng := rand.New(rand.NewPCG(1, 2))
				var rngMu sync.Mutex
				opts := []SubscribeOption{Concurrency(8)}
				if ordered {
					opts = append(opts, Ordered())
				}
				_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
					var seq int
					_, _ = fmt.Sscanf(m.Headers["seq"], "%d", &seq)
					key, keyed := m.Key, m.Key != "" || ordered
					mu.Lock()
					if keyed {
						if other, busy := runningKeys[key]; busy {
							violations = append(violations, fmt.Sprintf("key %q: #%d started while #%d runs", key, seq, other))
						}
						if m.Attempt == 1 {
							if prev, ok := lastStarted[key]; ok && seq < prev {
								violations = append(violations, fmt.Sprintf("key %q: #%d started after #%d", key, seq, prev))
							}
							if prev, ok := lastStarted[key]; ok && lastEnded[key] != prev {
								violations = append(violations, fmt.Sprintf("key %q: #%d started before #%d ended", key, seq, prev))
							}
							lastStarted[key] = seq
						}
						runningKeys[key] = seq
					}
					if runningIDs[m.ID] {
						violations = append(violations, fmt.Sprintf("ID %s runs twice at once", m.ID))
					}
					runningIDs[m.ID] = true
					mu.Unlock()
					rngMu.Lock()
					work := time.Duration(rng.IntN(3)) * time.Millisecond
					fail := rng.IntN(4) == 0
					rngMu.Unlock()
					time.Sleep(work)
					mu.Lock()
					defer mu.Unlock()
					delete(runningIDs, m.ID)
					if keyed {
						delete(runningKeys, key)
					}
					ended := !fail || m.Attempt == 4
					if keyed && ended {
						lastEnded[key] = seq
					}
					if fail {
						return errBoom
					}
					return nil
				}, opts...)
				require.NoError(t, err)
				for i := range 3000 {
					m := Message{ID: fmt.Sprint("id-", i%700), Topic: "t", Headers: map[string]string{"seq": fmt.Sprint(i)}}
					if i%3 != 0 {
						m.Key = fmt.Sprint("k", i%17)
					}
					require.NoError(t, b.Publish(context.Background(), m))
					if i%50 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				settle(t, b)
				mu.Lock()
				defer mu.Unlock()
				assert.Empty(t, violations)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// Each full-lane policy with a subscriber that holds its first message: the
// lane fills, then Block holds the dispatcher (and says so in Stats), and
// the dead-letter policies shed the newest or the oldest message with
// reason "overflow" while the neighbour gets everything.
func TestFullLanePolicies(t *testing.T) {
	tests := []struct {
		policy   FullLanePolicy
		wantShed []string // message IDs dead-lettered with reason overflow
	}{
		{Block, nil},
		{DeadLetterNewest, []string{"m-5", "m-6", "m-7", "m-8", "m-9"}},
		{DeadLetterOldest, []string{"m-1", "m-2", "m-3", "m-4", "m-5"}},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithQueueSize(100), WithPublishTimeout(0))
				release, stuck, other := stuckAndOther(t, b, tt.policy)
				for i := 1; i < 10; i++ { // m-1..m-4 fill the lane
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
				}
				idle()
				time.Sleep(time.Second)
				st := b.Stats().Topics["t"]
				var shed []string
				for _, dl := range deadLetters(t, b) {
					assert.Equal(t, ReasonOverflow, dl.Reason)
					assert.Equal(t, "stuck", dl.Subscriber)
					assert.Equal(t, CodeOverflow, dl.ErrorCode)
					assert.ErrorContains(t, ErrLaneFull, dl.Error[:len(ErrLaneFull.Error())])
					shed = append(shed, dl.Message.ID)
				}
				assert.Equal(t, tt.wantShed, shed)
				if tt.policy == Block {
					assert.Equal(t, "stuck", st.BlockedOn, "the dispatcher waits for the stuck lane")
					assert.GreaterOrEqual(t, st.Subscribers["stuck"].BlockedFor, time.Second)
					require.NoError(t, b.Publish(context.Background(), Message{ID: "later", Topic: "t"}))
					idle()
					assert.NotContains(t, other.ids(), "later", "the neighbour waits behind the dispatcher")
				} else {
					assert.Empty(t, st.BlockedOn)
					assert.Zero(t, st.Subscribers["stuck"].BlockedFor)
					assert.Equal(t, 10, other.len(), "the neighbour got everything")
				}
				requireConserved(t, b.Stats())
				close(release)
				settle(t, b)
				if tt.policy == Block {
					assert.Equal(t, 11, other.len())
					assert.Equal(t, 11, stuck.len())
					assert.GreaterOrEqual(t, subStats(t, b, "t", "stuck").BlockedFor, time.Second, "the wait, once over, is in the total")
				} else {
					assert.Equal(t, 10-len(tt.wantShed), stuck.len())
				}
				assert.Empty(t, b.Stats().Topics["t"].BlockedOn)
				requireConserved(t, b.Stats())
			})
		})
	}
}

// DeadLetterOldest sheds held and parked messages too when nothing else
// waits, and a parked message shed keeps its last failure.
func TestDeadLetterOldestShedsParked(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 5, Backoff: ConstantBackoff(time.Minute)}))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return codedError{"down"} },
			LaneSize(2), WhenLaneFull(DeadLetterOldest))
		require.NoError(t, err)
		for i := range 3 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m-", i), Topic: "t"}))
			idle() // each fails and parks
			time.Sleep(time.Millisecond)
		}
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, "m-0", dls[0].Message.ID, "the oldest parked message made room")
		assert.Equal(t, ReasonOverflow, dls[0].Reason)
		assert.Equal(t, "down", dls[0].ErrorCode, "its last failure")
		assert.Equal(t, 1, dls[0].Attempts)
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, 2, ss.Parked)
		requireConserved(t, b.Stats())
	})
}

// breakerLog records breaker transitions.
type breakerLog struct {
	NopObserver
	mu     sync.Mutex
	events []BreakerEvent
}

func (o *breakerLog) BreakerChanged(e BreakerEvent) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

func (o *breakerLog) path() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var p []string
	for _, e := range o.events {
		p = append(p, fmt.Sprintf("%s→%s", e.From, e.To))
	}
	return p
}

// The breaker trips after a run of failures, makes no attempt while open,
// probes once after the open interval, re-opens for twice as long when the
// probe fails, and closes when a probe succeeds.
func TestCircuitBreaker(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var obs breakerLog
		b := newTestBroker(t, WithObserver(&obs), WithRetryPolicy(RetryPolicy{MaxRetries: 100, Backoff: ConstantBackoff(100 * time.Millisecond)}))
		var healthy atomic.Bool
		var attempts stamps
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error {
			attempts.add()
			if healthy.Load() {
				return nil
			}
			return errBoom
		}, CircuitBreaker(BreakerPolicy{Failures: 3, OpenFor: time.Second, MaxOpenFor: 3 * time.Second}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 5)
		idle()
		count := func() int { attempts.mu.Lock(); defer attempts.mu.Unlock(); return len(attempts.at) }

		assert.Equal(t, 3, count(), "three failures in a row trip it")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, BreakerOpen, ss.Breaker)
		time.Sleep(999 * time.Millisecond)
		idle()
		assert.Equal(t, 3, count(), "no attempt while open, retries due included")
		assert.Equal(t, 5, subStats(t, b, "t", "s").Queued, "messages wait in the lane")

		time.Sleep(time.Millisecond) // open for 1 s: one probe, which fails
		idle()
		assert.Equal(t, 4, count())
		assert.Equal(t, BreakerOpen, subStats(t, b, "t", "s").Breaker)
		time.Sleep(2*time.Second - time.Millisecond)
		idle()
		assert.Equal(t, 4, count(), "re-opened for twice as long")
		time.Sleep(time.Millisecond)
		idle()
		assert.Equal(t, 5, count(), "the second probe")
		time.Sleep(3 * time.Second) // capped at MaxOpenFor
		idle()
		assert.Equal(t, 6, count(), "the third probe, after MaxOpenFor")

		healthy.Store(true)
		time.Sleep(3 * time.Second)
		settle(t, b)
		ss = subStats(t, b, "t", "s")
		assert.Equal(t, BreakerClosed, ss.Breaker)
		assert.Equal(t, uint64(5), ss.Delivered, "nothing was dead-lettered: no attempt burnt while open")
		assert.Equal(t, []string{
			"closed→open", "open→half_open", "half_open→open", "open→half_open", "half_open→open",
			"open→half_open", "half_open→open", "open→half_open", "half_open→closed",
		}, obs.path())
		requireConserved(t, b.Stats())
	})
}

// The ratio rule: a breaker trips when failures reach the ratio of the
// attempts in the window, not before MinAttempts.
func TestCircuitBreakerRatio(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var n atomic.Int32
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error {
			if n.Add(1)%2 == 0 {
				return errBoom // every second attempt fails: 50%
			}
			return nil
		}, CircuitBreaker(BreakerPolicy{FailureRatio: 0.5, MinAttempts: 10, Window: time.Minute}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 9)
		idle()
		assert.Equal(t, BreakerClosed, subStats(t, b, "t", "s").Breaker, "9 attempts < MinAttempts")
		publishN(t, b, "t", "x", 5)
		idle()
		assert.Equal(t, BreakerOpen, subStats(t, b, "t", "s").Breaker)
		assert.Equal(t, int32(10), n.Load(), "tripped at the tenth attempt")
	})
}

// A retry budget of 10% plus 1 a second: with every message failing, the
// retries over the window stay within the budget; the rest are
// dead-lettered with reason "budget".
func TestRetryBudget(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(10 * time.Millisecond)}))
		p := RetryBudgetPolicy{Ratio: 0.1, Window: 10 * time.Second, MinPerSecond: 1}
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return errBoom }, RetryBudget(p))
		require.NoError(t, err)
		assert.Equal(t, 10, subStats(t, b, "t", "s").RetryBudgetLeft, "the floor: 1 a second over 10 s")
		const n = 1000
		publishAt(t, b, "t", "m", n, 200, nil) // 5 s: every count stays in the 10 s window
		settle(t, b)
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(n), ss.Attempts-ss.Retries, "first attempts")
		assert.Equal(t, uint64(n), ss.DeadLettered)
		allowed := p.Ratio*float64(n) + p.MinPerSecond*p.Window.Seconds()
		assert.LessOrEqual(t, float64(ss.Retries), allowed, "retries ≤ ratio × first attempts + floor")
		assert.Greater(t, float64(ss.Retries), allowed*0.8, "the budget is used, not just refused")
		reasons := map[string]int{}
		for _, dl := range deadLetters(t, b) {
			reasons[dl.Reason]++
		}
		assert.Equal(t, n, reasons[ReasonBudget]+reasons[ReasonExhausted])
		assert.Greater(t, reasons[ReasonBudget], n/2)
		requireConserved(t, b.Stats())
	})
}

// A rate limit of 10 a second with a burst of 5: attempts per second never
// exceed the rate (after the burst), and waiting burns no attempt.
func TestRateLimit(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		var at stamps
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error {
			at.add()
			return nil
		}, RateLimit(10, 5), Concurrency(4))
		require.NoError(t, err)
		start := time.Now()
		publishN(t, b, "t", "m", 65)
		settle(t, b)
		at.mu.Lock()
		defer at.mu.Unlock()
		require.Len(t, at.at, 65)
		perSecond := map[int]int{}
		for _, ts := range at.at {
			perSecond[int(ts.Sub(start)/time.Second)]++
		}
		assert.Equal(t, 14, perSecond[0], "the burst of 5, then one every 100 ms")
		for s := 1; s < 6; s++ {
			assert.Equal(t, 10, perSecond[s], "second %d", s)
		}
		assert.Equal(t, 1, perSecond[6])
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(65), ss.Attempts, "no attempt burnt while waiting")
		assert.Equal(t, uint64(65), ss.Delivered)
	})
}

// Close and Unsubscribe whose deadline ends mid-backoff account for parked
// and held messages exactly like queued ones: each is dead-lettered with
// the stop's reason, keeping its last failure, and nothing is lost.
func TestStopWithParkedAndHeldMessages(t *testing.T) {
	for _, viaClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", viaClose), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(time.Minute)}))
				sub, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
					if m.Key == "bad" {
						return codedError{"down"}
					}
					return nil
				}, Concurrency(2))
				require.NoError(t, err)
				for i := range 4 {
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("bad-", i), Topic: "t", Key: "bad"}))
					require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("ok-", i), Topic: "t", Key: fmt.Sprint("ok", i)}))
				}
				idle()
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, 1, ss.Parked)
				assert.Equal(t, 3, ss.Held)
				assert.Equal(t, uint64(4), ss.Delivered)
				reason := ReasonUnsubscribed
				stop := sub.Unsubscribe
				if viaClose {
					reason, stop = ReasonShutdown, b.Close
				}
				de := stopWithin(t, 30*time.Second, stop) // ends mid-backoff
				assert.Equal(t, 4, de.DeadLettered)
				dls := deadLetters(t, b)
				require.Len(t, dls, 4)
				for _, dl := range dls {
					assert.Equal(t, reason, dl.Reason)
					if dl.Message.ID == "bad-0" {
						assert.Equal(t, "down", dl.ErrorCode, "the parked message keeps its last failure")
						assert.Equal(t, 1, dl.Attempts)
					} else {
						assert.Zero(t, dl.Attempts, "held messages were never attempted")
					}
				}
				requireConserved(t, b.Stats())
			})
		})
	}
}

// A graceful Close waits out the backoffs: parked and held messages get
// their retries.
func TestCloseDrainsParkedAndHeld(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Minute)}))
		var got calls
		_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
			if m.Attempt == 1 {
				return errBoom
			}
			return nil
		}), Ordered())
		require.NoError(t, err)
		publishN(t, b, "t", "m", 3)
		idle()
		require.NoError(t, b.Close(context.Background()))
		assert.Equal(t, []string{"m-0", "m-0", "m-1", "m-1", "m-2", "m-2"}, got.ids())
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(3), ss.Delivered)
		requireConserved(t, b.Stats())
	})
}

func TestProtectionOptionsValidation(t *testing.T) {
	b := newTestBroker(t)
	h := func(context.Context, Message) error { return nil }
	tests := []struct {
		name string
		opt  SubscribeOption
	}{
		{"unknown lane policy", WhenLaneFull(FullLanePolicy(9))},
		{"negative breaker failures", CircuitBreaker(BreakerPolicy{Failures: -1})},
		{"breaker ratio above 1", CircuitBreaker(BreakerPolicy{FailureRatio: 1.5})},
		{"breaker max below open", CircuitBreaker(BreakerPolicy{OpenFor: time.Minute, MaxOpenFor: time.Second})},
		{"budget without window", RetryBudget(RetryBudgetPolicy{Ratio: 0.1})},
		{"negative budget ratio", RetryBudget(RetryBudgetPolicy{Ratio: -1, Window: time.Second})},
		{"zero rate", RateLimit(0, 1)},
		{"zero burst", RateLimit(1, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.Subscribe("t", "s", h, tt.opt)
			assert.ErrorIs(t, err, ErrInvalidOption)
		})
	}
}

// A parked message whose ID was delivered meanwhile (a copy with another
// Key, by another worker) is deduplicated when its retry comes, not run
// again.
func TestRetryOfADeliveredIDIsDeduplicated(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Minute)}))
		var got calls
		_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
			if m.Key == "a" {
				return errBoom
			}
			return nil
		}), Concurrency(2))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t", Key: "a"}))
		idle() // fails, parks for a minute
		require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t", Key: "b"}))
		settle(t, b)
		assert.Equal(t, []int{1, 1}, got.attempts("x"), "the parked copy did not run again")
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(1), ss.Delivered)
		assert.Equal(t, uint64(1), ss.Deduplicated)
		assert.Zero(t, ss.DeadLettered)
	})
}

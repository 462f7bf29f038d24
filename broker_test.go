package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPublishValidation(t *testing.T) {
	b := newTestBroker(t)
	tests := []struct {
		name string
		msg  Message
		want error
	}{
		{"empty ID", Message{Topic: "t"}, ErrInvalidMessage},
		{"empty topic", Message{ID: "m"}, ErrInvalidMessage},
		{"both empty", Message{}, ErrInvalidMessage},
		{"valid", Message{ID: "m", Topic: "t"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := b.Publish(context.Background(), tt.msg)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), "empty")
		})
	}
}

func TestPublishStampsAndDoesNotRunHandlers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		release := make(chan struct{})
		var got calls
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			got.add(m)
			<-release
			return nil
		})
		require.NoError(t, err)
		before := time.Now()
		// The handler blocks until released: if Publish ran it, Publish would
		// never return.
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Attempt: 7}))
		idle()
		close(release)
		idle()
		msgs := got.all()
		require.Len(t, msgs, 1)
		assert.Equal(t, 1, msgs[0].Attempt, "Attempt is the broker's, from 1")
		assert.True(t, msgs[0].PublishedAt.Equal(before), "PublishedAt stamped by Publish (the fake clock stood still)")
	})
}

func TestFIFOAtConcurrencyOne(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const n = 10_000
		b := newTestBroker(t)
		var got calls
		_, err := b.Subscribe("orders", "s", okHandler(&got))
		require.NoError(t, err)
		want := make([]string, n)
		for i := range n {
			want[i] = fmt.Sprintf("m-%05d", i)
			require.NoError(t, b.Publish(context.Background(), Message{ID: want[i], Topic: "orders"}))
		}
		idle()
		require.Equal(t, want, got.ids())
	})
}

func TestPerKeyOrderAtConcurrencyEight(t *testing.T) {
	bubble(t, func(t *testing.T) {
		const keys, perKey = 40, 100
		b := newTestBroker(t)
		var (
			mu      sync.Mutex
			seq     = map[string][]int{}
			running atomic.Int32
			maxRun  atomic.Int32
		)
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			r := running.Add(1)
			for {
				old := maxRun.Load()
				if r <= old || maxRun.CompareAndSwap(old, r) {
					break
				}
			}
			time.Sleep(time.Millisecond) // lets other workers run meanwhile
			running.Add(-1)
			var i int
			_, _ = fmt.Sscanf(m.ID, "m-%d", &i)
			mu.Lock()
			seq[m.Key] = append(seq[m.Key], i)
			mu.Unlock()
			return nil
		}, Concurrency(8))
		require.NoError(t, err)
		for i := range keys * perKey {
			require.NoError(t, b.Publish(context.Background(),
				Message{ID: fmt.Sprintf("m-%d", i), Topic: "t", Key: fmt.Sprintf("k%d", i%keys)}))
		}
		settle(t, b)
		require.Len(t, seq, keys)
		for k, s := range seq {
			require.Len(t, s, perKey, "key %s", k)
			for j := 1; j < len(s); j++ {
				require.Less(t, s[j-1], s[j], "key %s out of order: %v", k, s)
			}
		}
		assert.Greater(t, maxRun.Load(), int32(1), "eight workers ran in parallel")
	})
}

func TestNoCrossTopicLeakage(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		topics := []string{"a", "b", "c"}
		got := map[string]*calls{}
		for _, tp := range topics {
			got[tp] = &calls{}
			_, err := b.Subscribe(tp, "s", okHandler(got[tp]))
			require.NoError(t, err)
		}
		for i := range 30 {
			tp := topics[i%3]
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprintf("%s-%d", tp, i), Topic: tp}))
		}
		idle()
		for _, tp := range topics {
			msgs := got[tp].all()
			require.Len(t, msgs, 10)
			for _, m := range msgs {
				assert.Equal(t, tp, m.Topic)
			}
		}
	})
}

// fillQueue subscribes a handler that blocks until release is closed, on a
// broker with queue and lane of one, and publishes until Publish reports the
// queue full. It returns how many were accepted.
func fillQueue(t *testing.T, b *Broker, release chan struct{}) int {
	t.Helper()
	_, err := b.Subscribe("t", "slow", func(ctx context.Context, m Message) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, LaneSize(1))
	require.NoError(t, err)
	// one in the handler, one in the lane, one held in the topic queue
	for i := range 3 {
		require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprintf("fill-%d", i), Topic: "t"}))
		idle()
	}
	return 3
}

func TestPublishOnFullQueue(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		ctx     func() (context.Context, context.CancelFunc)
		wantErr error
		wait    time.Duration // how long Publish waited (fake clock)
	}{
		{"timeout zero fails at once", 0, nil, ErrQueueFull, 0},
		{"waits the publish timeout", 250 * time.Millisecond, nil, ErrQueueFull, 250 * time.Millisecond},
		{"context ends first", time.Second, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, context.DeadlineExceeded, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithQueueSize(1), WithPublishTimeout(tt.timeout))
				release := make(chan struct{})
				defer close(release)
				fillQueue(t, b, release)
				ctx := context.Background()
				if tt.ctx != nil {
					var cancel context.CancelFunc
					ctx, cancel = tt.ctx()
					defer cancel()
				}
				start := time.Now()
				err := b.Publish(ctx, Message{ID: "over", Topic: "t"})
				require.ErrorIs(t, err, tt.wantErr)
				assert.Equal(t, tt.wait, time.Since(start))
				ts := b.Stats().Topics["t"]
				assert.Equal(t, uint64(1), ts.Rejected)
				assert.Equal(t, uint64(3), ts.Published)
				assert.Equal(t, 1, ts.Queued)
				assert.Equal(t, 1, ts.Capacity)
			})
		})
	}
}

func TestPublishWaitsForRoom(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(1), WithPublishTimeout(time.Second))
		release := make(chan struct{})
		fillQueue(t, b, release)
		go func() {
			time.Sleep(300 * time.Millisecond)
			close(release)
		}()
		start := time.Now()
		require.NoError(t, b.Publish(context.Background(), Message{ID: "late", Topic: "t"}))
		assert.Equal(t, 300*time.Millisecond, time.Since(start))
	})
}

func TestAttemptsAndReasons(t *testing.T) {
	tests := []struct {
		name         string
		maxRetries   int
		err          error
		wantAttempts []int
		wantCode     string
		wantReason   string
		retryable    bool
	}{
		{"always failing, no retries", NoRetries, errBoom, []int{1}, CodeError, ReasonExhausted, true},
		{"any negative MaxRetries is none", -7, errBoom, []int{1}, CodeError, ReasonExhausted, true},
		{"zero MaxRetries is the default", 0, errBoom, []int{1, 2, 3, 4, 5, 6}, CodeError, ReasonExhausted, true},
		{"always failing, 1 retry", 1, errBoom, []int{1, 2}, CodeError, ReasonExhausted, true},
		{"always failing, 3 retries", 3, errBoom, []int{1, 2, 3, 4}, CodeError, ReasonExhausted, true},
		{"own code", 2, codedError{"db_down"}, []int{1, 2, 3}, "db_down", ReasonExhausted, true},
		{"permanent", 5, Permanent(errBoom), []int{1}, CodePermanent, ReasonPermanent, false},
		{"permanent with own code", 5, Permanent(codedError{"invalid"}), []int{1}, "invalid", ReasonPermanent, false},
		{"wrapped permanent", 5, fmt.Errorf("ctx: %w", Permanent(errBoom)), []int{1}, CodePermanent, ReasonPermanent, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: tt.maxRetries, Backoff: ConstantBackoff(0)}))
				var got calls
				_, err := b.Subscribe("t", "s", recording(&got, func(Message) error { return tt.err }))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				idle()
				assert.Equal(t, tt.wantAttempts, got.attempts("m"))
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				assert.Equal(t, tt.wantCode, dls[0].ErrorCode)
				assert.Equal(t, tt.wantReason, dls[0].Reason)
				assert.Equal(t, tt.retryable, dls[0].Retryable)
				assert.Equal(t, len(tt.wantAttempts), dls[0].Attempts)
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, uint64(len(tt.wantAttempts)), ss.Attempts)
				assert.Equal(t, uint64(len(tt.wantAttempts)-1), ss.Retries)
				assert.Equal(t, uint64(1), ss.DeadLettered)
			})
		})
	}
}

func TestRetryDelays(t *testing.T) {
	tests := []struct {
		name    string
		backoff Backoff
		err     error
		want    time.Duration // gap between attempt 1 and attempt 2
	}{
		{"RetryAfter longer than backoff", ConstantBackoff(time.Second), RetryAfter(errBoom, 3*time.Second), 3 * time.Second},
		{"backoff longer than RetryAfter", ConstantBackoff(5 * time.Second), RetryAfter(errBoom, time.Second), 5 * time.Second},
		{"constant backoff", ConstantBackoff(700 * time.Millisecond), errBoom, 700 * time.Millisecond},
		{"zero backoff", ConstantBackoff(0), errBoom, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: tt.backoff}))
				var at stamps
				_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
					at.add()
					if m.Attempt == 1 {
						return tt.err
					}
					return nil
				})
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				time.Sleep(time.Minute)
				gaps := at.gaps()
				require.Len(t, gaps, 1)
				assert.Equal(t, tt.want, gaps[0])
				assert.Equal(t, uint64(1), subStats(t, b, "t", "s").Delivered)
			})
		})
	}
}

func TestExponentialBackoffBetweenAttempts(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 4, Backoff: ExponentialBackoff(100*time.Millisecond, 400*time.Millisecond)}))
		var at stamps
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			at.add()
			return errBoom
		})
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		time.Sleep(time.Minute)
		gaps := at.gaps()
		require.Len(t, gaps, 4)
		caps := []time.Duration{100, 200, 400, 400} // ms: base·2^(n-1), capped
		for i, c := range caps {
			gap := gaps[i]
			d := c * time.Millisecond
			assert.GreaterOrEqual(t, gap, d/2, "retry %d", i+1)
			assert.LessOrEqual(t, gap, d, "retry %d", i+1)
		}
	})
}

// The article's second worked example: timeouts retried 3 times, invalid
// input never, throttling 5 times with a longer backoff.
func TestPerCodeRules(t *testing.T) {
	policy := RetryPolicy{
		MaxRetries: 2,
		Backoff:    ConstantBackoff(10 * time.Millisecond),
		ByCode: map[string]RetryRule{
			CodeTimeout:   {MaxRetries: 3},
			"invalid":     {MaxRetries: NoRetries},
			CodeThrottled: {MaxRetries: 5, Backoff: ConstantBackoff(time.Second)},
		},
	}
	tests := []struct {
		name     string
		handler  Handler
		attempts int
		code     string
		gap      time.Duration
	}{
		{"timeout retried 3 times", blockUntilCancelled, 4, CodeTimeout, 50*time.Millisecond + 10*time.Millisecond},
		{"invalid never retried", func(ctx context.Context, m Message) error {
			return codedError{"invalid"}
		}, 1, "invalid", 0},
		{"throttled retried 5 times, longer backoff", func(ctx context.Context, m Message) error {
			return RetryAfter(errBoom, 0)
		}, 6, CodeThrottled, time.Second},
		{"other errors use the policy", func(ctx context.Context, m Message) error {
			return errBoom
		}, 3, CodeError, 10 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(policy))
				var at stamps
				_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
					at.add()
					return tt.handler(ctx, m)
				}, HandlerTimeout(50*time.Millisecond))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				time.Sleep(time.Hour)
				gaps := at.gaps()
				require.Len(t, gaps, tt.attempts-1)
				for _, g := range gaps {
					assert.Equal(t, tt.gap, g)
				}
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				assert.Equal(t, tt.code, dls[0].ErrorCode)
				assert.Equal(t, tt.attempts, dls[0].Attempts)
			})
		})
	}
}

func TestSubscriberPolicyOverridesBroker(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 5, Backoff: ConstantBackoff(0)}))
		var a, c calls
		fail := func(Message) error { return errBoom }
		_, err := b.Subscribe("t", "default", recording(&a, fail))
		require.NoError(t, err)
		_, err = b.Subscribe("t", "own", recording(&c, fail), WithSubscriberRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(0)}))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		assert.Equal(t, []int{1, 2, 3, 4, 5, 6}, a.attempts("m"))
		assert.Equal(t, []int{1, 2}, c.attempts("m"))
	})
}

func TestPanicsAreDeadLettered(t *testing.T) {
	tests := []struct {
		name     string
		policy   RetryPolicy
		attempts int
		reason   string
	}{
		{"retried under the policy", RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(0)}, 4, ReasonExhausted},
		{"retried under the default policy", RetryPolicy{Backoff: ConstantBackoff(0)}, DefaultMaxRetries + 1, ReasonExhausted},
		{"retried as a rule says", RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(0),
			ByCode: map[string]RetryRule{CodePanic: {MaxRetries: 1}}}, 2, ReasonExhausted},
		{"never when a rule says NoRetries", RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(0),
			ByCode: map[string]RetryRule{CodePanic: {MaxRetries: NoRetries}}}, 1, ReasonPermanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var seen []error
				var mu sync.Mutex
				obs := &funcObserver{attempted: func(e AttemptEvent) {
					mu.Lock()
					seen = append(seen, e.Err)
					mu.Unlock()
				}}
				b := newTestBroker(t, WithRetryPolicy(tt.policy), WithObserver(obs))
				var got calls
				_, err := b.Subscribe("t", "s", recording(&got, func(Message) error { panic("kaboom") }))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				idle()
				assert.Len(t, got.all(), tt.attempts)
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				assert.Equal(t, CodePanic, dls[0].ErrorCode)
				assert.Equal(t, tt.reason, dls[0].Reason)
				assert.Contains(t, dls[0].Error, "kaboom")
				assert.Equal(t, uint64(0), subStats(t, b, "t", "s").Delivered, "a panic never counts as success")
				require.NotEmpty(t, seen)
				pe, ok := errors.AsType[*PanicError](seen[0])
				require.True(t, ok, "attempt error is a *PanicError")
				assert.Equal(t, "kaboom", pe.Value)
				assert.Contains(t, string(pe.Stack), "safeCall")
			})
		})
	}
}

func TestHandlerTimeout(t *testing.T) {
	tests := []struct {
		name    string
		handler Handler
	}{
		{"handler honours ctx", blockUntilCancelled},
		{"handler ignores ctx and returns its own error late", func(ctx context.Context, m Message) error {
			time.Sleep(2 * time.Second)
			return errBoom
		}},
		{"permanent error after the deadline is a timeout", func(ctx context.Context, m Message) error {
			time.Sleep(2 * time.Second)
			return Permanent(errBoom)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(0)}))
				var deadlines stamps
				_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
					d, ok := ctx.Deadline()
					require.True(t, ok, "handler context has a deadline")
					deadlines.addDeadline(d)
					return tt.handler(ctx, m)
				}, HandlerTimeout(time.Second))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				time.Sleep(time.Minute)
				assert.Equal(t, []time.Duration{time.Second, time.Second}, deadlines.untilsList())
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				assert.Equal(t, CodeTimeout, dls[0].ErrorCode)
				assert.True(t, dls[0].Retryable)
				assert.Equal(t, ReasonExhausted, dls[0].Reason)
				assert.Equal(t, 2, dls[0].Attempts)
			})
		})
	}
}

func TestDeadLetterCarriesEveryField(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Second)}))
		_, err := b.Subscribe("orders", "billing", func(context.Context, Message) error {
			return codedError{"card_declined"}
		})
		require.NoError(t, err)
		msg := Message{ID: "m-9", Topic: "orders", Key: "customer-7", Payload: []byte("order=9"),
			Headers: map[string]string{"traceparent": "00-abc-def-01"}}
		published := time.Now()
		require.NoError(t, b.Publish(context.Background(), msg))
		idle()
		time.Sleep(time.Second)
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		dl := dls[0]
		assert.NotEmpty(t, dl.ID)
		assert.Equal(t, "m-9", dl.Message.ID)
		assert.Equal(t, "orders", dl.Message.Topic)
		assert.Equal(t, "customer-7", dl.Message.Key)
		assert.Equal(t, []byte("order=9"), dl.Message.Payload)
		assert.Equal(t, msg.Headers, dl.Message.Headers)
		assert.Equal(t, 2, dl.Message.Attempt, "as last delivered")
		assert.Equal(t, published, dl.Message.PublishedAt)
		assert.Equal(t, "billing", dl.Subscriber)
		assert.Equal(t, 2, dl.Attempts)
		assert.Equal(t, "card_declined", dl.ErrorCode)
		assert.Equal(t, "coded: card_declined", dl.Error)
		assert.True(t, dl.Retryable)
		assert.Equal(t, ReasonExhausted, dl.Reason)
		assert.Equal(t, published.Add(time.Second), dl.FailedAt)

		got, ok, err := b.DeadLetters().Get(context.Background(), dl.ID)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, dl, got)
	})
}

func TestRedrive(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var billing, inventory calls
		var fail atomic.Bool
		fail.Store(true)
		_, err := b.Subscribe("orders", "billing", okHandler(&billing))
		require.NoError(t, err)
		_, err = b.Subscribe("orders", "inventory", recording(&inventory, func(Message) error {
			if fail.Load() {
				return errBoom
			}
			return nil
		}))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m-1", Topic: "orders", Payload: []byte("p")}))
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		require.Equal(t, "inventory", dls[0].Subscriber)

		fail.Store(false)
		n, err := b.Redrive(context.Background(), dls[0].ID)
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		idle()
		assert.Equal(t, []int{1}, billing.attempts("m-1"), "billing is not redriven")
		assert.Equal(t, []int{1, 1}, inventory.attempts("m-1"), "inventory starts again at attempt 1")
		assert.Equal(t, []byte("p"), inventory.all()[1].Payload)
		assert.Empty(t, deadLetters(t, b), "redriven dead letter left the store")
		ss := subStats(t, b, "orders", "inventory")
		assert.Equal(t, uint64(2), ss.Routed)
		assert.Equal(t, uint64(1), ss.Delivered)
		assert.Equal(t, uint64(1), ss.DeadLettered)
		requireConserved(t, b.Stats())

		n, err = b.Redrive(context.Background(), dls[0].ID, "nope")
		assert.Equal(t, 0, n)
		assert.ErrorIs(t, err, ErrDeadLetterNotFound)
	})
}

func TestRedriveBypassesDedup(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var got calls
		var fail atomic.Bool
		fail.Store(true)
		_, err := b.Subscribe("t", "s", recording(&got, func(Message) error {
			if fail.Load() {
				return errBoom
			}
			return nil
		}))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		fail.Store(false)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"})) // delivered: recorded
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		n, err := b.Redrive(context.Background(), dls[0].ID)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		idle()
		assert.Equal(t, 3, got.len(), "the redriven message ran although its ID was delivered")
	})
}

func TestRedriveErrors(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		sub, err := b.Subscribe("t", "s", func(context.Context, Message) error { return errBoom })
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		require.NoError(t, sub.Unsubscribe(context.Background()))

		n, err := b.Redrive(context.Background(), dls[0].ID, "missing")
		assert.Equal(t, 0, n)
		assert.ErrorIs(t, err, ErrSubscriberNotFound)
		assert.ErrorIs(t, err, ErrDeadLetterNotFound)
		assert.Len(t, deadLetters(t, b), 1, "a dead letter that was not accepted stays")

		require.NoError(t, b.Close(context.Background()))
		_, err = b.Redrive(context.Background(), dls[0].ID)
		assert.ErrorIs(t, err, ErrClosed)
	})
}

func TestDedup(t *testing.T) {
	tests := []struct {
		name      string
		opts      []Option
		wantCalls int
		wantDedup uint64
	}{
		{"default store runs the handler once", nil, 1, 99},
		{"dedup disabled runs it every time", []Option{WithIdempotencyStore(nil)}, 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, tt.opts...)
				var got calls
				_, err := b.Subscribe("t", "s", okHandler(&got))
				require.NoError(t, err)
				for range 100 {
					require.NoError(t, b.Publish(context.Background(), Message{ID: "same", Topic: "t"}))
				}
				idle()
				assert.Equal(t, tt.wantCalls, got.len())
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, uint64(tt.wantCalls), ss.Delivered)
				assert.Equal(t, tt.wantDedup, ss.Deduplicated)
				requireConserved(t, b.Stats())
			})
		})
	}
}

func TestDedupIsPerSubscriberAndAfterSuccessOnly(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var a, c calls
		var fail atomic.Bool
		fail.Store(true)
		_, err := b.Subscribe("t", "a", okHandler(&a))
		require.NoError(t, err)
		_, err = b.Subscribe("t", "c", recording(&c, func(Message) error {
			if fail.Load() {
				return errBoom
			}
			return nil
		}))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		fail.Store(false)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		assert.Equal(t, 1, a.len(), "a delivered it the first time")
		assert.Equal(t, 2, c.len(), "a failed delivery is not remembered as delivered")
		assert.Equal(t, uint64(1), subStats(t, b, "t", "a").Deduplicated)
	})
}

func TestDedupWindowExpires(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(NewMemoryIdempotencyStore(time.Minute, 100)))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		time.Sleep(59 * time.Second)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		assert.Equal(t, 1, got.len(), "within the window")
		time.Sleep(2 * time.Second)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		assert.Equal(t, 2, got.len(), "after the window")
	})
}

func TestSameIDNeverRunsTwiceAtOnce(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// Permanent failures are never recorded as delivered, so every copy
		// runs; different Keys send the copies to different workers.
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
		var running, overlap, runs atomic.Int32
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			runs.Add(1)
			if running.Add(1) > 1 {
				overlap.Add(1)
			}
			time.Sleep(10 * time.Millisecond)
			running.Add(-1)
			return Permanent(errBoom)
		}, Concurrency(8))
		require.NoError(t, err)
		for i := range 16 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: "same", Topic: "t", Key: fmt.Sprintf("k%d", i)}))
		}
		time.Sleep(time.Second)
		assert.Equal(t, int32(16), runs.Load())
		assert.Zero(t, overlap.Load(), "two deliveries of one ID overlapped")
	})
}

func TestSlowSubscriberDoesNotDelayFast(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		release := make(chan struct{})
		var fast calls
		_, err := b.Subscribe("t", "slow", blockUntil(release))
		require.NoError(t, err)
		_, err = b.Subscribe("t", "fast", okHandler(&fast))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 100)
		idle()
		assert.Equal(t, 100, fast.len(), "fast got everything while slow holds its first message")
		ss := subStats(t, b, "t", "slow")
		assert.Equal(t, 1, ss.InFlight)
		assert.Equal(t, 99, ss.Queued)
		close(release)
		idle()
		assert.Equal(t, uint64(100), subStats(t, b, "t", "slow").Delivered)
	})
}

// InFlight counts the messages a subscriber's workers run; Queued the ones
// in its lane that no worker runs: waiting for a worker, or parked until
// their retry (Parked, of Queued).
func TestStatsInFlight(t *testing.T) {
	tests := []struct {
		name        string
		concurrency int
		failFirst   bool // each message fails once, then waits a minute's backoff
	}{
		{"one worker blocked", 1, false},
		{"four workers blocked", 4, false},
		{"retries waiting out their backoff", 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Minute)}))
				release := make(chan struct{})
				var tries sync.Map
				_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
					if _, again := tries.LoadOrStore(m.ID, true); tt.failFirst && !again {
						return errors.New("once")
					}
					<-release
					return nil
				}, Concurrency(tt.concurrency))
				require.NoError(t, err)
				for i := range 40 {
					m := Message{ID: fmt.Sprintf("m-%d", i), Topic: "t", Key: fmt.Sprintf("k%d", i)}
					require.NoError(t, b.Publish(context.Background(), m))
				}
				idle()
				ss := subStats(t, b, "t", "s")
				if tt.failFirst {
					assert.Zero(t, ss.InFlight, "every message failed and parked: the worker holds none")
					assert.Equal(t, 40, ss.Queued)
					assert.Equal(t, 40, ss.Parked)
					time.Sleep(time.Minute)
					idle()
					ss = subStats(t, b, "t", "s")
				}
				assert.Equal(t, tt.concurrency, ss.InFlight, "one per worker")
				assert.Equal(t, 40-tt.concurrency, ss.Queued)
				assert.Zero(t, ss.Parked)
				close(release)
				time.Sleep(2 * time.Hour) // every backoff
				idle()
				ss = subStats(t, b, "t", "s")
				assert.Zero(t, ss.InFlight)
				assert.Zero(t, ss.Queued)
				assert.Equal(t, uint64(40), ss.Delivered)
				wantAttempts := uint64(40)
				if tt.failFirst {
					wantAttempts = 80
				}
				assert.Equal(t, wantAttempts, ss.Attempts, "failed attempts and the delivered ones")
			})
		})
	}
}

func TestBackpressureReachesPublish(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(4), WithPublishTimeout(0))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "slow", blockUntil(release), LaneSize(4))
		require.NoError(t, err)
		accepted := 0
		for i := range 100 {
			err := b.Publish(context.Background(), Message{ID: fmt.Sprintf("m-%d", i), Topic: "t"})
			if errors.Is(err, ErrQueueFull) {
				break
			}
			require.NoError(t, err)
			accepted++
			idle()
		}
		// 1 in the handler + 4 in the lane + 4 in the topic queue
		assert.Equal(t, 9, accepted)
		st := b.Stats().Topics["t"]
		assert.Equal(t, 4, st.Queued)
		assert.Equal(t, 4, st.Subscribers["slow"].Queued)
		assert.Equal(t, 4, st.Subscribers["slow"].Capacity)
		close(release)
		idle()
		assert.Equal(t, uint64(9), subStats(t, b, "t", "slow").Delivered)
	})
}

func TestCloseDrains(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Second)}))
		var got calls
		_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
			if m.Attempt == 1 {
				return errBoom // one retry each, a second later
			}
			return nil
		}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 50)
		require.NoError(t, b.Close(context.Background()))
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(50), ss.Delivered, "everything queued was delivered, retries included")
		assert.Equal(t, 100, got.len())
		assert.Empty(t, deadLetters(t, b))

		require.NoError(t, b.Close(context.Background()), "second Close is a no-op")
		assert.ErrorIs(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t"}), ErrClosed)
		_, err = b.Subscribe("t", "late", okHandler(&got))
		assert.ErrorIs(t, err, ErrClosed)
	})
}

func TestCloseDeadlineDeadLettersLeftovers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(4))
		var closed atomic.Bool
		var lateRuns atomic.Int32
		block := func(ctx context.Context, m Message) error {
			if closed.Load() {
				lateRuns.Add(1)
			}
			return blockUntilCancelled(ctx, m) // runs until Close cancels it
		}
		_, err := b.Subscribe("t", "a", block, LaneSize(2))
		require.NoError(t, err)
		// b's two workers each hold up to 1 running + 2 queued, so b takes
		// whatever a takes, however its IDs hash.
		_, err = b.Subscribe("t", "b", block, LaneSize(4), Concurrency(2))
		require.NoError(t, err)
		for i := range 7 { // a: 1 running + 2 in lane, 4 in the topic queue
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprintf("m-%d", i), Topic: "t"}))
			idle()
		}
		require.Equal(t, 4, b.Stats().Topics["t"].Queued)

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		err = b.Close(ctx)
		closed.Store(true)
		assert.Equal(t, time.Second, time.Since(start), "Close drained until its deadline")
		var de *DrainError
		require.ErrorAs(t, err, &de)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, ReasonShutdown, de.Reason)
		assert.Equal(t, 14, de.DeadLettered, "7 messages × 2 subscribers")
		dls := deadLetters(t, b)
		assert.Len(t, dls, 14)
		perSub := map[string]int{}
		for _, dl := range dls {
			assert.Equal(t, ReasonShutdown, dl.Reason)
			perSub[dl.Subscriber]++
		}
		assert.Equal(t, map[string]int{"a": 7, "b": 7}, perSub)
		requireConserved(t, b.Stats())
		for _, name := range []string{"a", "b"} {
			ss := subStats(t, b, "t", name)
			assert.Equal(t, uint64(7), ss.Routed)
			assert.Equal(t, uint64(7), ss.DeadLettered)
		}
		assert.Zero(t, b.Stats().Topics["t"].Queued)
		time.Sleep(time.Second)
		assert.Zero(t, lateRuns.Load(), "no handler ran after Close returned")
		assert.Same(t, err, b.Close(context.Background()), "a second Close returns the first's result")
	})
}

func TestCloseTwiceConcurrently(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", blockUntil(release))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 3)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { errs[i] = b.Close(context.Background()) })
		}
		idle()
		close(release)
		wg.Wait()
		assert.Equal(t, []error{nil, nil}, errs)
		assert.Equal(t, uint64(3), subStats(t, b, "t", "s").Delivered)
	})
}

func TestUnsubscribe(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		var stay calls
		_, err := b.Subscribe("t", "stay", okHandler(&stay))
		require.NoError(t, err)
		var got calls
		sub, err := b.Subscribe("t", "leave", recording(&got, func(m Message) error {
			time.Sleep(time.Second)
			return nil
		}))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 5)
		idle()
		_, err = b.Subscribe("t", "leave", okHandler(&got))
		require.ErrorIs(t, err, ErrDuplicateSubscriber)

		require.NoError(t, sub.Unsubscribe(context.Background()))
		assert.Equal(t, 5, got.len(), "drained before returning")
		require.NoError(t, sub.Unsubscribe(context.Background()), "second Unsubscribe is a no-op")

		publishN(t, b, "t", "after", 3)
		idle()
		assert.Equal(t, 5, got.len(), "no routing after Unsubscribe")
		assert.Equal(t, 8, stay.len(), "the other subscriber is unaffected")

		var again calls
		_, err = b.Subscribe("t", "leave", okHandler(&again))
		require.NoError(t, err, "name is free again")
		publishN(t, b, "t", "again", 2)
		idle()
		assert.Equal(t, 2, again.len(), "a late subscriber sees only later messages")
		ss := subStats(t, b, "t", "leave")
		assert.Equal(t, uint64(7), ss.Delivered, "counters are kept per name")
		requireConserved(t, b.Stats())
	})
}

func TestUnsubscribeDeadlineDeadLettersLeftovers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		var cancelled atomic.Int32
		sub, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			err := blockUntilCancelled(ctx, m)
			cancelled.Add(1)
			return err
		})
		require.NoError(t, err)
		publishN(t, b, "t", "m", 4)
		idle()
		de := stopWithin(t, time.Second, sub.Unsubscribe)
		assert.Equal(t, ReasonUnsubscribed, de.Reason)
		assert.Equal(t, 4, de.DeadLettered)
		assert.Equal(t, int32(1), cancelled.Load(), "the running handler saw its context cancelled")
		dls := deadLetters(t, b)
		require.Len(t, dls, 4)
		for _, dl := range dls {
			assert.Equal(t, ReasonUnsubscribed, dl.Reason)
		}
		for _, dl := range dls {
			if dl.Message.ID == "m-0" {
				assert.Equal(t, 1, dl.Attempts, "the running message was attempted once, not retried")
				continue
			}
			assert.Equal(t, 0, dl.Attempts, "queued messages were never attempted")
			assert.Equal(t, CodeUnsubscribed, dl.ErrorCode)
		}
		requireConserved(t, b.Stats())
		assert.False(t, subStats(t, b, "t", "s").Active)
	})
}

func TestSubscribeValidation(t *testing.T) {
	b := newTestBroker(t)
	h := func(context.Context, Message) error { return nil }
	tests := []struct {
		name        string
		topic, sub  string
		handler     Handler
		opts        []SubscribeOption
		want        error
		wantMessage string
	}{
		{"empty topic", "", "s", h, nil, ErrInvalidOption, "empty topic"},
		{"empty name", "t", "", h, nil, ErrInvalidOption, "empty subscriber name"},
		{"nil handler", "t", "s", nil, nil, ErrInvalidOption, "nil handler"},
		{"zero concurrency", "t", "s", h, []SubscribeOption{Concurrency(0)}, ErrInvalidOption, "concurrency 0"},
		{"huge concurrency", "t", "s", h, []SubscribeOption{Concurrency(MaxConcurrency + 1)}, ErrInvalidOption, "outside 1..65536"},
		{"negative timeout", "t", "s", h, []SubscribeOption{HandlerTimeout(-1)}, ErrInvalidOption, "handler timeout"},
		{"zero lane", "t", "s", h, []SubscribeOption{LaneSize(0)}, ErrInvalidOption, "lane size"},
		{"huge lane", "t", "s", h, []SubscribeOption{LaneSize(MaxQueueSize + 1)}, ErrInvalidOption, "lane size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.Subscribe(tt.topic, tt.sub, tt.handler, tt.opts...)
			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.wantMessage)
		})
	}
	_, err := b.Subscribe("t", "s", h)
	require.NoError(t, err)
	_, err = b.Subscribe("t", "s", h)
	require.ErrorIs(t, err, ErrDuplicateSubscriber)
	_, err = b.Subscribe("other", "s", h)
	require.NoError(t, err, "names are per topic")
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name string
		opt  Option
		want string
	}{
		{"queue size", WithQueueSize(0), "queue size"},
		{"huge queue size", WithQueueSize(MaxQueueSize + 1), "queue size"},
		{"publish timeout", WithPublishTimeout(-time.Second), "publish timeout"},
		{"empty code", WithRetryPolicy(RetryPolicy{ByCode: map[string]RetryRule{"": {}}}), "empty error code"},
		{"nil store", WithDeadLetterStore(nil), "dead-letter store"},
		{"nil logger", WithLogger(nil), "logger"},
		{"nil observer", WithObserver(nil), "observer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(tt.opt)
			require.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), tt.want)
			assert.Nil(t, b)
		})
	}
}

func TestUnroutedAndLateSubscriber(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t)
		publishN(t, b, "t", "early", 3)
		idle()
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "late", 2)
		idle()
		assert.Equal(t, []string{"late-0", "late-1"}, got.ids())
		ts := b.Stats().Topics["t"]
		assert.Equal(t, uint64(5), ts.Published)
		assert.Equal(t, uint64(3), ts.Unrouted)
	})
}

func TestStatsMatchHandlers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(time.Millisecond)}))
		var got calls
		_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
			var i int
			_, _ = fmt.Sscanf(m.ID, "m-%d", &i)
			switch {
			case i%5 == 0:
				return Permanent(errBoom) // 1 attempt, dead letter
			case i%5 == 1 && m.Attempt < 3:
				return errBoom // succeeds on attempt 3
			case i%5 == 2:
				return errBoom // 3 attempts, dead letter
			}
			return nil
		}), Concurrency(3))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 100)
		settle(t, b)
		publishN(t, b, "t", "m", 10) // duplicates of m-0..m-9, once the originals ended
		settle(t, b)
		st := b.Stats()
		requireConserved(t, st)
		ss := st.Topics["t"].Subscribers["s"]
		assert.Equal(t, uint64(110), ss.Routed)
		assert.Equal(t, uint64(got.len()), ss.Attempts, "attempts equal handler calls")
		// Per 5 originals: one permanent (1 call), one retried twice then ok
		// (3), one exhausted (3), two ok (1 each). The duplicates of the
		// dead-lettered m-0, m-5 (1 call) and m-2, m-7 (3 calls) run again;
		// those of m-1, 3, 4, 6, 8, 9 were delivered before.
		assert.Equal(t, uint64(20*9+2*1+2*3), ss.Attempts)
		assert.Equal(t, uint64(20*2+20*2+2*2), ss.Retries)
		assert.Equal(t, uint64(20*3), ss.Delivered)
		assert.Equal(t, uint64(20*2+4), ss.DeadLettered)
		assert.Equal(t, uint64(6), ss.Deduplicated)
		assert.Equal(t, 0, ss.Backlog())
		assert.InDelta(t, float64(ss.Retries)/float64(ss.Attempts), ss.RetryRate(), 1e-9)
		dls := deadLetters(t, b)
		assert.Len(t, dls, int(ss.DeadLettered))
		assert.Equal(t, 3, ss.Concurrency)
		assert.Equal(t, DefaultLaneSize, ss.Capacity, "one lane, shared by the workers")
	})
}

func TestStatsOldestAge(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithQueueSize(2))
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", blockUntil(release), LaneSize(1))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 2) // one running, one in the lane
		idle()
		time.Sleep(3 * time.Second)
		publishN(t, b, "t", "n", 1) // in the topic queue
		idle()
		time.Sleep(time.Second)
		ts := b.Stats().Topics["t"]
		assert.Equal(t, time.Second, ts.OldestAge)
		assert.Equal(t, 4*time.Second, ts.Subscribers["s"].OldestAge)
		close(release)
		idle()
		ts = b.Stats().Topics["t"]
		assert.Zero(t, ts.OldestAge)
		assert.Zero(t, ts.Subscribers["s"].OldestAge)
	})
}

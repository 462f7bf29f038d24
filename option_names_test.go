package broker

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSubscriberRetryPolicyNames: Retries and its old name,
// WithSubscriberRetryPolicy, both set the subscriber's policy over the
// broker's (2 retries in newTestBroker; 1 here, so 2 attempts in all).
func TestSubscriberRetryPolicyNames(t *testing.T) {
	tests := []struct {
		name string
		opt  func(RetryPolicy) SubscribeOption
	}{
		{"Retries", Retries},
		{"WithSubscriberRetryPolicy", WithSubscriberRetryPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t)
				var c calls
				_, err := b.Subscribe("t", "s", recording(&c, func(Message) error { return errBoom }),
					tt.opt(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(0)}))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1)
				settle(t, b)
				require.Equal(t, []int{1, 2}, c.attempts("m-0"))
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				require.Equal(t, ReasonExhausted, dls[0].Reason)
			})
		})
	}
}

// TestSubscriberMiddlewareNames: HandlerMiddleware and its old name,
// WithSubscriberMiddleware, both wrap this subscriber's handler, in order,
// inside the broker's middleware, and refuse a nil entry.
func TestSubscriberMiddlewareNames(t *testing.T) {
	tests := []struct {
		name string
		opt  func(...Middleware) SubscribeOption
	}{
		{"HandlerMiddleware", HandlerMiddleware},
		{"WithSubscriberMiddleware", WithSubscriberMiddleware},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var mu sync.Mutex
				var order []string
				mark := func(name string) Middleware {
					return func(_ SubscriberInfo, next Handler) Handler {
						return func(ctx context.Context, m Message) error {
							mu.Lock()
							order = append(order, name)
							mu.Unlock()
							return next(ctx, m)
						}
					}
				}
				b := newTestBroker(t, WithMiddleware(mark("broker")))
				var c calls
				_, err := b.Subscribe("t", "s", okHandler(&c), tt.opt(mark("first"), mark("second")))
				require.NoError(t, err)
				publishN(t, b, "t", "m", 1)
				settle(t, b)
				require.Equal(t, 1, c.len())
				mu.Lock()
				require.Equal(t, []string{"broker", "first", "second"}, order)
				mu.Unlock()

				_, err = b.Subscribe("t", "nil", okHandler(&c), tt.opt(nil))
				require.ErrorIs(t, err, ErrInvalidOption)
			})
		})
	}
}

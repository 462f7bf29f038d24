package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failWith fails every attempt with codedError{code}, or errBoom when code
// is "".
func failWith(code string) func(Message) error {
	return func(Message) error {
		if code == "" {
			return errBoom
		}
		return codedError{code}
	}
}

// TestZeroFieldsMeanTheDefault: a policy or rule field left at zero takes
// the default (the policy's, for a rule); only NoRetries means never. The
// version-2 trap: a policy that set only its backoff, or only ByCode, gave
// one attempt.
func TestZeroFieldsMeanTheDefault(t *testing.T) {
	defaultAttempts := DefaultMaxRetries + 1
	for _, tt := range []struct {
		name       string
		policy     RetryPolicy
		code       string
		attempts   int
		reason     string
		retryable  bool
		wantDelays time.Duration // gap between the first two attempts, when > 0
	}{
		{"only the backoff set", RetryPolicy{Backoff: ConstantBackoff(10 * time.Millisecond)}, "", defaultAttempts, ReasonExhausted, true, 10 * time.Millisecond},
		{"only ByCode set: other codes", RetryPolicy{ByCode: map[string]RetryRule{"invalid": {MaxRetries: NoRetries}}}, "", defaultAttempts, ReasonExhausted, true, 0},
		{"only ByCode set: its code", RetryPolicy{ByCode: map[string]RetryRule{"invalid": {MaxRetries: NoRetries}}}, "invalid", 1, ReasonPermanent, false, 0},
		{"rule with only a backoff", RetryPolicy{MaxRetries: 1, ByCode: map[string]RetryRule{"slow": {Backoff: ConstantBackoff(time.Minute)}}}, "slow", 2, ReasonExhausted, true, time.Minute},
		{"rule with only a count", RetryPolicy{Backoff: ConstantBackoff(time.Second), ByCode: map[string]RetryRule{"x": {MaxRetries: 1}}}, "x", 2, ReasonExhausted, true, time.Second},
		{"policy NoRetries, rule with only a backoff", RetryPolicy{MaxRetries: NoRetries, ByCode: map[string]RetryRule{"x": {Backoff: ConstantBackoff(time.Second)}}}, "x", 1, ReasonExhausted, true, 0},
		{"zero policy", RetryPolicy{}, "", defaultAttempts, ReasonExhausted, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(tt.policy))
				var got calls
				var at stamps
				_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
					at.add()
					return failWith(tt.code)(m)
				}))
				require.NoError(t, err)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				settle(t, b)
				assert.Len(t, got.attempts("m"), tt.attempts)
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				assert.Equal(t, tt.reason, dls[0].Reason)
				assert.Equal(t, tt.retryable, dls[0].Retryable)
				if gaps := at.gaps(); tt.wantDelays > 0 && assert.NotEmpty(t, gaps) {
					assert.Equal(t, tt.wantDelays, gaps[0])
				}
			})
		})
	}
}

// TestSubscriberPolicyRefinesTheBrokers: a subscriber's policy takes the
// broker's values for its zero fields, and its rules are laid over the
// broker's, code by code.
func TestSubscriberPolicyRefinesTheBrokers(t *testing.T) {
	broker := RetryPolicy{MaxRetries: 3, Backoff: ConstantBackoff(0), ByCode: map[string]RetryRule{
		"a": {MaxRetries: 1}, "b": {MaxRetries: 2},
	}}
	for _, tt := range []struct {
		name     string
		own      RetryPolicy
		attempts map[string]int // by code ("" is CodeError)
	}{
		{"empty: the broker's", RetryPolicy{}, map[string]int{"": 4, "a": 2, "b": 3}},
		{"own count, the broker's rules", RetryPolicy{MaxRetries: 1}, map[string]int{"": 2, "a": 2, "b": 3}},
		{"a rule replaces one code's", RetryPolicy{ByCode: map[string]RetryRule{"a": {MaxRetries: NoRetries}}}, map[string]int{"": 4, "a": 1, "b": 3}},
		{"a new rule adds a code", RetryPolicy{ByCode: map[string]RetryRule{"c": {MaxRetries: 5}}}, map[string]int{"": 4, "a": 2, "c": 6}},
		{"own NoRetries, the broker's rules", RetryPolicy{MaxRetries: NoRetries}, map[string]int{"": 1, "a": 2, "b": 3}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithRetryPolicy(broker))
				var got calls
				_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
					return failWith(m.Key)(m)
				}), WithSubscriberRetryPolicy(tt.own))
				require.NoError(t, err)
				for code := range tt.attempts {
					require.NoError(t, b.Publish(context.Background(), Message{ID: "m-" + code, Topic: "t", Key: code}))
				}
				settle(t, b)
				for code, want := range tt.attempts {
					assert.Len(t, got.attempts("m-"+code), want, "code %q", code)
				}
			})
		})
	}
}

// TestDefaultBackoffTotal: the default policy's total backoff, jitter
// included, is at least 3 s at its shortest (SPEC) and at most 6.2 s.
func TestDefaultBackoffTotal(t *testing.T) {
	p := RetryPolicy{}.normalized()
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 10_000 {
		var total time.Duration
		for retry := 1; retry <= p.MaxRetries; retry++ {
			total += p.Backoff(retry)
		}
		lo, hi = min(lo, total), max(hi, total)
	}
	t.Logf("default policy: %d retries, total backoff %v to %v over 10,000 draws", p.MaxRetries, lo, hi)
	assert.GreaterOrEqual(t, lo, 3100*time.Millisecond)
	assert.LessOrEqual(t, hi, 6200*time.Millisecond)
}

// TestDefaultPolicyRidesOutABlip: with the default policy, a dependency
// down for 3 s costs retries, not dead letters (version 2's default gave
// up after about 150 ms).
func TestDefaultPolicyRidesOutABlip(t *testing.T) {
	for _, down := range []time.Duration{time.Second, 3 * time.Second} {
		t.Run(fmt.Sprint("down ", down), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b, err := New(WithLogger(discard))
				require.NoError(t, err)
				defer b.Close(context.Background())
				until := time.Now().Add(down)
				var got calls
				_, err = b.Subscribe("t", "s", recording(&got, func(Message) error {
					if time.Now().Before(until) {
						return errors.New("dependency down")
					}
					return nil
				}))
				require.NoError(t, err)
				publishAt(t, b, "t", "m", 100, 100, nil) // the first second
				settle(t, b)
				ss := subStats(t, b, "t", "s")
				assert.Equal(t, uint64(100), ss.Delivered)
				assert.Zero(t, ss.DeadLettered)
				assert.Positive(t, ss.Retries)
			})
		})
	}
}

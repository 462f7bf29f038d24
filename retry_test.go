package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decide is decideWith calling the backoff unguarded.
func (p *RetryPolicy) decide(f failure, attempt int) verdict {
	return p.decideWith(f, attempt, func(b Backoff, retry int) time.Duration { return b(retry) })
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		timedOut  bool
		code      string
		permanent bool
		after     time.Duration
	}{
		{"plain error", errBoom, false, CodeError, false, 0},
		{"wrapped plain error", fmt.Errorf("x: %w", errBoom), false, CodeError, false, 0},
		{"own code", codedError{"db"}, false, "db", false, 0},
		{"wrapped own code", fmt.Errorf("x: %w", codedError{"db"}), false, "db", false, 0},
		{"empty own code", codedError{""}, false, CodeError, false, 0},
		{"permanent", Permanent(errBoom), false, CodePermanent, true, 0},
		{"permanent with code", Permanent(codedError{"invalid"}), false, "invalid", true, 0},
		{"permanent with empty code", Permanent(codedError{""}), false, CodePermanent, true, 0},
		{"wrapped permanent", fmt.Errorf("x: %w", Permanent(errBoom)), false, CodePermanent, true, 0},
		{"retry after", RetryAfter(errBoom, time.Second), false, CodeThrottled, false, time.Second},
		{"retry after negative", RetryAfter(errBoom, -time.Second), false, CodeThrottled, false, 0},
		{"wrapped retry after", fmt.Errorf("x: %w", RetryAfter(codedError{"db"}, time.Second)), false, CodeThrottled, false, time.Second},
		{"panic", newPanicError("p"), false, CodePanic, false, 0},
		{"panic after deadline stays panic", newPanicError("p"), true, CodePanic, false, 0},
		{"deadline passed", errBoom, true, CodeTimeout, false, 0},
		{"deadline passed beats permanent", Permanent(errBoom), true, CodeTimeout, false, 0},
		{"deadline passed beats own code", codedError{"db"}, true, CodeTimeout, false, 0},
		{"context error without deadline", context.DeadlineExceeded, false, CodeError, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := classify(tt.err, tt.timedOut)
			assert.Equal(t, failure{code: tt.code, permanent: tt.permanent, after: tt.after}, f)
		})
	}
}

func TestMarkersKeepTheCause(t *testing.T) {
	assert.NoError(t, Permanent(nil))
	assert.NoError(t, RetryAfter(nil, time.Second))
	p := Permanent(errBoom)
	assert.ErrorIs(t, p, errBoom)
	assert.Equal(t, "permanent: boom", p.Error())
	r := RetryAfter(errBoom, time.Second)
	assert.ErrorIs(t, r, errBoom)
	assert.Equal(t, "retry after 1s: boom", r.Error())
	pe := newPanicError(errBoom)
	assert.ErrorIs(t, pe, errBoom, "a panic with an error value unwraps to it")
	assert.Equal(t, CodePanic, pe.ErrorCode())
	assert.NoError(t, newPanicError("text").Unwrap())
}

func TestDecide(t *testing.T) {
	p := RetryPolicy{
		MaxRetries: 2,
		Backoff:    ConstantBackoff(time.Second),
		ByCode: map[string]RetryRule{
			"never":       {MaxRetries: NoRetries},
			"often":       {MaxRetries: 5, Backoff: ConstantBackoff(time.Minute)},
			"inherit":     {MaxRetries: 1},
			"zero count":  {Backoff: ConstantBackoff(time.Minute)},
			CodePermanent: {MaxRetries: 9},
		},
	}.normalized()
	tests := []struct {
		name    string
		f       failure
		attempt int
		want    verdict
	}{
		{"default first", failure{code: CodeError}, 1, verdict{retryable: true, retry: true, delay: time.Second}},
		{"default last", failure{code: CodeError}, 2, verdict{retryable: true, retry: true, delay: time.Second}},
		{"default exhausted", failure{code: CodeError}, 3, verdict{retryable: true}},
		{"policy without retries", failure{code: "no-rule"}, 3, verdict{retryable: true}},
		{"rule never", failure{code: "never"}, 1, verdict{}},
		{"rule often", failure{code: "often"}, 5, verdict{retryable: true, retry: true, delay: time.Minute}},
		{"rule often exhausted", failure{code: "often"}, 6, verdict{retryable: true}},
		{"rule inherits backoff", failure{code: "inherit"}, 1, verdict{retryable: true, retry: true, delay: time.Second}},
		{"permanent ignores rules", failure{code: CodePermanent, permanent: true}, 1, verdict{}},
		{"rule inherits the count", failure{code: "zero count"}, 2, verdict{retryable: true, retry: true, delay: time.Minute}},
		{"rule inherits the count, exhausted", failure{code: "zero count"}, 3, verdict{retryable: true}},
		{"panic retried under the policy", failure{code: CodePanic}, 1, verdict{retryable: true, retry: true, delay: time.Second}},
		{"panic exhausted", failure{code: CodePanic}, 3, verdict{retryable: true}},
		{"retry after longer than backoff", failure{code: CodeThrottled, after: time.Hour}, 1, verdict{retryable: true, retry: true, delay: time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, p.decide(tt.f, tt.attempt))
		})
	}
}

func TestPolicyIsCopied(t *testing.T) {
	byCode := map[string]RetryRule{"x": {MaxRetries: 1}}
	p := RetryPolicy{MaxRetries: 0, ByCode: byCode}.normalized()
	assert.Equal(t, DefaultMaxRetries, p.MaxRetries, "zero MaxRetries is the default")
	byCode["x"] = RetryRule{MaxRetries: 7}
	byCode["y"] = RetryRule{MaxRetries: 7}
	assert.Equal(t, 1, p.ByCode["x"].MaxRetries)
	assert.NotContains(t, p.ByCode, "y")
	require.NotNil(t, p.Backoff, "nil backoff becomes the default")
	d := p.Backoff(1)
	assert.True(t, d >= DefaultBackoffBase/2 && d <= DefaultBackoffBase, "default first delay %v", d)
}

func TestExponentialBackoff(t *testing.T) {
	tests := []struct {
		name      string
		base, max time.Duration
		retry     int
		lo, hi    time.Duration
	}{
		{"first", 100 * time.Millisecond, time.Second, 1, 50 * time.Millisecond, 100 * time.Millisecond},
		{"zero retry counts as first", 100 * time.Millisecond, time.Second, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		{"negative retry counts as first", 100 * time.Millisecond, time.Second, -5, 50 * time.Millisecond, 100 * time.Millisecond},
		{"third", 100 * time.Millisecond, time.Second, 3, 200 * time.Millisecond, 400 * time.Millisecond},
		{"capped", 100 * time.Millisecond, time.Second, 10, 500 * time.Millisecond, time.Second},
		{"huge retry stays capped", time.Second, time.Hour, math.MaxInt, 30 * time.Minute, time.Hour},
		{"shift 62", 1, math.MaxInt64, 63, math.MaxInt64 / 2, math.MaxInt64},
		{"max below base", time.Second, time.Millisecond, 5, 500 * time.Millisecond, time.Second},
		{"zero base", 0, time.Second, 3, 0, 0},
		{"negative base", -time.Second, time.Second, 3, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := ExponentialBackoff(tt.base, tt.max)
			for range 200 {
				d := b(tt.retry)
				require.GreaterOrEqual(t, d, tt.lo)
				require.LessOrEqual(t, d, tt.hi)
			}
		})
	}
}

func TestExponentialBackoffIsJittered(t *testing.T) {
	b := ExponentialBackoff(time.Second, time.Minute)
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[b(4)] = true
	}
	assert.Greater(t, len(seen), 1, "delays vary")
}

func TestConstantBackoff(t *testing.T) {
	assert.Equal(t, time.Second, ConstantBackoff(time.Second)(7))
	assert.Equal(t, time.Duration(0), ConstantBackoff(-time.Second)(1))
}

func TestPolicyValidation(t *testing.T) {
	tests := []struct {
		name string
		p    RetryPolicy
		ok   bool
	}{
		{"zero", RetryPolicy{}, true},
		{"default", DefaultRetryPolicy(), true},
		{"no retries", RetryPolicy{MaxRetries: NoRetries}, true},
		{"any negative", RetryPolicy{MaxRetries: -9}, true},
		{"rule without retries", RetryPolicy{ByCode: map[string]RetryRule{"x": {MaxRetries: NoRetries}}}, true},
		{"empty code", RetryPolicy{ByCode: map[string]RetryRule{"": {}}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.validate()
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.True(t, errors.Is(err, ErrInvalidOption), "got %v", err)
			}
		})
	}
}

package broker

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime/debug"
	"time"
)

// Error codes the broker assigns. A handler error with an ErrorCode() string
// method carries its own code; RetryPolicy.ByCode can set a rule for any code.
//
// Codes, reasons and outcomes are one taxonomy in three places: a code
// (DeadLetter.ErrorCode, AttemptEvent.ErrorCode) says what the last attempt's
// error was, a reason (DeadLetter.Reason) why the message left the
// subscriber, and an Outcome what one attempt led to. Codes and reasons
// are plain strings (a user's ErrorCode() adds codes of its own, and
// stores and dashboards carry them as text); where a message is cut off
// before any attempt failed, its code is its reason, the same constant.
const (
	CodeError     = "error"     // any other error; retryable
	CodeTimeout   = "timeout"   // the subscriber's HandlerTimeout passed; retryable
	CodePanic     = "panic"     // the handler panicked; retried like any error (ByCode["panic"] with NoRetries: never)
	CodePermanent = "permanent" // Permanent(err) without its own code; never retried
	CodeThrottled = "throttled" // RetryAfter(err, d); retried no sooner than d
	// CodeShutdown and CodeUnsubscribed mark dead letters of messages that
	// Close or Unsubscribe cut off before any attempt ended with an error.
	CodeShutdown     = ReasonShutdown
	CodeUnsubscribed = ReasonUnsubscribed
	// CodeOverflow marks dead letters shed from a full lane before any
	// attempt failed.
	CodeOverflow = ReasonOverflow
)

// Defaults of the retry policy: 5 retries waiting 200 ms, 400 ms, 800 ms,
// 1.6 s and 3.2 s (each drawn from [d/2, d] by the jitter), 3.1–6.2 s of
// backoff in all (plus the attempts' own time) before a failing message is
// dead-lettered: a dependency that is down for a few seconds costs retries, not dead
// letters.
const (
	DefaultMaxRetries  = 5                      // retries after the first attempt
	DefaultBackoffBase = 200 * time.Millisecond // first retry waits between half this and this
	DefaultBackoffMax  = 10 * time.Second       // no retry waits longer (RetryAfter aside)
	maxShift           = 62                     // 1<<62 is the largest power of two in an int64
)

// NoRetries, as RetryPolicy.MaxRetries or RetryRule.MaxRetries, means
// never retry (any negative value does). A zero MaxRetries means "not
// set": the default, or for a rule the policy's.
const NoRetries = -1

// Backoff returns the delay before retry number retry (1 for the first
// retry). It must be safe for concurrent use and should be a pure function
// of retry (plus jitter): the broker keeps no backoff state between calls.
type Backoff func(retry int) time.Duration

// ConstantBackoff waits d before every retry; ConstantBackoff(0) retries at
// once. A negative d is treated as 0.
func ConstantBackoff(d time.Duration) Backoff {
	d = max(d, 0)
	return func(int) time.Duration { return d }
}

// ExponentialBackoff waits about base·2^(retry-1), capped at maxDelay, with
// equal jitter: the delay is drawn uniformly from [d/2, d] where d is the
// capped exponential value, so retries from many messages spread out while
// the cap is never exceeded. A maxDelay below base is raised to base; a
// non-positive base yields no delay.
func ExponentialBackoff(base, maxDelay time.Duration) Backoff {
	if base <= 0 {
		return ConstantBackoff(0)
	}
	maxDelay = max(maxDelay, base)
	return func(retry int) time.Duration {
		d := exponential(base, maxDelay, retry)
		half := d / 2
		return d - half + rand.N(half+1)
	}
}

// exponential returns min(base·2^(retry-1), maxDelay) without overflow,
// for 0 < base <= maxDelay. A retry below 1 counts as 1.
func exponential(base, maxDelay time.Duration, retry int) time.Duration {
	shift := retry - 1
	if shift <= 0 {
		return base
	}
	if shift >= maxShift || base > maxDelay>>shift {
		return maxDelay
	}
	return base << shift
}

// RetryPolicy decides how often and how soon a failed delivery is retried.
// A field left at zero means "not set", as in net.Dialer: the zero
// RetryPolicy is DefaultRetryPolicy(), and
// RetryPolicy{Backoff: ConstantBackoff(10 * time.Millisecond)} changes only
// the backoff. Never retrying is said with NoRetries.
//
// Given to Retries (or its old name WithSubscriberRetryPolicy), a policy
// refines the broker's: its
// zero fields take the broker's policy's values, and its ByCode rules are
// laid over the broker's, code by code. A policy is copied when given to
// the broker.
type RetryPolicy struct {
	// MaxRetries is how many times a failure is retried after the first
	// attempt, for codes without a rule in ByCode: 0 means
	// DefaultMaxRetries (or the broker's, for a subscriber's policy),
	// NoRetries none. With NoRetries a retryable failure is dead-lettered
	// at once with reason "exhausted".
	MaxRetries int
	// Backoff gives the delay before each retry; nil means
	// ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax) (or the
	// broker's, for a subscriber's policy).
	Backoff Backoff
	// ByCode overrides MaxRetries and Backoff for an error code.
	ByCode map[string]RetryRule
}

// RetryRule is the retry rule for one error code. A field left at zero
// takes the policy's value; MaxRetries NoRetries declares the code not
// worth retrying: its failures are dead-lettered at once with reason
// "permanent".
type RetryRule struct {
	MaxRetries int     // retries after the first attempt for this code; 0: the policy's; NoRetries: none
	Backoff    Backoff // nil means the policy's Backoff
}

// DefaultRetryPolicy returns the policy a broker uses unless told otherwise
// (and what a zero RetryPolicy means): DefaultMaxRetries retries with
// jittered exponential backoff from DefaultBackoffBase capped at
// DefaultBackoffMax, for every code, panics included.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		MaxRetries: DefaultMaxRetries,
		Backoff:    ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax),
	}
}

// validate reports a malformed policy, wrapping ErrInvalidOption.
func (p RetryPolicy) validate() error {
	if _, ok := p.ByCode[""]; ok {
		return fmt.Errorf("%w: retry rule for an empty error code", ErrInvalidOption)
	}
	return nil
}

// over returns p refined over base: p's zero fields take base's values,
// and its ByCode rules are laid over base's, code by code, in a new map
// (so later changes by the caller have no effect). The rules keep their
// zero fields; normalized resolves them.
func (p RetryPolicy) over(base RetryPolicy) RetryPolicy {
	p.MaxRetries = cmp.Or(p.MaxRetries, base.MaxRetries)
	if p.Backoff == nil {
		p.Backoff = base.Backoff
	}
	if len(base.ByCode)+len(p.ByCode) > 0 {
		byCode := make(map[string]RetryRule, len(base.ByCode)+len(p.ByCode))
		maps.Copy(byCode, base.ByCode)
		maps.Copy(byCode, p.ByCode)
		p.ByCode = byCode
	} else {
		p.ByCode = nil
	}
	return p
}

// normalized returns p over the defaults, each rule's zero fields taken
// from the policy and the ByCode map private: the policy a delivery
// decides by. A rule that inherits a policy-wide NoRetries is dropped (its
// code is then exhausted at once like any other, not declared permanent).
func (p RetryPolicy) normalized() RetryPolicy {
	p = p.over(DefaultRetryPolicy())
	for code, r := range p.ByCode {
		if r.MaxRetries == 0 {
			if p.MaxRetries < 0 {
				delete(p.ByCode, code)
				continue
			}
			r.MaxRetries = p.MaxRetries
		}
		if r.Backoff == nil {
			r.Backoff = p.Backoff
		}
		p.ByCode[code] = r
	}
	return p
}

// verdict is the policy's decision about one failed attempt.
type verdict struct {
	retryable bool          // the failure's kind may be retried under this policy
	retry     bool          // retry now (attempts remain)
	delay     time.Duration // wait before the retry
}

// decideWith applies a normalized policy to the failure f of attempt
// number attempt (1 for the first), the backoff called through call (which
// guards it against panics). Attempts stay within 1..MaxRetries+1 of the
// rule that applies to f's code.
//
// A failure is retryable unless it is Permanent or its code has a rule
// with NoRetries (the code is declared not worth retrying); a panic is
// retryable like any error. A retryable failure whose attempts are used
// up — including under a policy-wide NoRetries — is "exhausted", not
// "permanent".
func (p *RetryPolicy) decideWith(f failure, attempt int, call func(Backoff, int) time.Duration) verdict {
	if f.permanent {
		return verdict{}
	}
	maxRetries, backoff := p.MaxRetries, p.Backoff
	retryable := true
	if r, ok := p.ByCode[f.code]; ok {
		maxRetries, backoff = r.MaxRetries, r.Backoff
		retryable = maxRetries >= 0
	}
	v := verdict{retryable: retryable, retry: retryable && attempt <= maxRetries}
	if v.retry {
		v.delay = max(call(backoff, attempt), f.after, 0)
	}
	return v
}

// failure is a classified handler error.
type failure struct {
	code      string
	permanent bool          // Permanent(err): never retried
	after     time.Duration // RetryAfter: the least delay before a retry
	text      string        // the error's text, read once
}

// ErrorCoder is an error that names its own code: a handler error that
// implements it (anywhere in its chain, as errors.As finds it) is
// classified by that code, and RetryPolicy.ByCode can set a rule for it.
// An empty code counts as none.
type ErrorCoder interface {
	error
	ErrorCode() string
}

// classify turns a handler error into a failure. timedOut reports that the
// subscriber's HandlerTimeout deadline had passed when the handler returned;
// it makes the code "timeout" whatever the error (a panic stays a panic).
func classify(err error, timedOut bool) failure {
	if _, ok := errors.AsType[*PanicError](err); ok {
		return failure{code: CodePanic}
	}
	if timedOut {
		return failure{code: CodeTimeout}
	}
	if pe, ok := errors.AsType[*permanentError](err); ok {
		return failure{code: ownCode(pe.err, CodePermanent), permanent: true}
	}
	if ra, ok := errors.AsType[*retryAfterError](err); ok {
		return failure{code: CodeThrottled, after: ra.after}
	}
	return failure{code: ownCode(err, CodeError)}
}

// ownCode is the code of the ErrorCoder in err's chain, or otherwise when
// there is none or its code is empty.
func ownCode(err error, otherwise string) string {
	if c, ok := errors.AsType[ErrorCoder](err); ok {
		if code := c.ErrorCode(); code != "" {
			return code
		}
	}
	return otherwise
}

// Permanent marks err as not worth retrying (bad input, failed validation):
// the message goes straight to the dead-letter store. Its code is
// "permanent" unless err has an ErrorCode() method. Permanent(nil) is nil.
// The result wraps err, so errors.Is and errors.As still see it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// RetryAfter marks err as throttling: the next attempt happens no sooner than
// d (or the backoff, whichever is longer). Its code is "throttled" and it is
// retried as RetryPolicy.ByCode["throttled"] (or the policy) allows.
// RetryAfter(nil, d) is nil; a negative d counts as 0.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: max(d, 0)}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.after, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// PanicError is what a handler panic becomes: code "panic", with the value
// passed to panic and the stack of the panicking goroutine.
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // debug.Stack() at the recovery point
}

func newPanicError(v any) *PanicError { return &PanicError{Value: v, Stack: debug.Stack()} }

// Error says what the handler panicked with.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// ErrorCode returns "panic".
func (e *PanicError) ErrorCode() string { return CodePanic }

// Unwrap returns the panic value if it is an error, so errors.Is sees it.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

package brokertest

import (
	"fmt"
	"time"
)

// LongWindow is the dedup window the idempotency suite passes to its store
// constructor in every test but the expiry one: long enough that nothing
// expires while a test runs, however slow the machine.
const LongWindow = time.Hour

// Defaults of the idempotency suite's expiry test.
const (
	// DefaultTTLWindow is the window asked for by the expiry test of a store
	// that expires after Record (ExpiresAfterRecord(0)).
	DefaultTTLWindow = time.Second
	// DefaultPublishWindow is the window asked for by the expiry test of a
	// store that measures publish time (ExpiresByPublishTime(0)); no test
	// waits for it.
	DefaultPublishWindow = time.Minute
	// DefaultExpiryTimeout is how long past the window the expiry test of a
	// TTL store waits for a key to be forgotten.
	DefaultExpiryTimeout = 10 * time.Second
)

// DefaultWaitTimeout is how long the broker suite waits, by default, for
// anything it expects to happen (a delivery, a retry, a dead letter, Close
// to return) before it fails the subtest.
const DefaultWaitTimeout = 10 * time.Second

// Option adjusts a suite to what a store or a broker's transport documents.
// Options that do not concern a suite are ignored by it.
type Option func(*options)

type expiryMode int

const (
	expiresAfterRecord expiryMode = iota
	expiresByPublishTime
)

func (m expiryMode) String() string {
	if m == expiresByPublishTime {
		return "ExpiresByPublishTime"
	}
	return "ExpiresAfterRecord"
}

// options is what the Options set; the zero value is the defaults.
type options struct {
	expiry         expiryMode
	window         time.Duration // expiry test's window; 0: the mode's default
	expiryTimeout  time.Duration // 0: DefaultExpiryTimeout
	ignoresContext bool
	noDedup        bool          // broker suite: skip the Dedup subtest
	wait           time.Duration // broker suite: longest wait for an expected event; 0: DefaultWaitTimeout
	invalid        []string      // options given bad values, reported by the suite
}

// ExpiresAfterRecord declares that the idempotency store forgets a key the
// window after Record (a TTL, as in Redis SET EX or a JetStream KV bucket).
// This is the default. The expiry test asks the store for window
// (DefaultTTLWindow if 0): it records a key, polls Seen until it reports
// false, and fails if that takes longer than window plus ExpiryTimeout, or if
// the key was forgotten before 9/10 of window had passed since Record was
// called. A negative window fails the suite.
func ExpiresAfterRecord(window time.Duration) Option {
	return func(o *options) {
		o.expiry, o.window = expiresAfterRecord, window
		if window < 0 {
			o.invalid = append(o.invalid, fmt.Sprintf("ExpiresAfterRecord(%v): negative window", window))
		}
	}
}

// ExpiresByPublishTime declares that the idempotency store measures its window
// in publish time (DeliveryKey.PublishedAt), as broker.MemoryIdempotencyStore
// does: a key recorded for a message published at t0 is seen by a copy
// published less than the window after it, and not by one published later.
// The expiry test asks the store for window (DefaultPublishWindow if 0) and
// waits for nothing: it varies PublishedAt. A negative window fails the
// suite.
func ExpiresByPublishTime(window time.Duration) Option {
	return func(o *options) {
		o.expiry, o.window = expiresByPublishTime, window
		if window < 0 {
			o.invalid = append(o.invalid, fmt.Sprintf("ExpiresByPublishTime(%v): negative window", window))
		}
	}
}

// ExpiryTimeout sets how long past the window the expiry test of a TTL store
// waits for a recorded key to be forgotten (DefaultExpiryTimeout if 0). A
// negative d fails the suite.
func ExpiryTimeout(d time.Duration) Option {
	return func(o *options) {
		o.expiryTimeout = d
		if d < 0 {
			o.invalid = append(o.invalid, fmt.Sprintf("ExpiryTimeout(%v): negative", d))
		}
	}
}

// IgnoresContext declares that the store ignores the contexts it is given
// (broker.MemoryIdempotencyStore does: it never blocks), so the suite skips
// its Context subtests. Without it, every method called with a done context
// must return an error that matches the context's error.
func IgnoresContext() Option {
	return func(o *options) { o.ignoresContext = true }
}

// WithoutDedup tells the broker suite that the brokers it gets do not
// suppress duplicates, so it skips its Dedup subtest. Use it for a broker
// built with broker.WithIdempotencyStore(nil) (dedup off, for throughput),
// or over a transport whose deployment turns its idempotency store off;
// every other subtest still holds without dedup.
func WithoutDedup() Option {
	return func(o *options) { o.noDedup = true }
}

// WaitTimeout sets how long the broker suite waits for anything it expects
// (a delivery, a retry, a dead letter, Close to return) before it fails the
// subtest (DefaultWaitTimeout if 0). The suite never fails because something
// took long within this bound, so raise it for a transport that may be slow
// to deliver: a remote server or cluster, file storage on a busy disk, a
// machine shared with other jobs. A negative d fails the suite.
func WaitTimeout(d time.Duration) Option {
	return func(o *options) {
		o.wait = d
		if d < 0 {
			o.invalid = append(o.invalid, fmt.Sprintf("WaitTimeout(%v): negative", d))
		}
	}
}

func buildOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.window == 0 {
		o.window = DefaultTTLWindow
		if o.expiry == expiresByPublishTime {
			o.window = DefaultPublishWindow
		}
	}
	if o.expiryTimeout == 0 {
		o.expiryTimeout = DefaultExpiryTimeout
	}
	if o.wait == 0 {
		o.wait = DefaultWaitTimeout
	}
	return o
}

package broker

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/inproc/broker/internal/slide"
)

// BreakerState is the state of a subscriber's circuit breaker.
type BreakerState string

// Breaker states. A subscriber without a breaker reports BreakerNone.
const (
	BreakerNone     BreakerState = ""          // no breaker configured
	BreakerClosed   BreakerState = "closed"    // attempts run as usual
	BreakerOpen     BreakerState = "open"      // no attempts: messages wait in the lane
	BreakerHalfOpen BreakerState = "half_open" // one probe attempt decides
)

// Defaults of BreakerPolicy's zero fields.
const (
	DefaultBreakerFailures    = 5                // consecutive retryable failures that trip it, when no rule is set
	DefaultBreakerWindow      = 10 * time.Second // FailureRatio's window
	DefaultBreakerMinAttempts = 20               // attempts in the window before FailureRatio applies
	DefaultBreakerOpenFor     = time.Second      // the first open interval
	DefaultBreakerMaxOpenFor  = 5 * time.Second  // the longest open interval: a recovered dependency is noticed within it
)

// BreakerPolicy configures a subscriber's circuit breaker (see
// CircuitBreaker). It trips on retryable failures only (a panic
// included): a Permanent error says something about the message, not
// about what the handler depends on. Zero fields take the Default values;
// with neither Failures nor FailureRatio set, it trips after
// DefaultBreakerFailures failures in a row.
//
// The arithmetic, for a dependency that hangs: every attempt then lasts
// the subscriber's HandlerTimeout, and Concurrency of them run at once, so
// Failures failures in a row take Failures × HandlerTimeout ÷ Concurrency
// before the breaker trips (5 × 10 s ÷ 5 workers = 10 s: an outage of 10 s
// is over before it opens). A shorter HandlerTimeout trips it sooner. Once
// open, it probes after OpenFor, 2 × OpenFor, 4 × OpenFor… capped at
// MaxOpenFor: with the defaults after 1, 2, 4, then every 5 s, so a
// dependency that recovers is noticed within 5 s, and one that stays down
// costs one attempt every 5 s.
type BreakerPolicy struct {
	// Failures trips the breaker after this many retryable failures in a
	// row (a success resets the run).
	Failures int
	// FailureRatio trips the breaker when retryable failures are at least
	// this share (0 < r <= 1) of the attempts over Window, once Window
	// holds MinAttempts attempts.
	FailureRatio float64
	Window       time.Duration
	MinAttempts  int
	// OpenFor is how long the breaker stays open the first time; each
	// failed probe doubles it, up to MaxOpenFor. A successful probe closes
	// the breaker and resets it to OpenFor.
	OpenFor    time.Duration
	MaxOpenFor time.Duration
}

// CircuitBreaker gives the subscriber a circuit breaker. While it is open
// the subscriber makes no attempts and burns none: its messages wait in its
// lane (where the full-lane policy applies: Block pushes back on the
// topic's publishers, a dead-letter policy sheds with reason "overflow"),
// and retries that come due wait too. After the open interval one probe
// attempt decides: success closes it, a retryable failure opens it again
// for twice as long (capped). Its state is in SubscriberStats.Breaker; each
// transition is logged and passed to an Observer that implements
// BreakerObserver.
//
// Over a transport (WithTransport) it works the same: while it is open, a
// delivery the transport hands over is held in the process, kept alive
// and counted in flight, and runs when the breaker lets it, at the attempt
// number it came with;
// with Concurrency of them held the transport fetches nothing more (what
// natsjs already pulled waits in the process, kept alive too). A stop at
// once hands held deliveries back unstarted.
func CircuitBreaker(p BreakerPolicy) SubscribeOption {
	p, err := p.normalized()
	return option(err, func(c *subConfig) { c.breaker = &p })
}

func (p BreakerPolicy) normalized() (BreakerPolicy, error) {
	switch {
	case p.Failures < 0:
		return p, fmt.Errorf("%w: breaker Failures %d < 0", ErrInvalidOption, p.Failures)
	case p.FailureRatio < 0 || p.FailureRatio > 1 || p.FailureRatio != p.FailureRatio:
		return p, fmt.Errorf("%w: breaker FailureRatio %v outside 0..1", ErrInvalidOption, p.FailureRatio)
	case p.Window < 0 || p.OpenFor < 0 || p.MaxOpenFor < 0 || p.MinAttempts < 0:
		return p, fmt.Errorf("%w: breaker durations and MinAttempts must not be negative", ErrInvalidOption)
	}
	if p.Failures == 0 && p.FailureRatio == 0 {
		p.Failures = DefaultBreakerFailures
	}
	p.Window = cmp.Or(p.Window, DefaultBreakerWindow)
	p.MinAttempts = cmp.Or(p.MinAttempts, DefaultBreakerMinAttempts)
	p.OpenFor = cmp.Or(p.OpenFor, DefaultBreakerOpenFor)
	p.MaxOpenFor = cmp.Or(p.MaxOpenFor, max(DefaultBreakerMaxOpenFor, p.OpenFor))
	if p.MaxOpenFor < p.OpenFor {
		return p, fmt.Errorf("%w: breaker MaxOpenFor %v < OpenFor %v", ErrInvalidOption, p.MaxOpenFor, p.OpenFor)
	}
	return p, nil
}

// BreakerEvent describes a circuit breaker's transition.
type BreakerEvent struct {
	Topic, Subscriber string
	From, To          BreakerState
	OpenFor           time.Duration // how long it stays open (To == BreakerOpen)
	At                time.Time
}

// BreakerObserver is an Observer that also wants circuit breaker
// transitions. It is a separate interface so that Observers written before
// breakers existed still compile.
type BreakerObserver interface {
	BreakerChanged(BreakerEvent)
}

// health is what an attempt says about the subscriber, for its breaker.
type health int8

const (
	healthNone health = iota // no attempt ran, or its error was not retryable
	healthOK                 // the handler succeeded
	healthFail               // a retryable failure
)

// breaker is a subscriber's circuit breaker, guarded by its holder's mu.
type breaker struct {
	p       BreakerPolicy
	state   BreakerState
	run     int           // retryable failures in a row
	win     *slide.Window // retryable failures (A) and attempts (B), for FailureRatio
	openFor time.Duration // the current (or next) open interval
	probing bool          // a probe attempt is running (half open)
	// announcing holds the probe back while the move to half open is
	// reported.
	announcing bool
	timer      *time.Timer // ends the open interval

	// Its holder (the in-memory lane, a transport's hold) guards it with
	// mu; wake is called under mu when a waiting message may be let
	// through; report tells a transition, without mu; stopped (under mu)
	// says the subscription stopped: the open interval is not armed or
	// ended any more.
	mu      sync.Locker
	wake    func()
	report  func(from, to BreakerState)
	stopped bool
}

func newBreaker(p BreakerPolicy) *breaker {
	return &breaker{p: p, state: BreakerClosed, win: slide.New(p.Window), openFor: p.OpenFor}
}

// allows reports whether a worker may take a message now.
func (b *breaker) allows() bool {
	return b.state == BreakerClosed || (b.state == BreakerHalfOpen && !b.probing && !b.announcing)
}

// took notes that a worker took a message; it returns true when that
// message is the half-open breaker's probe.
func (b *breaker) took() bool {
	if b.state == BreakerHalfOpen {
		b.probing = true
		return true
	}
	return false
}

// record notes an attempt's health and returns the state the breaker moves
// to ("" when it stays). An attempt that started before the breaker opened
// and ends after does not count.
func (b *breaker) record(h health, probe bool, now time.Time) BreakerState {
	if probe {
		b.probing = false
		switch h {
		case healthOK:
			return b.close()
		case healthFail:
			b.openFor = min(2*b.openFor, b.p.MaxOpenFor)
			return b.open()
		}
		return "" // no verdict: the next message probes
	}
	if b.state != BreakerClosed || h == healthNone {
		return ""
	}
	fail := uint64(0)
	if h == healthFail {
		fail = 1
		b.run++
	} else {
		b.run = 0
	}
	b.win.Add(now, fail, 1)
	if b.p.Failures > 0 && b.run >= b.p.Failures {
		return b.open()
	}
	if b.p.FailureRatio > 0 {
		fails, attempts := b.win.Sums(now)
		if attempts >= uint64(b.p.MinAttempts) && float64(fails) >= b.p.FailureRatio*float64(attempts) {
			return b.open()
		}
	}
	return ""
}

func (b *breaker) open() BreakerState {
	b.state = BreakerOpen
	return BreakerOpen
}

func (b *breaker) close() BreakerState {
	b.state, b.run, b.openFor = BreakerClosed, 0, b.p.OpenFor
	b.win.Reset()
	return BreakerClosed
}

// arm starts the open interval of a breaker that just opened, once its
// opening was reported (so that the end of the interval is reported after
// it).
func (b *breaker) arm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerOpen && b.timer == nil && !b.stopped {
		b.timer = time.AfterFunc(b.openFor, b.endOpen)
	}
}

// endOpen is the open interval's timer callback: the move to half open is
// reported before a probe may start, so that observers see it first.
func (b *breaker) endOpen() {
	b.mu.Lock()
	b.timer = nil
	changed := !b.stopped && b.state == BreakerOpen
	if changed {
		b.state = BreakerHalfOpen
	}
	b.announcing = changed
	b.mu.Unlock()
	if !changed {
		return
	}
	b.report(BreakerOpen, BreakerHalfOpen)
	b.mu.Lock()
	b.announcing = false
	b.wake()
	b.mu.Unlock()
}

func (b *breaker) stopTimer() {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
}

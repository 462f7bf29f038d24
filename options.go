package broker

import (
	"fmt"
	"log/slog"
	"time"
)

// Defaults and limits of the broker's options.
const (
	DefaultQueueSize = 1024 // per-topic queue capacity
	// DefaultLaneSize is a subscriber lane's capacity unless WithQueueSize
	// or LaneSize says otherwise: what a subscriber whose dependency is
	// down parks at 1,000 messages/s under the default retry policy (up to
	// 6.2 s of backoff per message) fits in it, so its neighbours on the
	// topic never wait for it. Of the default lane, at most
	// DefaultQueueSize messages wait ready to run: the rest is room for
	// parked retries and messages held behind their Key, so a subscriber
	// that is only slow holds up its topic after DefaultQueueSize ready
	// messages, not DefaultLaneSize.
	DefaultLaneSize       = 8192
	DefaultPublishTimeout = 500 * time.Millisecond // longest Publish waits for room
	MaxQueueSize          = 1 << 30                // largest queue or lane capacity
)

// Option configures a Broker in New. An option given a bad value makes New
// return an error wrapping ErrInvalidOption.
type Option func(*config) error

// config is what New builds from its options.
type config struct {
	queueSize      int // also the default most messages of a lane ready to run
	laneSize       int // default lane capacity
	publishTimeout time.Duration
	policy         RetryPolicy
	dlq            DeadLetterStore
	dedup          IdempotencyStore
	logger         *slog.Logger
	obs            []Observer
	middleware     []Middleware
	publishHooks   []PublishHook
	transport      Transport // nil: the in-memory queues
}

// option is an Option or a SubscribeOption that applies set, or fails
// with err, the verdict on its argument. The verdict is reached when the
// option is made: the argument is a value, which cannot change by the time
// New or Subscribe applies the option. (An option given a slice or a map
// checks it when applied.)
func option[C any](err error, set func(*C)) func(*C) error {
	return func(c *C) error {
		if err == nil {
			set(c)
		}
		return err
	}
}

// invalidIf is, when bad, the error that says why (format and args)
// wrapping ErrInvalidOption; else nil.
func invalidIf(bad bool, format string, args ...any) error {
	if !bad {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidOption, fmt.Sprintf(format, args...))
}

func defaultConfig() config {
	return config{
		queueSize:      DefaultQueueSize,
		laneSize:       DefaultLaneSize,
		publishTimeout: DefaultPublishTimeout,
		policy:         DefaultRetryPolicy(),
		dedup:          NewMemoryIdempotencyStore(DefaultDedupWindow, DefaultDedupEntries),
		logger:         slog.Default(),
	}
}

// WithQueueSize sets the capacity of each topic queue and the default
// capacity of each subscriber lane, n for both (1 <= n <= MaxQueueSize;
// default DefaultQueueSize for the queues and DefaultLaneSize for the
// lanes, of which DefaultQueueSize ready to run). Queues and lanes grow to
// their capacity as they fill.
func WithQueueSize(n int) Option {
	err := invalidIf(n < 1 || n > MaxQueueSize, "queue size %d outside 1..%d", n, MaxQueueSize)
	return option(err, func(c *config) { c.queueSize, c.laneSize = n, n })
}

// WithPublishTimeout sets how long Publish waits for room in a full queue
// before it returns ErrQueueFull; 0 fails at once (default
// DefaultPublishTimeout). Negative durations are refused. A producer
// faster than a subscriber under Block fills that subscriber's lane, then
// the topic queue; from then on each Publish waits up to this long for
// room, and is refused when none comes: backpressure slows a producer
// before it refuses one.
func WithPublishTimeout(d time.Duration) Option {
	err := invalidIf(d < 0, "publish timeout %v < 0", d)
	return option(err, func(c *config) { c.publishTimeout = d })
}

// WithRetryPolicy sets the retry policy of every subscriber that does not
// set its own (default DefaultRetryPolicy()).
func WithRetryPolicy(p RetryPolicy) Option {
	return func(c *config) error {
		if err := p.validate(); err != nil {
			return err
		}
		c.policy = p
		return nil
	}
}

// WithDeadLetterStore sets where dead letters go (default: a
// MemoryDeadLetterStore of DefaultDeadLetterCapacity logging to the broker's
// logger). nil is refused.
func WithDeadLetterStore(s DeadLetterStore) Option {
	err := invalidIf(s == nil || isNilValue(s), "nil dead-letter store (%T)", s)
	return option(err, func(c *config) { c.dlq = s })
}

// WithIdempotencyStore sets the store that suppresses duplicate deliveries
// (default: a MemoryIdempotencyStore with DefaultDedupWindow and
// DefaultDedupEntries). nil disables deduplication; a typed nil (such as a
// nil *MemoryIdempotencyStore) is refused.
func WithIdempotencyStore(s IdempotencyStore) Option {
	err := invalidIf(s != nil && isNilValue(s), "nil idempotency store (%T); pass nil itself to disable deduplication", s)
	return option(err, func(c *config) { c.dedup = s })
}

// WithLogger sets the logger (default slog.Default()). nil is refused; use
// slog.New(slog.DiscardHandler) for none.
//
// What the broker logs by default, so that no mistake is silent and no
// flood drowns the log:
//   - a dead letter: one Warn line with every contract field, up to 10 a
//     second per subscriber and reason; past that, one Warn summary line
//     a second with the count. A dead letter the store refused is logged
//     at Error, every one, never folded into a summary.
//   - a message published to a topic without a subscriber (counted
//     Unrouted): Info, with the hint "subscribe before publishing";
//   - a duplicate message ID skipped at a subscriber (counted
//     Deduplicated): Info, with the dedup window and the hint that an ID
//     names one message, not an entity.
//
// Each of the last two is logged once a minute per topic (unrouted) or
// per subscriber (duplicate), at most 10 times a minute in all; then one
// Info summary line a minute counts the rest. The logger's level and
// handler are how to silence them. Close logs the summaries still due.
func WithLogger(l *slog.Logger) Option {
	err := invalidIf(l == nil || l.Handler() == nil, "nil logger")
	return option(err, func(c *config) { c.logger = l })
}

// WithObserver adds observers (default: none): each gets every event, in
// the order given (and of the WithObserver calls), so a Prometheus and an
// OpenTelemetry adapter can watch one broker. Each is guarded on its own: a
// panic in one loses that event for it only. nil is refused.
func WithObserver(obs ...Observer) Option {
	return func(c *config) error {
		for _, o := range obs {
			if o == nil || isNilValue(o) {
				return fmt.Errorf("%w: nil observer (%T)", ErrInvalidOption, o)
			}
		}
		c.obs = append(c.obs, obs...)
		return nil
	}
}

// SubscribeOption configures one subscription in Subscribe. An option given
// a bad value makes Subscribe return an error wrapping ErrInvalidOption.
type SubscribeOption func(*subConfig) error

type subConfig struct {
	concurrency int
	laneSize    int
	laneReady   int
	timeout     time.Duration
	policy      *RetryPolicy
	ordered     bool
	whenFull    FullLanePolicy
	breaker     *BreakerPolicy
	budget      *RetryBudgetPolicy
	rate        float64 // attempts per second; 0: no limit
	burst       int
	middleware  []Middleware
}

// MaxConcurrency is the most workers one subscriber may have.
const MaxConcurrency = 1 << 16

// Concurrency sets how many workers run the subscriber's handler
// (1 <= n <= MaxConcurrency; default 1). Any idle worker takes the oldest
// message whose ordering key is free: two messages with one Key never run
// at once, and the later never starts before the earlier ended; two
// messages with one ID never run at once either. Over a transport it is
// the most handlers running at once in this process (natsjs: keyed
// messages also at most one per partition at a time).
func Concurrency(n int) SubscribeOption {
	err := invalidIf(n < 1 || n > MaxConcurrency, "concurrency %d outside 1..%d", n, MaxConcurrency)
	return option(err, func(c *subConfig) { c.concurrency = n })
}

// LaneSize sets the capacity of the subscriber's lane, the messages routed
// to it that no worker runs now — queued, held behind their key, or parked
// until a retry (1 <= n <= MaxQueueSize; default DefaultLaneSize, or the
// broker's WithQueueSize). All n may be ready to run (the default lane
// takes at most DefaultQueueSize ready ones: see DefaultLaneSize).
// WhenLaneFull says what happens to a message that does not fit. The
// dispatcher adds only below n; a running message that fails parks even
// in a full lane (a retry is never dropped), so the lane may hold up to
// n + Concurrency messages until those retries run.
//
// Over a transport (WithTransport) the stream is the buffer: Subscribe
// refuses any size but the broker's default with ErrInvalidOption; bound
// the stream with the transport's limits instead (natsjs: WithQueueSize).
func LaneSize(n int) SubscribeOption {
	err := invalidIf(n < 1 || n > MaxQueueSize, "lane size %d outside 1..%d", n, MaxQueueSize)
	return option(err, func(c *subConfig) { c.laneSize, c.laneReady = n, n })
}

// Ordered makes the topic the ordering key of the subscriber's keyless
// messages: strict FIFO through retries. A failed keyless message then holds
// every keyless message behind it until it ends (delivered or
// dead-lettered), at the cost of isolation: one failing message delays the
// rest, and under Block its backlog reaches the topic's publishers (the
// full-lane policy, the breaker and the retry budget decide what gives).
// Without Ordered a keyless message is ordered only by dispatch, and a
// retry does not hold the messages behind it. Messages with a Key are
// ordered by their Key either way.
func Ordered() SubscribeOption {
	return option(nil, func(c *subConfig) { c.ordered = true })
}

// HandlerTimeout gives each attempt a deadline d in its context (d >= 0;
// 0, the default, means none). An attempt that fails after its deadline
// passed gets code "timeout", whatever its error; the same over a
// transport.
func HandlerTimeout(d time.Duration) SubscribeOption {
	return option(invalidIf(d < 0, "handler timeout %v < 0", d), func(c *subConfig) { c.timeout = d })
}

// WithSubscriberRetryPolicy refines the broker's retry policy for this
// subscriber: p's zero fields take the broker's policy's values, and its
// ByCode rules are laid over the broker's, code by code.
//
// Deprecated: use Retries, the same option named like the other
// SubscribeOptions.
func WithSubscriberRetryPolicy(p RetryPolicy) SubscribeOption {
	return func(c *subConfig) error {
		if err := p.validate(); err != nil {
			return err
		}
		c.policy = &p
		return nil
	}
}

package broker

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of the broker's counters and queues, by topic. Take it
// with Broker.Stats; it shares nothing with the broker.
type Stats struct {
	Topics map[string]TopicStats
	// DeadLetterEvicted is how many dead letters the store evicted to make
	// room (0 if the store does not count evictions).
	DeadLetterEvicted uint64
	// PluginPanics is how many panics of plugged-in code (stores, observer
	// hooks, backoffs) were recovered; each was logged at Error level.
	PluginPanics uint64
	// ForgottenTopics is how many retired topics' counters were dropped to
	// keep at most MaxGoneTopics of them.
	ForgottenTopics uint64
}

// TopicStats describes one topic: its queue, what was published to it, and
// its subscribers: the active ones and up to MaxGoneSubscribers that left.
// A topic with no subscriber and nothing queued retires (it holds no
// goroutine); its counters stay in Stats, up to MaxGoneTopics such topics.
type TopicStats struct {
	Published uint64 // messages accepted into the topic queue
	Rejected  uint64 // publishes refused because the queue stayed full (ErrQueueFull, or ctx ended while waiting)
	Unrouted  uint64 // messages dispatched while the topic had no subscriber to take them (none, or only ones leaving)
	Queued    int    // messages waiting in the topic queue
	Capacity  int    // topic queue capacity
	// OldestAge is how long the oldest message in the topic queue has been
	// waiting since it was published (0 when the queue is empty).
	OldestAge time.Duration
	// BlockedOn names the subscriber whose full lane the topic's dispatcher
	// waits for now ("" when it does not wait). Its SubscriberStats.BlockedFor
	// says for how long in total.
	BlockedOn   string
	Subscribers map[string]SubscriberStats // by subscriber name (MaxGoneSubscribers unsubscribed ones at most)
	// ForgottenSubscribers is how many unsubscribed names' counters were
	// dropped to keep at most MaxGoneSubscribers of them.
	ForgottenSubscribers uint64
}

// SubscriberStats describes one subscriber of a topic. Counters are kept per
// topic and name across Unsubscribe and a later Subscribe of the same name.
// At any quiet moment:
//
//	Routed == Delivered + Deduplicated + DeadLettered + Queued + InFlight
type SubscriberStats struct {
	Active      bool // subscribed now
	Concurrency int  // workers (0 when not active)
	// Queued is the messages in the subscriber's lane that no worker runs
	// now: waiting for a worker, held behind an earlier message of their
	// ordering key (Held), or parked until their retry's backoff ends
	// (Parked). They count against Capacity.
	Queued   int
	Held     int // of Queued: waiting behind an earlier message of their ordering key
	Parked   int // of Queued: failed, waiting out the backoff before their retry
	InFlight int // messages a worker runs now (or waits for a rate-limit token for), or being dead-lettered
	Capacity int // lane capacity (0 when not active)
	// OldestAge is how long the oldest message waiting in the lane has been
	// waiting since it was published (0 when the lane is empty).
	OldestAge time.Duration
	// Breaker is the circuit breaker's state (BreakerNone without one).
	Breaker BreakerState
	// RetryBudgetLeft is how many retries the retry budget allows now; -1
	// without a budget.
	RetryBudgetLeft int
	// BlockedFor is the total time the topic's dispatcher waited for room
	// in this subscriber's lane (under the Block policy): the time this
	// subscriber held up the topic.
	BlockedFor time.Duration

	Routed       uint64 // messages handed to this subscriber (dispatches, redrives included)
	Delivered    uint64 // messages whose handler returned nil
	Attempts     uint64 // handler calls
	Retries      uint64 // failed attempts scheduled for a retry (a retry cut off by shutdown included)
	DeadLettered uint64 // messages put into the dead-letter store
	Deduplicated uint64 // messages skipped because their ID was already delivered
	// DeadLetterErrors counts dead letters the store refused (Put returned an
	// error). They are counted in DeadLettered too, and logged with every
	// field, but are not in the store.
	DeadLetterErrors uint64
}

// Backlog is the subscriber's unfinished work: Queued + InFlight.
func (s SubscriberStats) Backlog() int { return s.Queued + s.InFlight }

// RetryRate is Retries / Attempts (0 before any attempt).
func (s SubscriberStats) RetryRate() float64 { return ratio(s.Retries, s.Attempts) }

// FailureRate is the share of finished messages that were dead-lettered.
func (s SubscriberStats) FailureRate() float64 {
	return ratio(s.DeadLettered, s.Delivered+s.Deduplicated+s.DeadLettered)
}

// Backlog is the topic's unfinished work: its queue plus every subscriber's
// Backlog (a message waiting for two subscribers counts twice, and one being
// routed right now may count in both the queue and a lane).
func (t TopicStats) Backlog() int {
	n := t.Queued
	for _, s := range t.Subscribers {
		n += s.Backlog()
	}
	return n
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func age(now, since time.Time, n int) time.Duration {
	if n == 0 || since.IsZero() {
		return 0
	}
	return max(now.Sub(since), 0)
}

// Outcome is what follows an attempt (AttemptEvent.Outcome), or how a
// message ended at a subscriber (the final_state log field).
type Outcome string

// Outcomes.
const (
	OutcomeDelivered    Outcome = "delivered"     // the handler returned nil
	OutcomeRetry        Outcome = "retry"         // the attempt failed and will be retried
	OutcomeDeadLettered Outcome = "dead_lettered" // the message went to the dead-letter store
	OutcomeDeduplicated Outcome = "deduplicated"  // the ID was already delivered; the handler did not run
)

// Observer receives the broker's events, for metrics or tracing adapters
// that live outside this package. Hooks are called synchronously on the
// publish and delivery paths: they must be safe for concurrent use, must not
// block and must not panic. Embed NopObserver to implement only some hooks.
type Observer interface {
	// Published is called when Publish accepted a message.
	Published(PublishEvent)
	// Rejected is called when Publish refused a message because the queue
	// stayed full or ctx ended while waiting.
	Rejected(RejectEvent)
	// Unrouted is called when a message was dispatched to a topic with no
	// subscriber.
	Unrouted(UnroutedEvent)
	// Attempted is called after each handler attempt, and once for a
	// deduplicated message (Attempt 0).
	Attempted(AttemptEvent)
	// DeadLettered is called after a dead letter was put into the store.
	DeadLettered(DeadLetterEvent)
}

// NopObserver ignores every event; it is the default Observer and can be
// embedded to implement only some hooks.
type NopObserver struct{}

var _ Observer = NopObserver{}

func (NopObserver) Published(PublishEvent)       {}
func (NopObserver) Rejected(RejectEvent)         {}
func (NopObserver) Unrouted(UnroutedEvent)       {}
func (NopObserver) Attempted(AttemptEvent)       {}
func (NopObserver) DeadLettered(DeadLetterEvent) {}

// PublishEvent describes an accepted message.
type PublishEvent struct {
	Topic, MessageID string
	PublishedAt      time.Time
}

// RejectEvent describes a refused publish.
type RejectEvent struct {
	Topic, MessageID string
	Err              error // wraps ErrQueueFull, or is the context's error
}

// UnroutedEvent describes a message that reached no subscriber.
type UnroutedEvent struct {
	Topic, MessageID string
}

// AttemptEvent describes one handler attempt.
type AttemptEvent struct {
	Topic, Subscriber, MessageID string
	Attempt                      int           // 1 for the first; 0 for a deduplicated message
	Duration                     time.Duration // handler run time
	ErrorCode                    string        // empty on success
	Retryable                    bool          // the policy allows retries for ErrorCode
	Outcome                      Outcome       // what follows
	Delay                        time.Duration // wait before the retry (Outcome == OutcomeRetry)
	PublishedAt                  time.Time     // for end-to-end latency
	Err                          error         // the handler's error, nil on success
}

// DeadLetterEvent describes a dead letter after the store was asked to keep it.
type DeadLetterEvent struct {
	DeadLetter DeadLetter
	StoreErr   error // the store's Put error; nil when stored
}

// subCounters are one (topic, subscriber name)'s counters; they outlive a
// subscription so that a name subscribed again keeps counting. routed is
// written by the topic's dispatcher, the rest by the subscriber's workers:
// padding keeps the two writers off one cache line.
type subCounters struct {
	routed       atomic.Uint64
	_            [cacheLine - 8]byte
	delivered    atomic.Uint64 // also the successful attempts
	failed       atomic.Uint64 // failed attempts; Attempts is failed + delivered
	retries      atomic.Uint64
	deadLettered atomic.Uint64
	deduplicated atomic.Uint64
	dlErrors     atomic.Uint64
	inFlight     atomic.Int64 // being dead-lettered outside the lane (shed, or stopped); the workers' are in the lane
	blocked      atomic.Int64 // nanoseconds the topic's dispatcher waited for room in the lane
	_            [cacheLine - 8]byte
}

// cacheLine is the size padding assumes (64 bytes on amd64 and arm64).
const cacheLine = 64

func (c *subCounters) snapshot() SubscriberStats {
	return SubscriberStats{
		InFlight:         int(c.inFlight.Load()),
		Routed:           c.routed.Load(),
		Delivered:        c.delivered.Load(),
		Attempts:         c.failed.Load() + c.delivered.Load(),
		Retries:          c.retries.Load(),
		DeadLettered:     c.deadLettered.Load(),
		Deduplicated:     c.deduplicated.Load(),
		DeadLetterErrors: c.dlErrors.Load(),
		BlockedFor:       time.Duration(c.blocked.Load()),
		RetryBudgetLeft:  -1,
	}
}

// recorder is the last stage of the delivery pipeline for one subscriber:
// it moves the counters, calls the Observer, logs, and puts dead letters into
// the store. It knows nothing of queues or goroutines.
type recorder struct {
	topic, subscriber string
	c                 *subCounters
	obs               Observer // nil: none
	log               *slog.Logger
	dlq               DeadLetterStore
	newID             func() string // dead-letter IDs
	onDeadLetter      func(reason string)
	stop              <-chan struct{} // closed when the subscription must stop at once: a failing Put is given up
}

// Retries of a dead letter the store refused.
const (
	putRetryBase = 10 * time.Millisecond
	putRetryMax  = 5 * time.Second
)

// put stores dl, retrying with backoff while the store refuses it, until
// the subscription must stop at once (Close's or Unsubscribe's deadline):
// then the last error is returned. The worker (so the message's key) is
// held meanwhile: a dead letter is never dropped while the broker runs.
func (r *recorder) put(dl *DeadLetter) error {
	err := r.dlq.Put(context.Background(), *dl)
	for retry := 1; err != nil; retry++ {
		delay := exponential(putRetryBase, putRetryMax, retry)
		if r.log.Enabled(context.Background(), slog.LevelWarn) {
			r.log.LogAttrs(context.Background(), slog.LevelWarn, "broker: dead-letter store refused a dead letter; retrying",
				slog.String("dead_letter_id", dl.ID), slog.String("topic", r.topic),
				slog.String("message_id", dl.Message.ID), slog.String("subscriber", r.subscriber),
				slog.Int("retry", retry), slog.Duration("delay", delay), slog.String("store_error", err.Error()))
		}
		t := time.NewTimer(delay)
		select {
		case <-r.stop:
			t.Stop()
			return err
		case <-t.C:
		}
		err = r.dlq.Put(context.Background(), *dl)
	}
	return nil
}

func (r *recorder) attempted(msg *Message, d time.Duration, code string, retryable bool, out Outcome, delay time.Duration, err error) {
	if r.obs != nil {
		r.obs.Attempted(AttemptEvent{
			Topic: r.topic, Subscriber: r.subscriber, MessageID: msg.ID,
			Attempt: msg.Attempt, Duration: d, ErrorCode: code, Retryable: retryable,
			Outcome: out, Delay: delay, PublishedAt: msg.PublishedAt, Err: err,
		})
	}
}

// fault is why a message failed: its code, whether the policy retries it,
// the error, and the error's text, read once (a handler's error may not be
// safe to ask twice; see vetError).
type fault struct {
	code      string
	retryable bool
	err       error
	text      string
}

// brokerFault is a fault of the broker's own making (shutdown, overflow).
func brokerFault(code string, err error) fault {
	return fault{code: code, err: err, text: err.Error()}
}

func (r *recorder) delivered(msg *Message, d time.Duration) {
	r.c.delivered.Add(1)
	r.attempted(msg, d, "", false, OutcomeDelivered, 0, nil)
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logAttrs(slog.LevelDebug, "broker: delivered", msg, fault{}, OutcomeDelivered)
	}
}

func (r *recorder) deduplicated(msg *Message) {
	r.c.deduplicated.Add(1)
	r.attempted(msg, 0, "", false, OutcomeDeduplicated, 0, nil)
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logAttrs(slog.LevelDebug, "broker: duplicate skipped", msg, fault{}, OutcomeDeduplicated)
	}
}

func (r *recorder) retrying(msg *Message, d, delay time.Duration, f fault) {
	r.c.retries.Add(1)
	r.attempted(msg, d, f.code, true, OutcomeRetry, delay, f.err)
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.logAttrs(slog.LevelDebug, "broker: attempt failed, retrying", msg, f, OutcomeRetry,
			slog.Duration("delay", delay))
	}
}

// deadLetter puts msg into the store, then counts it; the dead letter is in
// the store before it is counted. attempted says that msg.Attempt just ran
// and has no event yet.
func (r *recorder) deadLetter(msg *Message, d time.Duration, reason string, f fault, attempted bool) {
	code, retryable := f.code, f.retryable
	dl := DeadLetter{
		ID:         r.newID(),
		Message:    *msg,
		Subscriber: r.subscriber,
		Attempts:   msg.Attempt,
		ErrorCode:  code,
		Error:      f.text,
		Retryable:  retryable,
		Reason:     reason,
		FailedAt:   time.Now(),
	}
	storeErr := r.put(&dl)
	if storeErr != nil {
		r.c.dlErrors.Add(1)
	}
	r.c.deadLettered.Add(1)
	r.onDeadLetter(reason)
	if attempted {
		r.attempted(msg, d, code, retryable, OutcomeDeadLettered, 0, f.err)
	}
	if r.obs != nil {
		r.obs.DeadLettered(DeadLetterEvent{DeadLetter: dl, StoreErr: storeErr})
	}
	level := slog.LevelWarn
	if storeErr != nil {
		level = slog.LevelError
	}
	if r.log.Enabled(context.Background(), level) {
		attrs := []slog.Attr{slog.String("dead_letter_id", dl.ID), slog.String("reason", reason)}
		if storeErr != nil {
			// Given up at a stop's deadline: the log line is all that is
			// left of it, so it carries every field (the payload's size).
			attrs = append(attrs, slog.String("store_error", storeErr.Error()),
				slog.String("key", msg.Key), slog.Time("published_at", msg.PublishedAt),
				slog.Time("failed_at", dl.FailedAt), slog.Any("headers", msg.Headers),
				slog.Int("payload_bytes", len(msg.Payload)))
		}
		r.logAttrs(level, "broker: dead-lettered", msg, f, OutcomeDeadLettered, attrs...)
	}
}

func (r *recorder) logAttrs(level slog.Level, text string, msg *Message, f fault, out Outcome, extra ...slog.Attr) {
	attrs := make([]slog.Attr, 0, 9+len(extra))
	attrs = append(attrs,
		slog.String("topic", r.topic),
		slog.String("message_id", msg.ID),
		slog.String("subscriber", r.subscriber),
		slog.Int("attempt", msg.Attempt),
		slog.String("error_code", f.code),
		slog.Bool("retryable", f.retryable),
		slog.String("final_state", string(out)),
	)
	if f.text != "" {
		attrs = append(attrs, slog.String("error", f.text))
	}
	attrs = append(attrs, extra...)
	r.log.LogAttrs(context.Background(), level, text, attrs...)
}

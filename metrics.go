package broker

import (
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
	// hooks, backoffs, middleware, publish hooks, the logger's
	// slog.Handler) were recovered; each was logged at Error level (but
	// the logger's own).
	PluginPanics uint64
	// ForgottenTopics is how many retired topics' counters were dropped to
	// keep at most MaxGoneTopics of them.
	ForgottenTopics uint64
	// Dedup says what the bound of the default idempotency store
	// (MemoryIdempotencyStore) costs: how many IDs it holds, how many it
	// forgot before their window ended, the window it keeps now. Zero with
	// another store, or none.
	Dedup DedupStats
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
	// handedBack counts, over a transport, the messages this process handed
	// back for a retry (or at a stop) and has not been delivered again:
	// per name, so that a later subscription of the name takes them up.
	handedBack atomic.Int64
	_          [cacheLine - 8]byte
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

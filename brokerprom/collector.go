package brokerprom

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
	"github.com/prometheus/client_golang/prometheus"
)

// StoreLenTimeout bounds the dead-letter store's Len call a scrape makes:
// a store that does not answer in time (a database, say) leaves
// dead_letter_store_size out of that scrape rather than hold it up, as long
// as its Len returns when its context ends.
const StoreLenTimeout = time.Second

// Collector exports a broker's metrics to Prometheus. It is two things:
//
//   - a broker.Observer (give it to broker.New with broker.WithObserver)
//     whose hooks feed the handler_duration_seconds and
//     end_to_end_duration_seconds histograms;
//   - a prometheus.Collector (register it with a prometheus.Registerer)
//     whose Collect reads Broker.Stats once per scrape, for the broker
//     Watch named, and emits every counter and gauge from that snapshot, so
//     they obey the broker's law routed = delivered + deduplicated +
//     dead-lettered + queued + in flight.
//
// The histograms keep a series per (topic, subscriber) only while Stats
// keeps that subscriber: each scrape deletes the series of those it no
// longer reports (topics and subscribers gone beyond the broker's
// MaxGoneTopics and MaxGoneSubscribers), so topics derived from data do not
// grow the registry forever.
//
// One Collector serves one broker. It is safe for concurrent use: hooks,
// scrapes and Watch may run at once. Its hooks never block on anything but
// a brief lock, and allocate only the first time they see a (topic,
// subscriber).
type Collector struct {
	broker.NopObserver

	stats   statsDescs
	handler *prometheus.HistogramVec // topic, subscriber, outcome
	e2e     *prometheus.HistogramVec // topic, subscriber, state

	src atomic.Pointer[broker.Broker] // set by Watch

	// mu guards series. The Collector's own hooks hold it for reading
	// while they observe, so that a scrape deleting a series (holding it
	// for writing) never leaves them observing into a histogram no longer
	// exported; the hooks ForSubscriber returns do not (see there).
	mu     sync.RWMutex
	series map[seriesKey]*series
	topics map[string]*topicSeries // publish_duration_seconds children by topic name
	epoch  atomic.Uint64           // scrapes begun; a series is dated with it when created

	more        *breakdowns // the hook-fed counters by reason and error code, and publish durations
	timePublish bool        // WithPublishDuration
}

var (
	_ broker.Observer           = (*Collector)(nil)
	_ broker.SubscriberObserver = (*Collector)(nil)
	_ prometheus.Collector      = (*Collector)(nil)
)

// seriesKey names a subscriber as Stats does (raw names, not label values).
type seriesKey struct{ topic, subscriber string }

// series are one subscriber's histogram children, created together.
type series struct {
	handler [3]prometheus.Observer // by outcome: delivered, retry, dead_lettered
	e2e     [2]prometheus.Observer // by state: delivered, dead_lettered
	epoch   uint64                 // Collector.epoch when created
	deleted atomic.Bool            // a scrape deleted them (subscriberHooks look again)
	tl, sl  string                 // label values of topic and subscriber

	mu       sync.Mutex                       // guards counters
	counters map[[2]string]prometheus.Counter // breakdown children by {reason, error code}; reason "" for retries
}

// Indexes into series.handler and series.e2e, in the order of their label
// values below.
const (
	outDelivered, outRetry, outDeadLettered = 0, 1, 2 // series.handler
	stDelivered, stDeadLettered             = 0, 1    // series.e2e
)

var (
	handlerOutcomes = [3]string{string(broker.OutcomeDelivered), string(broker.OutcomeRetry), string(broker.OutcomeDeadLettered)}
	e2eStates       = [2]string{string(broker.OutcomeDelivered), string(broker.OutcomeDeadLettered)}
)

// New returns a Collector configured by opts, watching no broker yet. It
// fails with an error wrapping ErrInvalidOption when an option is given a
// bad value. The usual wiring:
//
//	c, err := brokerprom.New()
//	b, err := broker.New(broker.WithObserver(c))
//	c.Watch(b)
//	prometheus.MustRegister(c)
func New(opts ...Option) (*Collector, error) {
	cfg := defaults()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	histogram := func(name, help string, bounds []float64, label string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:                   cfg.namespace,
			Name:                        name,
			Help:                        help,
			ConstLabels:                 cfg.constLabels,
			Buckets:                     bounds,
			NativeHistogramBucketFactor: cfg.nativeFactor,
		}, []string{labelTopic, labelSubscriber, label})
	}
	return &Collector{
		stats: newStatsDescs(cfg.namespace, cfg.constLabels),
		handler: histogram("handler_duration_seconds",
			"Time one handler attempt took, by what followed it (outcome: delivered, retry, dead_lettered).",
			cfg.handlerBounds, labelOutcome),
		e2e: histogram("end_to_end_duration_seconds",
			"Time from Publish accepting a message to its final outcome at a subscriber (state: delivered, dead_lettered).",
			cfg.e2eBounds, labelState),
		series:      make(map[seriesKey]*series),
		topics:      make(map[string]*topicSeries),
		more:        newBreakdowns(&cfg),
		timePublish: cfg.publishDuration,
	}, nil
}

// Watch makes Collect read the counters and gauges of b. Give the Collector
// to b's New with broker.WithObserver too, or the histograms stay empty.
// Until Watch is called Collect reports only the histograms. Calling it
// again replaces the broker; it fails with ErrNilBroker for nil.
func (c *Collector) Watch(b *broker.Broker) error {
	if b == nil {
		return fmt.Errorf("%w: Watch needs the broker whose Stats to export", ErrNilBroker)
	}
	c.src.Store(b)
	return nil
}

// Describe sends the descriptors of every metric the Collector may emit.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.stats.describe(ch)
	c.handler.Describe(ch)
	c.e2e.Describe(ch)
	c.more.describe(ch)
}

// Collect takes one Stats snapshot of the watched broker, sends its
// counters and gauges, deletes the histogram series of subscribers the
// snapshot no longer has, and sends the histograms.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if b := c.src.Load(); b != nil {
		// Every series dated before epoch was created for a subscriber
		// that existed before this snapshot began, so the snapshot has
		// it unless the broker forgot it. A series created since (a name
		// subscribed again after the broker forgot it) is left alone.
		epoch := c.epoch.Add(1)
		st := b.Stats()
		c.stats.collect(ch, st, storeLen(b.DeadLetters()), storeCapacity(b.DeadLetters()))
		c.prune(st, epoch)
		c.pruneTopics(st, epoch)
	}
	c.handler.Collect(ch)
	c.e2e.Collect(ch)
	c.more.collect(ch)
}

// storeLen is s.Len, or -1 when it fails, panics, calls runtime.Goexit or
// (when it honours its context) takes longer than StoreLenTimeout. The store is plugged-in code: a panic
// that reached the registry would fail the whole scrape, and a Goexit would
// end the registry's collecting goroutine before it says it is done, so
// every later scrape would hang. So Len runs on a goroutine of its own,
// which storeLen waits for.
func storeLen(s broker.DeadLetterStore) int {
	n, done := -1, make(chan struct{})
	go func() {
		defer close(done) // also after a panic or a Goexit
		defer func() { _ = recover() }()
		ctx, cancel := context.WithTimeout(context.Background(), StoreLenTimeout)
		defer cancel()
		if v, err := s.Len(ctx); err == nil && v >= 0 {
			n = v
		}
	}()
	<-done
	return n
}

// storeCapacity is the store's Capacity() (as MemoryDeadLetterStore
// reports it), or -1 when it has none, reports a negative one or panics.
func storeCapacity(s broker.DeadLetterStore) (n int) {
	c, ok := s.(interface{ Capacity() int })
	if !ok {
		return -1
	}
	defer func() {
		if recover() != nil {
			n = -1
		}
	}()
	return max(c.Capacity(), -1)
}

// prune deletes the series dated before epoch whose subscriber st does not
// have. It looks for them holding mu for reading, so hooks go on, and holds
// it for writing only to delete what it found.
func (c *Collector) prune(st broker.Stats, epoch uint64) {
	var stale []seriesKey
	c.mu.RLock()
	for k, s := range c.series {
		if s.epoch < epoch && !has(st, k) {
			stale = append(stale, k)
		}
	}
	c.mu.RUnlock()
	if len(stale) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range stale {
		s := c.series[k]
		if s == nil || s.epoch >= epoch {
			continue // deleted by another scrape, maybe created again since
		}
		s.deleted.Store(true)
		tl, sl := labelValue(k.topic), labelValue(k.subscriber)
		for _, o := range handlerOutcomes {
			c.handler.DeleteLabelValues(tl, sl, o)
		}
		for _, state := range e2eStates {
			c.e2e.DeleteLabelValues(tl, sl, state)
		}
		c.more.deleteSubscriber(tl, sl)
		delete(c.series, k)
	}
}

func has(st broker.Stats, k seriesKey) bool {
	_, ok := st.Topics[k.topic].Subscribers[k.subscriber]
	return ok
}

// Attempted observes the attempt's duration in handler_duration_seconds
// and, for a delivered message, the time from its publication to the
// handler's return (e.Start + e.Duration, or the clock for an event without
// Start) in end_to_end_duration_seconds. A deduplicated message (no
// attempt) is not observed. The broker sends a subscriber's events to the
// Observer ForSubscriber returned for it instead, which observes the same
// without looking the series up.
func (c *Collector) Attempted(e broker.AttemptEvent) {
	if i, ok := attemptIndex(e.Outcome); ok {
		s, exclusive := c.acquire(seriesKey{e.Topic, e.Subscriber})
		s.attempted(i, &e)
		c.release(exclusive)
		if i == outRetry {
			c.count(s, "", e.ErrorCode)
		}
	}
}

// DeadLettered observes the time from the message's publication to its
// dead-lettering in end_to_end_duration_seconds (state dead_lettered),
// whatever the reason, attempted or not.
func (c *Collector) DeadLettered(e broker.DeadLetterEvent) {
	s, exclusive := c.acquire(seriesKey{e.DeadLetter.Message.Topic, e.DeadLetter.Subscriber})
	s.deadLettered(&e.DeadLetter)
	c.release(exclusive)
	c.count(s, e.DeadLetter.Reason, e.DeadLetter.ErrorCode)
}

// ForSubscriber returns the Observer of one subscriber's Attempted and
// DeadLettered events (broker.SubscriberObserver): it keeps the
// subscriber's series, so that its hooks observe without the lookup (a
// read lock and a map access by topic and subscriber) that the
// Collector's own hooks make. If a scrape deletes the series (the broker
// forgot the subscriber, and it was subscribed again), its next event
// looks them up again; an event racing that deletion may be lost.
func (c *Collector) ForSubscriber(topic, subscriber string) broker.Observer {
	return &subscriberHooks{c: c, key: seriesKey{topic, subscriber}}
}

// subscriberHooks are one subscriber's hooks (see ForSubscriber).
type subscriberHooks struct {
	broker.NopObserver
	c   *Collector
	key seriesKey
	s   atomic.Pointer[series] // nil until the first event
}

// series returns the subscriber's series, looking them up the first time
// and after a scrape deleted them.
func (h *subscriberHooks) series() *series {
	if s := h.s.Load(); s != nil && !s.deleted.Load() {
		return s
	}
	s, exclusive := h.c.acquire(h.key)
	h.c.release(exclusive)
	h.s.Store(s)
	return s
}

func (h *subscriberHooks) Attempted(e broker.AttemptEvent) {
	if i, ok := attemptIndex(e.Outcome); ok {
		s := h.series()
		s.attempted(i, &e)
		if i == outRetry {
			h.c.count(s, "", e.ErrorCode)
		}
	}
}

func (h *subscriberHooks) DeadLettered(e broker.DeadLetterEvent) {
	s := h.series()
	s.deadLettered(&e.DeadLetter)
	h.c.count(s, e.DeadLetter.Reason, e.DeadLetter.ErrorCode)
}

// attemptIndex is the index in series.handler of an attempt with outcome o;
// false for a deduplicated message.
func attemptIndex(o broker.Outcome) (int, bool) {
	switch o {
	case broker.OutcomeDelivered:
		return outDelivered, true
	case broker.OutcomeRetry:
		return outRetry, true
	case broker.OutcomeDeadLettered:
		return outDeadLettered, true
	}
	return 0, false
}

// attempted observes e, whose index in s.handler is i.
func (s *series) attempted(i int, e *broker.AttemptEvent) {
	s.handler[i].Observe(nonNegative(e.Duration).Seconds())
	if i == outDelivered {
		end := e.Start.Add(e.Duration) // when the handler returned: no clock read
		if e.Start.IsZero() {
			end = time.Now()
		}
		s.e2e[stDelivered].Observe(since(e.PublishedAt, end).Seconds())
	}
}

// deadLettered observes dl's time from publication to dead-lettering.
func (s *series) deadLettered(dl *broker.DeadLetter) {
	end := dl.FailedAt
	if end.IsZero() {
		end = time.Now()
	}
	s.e2e[stDeadLettered].Observe(since(dl.Message.PublishedAt, end).Seconds())
}

// acquire returns k's series with c.mu held: for reading when the series
// existed (exclusive false), for writing when it had to be created. The
// caller observes, then calls release(exclusive).
func (c *Collector) acquire(k seriesKey) (s *series, exclusive bool) {
	c.mu.RLock()
	if s = c.series[k]; s != nil {
		return s, false
	}
	c.mu.RUnlock()
	c.mu.Lock()
	if s = c.series[k]; s == nil {
		s = c.newSeries(k)
		c.series[k] = s
	}
	return s, true
}

func (c *Collector) release(exclusive bool) {
	if exclusive {
		c.mu.Unlock()
	} else {
		c.mu.RUnlock()
	}
}

// newSeries creates k's histogram children; c.mu is held for writing.
func (c *Collector) newSeries(k seriesKey) *series {
	tl, sl := labelValue(k.topic), labelValue(k.subscriber)
	s := &series{epoch: c.epoch.Load(), tl: tl, sl: sl, counters: make(map[[2]string]prometheus.Counter)}
	for i, o := range handlerOutcomes {
		s.handler[i] = c.handler.WithLabelValues(tl, sl, o)
	}
	for i, state := range e2eStates {
		s.e2e[i] = c.e2e.WithLabelValues(tl, sl, state)
	}
	return s
}

// since is end - start, or 0 when start is unset or later than end.
func since(start, end time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return nonNegative(end.Sub(start))
}

func nonNegative(d time.Duration) time.Duration { return max(d, 0) }

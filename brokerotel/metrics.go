package brokerotel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/inproc/broker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"
)

// Metric names the conventions do not define (the semconv ones are
// messaging.client.sent.messages, messaging.client.consumed.messages and
// messaging.process.duration).
const (
	MetricUnrouted     = "inproc.broker.unrouted.messages"
	MetricRetries      = "inproc.broker.delivery.retries"
	MetricDelivered    = "inproc.broker.delivered.messages"
	MetricDeadLettered = "inproc.broker.dead_lettered.messages"
	MetricDeduplicated = "inproc.broker.deduplicated.messages"
	MetricEndToEnd     = "inproc.broker.end_to_end.duration"
)

// Histogram bucket boundaries, in seconds.
var (
	// processBuckets are the conventions' for messaging durations (5 ms
	// to 10 s) with finer ones below, from 100 µs: an in-process handler
	// often takes well under a millisecond. brokerprom has the same.
	processBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
		0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	// publishBuckets are messaging.client.operation.duration's: from 10 µs
	// (an in-memory Publish takes about a microsecond) to 10 s (a Publish
	// waiting out its timeout), as brokerprom's publish_duration_seconds.
	publishBuckets = []float64{0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10}
	// endToEndBuckets reach further: retries with backoff take minutes.
	endToEndBuckets = []float64{0.0005, 0.001, 0.0025,
		0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
)

// instruments are the synchronous instruments, created once by New.
type instruments struct {
	sent         metric.Int64Counter
	consumed     metric.Int64Counter
	process      metric.Float64Histogram
	unrouted     metric.Int64Counter
	retries      metric.Int64Counter
	delivered    metric.Int64Counter
	deadLettered metric.Int64Counter
	deduplicated metric.Int64Counter
	endToEnd     metric.Float64Histogram
	operation    metric.Float64Histogram // messaging.client.operation.duration (Options.PublishDuration)
	stats        statsInstruments
}

func (in *instruments) init(m metric.Meter) error {
	sent, err1 := messagingconv.NewClientSentMessages(m)
	consumed, err2 := messagingconv.NewClientConsumedMessages(m)
	process, err3 := messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(processBuckets...))
	in.sent, in.consumed, in.process = sent.Inst(), consumed.Inst(), process.Inst()
	counter := func(dst *metric.Int64Counter, name, unit, desc string) error {
		var err error
		*dst, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return err
	}
	var err4, err5, err6, err7, err8, err9 error
	err4 = counter(&in.unrouted, MetricUnrouted, "{message}", "Messages dispatched while their topic had no subscriber.")
	err5 = counter(&in.retries, MetricRetries, "{retry}", "Failed attempts scheduled for a retry.")
	err6 = counter(&in.delivered, MetricDelivered, "{message}", "Messages whose handler returned nil.")
	err7 = counter(&in.deadLettered, MetricDeadLettered, "{message}", "Messages put into the dead-letter store.")
	err8 = counter(&in.deduplicated, MetricDeduplicated, "{message}", "Messages skipped because their ID was already delivered to the subscriber.")
	in.endToEnd, err9 = m.Float64Histogram(MetricEndToEnd, metric.WithUnit("s"),
		metric.WithDescription("Time from publish to the message's final outcome at a subscriber."),
		metric.WithExplicitBucketBoundaries(endToEndBuckets...))
	err10 := in.stats.init(m)
	operation, err11 := messagingconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(publishBuckets...))
	in.operation = operation.Inst()
	if err := errors.Join(err1, err2, err3, err4, err5, err6, err7, err8, err9, err10, err11); err != nil {
		return fmt.Errorf("brokerotel: create instruments: %w", err)
	}
	return nil
}

// Published counts an accepted message in messaging.client.sent.messages.
// It is part of t's broker.Observer.
func (t *Telemetry) Published(ev broker.PublishEvent) {
	ts := t.sets.topic(ev.Topic)
	t.inst.sent.Add(context.Background(), 1, ts.sent.add...)
	if t.timed {
		t.inst.operation.Record(context.Background(), seconds(ev.Duration), ts.sent.rec...)
	}
}

// Rejected counts a refused publish in messaging.client.sent.messages with
// error.type "queue_full", "canceled", "deadline_exceeded" (the context's
// error) or "_OTHER". It is part of t's broker.Observer.
func (t *Telemetry) Rejected(ev broker.RejectEvent) {
	set := attribute.NewSet(systemAttr, opPublish, opTypeSend,
		semconv.MessagingDestinationName(ev.Topic), semconv.ErrorTypeKey.String(rejectType(ev.Err)))
	t.inst.sent.Add(context.Background(), 1, metric.WithAttributeSet(set))
	if t.timed {
		t.inst.operation.Record(context.Background(), seconds(ev.Duration), metric.WithAttributeSet(set))
	}
}

// rejectType is the error.type of a refused publish.
func rejectType(err error) string {
	switch {
	case errors.Is(err, broker.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return errorTypeOther
}

// Unrouted counts a message that reached no subscriber in
// inproc.broker.unrouted.messages. It is part of t's broker.Observer.
func (t *Telemetry) Unrouted(ev broker.UnroutedEvent) {
	t.inst.unrouted.Add(context.Background(), 1, t.sets.topic(ev.Topic).unrouted.add...)
}

// Attempted counts what followed an attempt: a retry
// (inproc.broker.delivery.retries, with error.type), a delivery
// (inproc.broker.delivered.messages and inproc.broker.end_to_end.duration)
// or a duplicate (inproc.broker.deduplicated.messages). Attempts themselves
// and their durations are counted by the Middleware. It is part of t's
// broker.Observer. The broker sends a subscriber's events to the Observer
// ForSubscriber returned for it instead, which records the same without
// looking the subscriber's attribute sets up.
func (t *Telemetry) Attempted(ev broker.AttemptEvent) {
	switch ev.Outcome {
	case broker.OutcomeRetry, broker.OutcomeDelivered, broker.OutcomeDeduplicated:
		t.attempted(t.sets.subscriber(ev.Topic, ev.Subscriber), &ev)
	}
}

// DeadLettered counts a dead letter in inproc.broker.dead_lettered.messages
// (with inproc.broker.reason and error.type) and records its
// inproc.broker.end_to_end.duration. It is part of t's broker.Observer;
// as with Attempted, the broker sends a subscriber's dead letters to the
// Observer ForSubscriber returned for it.
func (t *Telemetry) DeadLettered(ev broker.DeadLetterEvent) {
	dl := &ev.DeadLetter
	t.deadLettered(t.sets.subscriber(dl.Message.Topic, dl.Subscriber), dl)
}

// ForSubscriber returns the Observer of one subscriber's Attempted and
// DeadLettered events (broker.SubscriberObserver). It holds the
// subscriber's attribute sets, so that its hooks record the same
// measurements as t's own without looking the sets up (a read lock and a
// map access by topic and subscriber) on every event. The sets depend on
// nothing but the topic and the subscriber's name and are never dropped
// from t's cache, so holding them stays correct for the subscription's
// life; beyond the cache's bound, where t's own hooks build them on every
// event, they are built once here.
func (t *Telemetry) ForSubscriber(topic, subscriber string) broker.Observer {
	ss := t.sets.subscriber(topic, subscriber)
	ss.parked.observed.Store(true) // its attempt events will come: the middleware may park spans
	return &subscriberHooks{t: t, ss: ss}
}

// subscriberHooks are one subscriber's hooks (see ForSubscriber). The
// broker sends them only that subscriber's events, so they trust ss over
// the events' topic and subscriber.
type subscriberHooks struct {
	broker.NopObserver
	t  *Telemetry
	ss *subSets
}

func (h *subscriberHooks) Attempted(ev broker.AttemptEvent) { h.t.attempted(h.ss, &ev) }

func (h *subscriberHooks) DeadLettered(ev broker.DeadLetterEvent) {
	h.t.deadLettered(h.ss, &ev.DeadLetter)
}

// attempted records ev, an event of the subscriber whose sets are ss.
func (t *Telemetry) attempted(ss *subSets, ev *broker.AttemptEvent) {
	ctx := context.Background()
	switch ev.Outcome {
	case broker.OutcomeRetry:
		ss.parked.end(ev.MessageID) // a retry follows: the attempt's span ends as it was
		t.inst.retries.Add(ctx, 1, ss.errorSet(t.codes.bound(ev.ErrorCode)).add...)
	case broker.OutcomeDelivered:
		t.inst.delivered.Add(ctx, 1, ss.base.add...)
		if !ev.PublishedAt.IsZero() {
			end := ev.Start.Add(ev.Duration) // the handler's return: no clock read
			if ev.Start.IsZero() {
				end = time.Now()
			}
			t.inst.endToEnd.Record(ctx, seconds(end.Sub(ev.PublishedAt)), ss.delivered.rec...)
		}
	case broker.OutcomeDeduplicated:
		t.inst.deduplicated.Add(ctx, 1, ss.base.add...)
		t.markDuplicate(ss, ev)
	}
}

// deadLettered records dl, a dead letter of the subscriber whose sets are ss.
func (t *Telemetry) deadLettered(ss *subSets, dl *broker.DeadLetter) {
	ctx := context.Background()
	set := attribute.NewSet(append(ss.attrs(),
		ReasonKey.String(dl.Reason), semconv.ErrorTypeKey.String(t.codes.bound(dl.ErrorCode)))...)
	t.inst.deadLettered.Add(ctx, 1, metric.WithAttributeSet(set))
	ss.parked.endDeadLettered(dl)
	t.markDeadLetter(ss, dl)
	if !dl.Message.PublishedAt.IsZero() && !dl.FailedAt.IsZero() {
		t.inst.endToEnd.Record(ctx, seconds(dl.FailedAt.Sub(dl.Message.PublishedAt)), ss.deadLettered.rec...)
	}
}

var (
	_ broker.Observer           = (*Telemetry)(nil)
	_ broker.SubscriberObserver = (*Telemetry)(nil)
)

// seconds is d in seconds, at least 0 (a wall clock stepped back between
// two times without monotonic readings).
func seconds(d time.Duration) float64 { return max(d, 0).Seconds() }

// errorTypeOther is the conventions' error.type fallback.
const errorTypeOther = "_OTHER"

// MaxCustomErrorTypes is how many distinct error codes of the application's
// own (from ErrorCoder errors) a Telemetry reports as error.type; later
// ones are reported as "_OTHER", so that a code built from data cannot
// blow up the metrics. The broker's codes are always reported.
const MaxCustomErrorTypes = 16

// builtinCodes are the codes the broker assigns.
var builtinCodes = map[string]bool{
	broker.CodeError: true, broker.CodeTimeout: true, broker.CodePanic: true,
	broker.CodePermanent: true, broker.CodeThrottled: true, broker.CodeShutdown: true,
	broker.CodeUnsubscribed: true, broker.CodeOverflow: true,
}

// codeBound keeps error.type bounded: the broker's codes plus the first
// MaxCustomErrorTypes others.
type codeBound struct {
	mu     sync.Mutex
	custom map[string]struct{} // guarded by mu
}

func (c *codeBound) init() { c.custom = make(map[string]struct{}, MaxCustomErrorTypes) }

// bound returns code, or "_OTHER" when it is empty or one custom code too many.
func (c *codeBound) bound(code string) string {
	if builtinCodes[code] {
		return code
	}
	if code == "" {
		return errorTypeOther
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.custom[code]; ok {
		return code
	}
	if len(c.custom) < MaxCustomErrorTypes {
		c.custom[code] = struct{}{}
		return code
	}
	return errorTypeOther
}

// opts is an attribute set as ready-made measurement options, so that
// recording with it allocates nothing.
type opts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newOpts(kvs ...attribute.KeyValue) opts {
	o := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return opts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// topicSets are the attribute sets of one topic's measurements, and its
// publish span's name and constant attributes.
type topicSets struct {
	sent, unrouted opts
	spanName       string
	spanAttrs      trace.SpanStartOption // the publish span's constant attributes
}

// subSets are the attribute sets of one subscriber's measurements.
type subSets struct {
	topic, name  string
	spanAttrs    trace.SpanStartOption // the process span's constant attributes
	base         opts                  // process: system, operation, destination, subscription
	delivered    opts                  // base + state=delivered (end to end)
	deadLettered opts                  // base + state=dead_lettered (end to end)

	mu     sync.Mutex
	errors map[string]opts // base + error.type, by bounded code; guarded by mu

	parked parkedSpans // failed attempts' process spans, until the broker says what follows
}

// attrs returns the attributes of base, in a new slice.
func (s *subSets) attrs() []attribute.KeyValue {
	return []attribute.KeyValue{systemAttr, opProcess, opTypeProcess,
		semconv.MessagingDestinationName(s.topic), semconv.MessagingDestinationSubscriptionName(s.name)}
}

// errorSet returns base + error.type=code; code must be bounded.
func (s *subSets) errorSet(code string) opts {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.errors[code]
	if !ok {
		o = newOpts(append(s.attrs(), semconv.ErrorTypeKey.String(code))...)
		s.errors[code] = o
	}
	return o
}

func newSubSets(topic, name string) *subSets {
	s := &subSets{topic: topic, name: name, errors: make(map[string]opts)}
	s.spanAttrs = trace.WithAttributes(s.attrs()...)
	s.base = newOpts(s.attrs()...)
	s.delivered = newOpts(append(s.attrs(), StateKey.String(string(broker.OutcomeDelivered)))...)
	s.deadLettered = newOpts(append(s.attrs(), StateKey.String(string(broker.OutcomeDeadLettered)))...)
	return s
}

// maxCachedSets bounds setCache: topics and subscribers beyond it (a broker
// with many dynamic topics) get their sets built on each event instead.
const maxCachedSets = 4096

// setCache keeps the attribute sets of the topics and subscribers seen.
type setCache struct {
	mu     sync.RWMutex
	topics map[string]*topicSets // guarded by mu
	subs   map[subKey]*subSets   // guarded by mu
}

type subKey struct{ topic, name string }

func (c *setCache) init() {
	c.topics = make(map[string]*topicSets)
	c.subs = make(map[subKey]*subSets)
}

func (c *setCache) topic(topic string) *topicSets {
	return cached(&c.mu, c.topics, topic, func() *topicSets {
		dest := semconv.MessagingDestinationName(topic)
		return &topicSets{
			sent:      newOpts(systemAttr, opPublish, opTypeSend, dest),
			unrouted:  newOpts(systemAttr, dest),
			spanName:  "publish " + topic,
			spanAttrs: trace.WithAttributes(systemAttr, opPublish, opTypeSend, dest),
		}
	})
}

func (c *setCache) subscriber(topic, name string) *subSets {
	return cached(&c.mu, c.subs, subKey{topic, name}, func() *subSets { return newSubSets(topic, name) })
}

// cached returns m[k], or else what build makes, which it keeps in m while m
// has fewer than maxCachedSets entries; mu guards m. build runs without the
// lock, so two callers may build for k at once: the first one stored wins.
func cached[K comparable, V any](mu *sync.RWMutex, m map[K]V, k K, build func() V) V {
	mu.RLock()
	v, ok := m[k]
	mu.RUnlock()
	if ok {
		return v
	}
	v = build()
	mu.Lock()
	defer mu.Unlock()
	if old, ok := m[k]; ok {
		return old
	}
	if len(m) < maxCachedSets {
		m[k] = v
	}
	return v
}

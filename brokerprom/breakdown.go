package brokerprom

import (
	"context"
	"errors"
	"sync"

	"github.com/inproc/broker"
	"github.com/prometheus/client_golang/prometheus"
)

// This file is the metrics that break the Stats counters down by why:
// dead letters by reason and error code, retries by error code, refused
// publishes by reason, and publish durations. Stats keeps no such
// breakdown, so they are counted by the Observer hooks; the unlabelled
// Stats counters stay the ones that obey the broker's law.

// Label names of the breakdowns.
const (
	labelReason    = "reason"     // dead letters: broker.Reason*; rejections: queue_full, canceled, deadline_exceeded, _OTHER
	labelErrorCode = "error_code" // broker.Code* and the application's own codes, bounded (MaxCustomErrorCodes)
)

// Publish outcomes (publish_duration_seconds' outcome label).
const (
	publishAccepted = "published"
	publishRejected = "rejected"
)

// errorCodeOther stands for an empty error code and for each custom code
// beyond MaxCustomErrorCodes; it is error.type's fallback in OpenTelemetry's
// conventions, which brokerotel reports too.
const errorCodeOther = "_OTHER"

// MaxCustomErrorCodes is how many distinct error codes of the
// application's own (from broker.ErrorCoder errors) a Collector reports in
// the error_code label; later ones are reported as "_OTHER", so that codes
// built from data cannot grow the registry without bound. The broker's own
// codes are always reported. The codes an application defines are its
// cardinality: each one multiplies the dead-letter and retry series of
// every subscriber that returns it.
const MaxCustomErrorCodes = 16

// builtinCodes are the codes the broker assigns.
var builtinCodes = map[string]bool{
	broker.CodeError: true, broker.CodeTimeout: true, broker.CodePanic: true,
	broker.CodePermanent: true, broker.CodeThrottled: true, broker.CodeShutdown: true,
	broker.CodeUnsubscribed: true, broker.CodeOverflow: true,
}

// codeBound keeps error_code bounded: the broker's codes plus the first
// MaxCustomErrorCodes others.
type codeBound struct {
	mu     sync.Mutex
	custom map[string]struct{} // guarded by mu
}

// bound returns code, or "_OTHER" when it is empty or one custom code too
// many.
func (c *codeBound) bound(code string) string {
	if builtinCodes[code] {
		return code
	}
	if code == "" {
		return errorCodeOther
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.custom[code]; ok {
		return code
	}
	if c.custom == nil {
		c.custom = make(map[string]struct{}, MaxCustomErrorCodes)
	}
	if len(c.custom) < MaxCustomErrorCodes {
		c.custom[code] = struct{}{}
		return code
	}
	return errorCodeOther
}

// rejectReason is the reason label of a refused publish.
func rejectReason(err error) string {
	switch {
	case errors.Is(err, broker.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return errorCodeOther
}

// breakdowns are the hook-fed vectors.
type breakdowns struct {
	deadLetters *prometheus.CounterVec   // topic, subscriber, reason, error_code
	retries     *prometheus.CounterVec   // topic, subscriber, error_code
	rejected    *prometheus.CounterVec   // topic, reason
	publish     *prometheus.HistogramVec // topic, outcome
	codes       codeBound
}

func newBreakdowns(cfg *config) *breakdowns {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.namespace, Name: name, Help: help, ConstLabels: cfg.constLabels,
		}, labels)
	}
	return &breakdowns{
		deadLetters: counter("dead_lettered_by_reason_total",
			"Messages dead-lettered, by reason (exhausted, permanent, overflow, budget, shutdown, unsubscribed) and error code; sums to dead_lettered_messages_total.",
			labelTopic, labelSubscriber, labelReason, labelErrorCode),
		retries: counter("delivery_retries_by_code_total",
			"Failed attempts scheduled for a retry, by error code; sums to delivery_retries_total.",
			labelTopic, labelSubscriber, labelErrorCode),
		rejected: counter("rejected_by_reason_total",
			"Publishes refused, by reason (queue_full, canceled, deadline_exceeded); sums to rejected_messages_total.",
			labelTopic, labelReason),
		publish: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace:                   cfg.namespace,
			Name:                        "publish_duration_seconds",
			Help:                        "Time Publish took, the wait for room in a full queue included, by outcome (published, rejected).",
			ConstLabels:                 cfg.constLabels,
			Buckets:                     cfg.publishBounds,
			NativeHistogramBucketFactor: cfg.nativeFactor,
		}, []string{labelTopic, labelOutcome}),
	}
}

func (b *breakdowns) describe(ch chan<- *prometheus.Desc) {
	b.deadLetters.Describe(ch)
	b.retries.Describe(ch)
	b.rejected.Describe(ch)
	b.publish.Describe(ch)
}

func (b *breakdowns) collect(ch chan<- prometheus.Metric) {
	b.deadLetters.Collect(ch)
	b.retries.Collect(ch)
	b.rejected.Collect(ch)
	b.publish.Collect(ch)
}

// deleteSubscriber drops the series of one (topic, subscriber).
func (b *breakdowns) deleteSubscriber(tl, sl string) {
	l := prometheus.Labels{labelTopic: tl, labelSubscriber: sl}
	b.deadLetters.DeletePartialMatch(l)
	b.retries.DeletePartialMatch(l)
}

// deleteTopic drops the series of one topic.
func (b *breakdowns) deleteTopic(tl string) {
	l := prometheus.Labels{labelTopic: tl}
	b.rejected.DeletePartialMatch(l)
	b.publish.DeletePartialMatch(l)
}

// topicSeries are one topic's publish children, created together.
type topicSeries struct {
	published, rejected prometheus.Observer
	epoch               uint64 // Collector.epoch when created
}

// Published observes the publish's duration in publish_duration_seconds
// (outcome published), with WithPublishDuration.
func (c *Collector) Published(e broker.PublishEvent) {
	if !c.timePublish {
		return
	}
	t, exclusive := c.acquireTopic(e.Topic)
	t.published.Observe(nonNegative(e.Duration).Seconds())
	c.release(exclusive)
}

// Rejected counts the refused publish in rejected_by_reason_total and
// observes how long it waited in publish_duration_seconds (outcome
// rejected) with WithPublishDuration.
func (c *Collector) Rejected(e broker.RejectEvent) {
	reason := rejectReason(e.Err)
	t, exclusive := c.acquireTopic(e.Topic)
	if c.timePublish {
		t.rejected.Observe(nonNegative(e.Duration).Seconds())
	}
	c.more.rejected.WithLabelValues(labelValue(e.Topic), reason).Inc()
	c.release(exclusive)
}

// acquireTopic is acquire for a topic's publish series.
func (c *Collector) acquireTopic(topic string) (t *topicSeries, exclusive bool) {
	c.mu.RLock()
	if t = c.topics[topic]; t != nil {
		return t, false
	}
	c.mu.RUnlock()
	c.mu.Lock()
	if t = c.topics[topic]; t == nil {
		tl := labelValue(topic)
		t = &topicSeries{
			published: c.more.publish.WithLabelValues(tl, publishAccepted),
			rejected:  c.more.publish.WithLabelValues(tl, publishRejected),
			epoch:     c.epoch.Load(),
		}
		c.topics[topic] = t
	}
	return t, true
}

// pruneTopics deletes the publish series dated before epoch of topics st
// does not have, as prune does for subscribers.
func (c *Collector) pruneTopics(st broker.Stats, epoch uint64) {
	var stale []string
	c.mu.RLock()
	for name, t := range c.topics {
		if _, ok := st.Topics[name]; !ok && t.epoch < epoch {
			stale = append(stale, name)
		}
	}
	c.mu.RUnlock()
	if len(stale) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range stale {
		if t := c.topics[name]; t == nil || t.epoch >= epoch {
			continue
		}
		c.more.deleteTopic(labelValue(name))
		delete(c.topics, name)
	}
}

// count adds one to s's breakdown counter: a dead letter's (reason,
// error code), or a retry's error code when reason is "". The child is
// cached in s; it is created holding c.mu for reading, so that a scrape
// deleting s's series (holding it for writing) cannot be undone by a hook
// creating a child after it: a hook that finds s deleted drops its event,
// as a histogram observation racing the deletion is lost.
func (c *Collector) count(s *series, reason, code string) {
	k := [2]string{reason, c.more.codes.bound(code)}
	s.mu.Lock()
	ctr := s.counters[k]
	s.mu.Unlock()
	if ctr == nil {
		ctr = c.child(s, k)
	}
	if ctr != nil {
		ctr.Inc()
	}
}

// child creates s's breakdown counter for k; nil when a scrape deleted s.
func (c *Collector) child(s *series, k [2]string) prometheus.Counter {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if s.deleted.Load() {
		return nil
	}
	var ctr prometheus.Counter
	if k[0] == "" {
		ctr = c.more.retries.WithLabelValues(s.tl, s.sl, k[1])
	} else {
		ctr = c.more.deadLetters.WithLabelValues(s.tl, s.sl, k[0], k[1])
	}
	s.mu.Lock()
	s.counters[k] = ctr
	s.mu.Unlock()
	return ctr
}

// TimesPublish makes the Collector a broker.PublishTimer: with
// WithPublishDuration, the broker measures each publish's Duration for
// publish_duration_seconds (a clock read per publish); without, it reads
// no clock for it and the histogram stays empty.
func (c *Collector) TimesPublish() bool { return c.timePublish }

var _ broker.PublishTimer = (*Collector)(nil)

package brokerprom

import (
	"strings"

	"github.com/inproc/broker"
	"github.com/prometheus/client_golang/prometheus"
)

// This file is the metrics read from Broker.Stats at scrape time: their
// descriptors and how one Stats snapshot becomes const metrics.

// Label names. Every value is a developer-declared topic or subscriber name
// or comes from a fixed set: never a message ID, key or error text.
const (
	labelTopic      = "topic"
	labelSubscriber = "subscriber"
	labelOutcome    = "outcome" // handler_duration_seconds: delivered, retry, dead_lettered
	labelState      = "state"   // end_to_end_duration_seconds: delivered, dead_lettered; breaker: closed, open, half_open
)

// ownLabels are the label names the collector sets itself; const labels
// may not reuse them.
var ownLabels = []string{labelTopic, labelSubscriber, labelOutcome, labelState, labelReason, labelErrorCode}

// breakerStates are the states subscriber_breaker_state reports, one series
// each (1 for the current one, 0 for the others).
var breakerStates = []broker.BreakerState{broker.BreakerClosed, broker.BreakerOpen, broker.BreakerHalfOpen}

// statsDescs describe the metrics read from Stats.
type statsDescs struct {
	// per topic
	published, rejected, unrouted                *prometheus.Desc
	topicQueueSize, topicQueueCapacity, topicAge *prometheus.Desc

	// per subscriber
	active, workers                                        *prometheus.Desc
	routed, delivered, deduplicated                        *prometheus.Desc
	attempts, retries, deadLettered, deadLetterStoreErrors *prometheus.Desc
	subQueueSize, held, parked, inflight, subQueueCapacity *prometheus.Desc
	subAge, blockedSeconds, blocking                       *prometheus.Desc
	breakerState, retryBudgetLeft                          *prometheus.Desc

	// broker-wide
	dlqSize, dlqCapacity, dlqEvictions               *prometheus.Desc
	pluginPanics, forgottenTopics                    *prometheus.Desc
	dedupEntries, dedupCapacity, dedupForgottenEarly *prometheus.Desc
	dedupWindow, dedupEffectiveWindow                *prometheus.Desc
}

func newStatsDescs(ns string, cl prometheus.Labels) statsDescs {
	topic := []string{labelTopic}
	sub := []string{labelTopic, labelSubscriber}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(ns+"_"+name, help, labels, cl)
	}
	return statsDescs{
		published:          d("published_messages_total", "Messages accepted into the topic's queue by Publish.", topic),
		rejected:           d("rejected_messages_total", "Publishes refused because the topic's queue stayed full (ErrQueueFull) or the caller's context ended while waiting.", topic),
		unrouted:           d("unrouted_messages_total", "Messages dispatched while the topic had no subscriber to take them.", topic),
		topicQueueSize:     d("topic_queue_size", "Messages waiting in the topic's queue.", topic),
		topicQueueCapacity: d("topic_queue_capacity", "Capacity of the topic's queue.", topic),
		topicAge:           d("topic_queue_oldest_message_age_seconds", "Time since the oldest message in the topic's queue was published (0 when empty).", topic),

		active:                d("subscriber_active", "1 while the subscriber is subscribed, 0 once it left (its counters are kept).", sub),
		workers:               d("subscriber_workers", "Workers running the subscriber's handler (0 once it left).", sub),
		routed:                d("routed_messages_total", "Messages handed to the subscriber (dispatches and redrives).", sub),
		delivered:             d("delivered_messages_total", "Messages whose handler returned nil.", sub),
		deduplicated:          d("deduplicated_messages_total", "Messages skipped because their ID was already delivered to the subscriber.", sub),
		attempts:              d("delivery_attempts_total", "Handler calls.", sub),
		retries:               d("delivery_retries_total", "Failed attempts scheduled for a retry.", sub),
		deadLettered:          d("dead_lettered_messages_total", "Messages put into the dead-letter store.", sub),
		deadLetterStoreErrors: d("dead_letter_store_errors_total", "Dead letters the store refused: counted in dead_lettered_messages_total and logged, but not stored.", sub),
		subQueueSize:          d("subscriber_queue_size", "Messages in the subscriber's lane that no worker runs now (held and parked ones included).", sub),
		held:                  d("subscriber_queue_held", "Of subscriber_queue_size: messages waiting behind an earlier message of their ordering key.", sub),
		parked:                d("subscriber_queue_parked", "Of subscriber_queue_size: failed messages waiting out their backoff before a retry.", sub),
		inflight:              d("subscriber_inflight", "Messages a worker runs now (or waits for a rate-limit token for), or being dead-lettered.", sub),
		subQueueCapacity:      d("subscriber_queue_capacity", "Capacity of the subscriber's lane (0 once it left).", sub),
		subAge:                d("subscriber_queue_oldest_message_age_seconds", "Time since the oldest message waiting in the subscriber's lane was published (0 when empty).", sub),
		blockedSeconds:        d("subscriber_blocked_seconds_total", "Time the topic's dispatcher waited for room in the subscriber's full lane: how long this subscriber held up its topic.", sub),
		blocking:              d("subscriber_blocking", "1 while the topic's dispatcher waits for room in this subscriber's lane, else 0.", sub),
		breakerState:          d("subscriber_breaker_state", "Circuit breaker state: 1 for the current state, 0 for the others (only subscribers with a breaker).", []string{labelTopic, labelSubscriber, labelState}),
		retryBudgetLeft:       d("subscriber_retry_budget_left", "Retries the subscriber's retry budget allows now (only subscribers with a budget).", sub),

		dlqSize:              d("dead_letter_store_size", "Dead letters in the store now.", nil),
		dlqCapacity:          d("dead_letter_store_capacity", "Most dead letters the store holds before it evicts the oldest (only stores that report it).", nil),
		dlqEvictions:         d("dead_letter_evictions_total", "Dead letters the store evicted to make room.", nil),
		pluginPanics:         d("plugin_panics_total", "Panics of plugged-in code (stores, observer hooks, backoffs) the broker recovered.", nil),
		forgottenTopics:      d("forgotten_topics_total", "Retired topics whose counters were dropped to keep the broker's bound on them.", nil),
		dedupEntries:         d("dedup_entries", "Message IDs the default idempotency store remembers now.", nil),
		dedupCapacity:        d("dedup_capacity", "Most message IDs the default idempotency store remembers.", nil),
		dedupForgottenEarly:  d("dedup_forgotten_early_total", "IDs the default idempotency store dropped to make room while still inside the window (nonzero: the store is too small).", nil),
		dedupWindow:          d("dedup_window_seconds", "Configured deduplication window.", nil),
		dedupEffectiveWindow: d("dedup_effective_window_seconds", "How far apart in publish time an ID and its copy are still caught now.", nil),
	}
}

func (d *statsDescs) describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{
		d.published, d.rejected, d.unrouted, d.topicQueueSize, d.topicQueueCapacity, d.topicAge,
		d.active, d.workers, d.routed, d.delivered, d.deduplicated,
		d.attempts, d.retries, d.deadLettered, d.deadLetterStoreErrors,
		d.subQueueSize, d.held, d.parked, d.inflight, d.subQueueCapacity,
		d.subAge, d.blockedSeconds, d.blocking, d.breakerState, d.retryBudgetLeft,
		d.dlqSize, d.dlqCapacity, d.dlqEvictions, d.pluginPanics, d.forgottenTopics,
		d.dedupEntries, d.dedupCapacity, d.dedupForgottenEarly, d.dedupWindow, d.dedupEffectiveWindow,
	} {
		ch <- x
	}
}

// collect sends the metrics of st; dlqSize < 0 means the store's Len
// failed, and its gauge is left out of this scrape; dlqCap < 0, that the
// store reports no capacity.
func (d *statsDescs) collect(ch chan<- prometheus.Metric, st broker.Stats, dlqSize, dlqCap int) {
	const (
		counter = prometheus.CounterValue
		gauge   = prometheus.GaugeValue
	)
	for name, t := range st.Topics {
		tl := labelValue(name)
		emit(ch, d.published, counter, float64(t.Published), tl)
		emit(ch, d.rejected, counter, float64(t.Rejected), tl)
		emit(ch, d.unrouted, counter, float64(t.Unrouted), tl)
		emit(ch, d.topicQueueSize, gauge, float64(t.Queued), tl)
		emit(ch, d.topicQueueCapacity, gauge, float64(t.Capacity), tl)
		emit(ch, d.topicAge, gauge, t.OldestAge.Seconds(), tl)
		for subName, s := range t.Subscribers {
			sl := labelValue(subName)
			emit(ch, d.active, gauge, bit(s.Active), tl, sl)
			emit(ch, d.workers, gauge, float64(s.Concurrency), tl, sl)
			emit(ch, d.routed, counter, float64(s.Routed), tl, sl)
			emit(ch, d.delivered, counter, float64(s.Delivered), tl, sl)
			emit(ch, d.deduplicated, counter, float64(s.Deduplicated), tl, sl)
			emit(ch, d.attempts, counter, float64(s.Attempts), tl, sl)
			emit(ch, d.retries, counter, float64(s.Retries), tl, sl)
			emit(ch, d.deadLettered, counter, float64(s.DeadLettered), tl, sl)
			emit(ch, d.deadLetterStoreErrors, counter, float64(s.DeadLetterErrors), tl, sl)
			emit(ch, d.subQueueSize, gauge, float64(s.Queued), tl, sl)
			emit(ch, d.held, gauge, float64(s.Held), tl, sl)
			emit(ch, d.parked, gauge, float64(s.Parked), tl, sl)
			emit(ch, d.inflight, gauge, float64(s.InFlight), tl, sl)
			emit(ch, d.subQueueCapacity, gauge, float64(s.Capacity), tl, sl)
			emit(ch, d.subAge, gauge, s.OldestAge.Seconds(), tl, sl)
			emit(ch, d.blockedSeconds, counter, s.BlockedFor.Seconds(), tl, sl)
			emit(ch, d.blocking, gauge, bit(t.BlockedOn != "" && t.BlockedOn == subName), tl, sl)
			if s.Breaker != broker.BreakerNone {
				for _, state := range breakerStates {
					emit(ch, d.breakerState, gauge, bit(s.Breaker == state), tl, sl, string(state))
				}
			}
			if s.RetryBudgetLeft >= 0 {
				emit(ch, d.retryBudgetLeft, gauge, float64(s.RetryBudgetLeft), tl, sl)
			}
		}
	}
	if dlqSize >= 0 {
		emit(ch, d.dlqSize, gauge, float64(dlqSize))
	}
	if dlqCap >= 0 {
		emit(ch, d.dlqCapacity, gauge, float64(dlqCap))
	}
	emit(ch, d.dlqEvictions, counter, float64(st.DeadLetterEvicted))
	emit(ch, d.pluginPanics, counter, float64(st.PluginPanics))
	emit(ch, d.forgottenTopics, counter, float64(st.ForgottenTopics))
	if dd := st.Dedup; dd.Capacity > 0 {
		emit(ch, d.dedupEntries, gauge, float64(dd.Entries))
		emit(ch, d.dedupCapacity, gauge, float64(dd.Capacity))
		emit(ch, d.dedupForgottenEarly, counter, float64(dd.ForgottenEarly))
		emit(ch, d.dedupWindow, gauge, dd.Window.Seconds())
		emit(ch, d.dedupEffectiveWindow, gauge, dd.EffectiveWindow.Seconds())
	}
}

// emit sends one const metric; a metric the client library refuses (it
// should not: label values are made valid UTF-8) is sent as an invalid
// metric, which the registry reports as a gather error.
func emit(ch chan<- prometheus.Metric, d *prometheus.Desc, vt prometheus.ValueType, v float64, lvs ...string) {
	m, err := prometheus.NewConstMetric(d, vt, v, lvs...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	ch <- m
}

func bit(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// labelValue makes a topic or subscriber name a valid label value: label
// values must be UTF-8, and a broker accepts any string as a name.
func labelValue(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

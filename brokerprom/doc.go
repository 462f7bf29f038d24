// Package brokerprom exports the metrics of a github.com/inproc/broker
// Broker to Prometheus.
//
// A Collector is both a broker.Observer and a prometheus.Collector:
//
//	c, err := brokerprom.New()
//	if err != nil { ... }
//	b, err := broker.New(broker.WithObserver(c))
//	if err != nil { ... }
//	if err := c.Watch(b); err != nil { ... }
//	prometheus.MustRegister(c)
//
// The broker must be created with the Collector as its Observer, and the
// Collector needs the broker to read its Stats, hence the two steps.
//
// # Counters and gauges come from Stats
//
// Each scrape calls Broker.Stats once and turns the snapshot into const
// metrics: per topic (published, rejected, unrouted, queue size, capacity
// and oldest age), per subscriber (routed, delivered, deduplicated,
// attempts, retries, dead-lettered, lane size, held, parked, in flight,
// capacity, oldest age, blocked time, breaker state, retry budget) and
// broker-wide (dead letters stored and evicted, plugin panics, the
// idempotency store's use). Because they come from one snapshot, at any
// quiet moment routed_messages_total equals delivered + deduplicated +
// dead_lettered + subscriber_queue_size + subscriber_inflight, as the
// broker promises; counters kept by hooks would drift from that.
//
// # Why it failed comes from the Observer hooks
//
// Stats counts dead letters, retries and refused publishes without saying
// why, so dead_lettered_by_reason_total (reason, error_code),
// delivery_retries_by_code_total (error_code) and rejected_by_reason_total
// (reason) count the events; each sums to its Stats counter at a quiet
// moment. error_code holds the broker's codes and the first
// MaxCustomErrorCodes of the application's own (then "_OTHER"): the codes
// an application defines are its cardinality. With WithPublishDuration,
// publish_duration_seconds observes how long each Publish took.
//
// # Histograms come from the Observer hooks
//
// handler_duration_seconds (topic, subscriber, outcome) observes each
// attempt's AttemptEvent.Duration; end_to_end_duration_seconds (topic,
// subscriber, state) observes the time from Publish to the final outcome,
// delivered or dead-lettered (for a redriven dead letter, from its first
// publication). A hook takes a read lock and a map lookup to find the
// cached series, then observes: it allocates only the first time it sees a
// subscriber.
//
// # Cardinality
//
// Labels are topic and subscriber names (which the developer declares) and
// values from fixed sets; never message IDs, keys or error texts. The
// histogram series of a subscriber go away at the first scrape after the
// broker's Stats stop reporting it, so a service that derives topic names
// from data does not grow the registry forever. Names that are not valid
// UTF-8 are made valid (invalid bytes become U+FFFD).
//
// # Names
//
// Every name starts with the namespace, "broker" unless WithNamespace says
// otherwise; counters end in _total and durations are in seconds. README.md
// lists every metric, and alerts.yml has sample alert rules.
package brokerprom

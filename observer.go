package broker

import (
	"context"
	"time"
)

// This file is the Observer: the events the broker reports, for metrics
// and tracing adapters that live outside this module.

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
//
// The events of one message come from different goroutines (the
// publisher's, then the topic's dispatcher and the subscriber's workers),
// which do not wait for each other's hooks: Published is called after the
// message was queued, so its Unrouted or Attempted events may arrive
// first. An adapter that keeps state per message must not rely on the
// order; a subscriber's own events (Attempted, DeadLettered) arrive in
// order.
type Observer interface {
	// Published is called when Publish accepted a message (after it was
	// queued: see above on order).
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
	// DeadLettered is called after a dead letter was put into the store, or
	// given up when the store refused it (DeadLetterEvent.StoreErr).
	DeadLettered(DeadLetterEvent)
}

// SubscriberObserver is an optional interface of an Observer that keeps
// state per subscriber, such as a metrics adapter's series: when a
// subscription starts, the broker calls ForSubscriber once and sends that
// subscriber's Attempted and DeadLettered events to the Observer it
// returns, until the subscription ends, so that the hooks need not look the
// subscriber up on every event. The other events still go to the Observer
// itself. A nil result (or a panic, which is recovered and counted) means
// the Observer itself gets them. What ForSubscriber returns is guarded as
// the Observer is. ForSubscriber is called before the broker takes any
// lock (it may call the broker, Stats for one), so a Subscribe it was
// called for may still be refused (a duplicate name, a closed broker).
type SubscriberObserver interface {
	Observer
	ForSubscriber(topic, subscriber string) Observer
}

// PublishTimer is an optional interface of an Observer that may want
// PublishEvent.Duration and RejectEvent.Duration: the broker reads the
// clock for them after each publish only when one of its Observers'
// TimesPublish returned true. New calls it once (a panic counts as false,
// and is recovered and counted).
type PublishTimer interface {
	Observer
	TimesPublish() bool
}

// NopObserver ignores every event; it is the default Observer and can be
// embedded to implement only some hooks.
type NopObserver struct{}

var _ Observer = NopObserver{}

// Published does nothing.
func (NopObserver) Published(PublishEvent) {}

// Rejected does nothing.
func (NopObserver) Rejected(RejectEvent) {}

// Unrouted does nothing.
func (NopObserver) Unrouted(UnroutedEvent) {}

// Attempted does nothing.
func (NopObserver) Attempted(AttemptEvent) {}

// DeadLettered does nothing.
func (NopObserver) DeadLettered(DeadLetterEvent) {}

// PublishEvent describes an accepted message.
type PublishEvent struct {
	Topic, MessageID string
	PublishedAt      time.Time
	// Duration is how long Publish took from stamping PublishedAt to the
	// message being queued (or handed to the transport), the wait for room
	// included. It is measured only when an Observer is a PublishTimer
	// (else 0), so that other observers cost no clock read per publish.
	Duration time.Duration
}

// RejectEvent describes a refused publish.
type RejectEvent struct {
	Topic, MessageID string
	Err              error         // wraps ErrQueueFull, or is the context's error
	Duration         time.Duration // how long Publish waited before refusing (as PublishEvent.Duration: only for a PublishTimer)
}

// UnroutedEvent describes a message that reached no subscriber.
type UnroutedEvent struct {
	Topic, MessageID string
}

// AttemptEvent describes one handler attempt.
type AttemptEvent struct {
	Topic, Subscriber, MessageID string
	Attempt                      int           // 1 for the first; 0 for a deduplicated message
	Start                        time.Time     // when the handler was called (zero for a deduplicated message); Start.Add(Duration) is when it returned
	Duration                     time.Duration // handler run time
	ErrorCode                    string        // empty on success
	Retryable                    bool          // the policy allows retries for ErrorCode
	Outcome                      Outcome       // what follows
	Delay                        time.Duration // wait before the retry (Outcome == OutcomeRetry)
	PublishedAt                  time.Time     // for end-to-end latency
	Err                          error         // the handler's error, nil on success
	// Headers are the message's headers as published (trace context,
	// for one), not a handler's copy: read-only, shared with the
	// broker, nil when the message was published without any.
	Headers map[string]string
}

// DeadLetterEvent describes a dead letter after the store was asked to keep it.
type DeadLetterEvent struct {
	DeadLetter DeadLetter
	StoreErr   error // the store's Put error; nil when stored
}

// redrivenKey is the context key of Redriven.
type redrivenKey struct{}

// Redriven reports whether ctx is the context of a handler attempt (or of
// the middleware around it) of a redriven dead letter (Broker.Redrive,
// RedriveMatching, or a transport's redelivery of one): a tracing or
// logging middleware can tell it from a first delivery. Its Attempt counts
// the redriven copy's attempts, from 1.
func Redriven(ctx context.Context) bool {
	v, _ := ctx.Value(redrivenKey{}).(bool)
	return v
}

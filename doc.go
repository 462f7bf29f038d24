// Package broker is an embeddable, in-process message broker whose failure
// behaviour is a written, tested contract.
//
// A service publishes events with [Broker.Publish]; every subscriber
// registered with [Broker.Subscribe] gets each message at least once, in its
// own lane, with its own workers. Failed deliveries are retried by a policy
// chosen per error code, what still fails lands in a [DeadLetterStore] with
// everything needed to diagnose and [Broker.Redrive] it, duplicates by
// message ID are suppressed, a full queue gives the producer an error
// instead of a hang, [Broker.Stats] says where the backlog is, and
// [Broker.Close] loses nothing.
//
// Every method of this package that takes a context.Context, the built-in
// stores' included, treats a nil ctx as context.Background().
//
// # Delivery semantics
//
// delivery_semantics = at_least_once. A message is handed to a subscriber
// again after a failed attempt, and a handler may be cut off (timeout,
// shutdown) after it caused its side effect, so handlers must be idempotent.
// The broker helps: a message whose ID was already delivered to a subscriber
// is not handed to it again when the two were published within the dedup
// window of each other (with the default store, MemoryIdempotencyStore),
// and two deliveries of one ID to one subscriber never run at the same time.
//
// # Pipeline
//
// Publish validates the message and puts it into its topic's bounded queue
// ("published" means "queued", never "handled"). One dispatcher goroutine
// per topic takes messages in FIFO order and copies each into the lane of
// every subscriber; when the topic is idle (its queue empty, its
// dispatcher asleep), Publish does that itself for its message, as far as
// it goes without waiting, which saves the delivery a goroutine hand-off.
// Publish never runs a handler. Each subscriber's workers take
// messages from its lane and run the delivery pipeline: dedup check,
// attempt (handler with deadline and panic recovery), classify the error,
// park for a retry or dead-letter, record stats, logs and observer events.
// [Broker.PublishBatch] publishes many messages at once, each as Publish
// would, saying which were refused ([BatchError]).
//
// # Isolation
//
// A failed attempt that will be retried parks: it waits out its backoff on
// a timer, holding only its ordering key (its Key; with [Ordered], the topic
// for keyless messages), and its worker goes on with the next message whose
// key is free. Later messages of the same key wait behind it, in order; any
// idle worker of the subscriber takes any free key. So one failing
// subscriber, or one failing key, costs its neighbours nothing while its
// lane has room. Parked and held messages count against the lane; what
// happens when it is full is the subscriber's [FullLanePolicy]: [Block]
// (backpressure to the topic) or shedding with reason "overflow" at that
// subscriber only. Opt-in protections decide what gives before that: a
// [CircuitBreaker] pauses a subscriber whose retries keep failing, a
// [RetryBudget] caps retries at a share of first attempts, a [RateLimit]
// paces attempts.
//
// # Failure contract
//
// A handler reports failure only by returning an error; a panic is
// recovered as a [*PanicError]. Errors are classified:
//
//   - a panic: code "panic", retryable like any error (a ByCode["panic"]
//     rule with [NoRetries] makes it permanent);
//   - the subscriber's HandlerTimeout had passed when the handler returned an
//     error: code "timeout", retryable, whatever the error;
//   - [Permanent](err): code "permanent" (or err's own code), never retried;
//   - [RetryAfter](err, d): code "throttled", retried no sooner than d;
//   - an error with a method ErrorCode() string ([ErrorCoder]): that code,
//     retryable;
//   - anything else: code "error", retryable.
//
// A retryable failure is retried while attempts remain under the rule for
// its code ([RetryPolicy.ByCode], else the policy's MaxRetries); attempts are
// numbered 1, 2, 3… and never exceed MaxRetries+1 for the code. The last
// failure goes to the dead-letter store with reason "exhausted" (or
// "permanent" when a [RetryPolicy.ByCode] rule of [NoRetries] declares the
// code not worth retrying; a policy-wide NoRetries leaves codes retryable,
// so their first failure is "exhausted"), is counted, logged and reported
// to the [Observer]. A zero field of a policy or rule means "not set": the
// default [DefaultRetryPolicy] (5 retries, 3.1 to 6.2 s of backoff in all),
// or for a rule the policy's.
//
// # Backpressure
//
// Topic queues and subscriber lanes are bounded. Under [Block], a
// subscriber whose lane is full holds up its topic's dispatcher, so the
// topic queue fills, and then Publish waits at most the publish timeout (or
// until its context ends) and returns [ErrQueueFull]; [TopicStats].BlockedOn
// names the subscriber it waits for. Memory stays bounded; nothing blocks
// forever.
//
// # Shutdown
//
// [Broker.Close] refuses new publishes, drains every queue and lane (with
// retries) until its context ends, then cancels handler contexts (their
// cause matches [ErrClosed]), waits at most four fifths of [ShutdownGrace]
// for handlers to return and dead-letters what is unfinished with reason
// "shutdown", returning a [*DrainError] with the count, by ShutdownGrace
// after its context ended. A handler that ignores its context is
// abandoned: Close honours its context.
// [Subscription.Unsubscribe] does the same for one subscriber with reason
// "unsubscribed" ([ErrUnsubscribed]); it owes the subscriber every message
// accepted before the call.
//
// Resources follow what is live: a topic with no subscriber and nothing
// queued holds no goroutine, and the counters of what is gone are kept up
// to [MaxGoneTopics] and [MaxGoneSubscribers]. Everything plugged in (stores,
// observers, backoffs) is guarded: a panic there is recovered, logged and
// counted in [Stats].PluginPanics.
//
// # Observability
//
// [Broker.Stats] gives, per topic and subscriber, queue depths, capacities,
// the age of the oldest waiting message and counters for which, at any
// quiet moment, routed = delivered + deduplicated + dead-lettered + queued +
// in flight. Logs use log/slog with the fields topic, message_id,
// subscriber, attempt, error_code, retryable and final_state. An
// [Observer] receives every event for metrics adapters; its hooks run on the
// hot path and must not block (a [SubscriberObserver] gets an Observer of
// its own per subscription, for per-subscriber state). [WithMiddleware] wraps every attempt (tracing,
// auth, logging), and [WithPublishHook] decorates each message in Publish
// with the publisher's context (trace context into Headers). Package
// [github.com/inproc/broker/admin] is an admin page.
//
// # Transports
//
// The in-memory queues and lanes are the default transport. [WithTransport]
// plugs in another (NATS JetStream, in module
// github.com/inproc/broker/natsjs) for messages that survive restarts and
// subscribers whose work is shared by several processes: the delivery
// engine — dedup, attempts, classification, retries, dead letters, Stats,
// Observer, logs — stays this package's, run over each [Delivery] the
// transport hands it, with the breaker, retry budget and rate limit acting
// in the process as in memory (LaneSize and WhenLaneFull are refused: the
// stream is the buffer). [Broker.Transport] returns the transport; a
// [BatchTransport] takes a PublishBatch in one call. Package [github.com/inproc/broker/brokertest] has the
// conformance suites a transport or a store runs.
package broker

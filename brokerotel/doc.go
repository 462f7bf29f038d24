// Package brokerotel traces and measures a [broker.Broker] with
// OpenTelemetry, following the messaging semantic conventions (semconv
// v1.43.0, the newest shipped with go.opentelemetry.io/otel v1.47.0).
//
// It lives in a module of its own, so that importing the broker never pulls
// in OpenTelemetry.
//
// # Wiring
//
// Create a [Telemetry] with the providers to use and give its options to
// the broker:
//
//	t, err := brokerotel.New(brokerotel.Options{
//		TracerProvider: tp, // nil: otel.GetTracerProvider()
//		MeterProvider:  mp, // nil: otel.GetMeterProvider()
//	})
//	b, err := broker.New(t.Options()...) // publish hook, middleware, observer
//	reg, err := t.ObserveStats(b)        // optional: queue gauges from b.Stats()
//	defer reg.Unregister()
//
// [Telemetry.Options] is shorthand for
// broker.WithPublishHook(t.PublishHook), broker.WithMiddleware(t.Middleware)
// and broker.WithObserver(t). Another adapter's observer (a Prometheus
// collector) is added with its own broker.WithObserver: each gets every
// event.
//
// # Traces
//
// The publish hook starts a PRODUCER span "publish <topic>" (operation
// "publish", type "send") as a child of the span in the publisher's context
// (a new trace without one) and injects its context into the message's
// Headers with the propagator (W3C Trace Context by default): the headers
// carry traceparent (and tracestate). That span is the message's creation
// context. The hook runs before Publish queues the message, and Publish can
// still refuse it afterwards (queue full, context ended): the span covers
// the hook point only and is ended in the hook, so no span is ever left open;
// [Telemetry.Publish] instead publishes and ends the span when Publish
// returns, with status Error and error.type for a refused message.
// Whether the message was accepted is what Publish returns to the caller
// and what the messaging.client.sent.messages metric counts (with error.type
// for a refusal). A message whose Headers already carry a trace context (a
// forwarded message) keeps it, as the conventions say: the publish span then
// links to it and injects nothing.
//
// The middleware starts a CONSUMER span "process <topic>" (operation
// "process") around every attempt, so a message retried twice has three. By
// default it is a child of the creation context, in the producer's trace,
// and it also links to it (the conventions say a process span SHOULD link to
// the creation context and MAY use it as parent); with [Options.LinkOnly] it
// starts a new trace and only links. The handler's context carries the span,
// so the handler's own spans nest under it. A failed attempt sets status
// Error, records the error as an exception event and sets error.type to the
// broker's error code. The attempt that made a dead letter gets a
// "dead_letter" event with the reason and the dead letter's ID (when the
// Telemetry is also the broker's Observer: it learns the outcome after the
// attempt), and an instant "dead_letter <topic>" span joins the trace. A
// skipped duplicate gets an instant "deduplicate <topic>" span; a
// redriven dead letter's attempts carry inproc.broker.redriven=true.
//
// # Metrics
//
// Semantic-convention metrics where they exist and inproc.broker.* for the
// rest; every attribute is bounded (topic, subscriber, error code, reason),
// never a message ID. See the README for the full list.
//
// # Cost
//
// Every publish and every attempt starts and ends a span and records a few
// measurements. The README gives the measured cost per message.
package brokerotel

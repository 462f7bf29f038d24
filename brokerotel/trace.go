package brokerotel

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/inproc/broker"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// PublishHook is a broker.PublishHook (give it to broker.WithPublishHook):
// it starts the PRODUCER span "publish <topic>" as a child of the span in
// ctx (the root of a new trace without one), injects its context into
// msg.Headers and ends it. The span covers the hook point, not the rest of
// Publish (see the package doc). A message that already carries a trace
// context keeps it: the span links to it and nothing is injected. It never
// refuses a message.
func (t *Telemetry) PublishHook(ctx context.Context, msg *broker.Message) error {
	if msg == nil {
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if msg.Headers == nil {
		msg.Headers = make(map[string]string, 2)
	}
	carrier := propagation.MapCarrier(msg.Headers)
	existing := t.creationContext(context.Background(), carrier)

	ts := t.sets.topic(msg.Topic)
	opts := make([]trace.SpanStartOption, 0, 3)
	opts = append(opts, producerKind, ts.spanAttrs)
	if existing.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: existing}))
	}
	sctx, span := t.tracer.Start(ctx, ts.spanName, opts...)
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingMessageID(msg.ID), semconv.MessagingMessageBodySize(len(msg.Payload)))
	}
	if !existing.IsValid() {
		t.prop.Inject(sctx, carrier)
	}
	if slot, ok := ctx.Value(publishSlotKey{}).(*publishSlot); ok && slot.span == nil {
		slot.span = span // Telemetry.Publish ends it when Publish returns
		return nil
	}
	span.End()
	return nil
}

// Span start options that are the same for every span. A span starts with
// the attributes the conventions list as relevant to sampling (system,
// operation, destination, subscription); the message's ID, size and attempt
// are set once the span turns out to be recorded, so that an unsampled
// message costs less.
var (
	producerKind = trace.WithSpanKind(trace.SpanKindProducer)
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
	newRoot      = trace.WithNewRoot()
)

// creationContext returns the span context the propagator finds in carrier
// on top of ctx: a remote one it extracted, or an invalid one.
func (t *Telemetry) creationContext(ctx context.Context, carrier propagation.TextMapCarrier) trace.SpanContext {
	sc := trace.SpanContextFromContext(t.prop.Extract(ctx, carrier))
	if !sc.IsRemote() { // nothing extracted: a local span of ctx, or none
		return trace.SpanContext{}
	}
	return sc
}

// Middleware is a broker.Middleware (give it to broker.WithMiddleware): it
// runs every attempt of sub's handler inside a CONSUMER span "process
// <topic>" and records messaging.client.consumed.messages and
// messaging.process.duration (the span's duration). The span is a child of
// the message's creation context (the publish span), or with LinkOnly the
// root of a new trace, and links to it either way; a message without trace
// context gets a new trace. The handler's context carries the span (and
// what the propagator extracted, such as baggage).
//
// A failed attempt (an error, a panic or runtime.Goexit, a deadline
// passed) sets the span's status to Error with error.type set to the
// broker's error code, and records the error; the code is "timeout" when
// the attempt's deadline had passed, as the broker files it.
func (t *Telemetry) Middleware(sub broker.SubscriberInfo, next broker.Handler) broker.Handler {
	if next == nil {
		return nil // the broker refuses it: a middleware returned a nil handler
	}
	ss := t.sets.subscriber(sub.Topic, sub.Name)
	name := "process " + sub.Topic
	return func(ctx context.Context, msg broker.Message) (err error) {
		if ctx == nil {
			ctx = context.Background()
		}
		ctx = t.prop.Extract(ctx, propagation.MapCarrier(msg.Headers))
		creation := trace.SpanContextFromContext(ctx)
		if !creation.IsRemote() {
			creation = trace.SpanContext{}
		}
		start := time.Now()
		opts := make([]trace.SpanStartOption, 0, 5)
		opts = append(opts, consumerKind, trace.WithTimestamp(start), ss.spanAttrs)
		if creation.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: creation}))
		}
		if t.linkOnly {
			opts = append(opts, newRoot)
		}
		sctx, span := t.tracer.Start(ctx, name, opts...)
		if span.IsRecording() {
			span.SetAttributes(semconv.MessagingMessageID(msg.ID),
				semconv.MessagingMessageBodySize(len(msg.Payload)), AttemptKey.Int(msg.Attempt))
			if broker.Redriven(ctx) {
				span.SetAttributes(RedrivenKey.Bool(true))
			}
		}
		t.inst.consumed.Add(context.Background(), 1, ss.base.add...)

		returned := false
		defer func() {
			if returned {
				return
			}
			// next panicked (a middleware inside this one: the broker
			// recovers the handler's own panics) or called runtime.Goexit
			// (recover returns nil); the broker files either as a panic.
			// End the span and record the attempt before it goes on.
			v := recover()
			cause := v
			if v == nil {
				cause = "runtime.Goexit called"
			}
			t.finish(ctx, span, start, ss, &msg, &broker.PanicError{Value: cause, Stack: debug.Stack()})
			if v != nil {
				panic(v)
			}
		}()
		err = next(sctx, msg)
		returned = true
		t.finish(ctx, span, start, ss, &msg, err)
		return err
	}
}

// finish ends an attempt's span and records its duration. A failed
// attempt's recorded span is parked instead, when the broker will say
// what follows (see parkedSpans), and ended then, at end.
func (t *Telemetry) finish(ctx context.Context, span trace.Span, start time.Time, ss *subSets, msg *broker.Message, err error) {
	end := time.Now()
	opts := ss.base.rec
	if err != nil {
		code := t.codes.bound(attemptCode(ctx, err))
		opts = ss.errorSet(code).rec
		if span.IsRecording() {
			span.SetAttributes(semconv.ErrorTypeKey.String(code))
			recordError(span, err)
			span.SetStatus(codes.Error, code)
		}
	}
	if span.IsRecording() {
		if err == nil || !ss.parked.park(ctx, msg.ID, msg.Attempt, span, end) {
			span.End(trace.WithTimestamp(end)) // the span lasts exactly what the metric says
		}
	} else {
		span.End()
	}
	t.inst.process.Record(context.Background(), end.Sub(start).Seconds(), opts...)
}

// attemptCode is the code the broker files an attempt's error under:
// ErrorCodeOf's, or "timeout" when the attempt's deadline had passed (the
// broker's only deadline on a handler's context is HandlerTimeout).
func attemptCode(ctx context.Context, err error) string {
	code := broker.ErrorCodeOf(err)
	if code == broker.CodePanic {
		return code
	}
	if deadline, ok := ctx.Deadline(); ok &&
		(errors.Is(ctx.Err(), context.DeadlineExceeded) || !time.Now().Before(deadline)) {
		return broker.CodeTimeout
	}
	return code
}

// recordError adds the exception event for err. A handler's error is user
// code: one whose methods panic (a typed nil) is recorded by its type.
func recordError(span trace.Span, err error) {
	defer func() {
		if recover() != nil {
			span.RecordError(fmt.Errorf("brokerotel: the handler's error (%T) panicked when read", err))
		}
	}()
	var opts []trace.EventOption
	if pe, ok := errors.AsType[*broker.PanicError](err); ok && len(pe.Stack) > 0 {
		opts = append(opts, trace.WithAttributes(semconv.ExceptionStacktrace(string(pe.Stack))))
	}
	span.RecordError(err, opts...)
}

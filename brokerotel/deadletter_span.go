package brokerotel

import (
	"context"

	"github.com/inproc/broker"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// DeadLetterIDKey is the dead letter's ID (broker.DeadLetter.ID) on the
// "dead_letter <topic>" span.
const DeadLetterIDKey = attribute.Key("inproc.broker.dead_letter.id")

// TimesPublish makes t a broker.PublishTimer: with Options.PublishDuration
// the broker measures each publish for messaging.client.operation.duration.
func (t *Telemetry) TimesPublish() bool { return t.timed }

var _ broker.PublishTimer = (*Telemetry)(nil)

// markDeadLetter puts a span "dead_letter <topic>" into the message's
// trace when a dead letter is stored: a child of its creation context (or,
// with LinkOnly, a root linked to it), with the reason, the dead letter's
// ID, error.type and status Error, so that a trace shows where the message
// ended and under which ID to find or redrive it. A message without trace
// context gets none. The span is INTERNAL and instant: the attempts that
// led to it are the process spans.
func (t *Telemetry) markDeadLetter(ss *subSets, dl *broker.DeadLetter) {
	creation := t.creationContext(context.Background(), propagation.MapCarrier(dl.Message.Headers))
	if !creation.IsValid() {
		return
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), creation)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithLinks(trace.Link{SpanContext: creation})}
	if t.linkOnly {
		opts = append(opts, newRoot)
	}
	if !dl.FailedAt.IsZero() {
		opts = append(opts, trace.WithTimestamp(dl.FailedAt))
	}
	_, span := t.tracer.Start(ctx, "dead_letter "+dl.Message.Topic, opts...)
	if span.IsRecording() {
		code := t.codes.bound(dl.ErrorCode)
		span.SetAttributes(append(ss.attrs(),
			semconv.MessagingMessageID(dl.Message.ID), AttemptKey.Int(dl.Attempts),
			ReasonKey.String(dl.Reason), DeadLetterIDKey.String(dl.ID), semconv.ErrorTypeKey.String(code))...)
		span.SetStatus(codes.Error, dl.Reason)
	}
	if !dl.FailedAt.IsZero() {
		span.End(trace.WithTimestamp(dl.FailedAt))
	} else {
		span.End()
	}
}

// markDuplicate puts an instant INTERNAL span "deduplicate <topic>" into
// the trace of a message the subscriber skipped as a duplicate (its
// handler did not run, so there is no process span): placed as
// markDeadLetter's, with inproc.broker.state=deduplicated. A message
// without trace context gets none.
func (t *Telemetry) markDuplicate(ss *subSets, ev *broker.AttemptEvent) {
	creation := t.creationContext(context.Background(), propagation.MapCarrier(ev.Headers))
	if !creation.IsValid() {
		return
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), creation)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithLinks(trace.Link{SpanContext: creation})}
	if t.linkOnly {
		opts = append(opts, newRoot)
	}
	_, span := t.tracer.Start(ctx, "deduplicate "+ss.topic, opts...)
	if span.IsRecording() {
		span.SetAttributes(append(ss.attrs(),
			semconv.MessagingMessageID(ev.MessageID), StateKey.String(string(broker.OutcomeDeduplicated)))...)
	}
	span.End()
}

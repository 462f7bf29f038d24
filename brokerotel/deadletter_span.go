package brokerotel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

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

// deadLetterEvent is the name of the event a dead letter adds to the span
// of the attempt that made it.
const deadLetterEvent = "dead_letter"

// maxParked bounds a subscriber's parked spans: one per failed attempt
// whose outcome has not been reported yet (at most its workers', when the
// broker is wired as usual). A failed attempt beyond it ends its span at
// once, without a marker.
const maxParked = 1024

// parkedSpans are the process spans of a subscriber's failed attempts
// whose outcome the broker has not reported yet. The broker decides what
// follows a failed attempt (a retry or a dead letter, and its ID) after
// the handler, and so the middleware, returned: the middleware parks the
// span (its end time fixed), and the subscriber's next event for the
// message ends it, adding a "dead_letter" event with the reason and the
// dead letter's ID when it is a dead letter. The broker reports every
// failed attempt's outcome, on the worker that ran it, before that worker
// runs anything else, and runs one copy of an ID at a time per subscriber,
// so the message ID names the span.
//
// A span is parked only where it will be ended:
//   - observed: t was asked ForSubscriber for this subscriber, so its
//     events come to t (the middleware alone never parks);
//   - not when the subscription's context was cancelled (a stop: the
//     broker may give up on the handler and report the dead letter before
//     it returns);
//   - at most maxParked at a time; a span parked again under the same ID
//     ends the previous one.
//
// What stays parked is bounded by maxParked: only a middleware on a broker
// without t's Observer, sharing topic and subscriber names with one that
// has it, can leave spans parked (never exported).
type parkedSpans struct {
	observed atomic.Bool
	n        atomic.Int32 // len(m): take skips the lock when 0
	mu       sync.Mutex
	m        map[string]parked // by message ID; guarded by mu
}

type parked struct {
	span    trace.Span
	end     time.Time
	attempt int // msg.Attempt: a dead letter of another copy of the ID does not match
}

// park keeps span, ended at end, for id's outcome; false if it must be
// ended now.
func (p *parkedSpans) park(ctx context.Context, id string, attempt int, span trace.Span, end time.Time) bool {
	if !p.observed.Load() || errors.Is(ctx.Err(), context.Canceled) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old, had := p.m[id]
	if !had && len(p.m) >= maxParked {
		return false
	}
	if p.m == nil {
		p.m = make(map[string]parked)
	}
	p.m[id] = parked{span: span, end: end, attempt: attempt}
	if had {
		old.span.End(trace.WithTimestamp(old.end))
	} else {
		p.n.Add(1)
	}
	return true
}

// take removes and returns id's parked span; with attempt > 0, only the
// span of that attempt.
func (p *parkedSpans) take(id string, attempt int) (parked, bool) {
	if p.n.Load() == 0 {
		return parked{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[id]
	if ok && attempt > 0 && v.attempt != attempt {
		return parked{}, false
	}
	if ok {
		delete(p.m, id)
		p.n.Add(-1)
	}
	return v, ok
}

// end ends id's parked span, if any, as it was.
func (p *parkedSpans) end(id string) {
	if v, ok := p.take(id, 0); ok {
		v.span.End(trace.WithTimestamp(v.end))
	}
}

// endDeadLettered ends the parked span of the attempt that made dl, if
// any, with a "dead_letter" event: the reason and the dead letter's ID.
func (p *parkedSpans) endDeadLettered(dl *broker.DeadLetter) {
	// A copy of the ID shed or cut off meanwhile is dead-lettered with its
	// own attempt count, which is not the parked attempt's.
	v, ok := p.take(dl.Message.ID, max(dl.Attempts, 1))
	if !ok {
		return
	}
	v.span.AddEvent(deadLetterEvent, trace.WithTimestamp(v.end),
		trace.WithAttributes(ReasonKey.String(dl.Reason), DeadLetterIDKey.String(dl.ID)))
	v.span.End(trace.WithTimestamp(v.end))
}

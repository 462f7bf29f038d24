package brokerotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/inproc/broker"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Publisher publishes a message: a *broker.Broker.
type Publisher interface {
	Publish(ctx context.Context, msg broker.Message) error
}

// publishSlot carries the publish span from PublishHook to Publish.
type publishSlot struct{ span trace.Span }

type publishSlotKey struct{}

// Publish publishes msg with b, as b.Publish(ctx, msg) does, and makes the
// publish span cover the whole call: the publish hook leaves its span open
// for Publish to end when b.Publish returns, with status Error,
// error.type ("queue_full", "canceled", "deadline_exceeded", "closed" or
// "_OTHER") and the error recorded when b refused the message. Without it
// (b.Publish called directly) the span ends in the hook, before the broker
// queues the message, and a refusal shows only in Publish's error and the
// metrics. b must have t's PublishHook; otherwise Publish is b.Publish.
func (t *Telemetry) Publish(ctx context.Context, b Publisher, msg broker.Message) (err error) {
	if b == nil {
		return fmt.Errorf("%w: nil Publisher", ErrInvalidArgument)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	slot := &publishSlot{}
	defer func() {
		if slot.span != nil {
			endPublish(slot.span, err)
		}
	}()
	return b.Publish(context.WithValue(ctx, publishSlotKey{}, slot), msg)
}

// endPublish ends a publish span with what Publish returned.
func endPublish(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		typ := rejectType(err)
		if typ == errorTypeOther && errors.Is(err, broker.ErrClosed) {
			typ = "closed"
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(typ))
		span.RecordError(err)
		span.SetStatus(codes.Error, typ)
	}
	span.End()
}

package brokerotel_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// delivery is what a test handler saw.
type delivery struct {
	msg  broker.Message
	span trace.SpanContext // the span in the handler's context
	ctx  context.Context
}

// capture returns a handler that reports each call on the returned channel.
func capture() (broker.Handler, chan delivery) {
	ch := make(chan delivery, 16)
	return func(ctx context.Context, msg broker.Message) error {
		ch <- delivery{msg: msg, span: trace.SpanContextFromContext(ctx), ctx: ctx}
		return nil
	}, ch
}

func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

func TestPublishWithinParentSpan(t *testing.T) {
	for _, linkOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("LinkOnly=%v", linkOnly), func(t *testing.T) {
			e := newEnv(t, brokerotel.Options{LinkOnly: linkOnly})
			b := e.broker(t)
			h, got := capture()
			_, err := b.Subscribe("orders", "billing", h)
			require.NoError(t, err)

			ctx, parent := e.tp.Tracer("test").Start(context.Background(), "request")
			require.NoError(t, b.Publish(ctx, broker.Message{ID: "m1", Topic: "orders", Payload: []byte("hello")}))
			parent.End()
			d := receive(t, got)
			closeBroker(t, b)

			producer := e.one(t, "publish orders")
			assert.Equal(t, trace.SpanKindProducer, producer.SpanKind())
			assert.Equal(t, parent.SpanContext().TraceID(), producer.SpanContext().TraceID(), "producer in the publisher's trace")
			assert.Equal(t, parent.SpanContext().SpanID(), producer.Parent().SpanID(), "producer is the publisher span's child")
			assert.Equal(t, map[string]any{
				"messaging.system":            "inproc.broker",
				"messaging.operation.name":    "publish",
				"messaging.operation.type":    "send",
				"messaging.destination.name":  "orders",
				"messaging.message.id":        "m1",
				"messaging.message.body.size": int64(5),
			}, attrs(producer.Attributes()))
			assert.Empty(t, producer.Links())
			assert.Equal(t, traceparent(producer.SpanContext()), d.msg.Headers["traceparent"], "headers carry the producer's context")

			consumer := e.one(t, "process orders")
			assert.Equal(t, trace.SpanKindConsumer, consumer.SpanKind())
			assert.Equal(t, map[string]any{
				"messaging.system":                        "inproc.broker",
				"messaging.operation.name":                "process",
				"messaging.operation.type":                "process",
				"messaging.destination.name":              "orders",
				"messaging.destination.subscription.name": "billing",
				"messaging.message.id":                    "m1",
				"messaging.message.body.size":             int64(5),
				"inproc.broker.attempt":                   int64(1),
			}, attrs(consumer.Attributes()))
			assert.Equal(t, codes.Unset, consumer.Status().Code)
			require.Len(t, consumer.Links(), 1, "the process span links to the creation context")
			assert.True(t, consumer.Links()[0].SpanContext.Equal(producer.SpanContext().WithRemote(true)))
			if linkOnly {
				assert.False(t, consumer.Parent().IsValid(), "LinkOnly: a new trace")
				assert.NotEqual(t, producer.SpanContext().TraceID(), consumer.SpanContext().TraceID())
			} else {
				assert.Equal(t, producer.SpanContext().TraceID(), consumer.SpanContext().TraceID(), "same trace")
				assert.Equal(t, producer.SpanContext().SpanID(), consumer.Parent().SpanID(), "child of the producer span")
				assert.True(t, consumer.Parent().IsRemote())
			}
			assert.Equal(t, consumer.SpanContext(), d.span, "the handler's context carries the process span")
		})
	}
}

func TestPublishWithoutSpanContext(t *testing.T) {
	t.Run("publisher without a span", func(t *testing.T) {
		e := newEnv(t, brokerotel.Options{})
		b := e.broker(t)
		h, got := capture()
		_, err := b.Subscribe("orders", "billing", h)
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
		d := receive(t, got)
		closeBroker(t, b)

		producer := e.one(t, "publish orders")
		assert.False(t, producer.Parent().IsValid(), "the producer span starts a trace")
		assert.True(t, producer.SpanContext().TraceID().IsValid())
		assert.Equal(t, traceparent(producer.SpanContext()), d.msg.Headers["traceparent"])
		consumer := e.one(t, "process orders")
		assert.Equal(t, producer.SpanContext().TraceID(), consumer.SpanContext().TraceID())
		assert.Equal(t, producer.SpanContext().SpanID(), consumer.Parent().SpanID())
	})
	t.Run("message without trace context", func(t *testing.T) {
		e := newEnv(t, brokerotel.Options{})
		b := newBroker(t, broker.WithMiddleware(e.tel.Middleware)) // no publish hook
		h, got := capture()
		_, err := b.Subscribe("orders", "billing", h)
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
		d := receive(t, got)
		closeBroker(t, b)

		assert.Empty(t, d.msg.Headers)
		assert.Empty(t, e.ended("publish orders"))
		consumer := e.one(t, "process orders")
		assert.False(t, consumer.Parent().IsValid(), "a new trace")
		assert.True(t, consumer.SpanContext().TraceID().IsValid())
		assert.Empty(t, consumer.Links())
		assert.Equal(t, consumer.SpanContext(), d.span)
	})
}

func TestExistingTraceContextIsKept(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t)
	h, got := capture()
	_, err := b.Subscribe("orders", "billing", h)
	require.NoError(t, err)

	_, origin := e.tp.Tracer("test").Start(context.Background(), "origin")
	origin.End()
	headers := map[string]string{"traceparent": traceparent(origin.SpanContext()), "tenant": "acme"}
	ctx, parent := e.tp.Tracer("test").Start(context.Background(), "forwarder")
	require.NoError(t, b.Publish(ctx, broker.Message{ID: "m1", Topic: "orders", Headers: headers}))
	parent.End()
	d := receive(t, got)
	closeBroker(t, b)

	assert.Equal(t, headers, d.msg.Headers, "the message's trace context is not overwritten")
	producer := e.one(t, "publish orders")
	assert.Equal(t, parent.SpanContext().SpanID(), producer.Parent().SpanID())
	require.Len(t, producer.Links(), 1)
	assert.Equal(t, origin.SpanContext().SpanID(), producer.Links()[0].SpanContext.SpanID(), "publish links to the message's context")
	consumer := e.one(t, "process orders")
	assert.Equal(t, origin.SpanContext().TraceID(), consumer.SpanContext().TraceID())
	assert.Equal(t, origin.SpanContext().SpanID(), consumer.Parent().SpanID(), "process continues the message's context")
}

func TestPropagatorCarriesBaggage(t *testing.T) {
	e := newEnv(t, brokerotel.Options{
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	})
	b := e.broker(t)
	h, got := capture()
	_, err := b.Subscribe("orders", "billing", h)
	require.NoError(t, err)

	member, err := baggage.NewMember("tenant", "acme")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	require.NoError(t, b.Publish(baggage.ContextWithBaggage(context.Background(), bag),
		broker.Message{ID: "m1", Topic: "orders"}))
	d := receive(t, got)
	closeBroker(t, b)

	assert.Equal(t, "tenant=acme", d.msg.Headers["baggage"])
	assert.Equal(t, "acme", baggage.FromContext(d.ctx).Member("tenant").Value())
	assert.Equal(t, e.one(t, "process orders").SpanContext(), d.span)
}

// nilErr's Error method panics on a nil receiver.
type nilErr struct{ text string }

func (e *nilErr) Error() string { return e.text }

func TestFailedAttempt(t *testing.T) {
	tests := []struct {
		name     string
		handler  broker.Handler
		opts     []broker.SubscribeOption
		wantCode string
		stack    bool // an exception.stacktrace is recorded
	}{
		{name: "error", handler: func(context.Context, broker.Message) error { return errors.New("boom") }, wantCode: "error"},
		{name: "permanent", handler: func(context.Context, broker.Message) error { return broker.Permanent(errors.New("bad input")) }, wantCode: "permanent"},
		{name: "own code", handler: func(context.Context, broker.Message) error { return codedErr("card_declined") }, wantCode: "card_declined"},
		{name: "throttled", handler: func(context.Context, broker.Message) error { return broker.RetryAfter(errors.New("slow down"), 0) }, wantCode: "throttled"},
		{name: "panic", handler: func(context.Context, broker.Message) error { panic("kaboom") }, wantCode: "panic", stack: true},
		{name: "typed nil", handler: func(context.Context, broker.Message) error { return (*nilErr)(nil) }, wantCode: "panic"},
		{
			name: "timeout",
			handler: func(ctx context.Context, _ broker.Message) error {
				<-ctx.Done()
				return ctx.Err()
			},
			opts:     []broker.SubscribeOption{broker.HandlerTimeout(time.Millisecond)},
			wantCode: "timeout",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, brokerotel.Options{})
			b := e.broker(t, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries})) // no retries
			_, err := b.Subscribe("orders", "billing", tt.handler, tt.opts...)
			require.NoError(t, err)
			require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
			closeBroker(t, b) // drains: the attempt has ended

			dls, err := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
			require.NoError(t, err)
			require.Len(t, dls, 1)
			require.Equal(t, tt.wantCode, dls[0].ErrorCode, "the broker's code")

			consumer := e.one(t, "process orders")
			assert.Equal(t, codes.Error, consumer.Status().Code)
			assert.Equal(t, tt.wantCode, consumer.Status().Description)
			assert.Equal(t, tt.wantCode, attrs(consumer.Attributes())["error.type"], "error.type is the broker's code")
			require.Len(t, consumer.Events(), 2, "the exception, then the dead letter's mark")
			assert.Equal(t, "dead_letter", consumer.Events()[1].Name)
			ev := consumer.Events()[0]
			assert.Equal(t, "exception", ev.Name)
			evAttrs := attrs(ev.Attributes)
			assert.NotEmpty(t, evAttrs["exception.message"])
			_, hasStack := evAttrs["exception.stacktrace"]
			assert.Equal(t, tt.stack, hasStack)
			assert.Zero(t, b.Stats().PluginPanics, "the middleware itself never panics")
		})
	}
}

func TestRetriesGetOneSpanPerAttempt(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(0)}))
	_, err := b.Subscribe("orders", "billing", func(_ context.Context, msg broker.Message) error {
		if msg.Attempt < 3 {
			return fmt.Errorf("attempt %d failed", msg.Attempt)
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	closeBroker(t, b)
	require.EqualValues(t, 1, b.Stats().Topics["orders"].Subscribers["billing"].Delivered)

	producer := e.one(t, "publish orders")
	spans := e.ended("process orders")
	require.Len(t, spans, 3, "one process span per attempt")
	for i, s := range spans {
		a := attrs(s.Attributes())
		assert.Equal(t, int64(i+1), a["inproc.broker.attempt"])
		assert.Equal(t, producer.SpanContext().SpanID(), s.Parent().SpanID(), "every attempt continues the producer's trace")
		if i < 2 {
			assert.Equal(t, codes.Error, s.Status().Code)
			assert.Equal(t, "error", a["error.type"])
		} else {
			assert.Equal(t, codes.Unset, s.Status().Code)
			assert.NotContains(t, a, "error.type")
		}
	}
}

func TestPanickingInnerMiddleware(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	inner := func(broker.SubscriberInfo, broker.Handler) broker.Handler {
		return func(context.Context, broker.Message) error { panic("middleware bug") }
	}
	b := e.broker(t, broker.WithMiddleware(inner), broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	_, err := b.Subscribe("orders", "billing", func(context.Context, broker.Message) error { return nil })
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	closeBroker(t, b)

	assert.EqualValues(t, 1, b.Stats().PluginPanics, "the panic went on to the broker")
	consumer := e.one(t, "process orders")
	assert.Equal(t, codes.Error, consumer.Status().Code)
	assert.Equal(t, "panic", attrs(consumer.Attributes())["error.type"])
}

// TestHandlerGoexit: a handler that calls runtime.Goexit (as t.FailNow
// does) never returns to the middleware; its span is still ended, as a
// panic, and its duration recorded.
func TestHandlerGoexit(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	b := e.broker(t, broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: broker.NoRetries}))
	_, err := b.Subscribe("orders", "billing", func(context.Context, broker.Message) error {
		runtime.Goexit()
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	closeBroker(t, b)

	dls, err := b.DeadLetters().List(context.Background(), broker.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "panic", dls[0].ErrorCode, "the broker's code")
	consumer := e.one(t, "process orders")
	assert.Equal(t, codes.Error, consumer.Status().Code)
	assert.Equal(t, "panic", attrs(consumer.Attributes())["error.type"])
	base := []attribute.KeyValue{system, opProcess, typeProcess, dest("orders"), subscription("billing"), errorType("panic")}
	assert.Equal(t, 1.0, value(t, e.collect(t), "messaging.process.duration", base...), "the attempt's duration is recorded")
}

func TestZeroOptionsUseGlobals(t *testing.T) {
	tel, err := brokerotel.New(brokerotel.Options{}) // no-op global providers
	require.NoError(t, err)
	b := newBroker(t, tel.Options()...)
	h, got := capture()
	_, err = b.Subscribe("orders", "billing", h)
	require.NoError(t, err)
	require.NoError(t, b.Publish(context.Background(), broker.Message{ID: "m1", Topic: "orders"}))
	d := receive(t, got)
	assert.NotContains(t, d.msg.Headers, "traceparent", "a no-op provider has no context to inject")
	reg, err := tel.ObserveStats(b)
	require.NoError(t, err)
	require.NoError(t, reg.Unregister())
	_, err = tel.ObserveStats(nil)
	require.ErrorIs(t, err, brokerotel.ErrInvalidArgument)
}

func TestMiddlewareOfNilHandler(t *testing.T) {
	e := newEnv(t, brokerotel.Options{})
	assert.Nil(t, e.tel.Middleware(broker.SubscriberInfo{Topic: "orders", Name: "billing"}, nil))
}

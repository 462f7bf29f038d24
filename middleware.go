package broker

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// This file is what users wrap around the broker's edges: handler
// middleware (around every attempt) and publish hooks (in Publish, before
// the message is queued). Both are plugged-in code and are guarded like the
// rest (plugins.go).

// Middleware wraps a subscriber's handler, for tracing, auth, logging or
// metrics. It is called once per subscriber, at Subscribe, with the
// subscriber's identity, and returns the handler the broker calls for each
// attempt. The returned handler sees the message (Attempt set, its own copy
// of Headers) and the attempt's outcome: the error next returned, a panic
// of next as a *PanicError (use ErrorCodeOf for the code the broker will
// file it under). What it returns is the attempt's outcome.
//
// A Middleware is plugged-in code: a panic in it is recovered, counted in
// Stats.PluginPanics and fails that attempt with code "panic", like a
// handler's.
type Middleware func(sub SubscriberInfo, next Handler) Handler

// SubscriberInfo names the subscriber a Middleware wraps.
type SubscriberInfo struct {
	Topic, Name string
}

// WithMiddleware wraps every subscriber's handler in mw, in the order
// given: the first is outermost. A subscriber's own middleware
// (HandlerMiddleware) runs inside the broker's. nil entries are
// refused.
func WithMiddleware(mw ...Middleware) Option {
	return func(c *config) error { return appendAll(&c.middleware, "middleware", mw) }
}

// WithSubscriberMiddleware wraps this subscriber's handler in mw, in the
// order given (the first is outermost), inside the broker's middleware.
// nil entries are refused.
//
// Deprecated: use HandlerMiddleware, the same option named like the other
// SubscribeOptions.
func WithSubscriberMiddleware(mw ...Middleware) SubscribeOption {
	return func(c *subConfig) error { return appendAll(&c.middleware, "middleware", mw) }
}

// appendAll appends fs to *to, or refuses a nil entry, named what and its
// index.
func appendAll[F any](to *[]F, what string, fs []F) error {
	for i, f := range fs {
		if isNilValue(f) {
			return fmt.Errorf("%w: %s %d is nil", ErrInvalidOption, what, i)
		}
	}
	*to = append(*to, fs...)
	return nil
}

// chain builds the handler the pipeline calls: outer... around h. With
// middleware, h runs inside a recover of its own, so that the middleware
// sees a handler panic as a *PanicError, and a panic that reaches the
// pipeline's recover came from middleware (counted as a plug-in panic).
// Without middleware h is returned as it is.
func chain(g guard, sub SubscriberInfo, h Handler, outer ...[]Middleware) (Handler, error) {
	mws := slices.Concat(outer...)
	if len(mws) == 0 {
		return h, nil
	}
	wrapped := Handler(func(ctx context.Context, msg Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = newPanicError(v)
			}
		}()
		return h(ctx, msg)
	})
	for _, m := range slices.Backward(mws) {
		// A panic or a nil handler is an error for Subscribe.
		next, err := guarded(g, "Middleware", "build", func() (Handler, error) { return m(sub, wrapped), nil })
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		if next == nil {
			return nil, fmt.Errorf("%w: a middleware returned a nil handler", ErrInvalidOption)
		}
		wrapped = next
	}
	return func(ctx context.Context, msg Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				g.recovered("Middleware", "handler", v)
				err = newPanicError(v)
			}
		}()
		return wrapped(ctx, msg)
	}, nil
}

// ErrorCodeOf returns the code the broker files err under when a handler
// returns it ("" for nil): "panic" for a *PanicError, the code of
// Permanent and RetryAfter errors, an ErrorCoder's own code, else "error".
// It cannot know about "timeout", which depends on the subscriber's
// HandlerTimeout when the handler returned.
func ErrorCodeOf(err error) string {
	if err == nil {
		return ""
	}
	_, f := vetError(err, false)
	return f.code
}

// PublishHook runs in Publish for every valid message, before it is
// queued, with the publisher's ctx: it may add Headers (trace context from
// ctx, a tenant, an auth token) or refuse the message by returning an error,
// which Publish returns wrapped. msg.Headers is the message's own copy,
// never nil, so the hook may write to it; the caller's map is not changed.
// Hooks must be safe for concurrent use and should be quick: they run on
// the publisher's goroutine.
//
// A hook that panics is recovered and counted in Stats.PluginPanics; the
// message is published anyway (a decoration is not worth losing a message
// over), as the hooks before it left it: each hook works on a copy, so
// nothing the panicking hook changed is kept (its writes to Headers
// included; only bytes written into the caller's Payload cannot be
// undone). A hook that changes ID or Topic to invalid values gets
// ErrInvalidMessage from Publish.
type PublishHook func(ctx context.Context, msg *Message) error

// WithPublishHook adds hooks that Publish runs, in the order given, before
// it queues a message. nil entries are refused.
func WithPublishHook(hooks ...PublishHook) Option {
	return func(c *config) error { return appendAll(&c.publishHooks, "publish hook", hooks) }
}

// hooked returns msg as the publish hooks leave it, on Headers of its own
// (never the caller's map), or the first hook error, wrapped. It takes and
// returns the message by value: Publish handing &msg to a call made every
// Publish 27% slower (W1, alternating runs), hooks or not.
func (b *Broker) hooked(ctx context.Context, msg Message) (Message, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	kept := false
	for i, hook := range b.cfg.publishHooks {
		// Each hook decorates a copy, kept only if the hook returns: a
		// panic leaves the message as the hooks before it left it.
		c := msg
		c.Headers = make(map[string]string, len(msg.Headers)+2)
		maps.Copy(c.Headers, msg.Headers)
		// A hook that panics is left out: the message is published
		// anyway, without what the hook did to it.
		err, panicErr := guarded(b.guard, "PublishHook", "call", func() (error, error) { return hook(ctx, &c), nil })
		if panicErr != nil {
			continue
		}
		msg, kept = c, true
		if err != nil {
			return msg, fmt.Errorf("broker: publish %q to %q: hook %d: %w", msg.ID, msg.Topic, i, err)
		}
	}
	if !kept { // every hook panicked: Headers is still the caller's map
		msg.Headers = maps.Clone(msg.Headers)
	}
	if len(msg.Headers) == 0 {
		msg.Headers = nil
	}
	return msg, msg.validate()
}

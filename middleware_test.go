package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tracer is a middleware that records, in order, where each layer ran.
type tracer struct {
	mu  sync.Mutex
	log []string
}

func (tr *tracer) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.log = append(tr.log, s)
}

func (tr *tracer) lines() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.log...)
}

func (tr *tracer) layer(name string) Middleware {
	return func(sub SubscriberInfo, next Handler) Handler {
		tr.add(fmt.Sprintf("build %s for %s/%s", name, sub.Topic, sub.Name))
		return func(ctx context.Context, msg Message) error {
			tr.add(fmt.Sprintf("%s> %s#%d", name, msg.ID, msg.Attempt))
			err := next(ctx, msg)
			tr.add(fmt.Sprintf("<%s %s code=%q", name, msg.ID, ErrorCodeOf(err)))
			return err
		}
	}
}

func TestMiddlewareOrderAndOutcome(t *testing.T) {
	bubble(t, func(t *testing.T) {
		tr := &tracer{}
		b := newTestBroker(t, WithMiddleware(tr.layer("A"), tr.layer("B")))
		fails := 1
		_, err := b.Subscribe("t", "s", func(ctx context.Context, msg Message) error {
			tr.add("handler " + msg.ID)
			if fails > 0 {
				fails--
				return codedError{"flaky"}
			}
			return nil
		}, WithSubscriberMiddleware(tr.layer("C")))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		settle(t, b)

		assert.Equal(t, []string{
			"build C for t/s", "build B for t/s", "build A for t/s", // inner first, once
			"A> m#1", "B> m#1", "C> m#1", "handler m", `<C m code="flaky"`, `<B m code="flaky"`, `<A m code="flaky"`,
			"A> m#2", "B> m#2", "C> m#2", "handler m", `<C m code=""`, `<B m code=""`, `<A m code=""`,
		}, tr.lines())
		st := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(1), st.Delivered)
		assert.Equal(t, uint64(1), st.Retries)
	})
}

func TestMiddlewareSeesHandlerPanicAsPanicError(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var seen error
		mw := func(_ SubscriberInfo, next Handler) Handler {
			return func(ctx context.Context, msg Message) error {
				seen = next(ctx, msg)
				return seen
			}
		}
		b := newTestBroker(t, WithMiddleware(mw))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { panic("boom") })
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		settle(t, b)

		pe, ok := errors.AsType[*PanicError](seen)
		require.True(t, ok, "middleware saw %v", seen)
		assert.Equal(t, "boom", pe.Value)
		assert.Equal(t, CodePanic, ErrorCodeOf(seen))
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, CodePanic, dls[0].ErrorCode)
		assert.Zero(t, b.Stats().PluginPanics, "a handler's panic is not a plug-in's")
	})
}

func TestMiddlewareCanRefuse(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := &calls{}
		auth := func(_ SubscriberInfo, next Handler) Handler {
			return func(ctx context.Context, msg Message) error {
				if msg.Headers["token"] != "ok" {
					return Permanent(errors.New("unauthorized"))
				}
				return next(ctx, msg)
			}
		}
		b := newTestBroker(t)
		_, err := b.Subscribe("t", "s", okHandler(c), WithSubscriberMiddleware(auth))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "good", Topic: "t", Headers: map[string]string{"token": "ok"}}))
		settle(t, b)

		assert.Equal(t, []string{"good"}, c.ids())
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		assert.Equal(t, "bad", dls[0].Message.ID)
		assert.Equal(t, ReasonPermanent, dls[0].Reason)
	})
}

func TestMiddlewarePanicIsGuarded(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := &calls{}
		bad := func(_ SubscriberInfo, next Handler) Handler {
			return func(ctx context.Context, msg Message) error {
				if msg.ID == "x" {
					panic("middleware bug")
				}
				return next(ctx, msg)
			}
		}
		b := newTestBroker(t, WithMiddleware(bad))
		_, err := b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "t"}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "y", Topic: "t"}))
		settle(t, b)

		assert.Equal(t, []string{"y"}, c.ids())
		dls := deadLetters(t, b)
		require.Len(t, dls, 1, "the message ends in exactly one state")
		assert.Equal(t, CodePanic, dls[0].ErrorCode)
		st := b.Stats()
		assert.Equal(t, uint64(3), st.PluginPanics, "retried like a handler's panic: once per attempt (MaxRetries 2)")
		requireConserved(t, st)
	})
}

func TestMiddlewareRefusedAtSubscribe(t *testing.T) {
	ok := func(_ SubscriberInfo, next Handler) Handler { return next }
	tests := []struct {
		name   string
		broker []Middleware
		sub    []Middleware
	}{
		{"nil broker middleware", []Middleware{ok, nil}, nil},
		{"nil subscriber middleware", nil, []Middleware{nil}},
		{"returns a nil handler", nil, []Middleware{func(SubscriberInfo, Handler) Handler { return nil }}},
		{"panics when built", nil, []Middleware{func(SubscriberInfo, Handler) Handler { panic("no") }}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(WithLogger(discard), WithMiddleware(tt.broker...))
			if err != nil {
				require.ErrorIs(t, err, ErrInvalidOption)
				return
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			_, err = b.Subscribe("t", "s", okHandler(&calls{}), WithSubscriberMiddleware(tt.sub...))
			require.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), `subscribe "s" to "t"`)
		})
	}
}

type traceKey struct{}

func TestPublishHookAddsHeadersFromContext(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := &calls{}
		hook := func(ctx context.Context, msg *Message) error {
			if id, ok := ctx.Value(traceKey{}).(string); ok {
				msg.Headers["traceparent"] = id
			}
			return nil
		}
		b := newTestBroker(t, WithPublishHook(hook))
		_, err := b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err)

		mine := map[string]string{"a": "1"}
		ctx := context.WithValue(context.Background(), traceKey{}, "00-abc-01")
		require.NoError(t, b.Publish(ctx, Message{ID: "m1", Topic: "t", Headers: mine}))
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m2", Topic: "t"}))
		settle(t, b)

		assert.Equal(t, map[string]string{"a": "1"}, mine, "the caller's map is not changed")
		got := c.all()
		require.Len(t, got, 2)
		assert.Equal(t, map[string]string{"a": "1", "traceparent": "00-abc-01"}, got[0].Headers)
		assert.Empty(t, got[1].Headers, "a hook that adds nothing leaves no headers (the handler gets its own empty map)")
	})
}

func TestPublishHookOutcomes(t *testing.T) {
	refuse := errors.New("tenant missing")
	tests := []struct {
		name       string
		hook       PublishHook
		wantErr    error // nil: published
		wantPanics uint64
	}{
		{"error refuses", func(context.Context, *Message) error { return refuse }, refuse, 0},
		{"panic publishes anyway", func(context.Context, *Message) error { panic("hook bug") }, nil, 1},
		{"clearing the ID is invalid", func(_ context.Context, m *Message) error { m.ID = ""; return nil }, ErrInvalidMessage, 0},
		{"dropping the map is fine", func(_ context.Context, m *Message) error { m.Headers = nil; return nil }, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				c := &calls{}
				second := func(_ context.Context, m *Message) error { m.Headers["second"] = "ran"; return nil }
				b := newTestBroker(t, WithPublishHook(tt.hook, second))
				_, err := b.Subscribe("t", "s", okHandler(c))
				require.NoError(t, err)
				err = b.Publish(context.Background(), Message{ID: "m", Topic: "t"})
				settle(t, b)
				st := b.Stats()
				assert.Equal(t, tt.wantPanics, st.PluginPanics)
				if tt.wantErr != nil {
					require.ErrorIs(t, err, tt.wantErr)
					assert.Zero(t, c.len(), "a refused message is not queued")
					assert.Zero(t, st.Topics["t"].Published)
					return
				}
				require.NoError(t, err)
				require.Equal(t, 1, c.len())
				assert.Equal(t, "ran", c.all()[0].Headers["second"], "later hooks still run")
			})
		})
	}
}

// A hook that panics is skipped as a whole: the message goes on as the
// hooks before it left it, without the half-made decoration (before, its
// Headers and Key changes were published).
func TestPanickingPublishHookLeavesNoDecoration(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := &calls{}
		first := func(_ context.Context, m *Message) error { m.Headers["first"] = "ran"; return nil }
		partial := func(_ context.Context, m *Message) error {
			m.Headers["tenant"] = "acme"
			m.Headers["first"] = "overwritten"
			m.Key = "acme"
			m.Payload = []byte("changed")
			panic("hook bug")
		}
		replaced := func(_ context.Context, m *Message) error {
			m.Headers = map[string]string{"only": "this"}
			m.Topic = "elsewhere"
			panic("hook bug")
		}
		last := func(_ context.Context, m *Message) error { m.Headers["last"] = "ran"; return nil }
		b := newTestBroker(t, WithPublishHook(first, partial, replaced, last))
		_, err := b.Subscribe("t", "s", okHandler(c))
		require.NoError(t, err)
		mine := map[string]string{"a": "1"}
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Headers: mine, Payload: []byte("p")}))
		require.NoError(t, b.PublishBatch(context.Background(), []Message{{ID: "n", Topic: "t", Headers: mine, Payload: []byte("p")}}))
		settle(t, b)
		assert.Equal(t, map[string]string{"a": "1"}, mine, "the caller's map is not changed")
		require.Equal(t, 2, c.len())
		for _, got := range c.all() {
			assert.Equal(t, map[string]string{"a": "1", "first": "ran", "last": "ran"}, got.Headers, got.ID)
			assert.Empty(t, got.Key, got.ID)
			assert.Equal(t, "t", got.Topic, got.ID)
			assert.Equal(t, "p", string(got.Payload), got.ID)
		}
		assert.Equal(t, uint64(4), b.Stats().PluginPanics)
	})
}

func TestPublishHookRefusedWhenNil(t *testing.T) {
	_, err := New(WithPublishHook(nil))
	require.ErrorIs(t, err, ErrInvalidOption)
}

func TestErrorCodeOf(t *testing.T) {
	var typedNil *PanicError
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("x"), CodeError},
		{Permanent(errors.New("x")), CodePermanent},
		{Permanent(codedError{"bad_input"}), "bad_input"},
		{RetryAfter(errors.New("x"), 0), CodeThrottled},
		{fmt.Errorf("wrapped: %w", codedError{"db"}), "db"},
		{newPanicError("p"), CodePanic},
		{typedNil, CodePanic},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, ErrorCodeOf(tt.err), "%v", tt.err)
	}
}

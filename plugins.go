package broker

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// This file guards everything a user plugs in — stores, observers,
// backoffs: a panic there is recovered, logged at Error level and counted
// (Stats.PluginPanics), and never crashes the process or loses a message.
// A store that panics is treated as that store returning an error; an
// observer hook that panics loses that event; a backoff that panics gives
// the default backoff's delay. runtime.Goexit is guarded where the handler
// runs (middleware included) and in a subscriber's shedder, which puts back
// the shed messages it had not stored and starts another; elsewhere a
// store, observer or backoff calling it ends the broker's goroutine that
// called it, as it would any caller's.

// guard recovers and reports panics of plugged-in code.
type guard struct {
	panics *atomic.Uint64
	log    *slog.Logger
}

// recovered is deferred around a call of plugged-in code: it recovers a
// panic, logs and counts it, and returns it as an error (nil if none).
func (g guard) recovered(plugin, method string, v any) error {
	if v == nil {
		return nil
	}
	g.panics.Add(1)
	err := fmt.Errorf("broker: %s.%s panicked: %v", plugin, method, v)
	g.log.LogAttrs(context.Background(), slog.LevelError, "broker: plugged-in code panicked",
		slog.String("plugin", plugin), slog.String("method", method),
		slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
	return err
}

// guarded runs f, a call of plugged-in code's method: a panic there is
// its error (logged and counted), with a zero v. It is the one guard of
// every plugged-in call; f does not escape, so it costs no allocation.
func guarded[T any](g guard, plugin, method string, f func() (T, error)) (v T, err error) {
	defer func() {
		if e := g.recovered(plugin, method, recover()); e != nil {
			err = e
		}
	}()
	return f()
}

// call is guarded for a method that returns only an error.
func (g guard) call(plugin, method string, f func() error) error {
	_, err := guarded(g, plugin, method, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// do is guarded for a method that returns nothing (an Observer's hook:
// its panic loses that event).
func (g guard) do(plugin, method string, f func()) {
	_ = g.call(plugin, method, func() error { f(); return nil })
}

// guardedLogHandler is the user's slog.Handler with its panics recovered
// and counted; they are not logged, the logger being what failed.
type guardedLogHandler struct {
	h      slog.Handler
	panics *atomic.Uint64
}

func (g guardedLogHandler) Enabled(ctx context.Context, l slog.Level) (ok bool) {
	defer func() {
		if recover() != nil {
			g.panics.Add(1)
			ok = false
		}
	}()
	return g.h.Enabled(ctx, l)
}

func (g guardedLogHandler) Handle(ctx context.Context, r slog.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			g.panics.Add(1)
			err = fmt.Errorf("broker: slog.Handler.Handle panicked: %v", v)
		}
	}()
	return g.h.Handle(ctx, r)
}

func (g guardedLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return g.derive(func() slog.Handler { return g.h.WithAttrs(attrs) })
}

func (g guardedLogHandler) WithGroup(name string) slog.Handler {
	return g.derive(func() slog.Handler { return g.h.WithGroup(name) })
}

// derive guards the handler made by with; if with panics, g stays.
func (g guardedLogHandler) derive(with func() slog.Handler) (h slog.Handler) {
	defer func() {
		if recover() != nil {
			g.panics.Add(1)
			h = g
		}
	}()
	return guardedLogHandler{h: with(), panics: g.panics}
}

// isNilValue reports whether v is a typed nil (a nil pointer, map, slice,
// func or channel in a non-nil interface), whose methods would panic.
func isNilValue(v any) bool {
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// guardedDLQ is a DeadLetterStore whose panics are errors.
type guardedDLQ struct {
	s DeadLetterStore
	g guard
}

func (d guardedDLQ) Put(ctx context.Context, dl DeadLetter) error {
	return d.g.call("DeadLetterStore", "Put", func() error { return d.s.Put(ctx, dl) })
}

// evicted is the store's Evicted() count, if it has one (0 if it panics).
func (d guardedDLQ) evicted() uint64 {
	e, ok := d.s.(interface{ Evicted() uint64 })
	if !ok {
		return 0
	}
	n, _ := guarded(d.g, "DeadLetterStore", "Evicted", func() (uint64, error) { return e.Evicted(), nil })
	return n
}

func (d guardedDLQ) List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	return guarded(d.g, "DeadLetterStore", "List", func() ([]DeadLetter, error) { return d.s.List(ctx, f) })
}

func (d guardedDLQ) Get(ctx context.Context, id string) (dl DeadLetter, ok bool, err error) {
	_, err = guarded(d.g, "DeadLetterStore", "Get", func() (_ struct{}, err error) {
		dl, ok, err = d.s.Get(ctx, id)
		return
	})
	return dl, ok, err
}

func (d guardedDLQ) Delete(ctx context.Context, ids ...string) error {
	return d.g.call("DeadLetterStore", "Delete", func() error { return d.s.Delete(ctx, ids...) })
}

func (d guardedDLQ) Len(ctx context.Context) (int, error) {
	return guarded(d.g, "DeadLetterStore", "Len", func() (int, error) { return d.s.Len(ctx) })
}

// guardedDedup is an IdempotencyStore whose panics are errors.
type guardedDedup struct {
	s IdempotencyStore
	g guard
}

func (d guardedDedup) Seen(ctx context.Context, k DeliveryKey) (bool, error) {
	return guarded(d.g, "IdempotencyStore", "Seen", func() (bool, error) { return d.s.Seen(ctx, k) })
}

func (d guardedDedup) Record(ctx context.Context, k DeliveryKey) error {
	return d.g.call("IdempotencyStore", "Record", func() error { return d.s.Record(ctx, k) })
}

// guardedObserver is an Observer whose hooks' panics lose only that event.
type guardedObserver struct {
	o Observer
	g guard
}

func (o guardedObserver) Published(e PublishEvent) {
	o.g.do("Observer", "Published", func() { o.o.Published(e) })
}

func (o guardedObserver) Rejected(e RejectEvent) {
	o.g.do("Observer", "Rejected", func() { o.o.Rejected(e) })
}

func (o guardedObserver) Unrouted(e UnroutedEvent) {
	o.g.do("Observer", "Unrouted", func() { o.o.Unrouted(e) })
}

func (o guardedObserver) Attempted(e AttemptEvent) {
	o.g.do("Observer", "Attempted", func() { o.o.Attempted(e) })
}

func (o guardedObserver) DeadLettered(e DeadLetterEvent) {
	o.g.do("Observer", "DeadLettered", func() { o.o.DeadLettered(e) })
}

func (o guardedObserver) BreakerChanged(e BreakerEvent) {
	if bo, ok := o.o.(BreakerObserver); ok {
		o.g.do("Observer", "BreakerChanged", func() { bo.BreakerChanged(e) })
	}
}

// forSubscriber is o for the events of one subscriber: what o's
// ForSubscriber returns when o is a SubscriberObserver, else o.
func (o guardedObserver) forSubscriber(topic, name string) (scoped guardedObserver) {
	so, ok := o.o.(SubscriberObserver)
	if !ok {
		return o
	}
	scoped = o // also after a panic
	o.g.do("Observer", "ForSubscriber", func() {
		if s := so.ForSubscriber(topic, name); s != nil && !isNilValue(s) {
			scoped.o = s
		}
	})
	return scoped
}

// observerFor is the Observer of subscriber name's events (see
// SubscriberObserver); nil when the broker has none.
func (b *Broker) observerFor(topic, name string) Observer {
	switch o := b.obs.(type) {
	case guardedObserver:
		return o.forSubscriber(topic, name)
	case observers:
		m := make(observers, len(o))
		for i := range o {
			m[i] = o[i].forSubscriber(topic, name)
		}
		return m
	}
	return b.obs
}

// observers fans events out to several guarded observers, in order.
type observers []guardedObserver

func (m observers) Published(e PublishEvent) {
	for _, o := range m {
		o.Published(e)
	}
}

func (m observers) Rejected(e RejectEvent) {
	for _, o := range m {
		o.Rejected(e)
	}
}

func (m observers) Unrouted(e UnroutedEvent) {
	for _, o := range m {
		o.Unrouted(e)
	}
}

func (m observers) Attempted(e AttemptEvent) {
	for _, o := range m {
		o.Attempted(e)
	}
}

func (m observers) DeadLettered(e DeadLetterEvent) {
	for _, o := range m {
		o.DeadLettered(e)
	}
}

func (m observers) BreakerChanged(e BreakerEvent) {
	for _, o := range m {
		o.BreakerChanged(e)
	}
}

// safeBackoff returns backoff(retry), or the default backoff's delay if it
// panics.
func (g guard) safeBackoff(backoff Backoff, retry int) time.Duration {
	d, err := guarded(g, "Backoff", "call", func() (time.Duration, error) { return backoff(retry), nil })
	if err != nil {
		d = exponential(DefaultBackoffBase, DefaultBackoffMax, retry)
	}
	return d
}

// timesPublish is pt.TimesPublish(), false if it panics (logged and
// counted).
func (g guard) timesPublish(pt PublishTimer) bool {
	yes, _ := guarded(g, "Observer", "TimesPublish", func() (bool, error) { return pt.TimesPublish(), nil })
	return yes
}

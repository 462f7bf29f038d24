package broker

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"slices"
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
	if g.log != nil { // nil: the logger's own guard (guardedLogHandler)
		g.log.LogAttrs(context.Background(), slog.LevelError, "broker: plugged-in code panicked",
			slog.String("plugin", plugin), slog.String("method", method),
			slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
	}
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
// its panic loses that event), written out: it runs on every event.
func (g guard) do(plugin, method string, f func()) {
	defer func() { g.recovered(plugin, method, recover()) }()
	f()
}

// guardedLogHandler is the user's slog.Handler with its panics recovered
// and counted; they are not logged, the logger being what failed. A
// panicking Enabled says false, Handle returns the panic as its error.
type guardedLogHandler struct {
	h      slog.Handler
	panics *atomic.Uint64
}

// guard counts the handler's panics and logs none.
func (g guardedLogHandler) guard() guard { return guard{panics: g.panics} }

// Enabled runs at every delivery (for its Debug line): its recover is
// written out, as guarded's closure would cost a call more.
func (g guardedLogHandler) Enabled(ctx context.Context, l slog.Level) (ok bool) {
	defer func() {
		if recover() != nil {
			g.panics.Add(1)
			ok = false
		}
	}()
	return g.h.Enabled(ctx, l)
}

func (g guardedLogHandler) Handle(ctx context.Context, r slog.Record) error {
	return g.guard().call("slog.Handler", "Handle", func() error { return g.h.Handle(ctx, r) })
}

func (g guardedLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return g.derive("WithAttrs", func() slog.Handler { return g.h.WithAttrs(attrs) })
}

func (g guardedLogHandler) WithGroup(name string) slog.Handler {
	return g.derive("WithGroup", func() slog.Handler { return g.h.WithGroup(name) })
}

// derive guards the handler made by with; if with panics, g stays.
func (g guardedLogHandler) derive(method string, with func() slog.Handler) slog.Handler {
	h, err := guarded(g.guard(), "slog.Handler", method, func() (slog.Handler, error) { return with(), nil })
	if err != nil {
		return g
	}
	return guardedLogHandler{h: h, panics: g.panics}
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
	err = d.g.call("DeadLetterStore", "Get", func() (err error) {
		dl, ok, err = d.s.Get(ctx, id)
		return err
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

// observers are the broker's Observers (one or more), each guarded on its
// own: every event goes to each in order, and a hook's panic loses that
// event for that observer only.
type observers struct {
	list []Observer
	g    guard
}

func (m observers) Published(e PublishEvent) {
	m.each("Published", func(o Observer) { o.Published(e) })
}
func (m observers) Rejected(e RejectEvent) {
	m.each("Rejected", func(o Observer) { o.Rejected(e) })
}
func (m observers) Unrouted(e UnroutedEvent) {
	m.each("Unrouted", func(o Observer) { o.Unrouted(e) })
}
func (m observers) Attempted(e AttemptEvent) {
	m.each("Attempted", func(o Observer) { o.Attempted(e) })
}
func (m observers) DeadLettered(e DeadLetterEvent) {
	m.each("DeadLettered", func(o Observer) { o.DeadLettered(e) })
}

// each calls hook for every observer, in order, each guarded on its own.
func (m observers) each(method string, hook func(Observer)) {
	for _, o := range m.list {
		m.g.do("Observer", method, func() { hook(o) })
	}
}

func (m observers) BreakerChanged(e BreakerEvent) {
	for _, o := range m.list {
		if bo, ok := o.(BreakerObserver); ok {
			m.g.do("Observer", "BreakerChanged", func() { bo.BreakerChanged(e) })
		}
	}
}

// forSubscriber is m for the events of one subscriber: each observer is
// what its ForSubscriber returns when it is a SubscriberObserver (itself
// if that panics or returns nil), else itself.
func (m observers) forSubscriber(topic, name string) observers {
	scoped := observers{list: slices.Clone(m.list), g: m.g}
	for i, o := range m.list {
		if so, ok := o.(SubscriberObserver); ok {
			m.g.do("Observer", "ForSubscriber", func() {
				if s := so.ForSubscriber(topic, name); s != nil && !isNilValue(s) {
					scoped.list[i] = s
				}
			})
		}
	}
	return scoped
}

// observerFor is the Observer of subscriber name's events (see
// SubscriberObserver); nil when the broker has none.
func (b *Broker) observerFor(topic, name string) Observer {
	if obs, ok := b.obs.(observers); ok {
		return obs.forSubscriber(topic, name)
	}
	return b.obs
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

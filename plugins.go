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

// call runs f, plugged-in code's method, its panic being its error
// (logged and counted).
func (g guard) call(plugin, method string, f func() error) (err error) {
	defer func() {
		if e := g.recovered(plugin, method, recover()); e != nil {
			err = e
		}
	}()
	return f()
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

func (d guardedDLQ) Put(ctx context.Context, dl DeadLetter) (err error) {
	defer func() {
		if e := d.g.recovered("DeadLetterStore", "Put", recover()); e != nil {
			err = e
		}
	}()
	return d.s.Put(ctx, dl)
}

// evicted is the store's Evicted() count, if it has one (0 if it panics).
func (d guardedDLQ) evicted() (n uint64) {
	e, ok := d.s.(interface{ Evicted() uint64 })
	if !ok {
		return 0
	}
	defer func() { d.g.recovered("DeadLetterStore", "Evicted", recover()) }() // n stays 0
	return e.Evicted()
}

func (d guardedDLQ) List(ctx context.Context, f DeadLetterFilter) (_ []DeadLetter, err error) {
	defer func() {
		if e := d.g.recovered("DeadLetterStore", "List", recover()); e != nil {
			err = e
		}
	}()
	return d.s.List(ctx, f)
}

func (d guardedDLQ) Get(ctx context.Context, id string) (_ DeadLetter, _ bool, err error) {
	defer func() {
		if e := d.g.recovered("DeadLetterStore", "Get", recover()); e != nil {
			err = e
		}
	}()
	return d.s.Get(ctx, id)
}

func (d guardedDLQ) Delete(ctx context.Context, ids ...string) (err error) {
	defer func() {
		if e := d.g.recovered("DeadLetterStore", "Delete", recover()); e != nil {
			err = e
		}
	}()
	return d.s.Delete(ctx, ids...)
}

func (d guardedDLQ) Len(ctx context.Context) (_ int, err error) {
	defer func() {
		if e := d.g.recovered("DeadLetterStore", "Len", recover()); e != nil {
			err = e
		}
	}()
	return d.s.Len(ctx)
}

// guardedDedup is an IdempotencyStore whose panics are errors.
type guardedDedup struct {
	s IdempotencyStore
	g guard
}

func (d guardedDedup) Seen(ctx context.Context, k DeliveryKey) (_ bool, err error) {
	defer func() {
		if e := d.g.recovered("IdempotencyStore", "Seen", recover()); e != nil {
			err = e
		}
	}()
	return d.s.Seen(ctx, k)
}

func (d guardedDedup) Record(ctx context.Context, k DeliveryKey) (err error) {
	defer func() {
		if e := d.g.recovered("IdempotencyStore", "Record", recover()); e != nil {
			err = e
		}
	}()
	return d.s.Record(ctx, k)
}

// guardedObserver is an Observer whose hooks' panics lose only that event.
type guardedObserver struct {
	o Observer
	g guard
}

func (o guardedObserver) Published(e PublishEvent) {
	defer func() { o.g.recovered("Observer", "Published", recover()) }()
	o.o.Published(e)
}

func (o guardedObserver) Rejected(e RejectEvent) {
	defer func() { o.g.recovered("Observer", "Rejected", recover()) }()
	o.o.Rejected(e)
}

func (o guardedObserver) Unrouted(e UnroutedEvent) {
	defer func() { o.g.recovered("Observer", "Unrouted", recover()) }()
	o.o.Unrouted(e)
}

func (o guardedObserver) Attempted(e AttemptEvent) {
	defer func() { o.g.recovered("Observer", "Attempted", recover()) }()
	o.o.Attempted(e)
}

func (o guardedObserver) DeadLettered(e DeadLetterEvent) {
	defer func() { o.g.recovered("Observer", "DeadLettered", recover()) }()
	o.o.DeadLettered(e)
}

func (o guardedObserver) BreakerChanged(e BreakerEvent) {
	bo, ok := o.o.(BreakerObserver)
	if !ok {
		return
	}
	defer func() { o.g.recovered("Observer", "BreakerChanged", recover()) }()
	bo.BreakerChanged(e)
}

// forSubscriber is o for the events of one subscriber: what o's
// ForSubscriber returns when o is a SubscriberObserver, else o.
func (o guardedObserver) forSubscriber(topic, name string) (scoped guardedObserver) {
	so, ok := o.o.(SubscriberObserver)
	if !ok {
		return o
	}
	scoped = o // also after a panic
	defer func() { o.g.recovered("Observer", "ForSubscriber", recover()) }()
	if s := so.ForSubscriber(topic, name); s != nil && !isNilValue(s) {
		scoped.o = s
	}
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
func (g guard) safeBackoff(backoff Backoff, retry int) (d time.Duration) {
	defer func() {
		if g.recovered("Backoff", "call", recover()) != nil {
			d = exponential(DefaultBackoffBase, DefaultBackoffMax, retry)
		}
	}()
	return backoff(retry)
}

// timesPublish is pt.TimesPublish(), false if it panics (logged and
// counted).
func (g guard) timesPublish(pt PublishTimer) (yes bool) {
	_ = g.call("Observer", "TimesPublish", func() error {
		yes = pt.TimesPublish()
		return nil
	})
	return yes
}

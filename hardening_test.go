package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// This file tests SPEC.md "Shutdown and lifecycle": everything a user
// plugs in is guarded, and a handler's odd outcomes end its message like a
// panic while its worker goes on.

type nilErr struct{ msg string }

func (e *nilErr) Error() string { return e.msg } // panics on a nil receiver

type panickyText struct{}

func (panickyText) Error() string { panic("Error() exploded") }

type panickyCode struct{}

func (panickyCode) Error() string     { return "coded" }
func (panickyCode) ErrorCode() string { panic("ErrorCode() exploded") }

// A handler that returns a typed nil, an error whose Error or ErrorCode
// panics, or that calls runtime.Goexit gets an outcome like a panic: its
// message is dead-lettered with code "panic", the process lives, and the
// worker goes on to the next message.
func TestOddHandlerOutcomesEndLikeAPanic(t *testing.T) {
	tests := []struct {
		name string
		bad  func() error
		text string
	}{
		{"typed nil error", func() error { var e *nilErr; return e }, "nil *broker.nilErr"},
		{"Error panics", func() error { return panickyText{} }, "Error() exploded"},
		{"ErrorCode panics", func() error { return panickyCode{} }, "ErrorCode() exploded"},
		{"Goexit", func() error { runtime.Goexit(); return nil }, errGoexit.Error()},
		{"Goexit after a retry", nil, errGoexit.Error()},
	}
	for _, tt := range tests {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/concurrency %d", tt.name, workers), func(t *testing.T) {
				bubble(t, func(t *testing.T) {
					b := newTestBroker(t, WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Second)}))
					var got calls
					_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
						if m.ID != "bad" {
							return nil
						}
						if tt.bad == nil { // fails once, then calls Goexit on its retry
							if m.Attempt == 1 {
								return errBoom
							}
							runtime.Goexit()
						}
						return tt.bad()
					}), Concurrency(workers))
					require.NoError(t, err)
					publishN(t, b, "t", "before", 3)
					require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
					publishN(t, b, "t", "after", 5)
					settle(t, b)
					dls := deadLetters(t, b)
					require.Len(t, dls, 1)
					assert.Equal(t, "bad", dls[0].Message.ID)
					assert.Equal(t, CodePanic, dls[0].ErrorCode)
					assert.Equal(t, ReasonExhausted, dls[0].Reason, "retried like a panic, under the policy")
					assert.Equal(t, 2, dls[0].Attempts)
					assert.Contains(t, dls[0].Error, tt.text)
					ss := subStats(t, b, "t", "s")
					assert.Equal(t, uint64(8), ss.Delivered, "the worker went on")
					assert.Equal(t, uint64(got.len()), ss.Attempts)
					requireConserved(t, b.Stats())
					require.NoError(t, b.Close(context.Background()))
				})
			})
		}
	}
}

// Each handler gets its own copy of Headers: handlers that add to theirs
// race with nobody (run under -race), and the publisher's map is untouched.
func TestEachHandlerGetsItsOwnHeaders(t *testing.T) {
	b := newTestBroker(t)
	var wg sync.WaitGroup
	const subs, msgs = 4, 50
	wg.Add(subs * msgs)
	seen := make(chan string, subs*msgs)
	for i := range subs {
		_, err := b.Subscribe("t", fmt.Sprint("s", i), func(_ context.Context, m Message) error {
			defer wg.Done()
			m.Headers["traceparent"] = fmt.Sprint("span-", i) // a tracing middleware would
			seen <- m.Headers["tenant"]
			return nil
		}, Concurrency(2))
		require.NoError(t, err)
	}
	published := make([]map[string]string, msgs)
	for i := range msgs {
		published[i] = map[string]string{"tenant": "acme"}
		require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m", i), Topic: "t", Headers: published[i]}))
	}
	wg.Wait()
	close(seen)
	for v := range seen {
		require.Equal(t, "acme", v)
	}
	for _, h := range published {
		assert.Equal(t, map[string]string{"tenant": "acme"}, h, "the publisher's map is not written")
	}
}

// A message published without Headers reaches every handler call with a
// map of its own, non-nil and empty: a handler (and the middleware around
// it, which sees the same map) writes to it without a nil check, no other
// subscriber and no later attempt sees the write, and the dead letter keeps
// the headers as published (none). Before, the write panicked on the nil
// map and the message became a dead letter.
func TestHandlersGetTheirOwnHeadersWhenPublishedWithout(t *testing.T) {
	for _, viaTransport := range []bool{false, true} {
		t.Run(fmt.Sprintf("transport=%v", viaTransport), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var mwSaw sync.Map // attempt → the map middleware saw, after the handler
				mw := func(_ SubscriberInfo, next Handler) Handler {
					return func(ctx context.Context, m Message) error {
						err := next(ctx, m)
						mwSaw.Store(fmt.Sprint(m.Attempt, "/", m.Headers["by"]), len(m.Headers))
						return err
					}
				}
				opts := []Option{WithMiddleware(mw)}
				var b *Broker
				if viaTransport {
					b = newTransportBroker(t, newFakeTransport(), opts...)
				} else {
					b = newTestBroker(t, opts...)
				}
				got := make(chan string, 8)
				for _, name := range []string{"a", "b"} {
					_, err := b.Subscribe("t", name, func(_ context.Context, m Message) error {
						got <- fmt.Sprintf("%s#%d saw %d headers", name, m.Attempt, len(m.Headers))
						m.Headers["by"] = name // no nil check
						if name == "b" {
							return Permanent(errBoom)
						}
						if m.Attempt == 1 {
							return errBoom // the retry gets a fresh map
						}
						return nil
					})
					require.NoError(t, err)
				}
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
				settle(t, b)
				close(got)
				var lines []string
				for l := range got {
					lines = append(lines, l)
				}
				assert.ElementsMatch(t, []string{"a#1 saw 0 headers", "a#2 saw 0 headers", "b#1 saw 0 headers"}, lines)
				for _, k := range []string{"1/a", "2/a", "1/b"} {
					n, ok := mwSaw.Load(k)
					assert.True(t, ok && n == 1, "middleware saw the handler's write at %s", k)
				}
				dls := deadLetters(t, b)
				require.Len(t, dls, 1)
				assert.Nil(t, dls[0].Message.Headers, "a dead letter keeps the headers as published")
				assert.Equal(t, uint64(1), subStats(t, b, "t", "a").Delivered)
				requireConserved(t, b.Stats())
			})
		})
	}
}

var _ = errors.New

// Close and Unsubscribe honour their context when a handler ignores its
// own: after the handlers' part of ShutdownGrace they abandon it, dead-letter its message (counted
// apart), and return; what the handler returns later is ignored. A second
// call returns the same result, and the handler's cause matches the
// sentinel.
func TestStopAbandonsAHandlerThatIgnoresItsContext(t *testing.T) {
	for _, viaClose := range []bool{true, false} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("close=%v/concurrency %d", viaClose, workers), func(t *testing.T) {
				bubble(t, func(t *testing.T) {
					var logs lockedBuffer
					var events eventLog
					b := newTestBroker(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithObserver(&events))
					release := make(chan struct{})
					var cause atomic.Value
					var late atomic.Int32
					sub, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
						if m.ID != "stuck" {
							late.Add(1)
							return nil
						}
						<-ctx.Done()
						cause.Store(context.Cause(ctx))
						<-release // ignores its context
						return nil
					}, Concurrency(workers))
					require.NoError(t, err)
					require.NoError(t, b.Publish(context.Background(), Message{ID: "stuck", Topic: "t"}))
					idle()
					late.Store(0)
					publishN(t, b, "t", "queued", 3)
					idle()
					late.Store(0)

					stop, reason, sentinel := sub.Unsubscribe, ReasonUnsubscribed, ErrUnsubscribed
					if viaClose {
						stop, reason, sentinel = b.Close, ReasonShutdown, ErrClosed
					}
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					defer cancel()
					start := time.Now()
					err = stop(ctx)
					assert.Equal(t, 100*time.Millisecond+handlerGrace, time.Since(start), "returned once the handlers' part of the grace ended and the dead letters were stored")
					var de *DrainError
					require.ErrorAs(t, err, &de)
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.Equal(t, 1, de.Abandoned)
					assert.Equal(t, reason, de.Reason)
					assert.ErrorIs(t, cause.Load().(error), sentinel, "the handler's context.Cause")
					dls := deadLetters(t, b)
					byID := map[string]DeadLetter{}
					for _, dl := range dls {
						byID[dl.Message.ID] = dl
						assert.Equal(t, reason, dl.Reason)
					}
					if workers == 1 {
						assert.Len(t, dls, 4, "the abandoned message and the three queued")
						assert.Equal(t, 4, de.DeadLettered)
					}
					require.Contains(t, byID, "stuck")
					assert.Equal(t, 1, byID["stuck"].Attempts)
					assert.Contains(t, byID["stuck"].Error, "abandoned")
					assert.Same(t, err, stop(context.Background()), "a second call returns the first's result")
					events.mu.Lock()
					var stuckEvents []string
					for _, e := range events.events {
						if strings.Contains(e, "t/s/stuck #1") {
							stuckEvents = append(stuckEvents, e)
						}
					}
					events.mu.Unlock()
					require.Len(t, stuckEvents, 1, "the abandoned attempt has its event")
					assert.Contains(t, stuckEvents[0], "outcome=dead_lettered")
					requireConserved(t, b.Stats())
					if viaClose {
						ss := subStats(t, b, "t", "s")
						assert.False(t, ss.Active, "after Close no subscriber is active")
						assert.Zero(t, ss.Capacity)
					}

					before := subStats(t, b, "t", "s")
					close(release) // the abandoned handler returns: ignored, and logged
					idle()
					assert.Zero(t, late.Load(), "no attempt started after the stop returned")
					assert.Equal(t, before, subStats(t, b, "t", "s"), "what the abandoned handler returned is ignored")
					requireConserved(t, b.Stats())
					assert.Contains(t, logs.String(), "abandoned handler returned")
				})
			})
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// New refuses typed-nil plug-ins: their methods would panic in a worker.
func TestNewRefusesTypedNilPlugins(t *testing.T) {
	tests := []struct {
		name string
		opt  Option
	}{
		{"dead-letter store", WithDeadLetterStore((*MemoryDeadLetterStore)(nil))},
		{"idempotency store", WithIdempotencyStore((*MemoryIdempotencyStore)(nil))},
		{"observer", WithObserver((*eventLog)(nil))},
		{"logger without handler", WithLogger(&slog.Logger{})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opt)
			assert.ErrorIs(t, err, ErrInvalidOption)
		})
	}
	b, err := New(WithIdempotencyStore(nil), WithLogger(discard)) // nil itself disables dedup
	require.NoError(t, err)
	require.NoError(t, b.Close(context.Background()))
}

// Plug-ins that panic on every call.
type panicObserver struct{}

func (panicObserver) Published(PublishEvent)       { panic("observer") }
func (panicObserver) Rejected(RejectEvent)         { panic("observer") }
func (panicObserver) Unrouted(UnroutedEvent)       { panic("observer") }
func (panicObserver) Attempted(AttemptEvent)       { panic("observer") }
func (panicObserver) DeadLettered(DeadLetterEvent) { panic("observer") }
func (panicObserver) BreakerChanged(BreakerEvent)  { panic("observer") }

type panicDedup struct{}

func (panicDedup) Seen(context.Context, DeliveryKey) (bool, error) { panic("seen") }
func (panicDedup) Record(context.Context, DeliveryKey) error       { panic("record") }

type panicPutStore struct{ *MemoryDeadLetterStore }

func (panicPutStore) Put(context.Context, DeadLetter) error { panic("put") }

// A panic in an Observer hook, a Backoff, an IdempotencyStore or a
// DeadLetterStore is recovered, logged and counted; the process lives and
// every message still ends in exactly one state.
func TestPanickingPluginsAreGuarded(t *testing.T) {
	panicBackoff := func(int) time.Duration { panic("backoff") }
	tests := []struct {
		name string
		opts []Option
	}{
		{"observer", []Option{WithObserver(panicObserver{})}},
		{"backoff", []Option{WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: panicBackoff})}},
		{"idempotency store", []Option{WithIdempotencyStore(panicDedup{})}},
		{"dead-letter store", []Option{WithDeadLetterStore(panicPutStore{NewMemoryDeadLetterStore(10, nil)})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, tt.opts...)
				_, err := b.Subscribe("t", "s", func(_ context.Context, m Message) error {
					if m.ID == "bad" && m.Attempt < 3 {
						return errBoom
					}
					if m.ID == "worse" {
						return Permanent(errBoom)
					}
					return nil
				}, CircuitBreaker(BreakerPolicy{Failures: 100}))
				require.NoError(t, err)
				publishN(t, b, "t", "ok", 3)
				// "worse" before "bad": with the failing store, worse's Put
				// holds the worker before bad runs at all (published after
				// it, bad could run its three attempts first).
				for _, id := range []string{"worse", "bad", "ok-0"} {
					require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
				}
				require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: "nobody"}))
				deadLettered := uint64(1) // worse
				if tt.name == "dead-letter store" {
					// Its Put is retried while the broker runs, holding the
					// worker (so "bad" waits): only Close's deadline gives it
					// up, and bad's shutdown dead letter with it.
					time.Sleep(time.Minute)
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					_ = b.Close(ctx)
					deadLettered = 2
					assert.Equal(t, deadLettered, subStats(t, b, "t", "s").DeadLetterErrors)
				}
				settle(t, b)
				st := b.Stats()
				requireConserved(t, st)
				ss := st.Topics["t"].Subscribers["s"]
				assert.Equal(t, uint64(6), ss.Routed)
				assert.Equal(t, deadLettered, ss.DeadLettered)
				assert.Equal(t, ss.Routed, ss.Delivered+ss.Deduplicated+ss.DeadLettered, "each message ended once")
				assert.NotZero(t, st.PluginPanics, "the panics were counted")
				_ = b.Close(context.Background())
			})
		})
	}
}

// wrappedStore is the default store behind a type of the user's own: the
// broker cannot take its fast path, and must behave the same.
type wrappedStore struct{ s *MemoryIdempotencyStore }

func (w wrappedStore) Seen(ctx context.Context, k DeliveryKey) (bool, error) { return w.s.Seen(ctx, k) }
func (w wrappedStore) Record(ctx context.Context, k DeliveryKey) error       { return w.s.Record(ctx, k) }

// The default store's window is in publish time whether the broker uses it
// directly or through a wrapper: a copy published 30 s after the first, but
// delivered 2 min after it (behind a backlog), is still a duplicate; one
// published 2 min later is not.
func TestWrappedDefaultStoreBehavesTheSame(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		t.Run(fmt.Sprintf("wrapped=%v", wrapped), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				var store IdempotencyStore = NewMemoryIdempotencyStore(time.Minute, 1000)
				if wrapped {
					store = wrappedStore{store.(*MemoryIdempotencyStore)}
				}
				b := newTestBroker(t, WithIdempotencyStore(store))
				release := make(chan struct{})
				var got calls
				_, err := b.Subscribe("t", "s", recording(&got, func(m Message) error {
					if m.ID == "blocker" {
						<-release
					}
					return nil
				}))
				require.NoError(t, err)
				copyOf := func(n string) Message {
					return Message{ID: "m", Topic: "t", Headers: map[string]string{"copy": n}}
				}
				require.NoError(t, b.Publish(context.Background(), copyOf("1")))
				idle()
				require.NoError(t, b.Publish(context.Background(), Message{ID: "blocker", Topic: "t"}))
				time.Sleep(30 * time.Second)
				require.NoError(t, b.Publish(context.Background(), copyOf("2"))) // 30 s later: a duplicate
				time.Sleep(90 * time.Second)
				close(release) // copy 2 is delivered 2 min after copy 1
				settle(t, b)
				time.Sleep(30 * time.Second)
				require.NoError(t, b.Publish(context.Background(), copyOf("3"))) // 2.5 min after copy 1: not one
				settle(t, b)
				var ran []string
				for _, m := range got.all() {
					ran = append(ran, m.ID+m.Headers["copy"])
				}
				assert.Equal(t, []string{"m1", "blocker", "m3"}, ran)
				assert.Equal(t, uint64(1), subStats(t, b, "t", "s").Deduplicated)
			})
		})
	}
}

// Dead-letter IDs never repeat across brokers, restarts included: each
// broker's prefix has its start time and 64 random bits.
func TestDeadLetterIDsAreUniqueAcrossBrokers(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		b, err := New(WithLogger(discard))
		require.NoError(t, err)
		for range 3 {
			id := b.newDeadLetterID()
			require.False(t, seen[id], "dead-letter ID %s repeated", id)
			seen[id] = true
		}
		require.NoError(t, b.Close(context.Background()))
	}
	p := newDeadLetterPrefix(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	assert.Regexp(t, `^dl-[0-9a-z]+-[0-9a-f]{16}-$`, p)
}

// A graceful Unsubscribe right after a burst delivers every message
// accepted before it, including those the dispatcher had not reached.
func TestUnsubscribeAfterABurstDeliversIt(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", workers), func(t *testing.T) {
			b := newTestBroker(t, WithQueueSize(64))
			var n atomic.Int32
			sub, err := b.Subscribe("t", "s", func(context.Context, Message) error {
				n.Add(1)
				return nil
			}, Concurrency(workers), LaneSize(8))
			require.NoError(t, err)
			const burst = 60
			for i := range burst {
				require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("m", i), Topic: "t"}))
			}
			require.NoError(t, sub.Unsubscribe(context.Background()))
			assert.Equal(t, int32(burst), n.Load())
			ss := subStats(t, b, "t", "s")
			assert.Equal(t, uint64(burst), ss.Routed)
			assert.Equal(t, uint64(burst), ss.Delivered)
			assert.Empty(t, deadLetters(t, b))
		})
	}
}

// Every error the API returns says where it comes from, once: "broker: …".
func TestErrorsSayBrokerOnce(t *testing.T) {
	b := newTestBroker(t)
	_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return nil })
	require.NoError(t, err)
	_, newErr := New(WithQueueSize(0))
	_, subErr := b.Subscribe("t", "x", func(context.Context, Message) error { return nil }, LaneSize(0))
	_, redriveErr := b.Redrive(context.Background(), "nope")
	pubErr := b.Publish(context.Background(), Message{Topic: "t"})
	require.NoError(t, b.Close(context.Background()))
	_, closedErr := b.Redrive(context.Background(), "nope")
	for _, err := range []error{newErr, subErr, redriveErr, pubErr, closedErr, b.Publish(context.Background(), Message{ID: "m", Topic: "t"})} {
		require.Error(t, err)
		assert.True(t, strings.HasPrefix(err.Error(), "broker: "), "%q", err)
		assert.Equal(t, 1, strings.Count(err.Error(), "broker:"), "%q", err)
	}
}

// seenButFailing answers "seen" together with an error.
type seenButFailing struct{}

func (seenButFailing) Seen(context.Context, DeliveryKey) (bool, error) { return true, errBoom }
func (seenButFailing) Record(context.Context, DeliveryKey) error       { return nil }

// A Seen that fails counts as "not seen", whatever else it returned: the
// message is delivered, not dropped as a duplicate.
func TestFailingSeenDelivers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(seenButFailing{}))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 3)
		settle(t, b)
		assert.Equal(t, 3, got.len())
		assert.Zero(t, subStats(t, b, "t", "s").Deduplicated)
	})
}

// panicLogHandler is a slog.Handler that panics at every record (or, with
// inEnabled, already when asked whether a level is enabled).
type panicLogHandler struct{ inEnabled bool }

func (h panicLogHandler) Enabled(context.Context, slog.Level) bool {
	if h.inEnabled {
		panic("log handler: Enabled")
	}
	return true
}
func (panicLogHandler) Handle(context.Context, slog.Record) error { panic("log handler: Handle") }
func (h panicLogHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panicLogHandler) WithGroup(string) slog.Handler           { return h }

// A logger whose handler panics is plugged-in code too: every message still
// ends in exactly one state, and the panics are counted.
func TestPanickingLogHandlerIsGuarded(t *testing.T) {
	for _, inEnabled := range []bool{false, true} {
		t.Run(fmt.Sprintf("inEnabled=%v", inEnabled), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				b := newTestBroker(t, WithLogger(slog.New(panicLogHandler{inEnabled})))
				c := &calls{}
				_, err := b.Subscribe("t", "s", recording(c, func(m Message) error {
					if m.ID == "bad" {
						return Permanent(errBoom) // logged at Warn
					}
					return nil
				}))
				require.NoError(t, err)
				publishN(t, b, "t", "ok", 3)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
				settle(t, b)
				st := b.Stats()
				requireConserved(t, st)
				ss := st.Topics["t"].Subscribers["s"]
				assert.Equal(t, uint64(3), ss.Delivered)
				assert.Equal(t, uint64(1), ss.DeadLettered)
				assert.NotZero(t, st.PluginPanics)
			})
		})
	}
}

// evictedPanics is a dead-letter store whose Evicted count panics.
type evictedPanics struct{ *MemoryDeadLetterStore }

func (evictedPanics) Evicted() uint64 { panic("store bug") }

// Stats calls the store's Evicted (for DeadLetterEvicted): a panic there is
// a plug-in's, recovered and counted, not a crash of whoever asked for Stats.
func TestStatsSurvivesAPanickingEvicted(t *testing.T) {
	b := newTestBroker(t, WithDeadLetterStore(evictedPanics{NewMemoryDeadLetterStore(0, nil)}))
	st := b.Stats()
	assert.Zero(t, st.DeadLetterEvicted)
	assert.Equal(t, uint64(1), st.PluginPanics)
}

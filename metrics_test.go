package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// funcObserver calls the funcs that are set.
type funcObserver struct {
	NopObserver
	attempted    func(AttemptEvent)
	deadLettered func(DeadLetterEvent)
}

func (o *funcObserver) Attempted(e AttemptEvent) {
	if o.attempted != nil {
		o.attempted(e)
	}
}

func (o *funcObserver) DeadLettered(e DeadLetterEvent) {
	if o.deadLettered != nil {
		o.deadLettered(e)
	}
}

// eventLog records every event as a line.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	l.events = append(l.events, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *eventLog) Published(e PublishEvent) { l.add("published %s/%s", e.Topic, e.MessageID) }
func (l *eventLog) Rejected(e RejectEvent)   { l.add("rejected %s/%s", e.Topic, e.MessageID) }
func (l *eventLog) Unrouted(e UnroutedEvent) { l.add("unrouted %s/%s", e.Topic, e.MessageID) }
func (l *eventLog) Attempted(e AttemptEvent) {
	l.add("attempt %s/%s/%s #%d code=%q retryable=%v outcome=%s delay=%v published=%v",
		e.Topic, e.Subscriber, e.MessageID, e.Attempt, e.ErrorCode, e.Retryable, e.Outcome, e.Delay, !e.PublishedAt.IsZero())
}
func (l *eventLog) DeadLettered(e DeadLetterEvent) {
	l.add("dead letter %s/%s reason=%s stored=%v", e.DeadLetter.Subscriber, e.DeadLetter.Message.ID, e.DeadLetter.Reason, e.StoreErr == nil)
}

// A message's "published" event and its first "attempt" (or "unrouted")
// come from different goroutines, in either order: the events are checked
// step by step, each step's as a set.
func TestObserverEvents(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var log eventLog
		b := newTestBroker(t, WithObserver(&log), WithQueueSize(1), WithPublishTimeout(0),
			WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Second)}))
		step := func(want ...string) {
			t.Helper()
			idle()
			log.mu.Lock()
			got := log.events
			log.events = nil
			log.mu.Unlock()
			assert.ElementsMatch(t, want, got)
		}
		require.NoError(t, b.Publish(context.Background(), Message{ID: "lost", Topic: "nobody"}))
		step("published nobody/lost", "unrouted nobody/lost")
		release := make(chan struct{})
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			switch m.ID {
			case "bad":
				return errBoom
			case "hold":
				<-release
			}
			return nil
		}, LaneSize(2)) // "bad", parked, and "q1"
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "ok", Topic: "t"}))
		step("published t/ok", `attempt t/s/ok #1 code="" retryable=false outcome=delivered delay=0s published=true`)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "ok", Topic: "t"}))
		step("published t/ok", `attempt t/s/ok #0 code="" retryable=false outcome=deduplicated delay=0s published=true`)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
		step("published t/bad", `attempt t/s/bad #1 code="error" retryable=true outcome=retry delay=1s published=true`)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "hold", Topic: "t"})) // the worker
		step("published t/hold")
		require.NoError(t, b.Publish(context.Background(), Message{ID: "q1", Topic: "t"})) // lane, beside "bad"
		step("published t/q1")
		require.NoError(t, b.Publish(context.Background(), Message{ID: "q2", Topic: "t"})) // topic queue
		require.Error(t, b.Publish(context.Background(), Message{ID: "full", Topic: "t"}))
		step("published t/q2", "rejected t/full")
		close(release)
		time.Sleep(2 * time.Second)
		idle()
		log.mu.Lock()
		defer log.mu.Unlock()
		assert.Equal(t, []string{ // one worker, in order: "bad" parked, the others do not wait for it
			`attempt t/s/hold #1 code="" retryable=false outcome=delivered delay=0s published=true`,
			`attempt t/s/q1 #1 code="" retryable=false outcome=delivered delay=0s published=true`,
			`attempt t/s/q2 #1 code="" retryable=false outcome=delivered delay=0s published=true`,
			`attempt t/s/bad #2 code="error" retryable=true outcome=dead_lettered delay=0s published=true`,
			"dead letter s/bad reason=exhausted stored=true",
		}, log.events)
	})
}

func TestLogsCarryContractFields(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var buf bytes.Buffer
		var mu sync.Mutex
		logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		b := newTestBroker(t, WithLogger(logger), WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(0)}))
		_, err := b.Subscribe("orders", "billing", func(context.Context, Message) error { return codedError{"declined"} })
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m-1", Topic: "orders"}))
		idle()
		mu.Lock()
		defer mu.Unlock()
		var lines []map[string]any
		for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
			var m map[string]any
			require.NoError(t, json.Unmarshal(line, &m))
			lines = append(lines, m)
		}
		require.Len(t, lines, 2, "a retry line and a dead-letter line")
		want := map[string]any{
			"topic": "orders", "message_id": "m-1", "subscriber": "billing",
			"error_code": "declined", "retryable": true,
		}
		for i, state := range []string{"retry", "dead_lettered"} {
			for k, v := range want {
				assert.Equal(t, v, lines[i][k], "line %d field %s", i, k)
			}
			assert.Equal(t, float64(i+1), lines[i]["attempt"])
			assert.Equal(t, state, lines[i]["final_state"])
		}
		assert.Equal(t, "WARN", lines[1]["level"])
		assert.Equal(t, "exhausted", lines[1]["reason"])
		assert.NotEmpty(t, lines[1]["dead_letter_id"])
	})
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestStatsRatios(t *testing.T) {
	s := SubscriberStats{Attempts: 10, Retries: 2, Delivered: 6, Deduplicated: 1, DeadLettered: 3, Queued: 4, InFlight: 1}
	assert.InDelta(t, 0.2, s.RetryRate(), 1e-9)
	assert.InDelta(t, 0.3, s.FailureRate(), 1e-9)
	assert.Equal(t, 5, s.Backlog())
	assert.Zero(t, SubscriberStats{}.RetryRate())
	assert.Zero(t, SubscriberStats{}.FailureRate())
	ts := TopicStats{Queued: 2, Subscribers: map[string]SubscriberStats{"a": s, "b": {Queued: 1}}}
	assert.Equal(t, 8, ts.Backlog())
}

// Several observers each get every event, in order, and one that panics
// loses its events only.
func TestSeveralObservers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var first, second eventLog
		b := newTestBroker(t, WithObserver(&first, panicObserver{}), WithObserver(&second))
		_, err := b.Subscribe("t", "s", okHandler(&calls{}))
		require.NoError(t, err)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		settle(t, b)
		want := []string{"published t/m", `attempt t/s/m #1 code="" retryable=false outcome=delivered delay=0s published=true`}
		assert.ElementsMatch(t, want, first.events)
		assert.ElementsMatch(t, want, second.events)
		assert.Equal(t, uint64(2), b.Stats().PluginPanics, "the panicking one's two events")
	})
	_, err := New(WithObserver(&eventLog{}, nil))
	require.ErrorIs(t, err, ErrInvalidOption)
}

// An AttemptEvent says when the handler was called and how long it ran
// (Start.Add(Duration) is when it returned, so an observer needs no clock
// of its own); a deduplicated message was not attempted: zero Start.
func TestAttemptEventTiming(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var mu sync.Mutex
		var events []AttemptEvent
		var called []time.Time
		obs := &funcObserver{attempted: func(e AttemptEvent) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}}
		b := newTestBroker(t, WithObserver(obs),
			WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(time.Second)}))
		_, err := b.Subscribe("t", "s", func(ctx context.Context, m Message) error {
			mu.Lock()
			called = append(called, time.Now())
			mu.Unlock()
			time.Sleep(3 * time.Second)
			if m.Attempt == 1 {
				return errBoom
			}
			return nil
		})
		require.NoError(t, err)
		published := time.Now()
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		time.Sleep(10 * time.Second)
		require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t"}))
		idle()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, events, 3)
		require.Len(t, called, 2)
		for i, want := range called {
			e := events[i]
			assert.True(t, e.Start.Equal(want), "attempt %d: Start %v, handler called at %v", e.Attempt, e.Start, want)
			assert.Equal(t, 3*time.Second, e.Duration)
			assert.False(t, e.Start.Before(e.PublishedAt))
		}
		assert.True(t, called[0].Equal(published))
		assert.True(t, called[1].Equal(published.Add(4*time.Second)), "3 s attempt, 1 s backoff")
		assert.Equal(t, OutcomeDeduplicated, events[2].Outcome)
		assert.True(t, events[2].Start.IsZero())
	})
}

// scopedLog is a SubscriberObserver: each subscriber's events go to an
// eventLog of its own, made by ForSubscriber as mode says.
type scopedLog struct {
	eventLog
	mode   string // "scoped", "nil", "typed-nil" or "panic"
	mu     sync.Mutex
	scopes map[string]*eventLog
}

func (s *scopedLog) ForSubscriber(topic, name string) Observer {
	switch s.mode {
	case "nil":
		return nil
	case "typed-nil":
		return (*eventLog)(nil)
	case "panic":
		panic("ForSubscriber")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := &eventLog{}
	s.scopes[topic+"/"+name] = l
	return l
}

// TestSubscriberObserver: an Observer that implements ForSubscriber gets a
// subscriber's Attempted and DeadLettered events on the Observer it
// returned for that subscriber, the others on itself; one that returns nil
// (or a typed nil) or panics gets them all itself, the panic counted; an
// Observer beside it that is not a SubscriberObserver gets every event.
func TestSubscriberObserver(t *testing.T) {
	for _, mode := range []string{"scoped", "nil", "typed-nil", "panic"} {
		t.Run(mode, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				so := &scopedLog{mode: mode, scopes: map[string]*eventLog{}}
				var plain eventLog
				b := newTestBroker(t, WithObserver(so, &plain), WithRetryPolicy(RetryPolicy{MaxRetries: NoRetries}))
				for _, name := range []string{"a", "b"} {
					_, err := b.Subscribe("t", name, func(_ context.Context, m Message) error {
						if m.ID == "bad" {
							return errBoom
						}
						return nil
					})
					require.NoError(t, err)
				}
				require.NoError(t, b.Publish(context.Background(), Message{ID: "ok", Topic: "t"}))
				require.NoError(t, b.Publish(context.Background(), Message{ID: "bad", Topic: "t"}))
				idle()
				sub := func(name string) []string {
					return []string{
						`attempt t/` + name + `/ok #1 code="" retryable=false outcome=delivered delay=0s published=true`,
						`attempt t/` + name + `/bad #1 code="error" retryable=true outcome=dead_lettered delay=0s published=true`,
						"dead letter " + name + "/bad reason=exhausted stored=true",
					}
				}
				published := []string{"published t/ok", "published t/bad"}
				all := append(append(append([]string{}, published...), sub("a")...), sub("b")...)
				assert.ElementsMatch(t, all, plain.events, "the plain Observer gets everything")
				if mode != "scoped" {
					assert.ElementsMatch(t, all, so.events)
					assert.Empty(t, so.scopes)
					if mode == "panic" {
						assert.Equal(t, uint64(2), b.Stats().PluginPanics, "one per Subscribe")
					}
					return
				}
				assert.ElementsMatch(t, published, so.events, "the Observer itself: the other events")
				require.Len(t, so.scopes, 2)
				for _, name := range []string{"a", "b"} {
					assert.ElementsMatch(t, sub(name), so.scopes["t/"+name].events, name)
				}
				assert.Zero(t, b.Stats().PluginPanics)
			})
		})
	}
}

// statsAsking is a SubscriberObserver whose ForSubscriber reads the
// broker's Stats, as an adapter sizing its series might.
type statsAsking struct {
	NopObserver
	b     atomic.Pointer[Broker]
	asked atomic.Int32
}

func (o *statsAsking) ForSubscriber(topic, _ string) Observer {
	if b := o.b.Load(); b != nil {
		_ = b.Stats().Topics[topic]
		o.asked.Add(1)
	}
	return nil
}

// ForSubscriber is user code: the broker asks it before taking its locks,
// so one that calls back into the broker (Stats) does not deadlock
// Subscribe, over the in-memory transport or another (it did: Subscribe
// held the broker's and the topic's locks, which Stats takes).
func TestForSubscriberMayCallTheBroker(t *testing.T) {
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprint("transport=", remote), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				o := &statsAsking{}
				opts := []Option{WithObserver(o)}
				if remote {
					opts = append(opts, WithTransport(newFakeTransport()))
				}
				b := newTestBroker(t, opts...)
				o.b.Store(b)
				for _, name := range []string{"a", "b"} {
					_, err := b.Subscribe("t", name, func(context.Context, Message) error { return nil })
					require.NoError(t, err)
				}
				assert.Equal(t, int32(2), o.asked.Load())
			})
		})
	}
}

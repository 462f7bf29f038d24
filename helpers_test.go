package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// discard is a logger that writes nowhere.
var discard = slog.New(slog.DiscardHandler)

// newTestBroker returns a broker with a silent logger and zero backoff, and
// closes it when the test ends.
func newTestBroker(t *testing.T, opts ...Option) *Broker {
	t.Helper()
	base := []Option{WithLogger(discard), WithRetryPolicy(RetryPolicy{MaxRetries: 2, Backoff: ConstantBackoff(0)})}
	b, err := New(append(base, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

// bubble runs f in a synctest bubble: time is fake and synctest.Wait tells
// when every goroutine of the broker is idle.
func bubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, f)
}

// idle waits until every goroutine in the bubble is blocked: the broker has
// done all it can.
func idle() { synctest.Wait() }

// settle lets fake time pass until the broker has no backlog: every topic
// queue and lane empty and nothing in flight (handlers sleeping or waiting to
// retry included). It fails the test if that takes more than an hour of fake
// time.
func settle(t *testing.T, b *Broker) {
	t.Helper()
	deadline := time.Now().Add(time.Hour)
	for {
		idle()
		busy := 0
		for _, ts := range b.Stats().Topics {
			busy += ts.Backlog()
		}
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker still has %d messages in its backlog after an hour", busy)
		}
		time.Sleep(time.Millisecond)
	}
}

// publishN publishes n messages "<prefix>-<i>" to topic.
func publishN(t *testing.T, b *Broker, topic, prefix string, n int) {
	t.Helper()
	for i := range n {
		require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprintf("%s-%d", prefix, i), Topic: topic}))
	}
}

// calls records what a handler saw.
type calls struct {
	mu   sync.Mutex
	msgs []Message
}

func (c *calls) add(m Message) {
	c.mu.Lock()
	c.msgs = append(c.msgs, m)
	c.mu.Unlock()
}

func (c *calls) all() []Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Message(nil), c.msgs...)
}

func (c *calls) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// ids returns the IDs seen, in order.
func (c *calls) ids() []string {
	var out []string
	for _, m := range c.all() {
		out = append(out, m.ID)
	}
	return out
}

// attempts returns the Attempt numbers seen for id, in order.
func (c *calls) attempts(id string) []int {
	var out []int
	for _, m := range c.all() {
		if m.ID == id {
			out = append(out, m.Attempt)
		}
	}
	return out
}

// recording returns a handler that records each call and returns ret(msg).
func recording(c *calls, ret func(Message) error) Handler {
	return func(_ context.Context, m Message) error {
		c.add(m)
		if ret == nil {
			return nil
		}
		return ret(m)
	}
}

func okHandler(c *calls) Handler { return recording(c, nil) }

// codedError is an error with its own code.
type codedError struct{ code string }

func (e codedError) Error() string     { return "coded: " + e.code }
func (e codedError) ErrorCode() string { return e.code }

var errBoom = errors.New("boom")

// deadLetters lists every dead letter of b.
func deadLetters(t *testing.T, b *Broker) []DeadLetter {
	t.Helper()
	dls, err := b.DeadLetters().List(context.Background(), DeadLetterFilter{})
	require.NoError(t, err)
	return dls
}

// subStats returns the stats of subscriber name on topic.
func subStats(t *testing.T, b *Broker, topic, name string) SubscriberStats {
	t.Helper()
	ts, ok := b.Stats().Topics[topic]
	require.True(t, ok, "topic %q in stats", topic)
	ss, ok := ts.Subscribers[name]
	require.True(t, ok, "subscriber %q in stats", name)
	return ss
}

// requireConserved checks routed = delivered + deduplicated + dead-lettered +
// queued + in flight for every subscriber.
func requireConserved(t *testing.T, st Stats) {
	t.Helper()
	for tn, ts := range st.Topics {
		for sn, ss := range ts.Subscribers {
			sum := ss.Delivered + ss.Deduplicated + ss.DeadLettered + uint64(ss.Queued) + uint64(ss.InFlight)
			require.Equal(t, ss.Routed, sum, "conservation for %s/%s: %+v", tn, sn, ss)
		}
	}
}

// stamps records times from handlers, safely.
type stamps struct {
	mu     sync.Mutex
	at     []time.Time
	untils []time.Duration
}

// add records now.
func (s *stamps) add() {
	s.mu.Lock()
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
}

// addDeadline records how far away deadline is.
func (s *stamps) addDeadline(deadline time.Time) {
	s.mu.Lock()
	s.untils = append(s.untils, time.Until(deadline))
	s.mu.Unlock()
}

// gaps returns the time between consecutive stamps.
func (s *stamps) gaps() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for i := 1; i < len(s.at); i++ {
		out = append(out, s.at[i].Sub(s.at[i-1]))
	}
	return out
}

func (s *stamps) untilsList() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.untils...)
}

type syncMutex struct{ sync.Mutex }

// blockUntil returns a handler that holds each message until release is
// closed, ignoring its context.
func blockUntil(release <-chan struct{}) Handler {
	return func(context.Context, Message) error {
		<-release
		return nil
	}
}

// blockUntilCancelled is a handler that runs until its context ends.
func blockUntilCancelled(ctx context.Context, _ Message) error {
	<-ctx.Done()
	return ctx.Err()
}

// stopWithin calls stop (Close or Unsubscribe) with a context that ends
// after d, and returns the *DrainError it must report.
func stopWithin(t *testing.T, d time.Duration, stop func(context.Context) error) *DrainError {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var de *DrainError
	require.ErrorAs(t, stop(ctx), &de)
	return de
}

// stuckAndOther subscribes to topic "t" of b a subscriber "stuck", whose
// handler waits until release is closed (a lane of 4 under policy), then a
// no-op one, "other"; it publishes m-0 and waits until stuck runs it.
func stuckAndOther(t *testing.T, b *Broker, policy FullLanePolicy) (release chan struct{}, stuck, other *calls) {
	t.Helper()
	release = make(chan struct{})
	stuck, other = new(calls), new(calls)
	_, err := b.Subscribe("t", "stuck", recording(stuck, func(Message) error {
		<-release
		return nil
	}), LaneSize(4), WhenLaneFull(policy))
	require.NoError(t, err)
	_, err = b.Subscribe("t", "other", okHandler(other))
	require.NoError(t, err)
	publishN(t, b, "t", "m", 1) // m-0 runs
	idle()
	return release, stuck, other
}

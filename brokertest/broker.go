package brokertest

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
)

// TestBroker runs the conformance suite for a broker and its transport: the
// contract of package broker (delivery, retries, dead letters, dedup,
// redrive, per-key order, Stats, middleware and publish hooks, Unsubscribe
// and Close) that must hold whatever carries the messages.
//
// newBroker is called once per subtest with that subtest's t and the
// suite's options (a discarding logger, a retry policy of 2 retries 10 ms
// apart, and the middleware or publish hook the subtest needs); it must
// return a running broker built with them, plus whatever the transport
// needs: broker.WithTransport and the transport's stores, appended after
// the suite's options (so an appended WithLogger wins). It must not set a
// retry policy, middleware or publish hooks of its own. For the built-in
// in-memory transport it is just broker.New(opts...).
//
// The suite closes every broker it gets when the subtest ends (Close is
// safe to call twice, so newBroker may register its own Close too); newBroker
// releases what the transport holds (a connection, an embedded server) with
// t.Cleanup, which runs after the suite's Close.
//
// Each subtest uses a topic of its own, named from the subtest, a random
// tag drawn per run and a counter, of letters, digits and '-' only
// ("bt-fields-3fa9c1-1"), so subtests never see each other's messages, dead
// letters or counters even when the brokers share a server and stores.
// Subscriber names are short lower-case words. The suite waits for what it
// expects by polling, up to WaitTimeout, and never fails because something
// took long within it; it times nothing except that a RetryAfter delay is
// not cut short.
//
// The subtests (one property each):
//
//   - Publish/Fields: the handler gets the message once, with ID, Topic,
//     Key, Payload (every byte value), Headers intact, Attempt 1 and
//     PublishedAt set.
//   - Publish/InvalidMessage/*: a message without ID or Topic is refused with
//     an error wrapping broker.ErrInvalidMessage and delivered to no one.
//   - Publish/FanOut: two subscribers each get every message once, and each
//     gets its own copy of Headers.
//   - Retry/Attempts: a handler failing twice then succeeding sees attempts
//     1, 2, 3 and leaves no dead letter.
//   - Retry/ByCode/*: RetryPolicy.ByCode rules set the attempts of their
//     codes (more retries; NoRetries = never, reason "permanent"; a rule
//     that sets only its backoff keeps the policy's MaxRetries), other
//     codes follow the policy.
//   - Retry/RetryAfter: broker.RetryAfter(err, d) delays the next attempt by
//     at least d.
//   - DeadLetter/*: a permanent error (one attempt, reason "permanent"),
//     exhausted retries (MaxRetries+1 attempts, "exhausted"), a panic (code
//     "panic", retried like any error: "exhausted") and an ErrorCoder's
//     code end in one dead letter with every
//     field: ID, Message (payload, headers, last Attempt, PublishedAt),
//     Subscriber, Attempts, ErrorCode, Error, Retryable, Reason, FailedAt.
//   - Dedup: a message ID published again after it was delivered is not
//     handled again (skipped with WithoutDedup).
//   - Redrive: a redriven dead letter is delivered again from attempt 1 to
//     the subscriber that failed it, no other, and leaves the store.
//   - Redrive/FailsAgain: a redriven message that fails again is retried
//     (attempts 1, 2, 3 again) and dead-lettered again; Stats count it
//     routed once per publish and once per redrive.
//   - KeyOrder: with Concurrency(4), messages of one Key run one at a time in
//     publish order, also when one of them fails once and is retried.
//   - Stats: at a quiet moment Published counts the publishes and, for every
//     subscriber, Routed = Delivered + Deduplicated + DeadLettered + Queued +
//     InFlight, with the expected Delivered, DeadLettered, Attempts and
//     Retries.
//   - Middleware: broker middleware sees each attempt, with its number and
//     error code.
//   - PublishHook: a header added by a publish hook reaches the handler, the
//     caller's map is untouched, and a hook's error refuses the message.
//   - Unsubscribe: Unsubscribe waits for the subscription's running handler;
//     after it returns no handler of the subscription runs, and its name can
//     subscribe again.
//   - Close/Returns: Close returns nil when nothing had to be cut off; then
//     Publish, Subscribe and Redrive return errors matching broker.ErrClosed
//     and a second Close returns the first's result.
//   - Close/CancelsHandlers: when Close's context ends while a handler runs,
//     the handler's context is cancelled with a cause matching
//     broker.ErrClosed, Close returns (the handler returns at once, well
//     within broker.ShutdownGrace) and the message is not attempted again.
func TestBroker(t *testing.T, newBroker func(t *testing.T, opts ...broker.Option) *broker.Broker, opts ...Option) {
	t.Helper()
	if newBroker == nil {
		t.Fatal("brokertest: TestBroker: nil newBroker")
	}
	brokerSuite(stdT{t}, func(t tb, opts ...broker.Option) *broker.Broker {
		return newBroker(testingT(t), opts...)
	}, buildOptions(opts))
}

// suitePolicy is the retry policy the suite gives every broker: short
// constant backoffs, so that retries cost the run little.
func suitePolicy() broker.RetryPolicy {
	return broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(10 * time.Millisecond)}
}

// slack is how far a time the broker stamps may lie outside the interval it
// was stamped in: room for a transport that stores times coarser than the
// nanosecond, or a wall clock stepped meanwhile.
const slack = time.Second

type bSuite struct {
	newBroker func(tb, ...broker.Option) *broker.Broker
	o         options
	tag       string       // random, per run: in every topic name
	topics    atomic.Int64 // topics named so far
}

func brokerSuite(t tb, newBroker func(tb, ...broker.Option) *broker.Broker, o options) {
	t.Helper()
	if len(o.invalid) > 0 {
		t.Fatalf("brokertest: invalid options: %s", strings.Join(o.invalid, "; "))
	}
	s := &bSuite{newBroker: newBroker, o: o, tag: fmt.Sprintf("%06x", rand.Uint32()&0xffffff)}
	t.run("Publish", func(t tb) {
		t.run("Fields", s.publishFields)
		t.run("InvalidMessage", s.publishInvalid)
		t.run("FanOut", s.fanOut)
	})
	t.run("Retry", func(t tb) {
		t.run("Attempts", s.retryAttempts)
		t.run("ByCode", s.retryByCode)
		t.run("RetryAfter", s.retryAfter)
	})
	t.run("DeadLetter", s.deadLetter)
	if !o.noDedup {
		t.run("Dedup", s.dedup)
	}
	t.run("Redrive", s.redrive)
	t.run("Redrive/FailsAgain", s.redriveFailsAgain)
	t.run("KeyOrder", s.keyOrder)
	t.run("Stats", s.stats)
	t.run("Middleware", s.middleware)
	t.run("PublishHook", s.publishHook)
	t.run("Unsubscribe", s.unsubscribe)
	t.run("Close", func(t tb) {
		t.run("Returns", s.closeReturns)
		t.run("CancelsHandlers", s.closeCancelsHandlers)
	})
}

// env is one subtest's broker, topic, and what its handlers saw.
type env struct {
	t      tb
	s      *bSuite
	b      *broker.Broker
	topic  string
	giveUp chan struct{} // closed when the subtest ends: handlers that block return

	mu       sync.Mutex // guards the fields below: handlers run concurrently
	calls    []call
	barriers int
}

// call is one handler call.
type call struct {
	sub string         // the subscriber
	msg broker.Message // as the handler got it (Headers copied before the handler ran)
	at  time.Time      // when the call started
}

// barrierPrefix starts the IDs of the messages settle publishes; no other
// message of the suite has it.
const barrierPrefix = "barrier-"

// start returns a new broker for subtest t, built with the suite's options
// and opts, on a topic of its own named after short. The broker is closed
// when the subtest ends.
func (s *bSuite) start(t tb, short string, opts ...broker.Option) *env {
	t.Helper()
	base := []broker.Option{broker.WithLogger(slog.New(slog.DiscardHandler)), broker.WithRetryPolicy(suitePolicy())}
	b := s.newBroker(t, append(base, opts...)...)
	if b == nil {
		t.Fatalf("brokertest: newBroker returned nil")
	}
	e := &env{t: t, s: s, b: b, giveUp: make(chan struct{}),
		topic: fmt.Sprintf("bt-%s-%s-%d", short, s.tag, s.topics.Add(1))}
	t.Cleanup(e.closeAtEnd) // runs last
	t.Cleanup(func() { close(e.giveUp) })
	return e
}

// closeAtEnd closes the broker (again, if the subtest did) with the wait
// timeout as its deadline.
func (e *env) closeAtEnd() {
	if ok, _ := e.close(e.s.o.wait); !ok {
		e.t.Errorf("Close with a deadline %v away did not return within %v more", e.s.o.wait, 2*broker.ShutdownGrace)
	}
}

// close calls Close with a context that ends after d, and returns whether
// it returned within d plus twice ShutdownGrace (its deadline is d plus
// ShutdownGrace; one more grace of slack for a real, loaded clock; if
// not, it is left running) and its result.
func (e *env) close(d time.Duration) (returned bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.b.Close(ctx) }() // ends when Close returns
	timer := time.NewTimer(d + 2*broker.ShutdownGrace)
	defer timer.Stop()
	select {
	case err := <-done:
		return true, err
	case <-timer.C:
		return false, nil
	}
}

// handler returns a handler for subscriber sub that records each call and
// then runs f (nil: succeed). Barrier messages are recorded and succeed
// without running f.
func (e *env) handler(sub string, f broker.Handler) broker.Handler {
	return func(ctx context.Context, m broker.Message) error {
		rec := m
		rec.Headers = maps.Clone(m.Headers)
		e.mu.Lock()
		e.calls = append(e.calls, call{sub: sub, msg: rec, at: time.Now()})
		e.mu.Unlock()
		if f == nil || strings.HasPrefix(m.ID, barrierPrefix) {
			return nil
		}
		return f(ctx, m)
	}
}

// subscribe subscribes name on the env's topic with e.handler(name, f).
func (e *env) subscribe(name string, f broker.Handler, opts ...broker.SubscribeOption) *broker.Subscription {
	e.t.Helper()
	sub, err := e.b.Subscribe(e.topic, name, e.handler(name, f), opts...)
	if err != nil {
		e.t.Fatalf("Subscribe(%q, %q): %v", e.topic, name, err)
	}
	return sub
}

// publish publishes m on the env's topic (a copy of its Headers and
// Payload, so that what the test compares with cannot be changed by the
// broker).
func (e *env) publish(m broker.Message) {
	e.t.Helper()
	m.Topic = e.topic
	m.Headers = maps.Clone(m.Headers)
	m.Payload = slices.Clone(m.Payload)
	if err := e.b.Publish(e.t.Context(), m); err != nil {
		e.t.Fatalf("Publish(%q): %v", m.ID, err)
	}
}

// settle publishes a barrier message with the given Key and waits until
// every named subscriber has handled it. Messages of the Key published
// before it have then ended at those subscribers (per-key order), so what a
// handler saw can be checked for what must not have happened.
func (e *env) settle(key string, subs ...string) {
	e.t.Helper()
	e.mu.Lock()
	e.barriers++
	id := fmt.Sprintf("%s%d", barrierPrefix, e.barriers)
	e.mu.Unlock()
	e.publish(broker.Message{ID: id, Key: key})
	e.wait(fmt.Sprintf("the barrier message %q (Key %q) at %q, published after the others", id, key, subs), func() bool {
		for _, sub := range subs {
			if len(e.callsOf(sub, id)) == 0 {
				return false
			}
		}
		return true
	})
}

// wait polls cond until it holds, and fails the subtest if it does not
// within the wait timeout.
func (e *env) wait(what string, cond func() bool) {
	e.t.Helper()
	if !e.poll(cond) {
		e.t.Fatalf("waited %v for %s", e.s.o.wait, what)
	}
}

// poll polls cond until it holds (true) or the wait timeout passed.
func (e *env) poll(cond func() bool) bool {
	deadline := time.Now().Add(e.s.o.wait)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-tick.C:
		case <-e.t.Context().Done():
			return cond()
		}
	}
	return true
}

// await waits for a value from ch, failing the subtest after the wait
// timeout.
func await[T any](e *env, what string, ch <-chan T) T {
	e.t.Helper()
	timer := time.NewTimer(e.s.o.wait)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		e.t.Fatalf("waited %v for %s", e.s.o.wait, what)
		var zero T
		return zero // not reached: Fatalf ends the goroutine
	}
}

// callsOf returns the calls of subscriber sub for message ID id, in the
// order they started.
func (e *env) callsOf(sub, id string) []call {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []call
	for _, c := range e.calls {
		if c.sub == sub && c.msg.ID == id {
			out = append(out, c)
		}
	}
	return out
}

// attempts returns the Attempt of each call of sub for id.
func (e *env) attempts(sub, id string) []int {
	var out []int
	for _, c := range e.callsOf(sub, id) {
		out = append(out, c.msg.Attempt)
	}
	return out
}

// nonBarrier returns the IDs of the messages other than barriers that sub
// was called for, in call order.
func (e *env) nonBarrier(sub string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, c := range e.calls {
		if c.sub == sub && !strings.HasPrefix(c.msg.ID, barrierPrefix) {
			out = append(out, c.msg.ID)
		}
	}
	return out
}

// deadLetters lists the dead letters of the env's topic.
func (e *env) deadLetters() []broker.DeadLetter {
	e.t.Helper()
	list, err := e.b.DeadLetters().List(e.t.Context(), broker.DeadLetterFilter{Topic: e.topic})
	if err != nil {
		e.t.Fatalf("DeadLetters().List(topic %q): %v", e.topic, err)
	}
	return list
}

// awaitDeadLetters waits until the topic has at least n dead letters and
// returns them.
func (e *env) awaitDeadLetters(n int) []broker.DeadLetter {
	e.t.Helper()
	var list []broker.DeadLetter
	e.wait(fmt.Sprintf("%d dead letter(s) of topic %q in the store", n, e.topic), func() bool {
		list = e.deadLetters()
		return len(list) >= n
	})
	return list
}

// subStats returns the Stats of subscriber name on the env's topic.
func (e *env) subStats(name string) broker.SubscriberStats {
	return e.b.Stats().Topics[e.topic].Subscribers[name]
}

// codeError is a handler error that names its own code (broker.ErrorCoder).
type codeError struct{ code, text string }

func (e codeError) Error() string     { return e.text }
func (e codeError) ErrorCode() string { return e.code }

// allBytes is a payload of every byte value, invalid UTF-8 included.
func allBytes() []byte {
	p := make([]byte, 256)
	for i := range p {
		p[i] = byte(i)
	}
	return p
}

// testHeaders are the headers of the suite's messages: trace context, a
// mixed-case name and a non-ASCII value.
func testHeaders() map[string]string {
	return map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"X-Tenant":    "acme",
		"greeting":    "héllo, 世界",
	}
}

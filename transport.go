package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// This file is the transport seam: what another transport (NATS
// JetStream, in module natsjs) implements to carry messages in place of the
// built-in in-memory queues and lanes, and the broker's side of it. The
// delivery engine is the one the in-memory lane uses (pipeline.turn in
// delivery.go: dedup check, attempt with deadline and guards, classify,
// retry decision with budget, dead letter; recorder.go: counters, observer,
// logs); here its verdict becomes Ack, Retry or Terminate, and hold.go
// holds a delivery for the rate limit and the breaker first.

// Transport carries messages between Publish and the subscribers' handlers,
// in place of the built-in in-memory queues (WithTransport). The broker
// keeps everything else: validation, publish hooks, middleware, dedup,
// attempts, classification, the retry decision, dead letters, Stats, the
// Observer and logs. A Transport must be safe for concurrent use.
type Transport interface {
	// Publish stores msg (validated, PublishedAt set) for the current
	// subscribers of msg.Topic and returns once it is stored. It returns
	// an error wrapping ErrQueueFull when the topic has no room by the
	// time ctx ends (the broker gives it the publish timeout as a
	// deadline); with a publish timeout of 0 ctx has no deadline, and a
	// full topic fails at once.
	Publish(ctx context.Context, msg Message) error
	// Subscribe starts delivering the messages of sub.Topic published
	// from now on to the subscriber sub.Name, calling sub.Deliver for each
	// delivery, at most sub.Concurrency at once. A subscriber name is one
	// consumer: transports that share work between processes give each
	// message to one of the processes subscribed under that name.
	Subscribe(sub TransportSubscriber) (TransportSubscription, error)
	// Redrive hands dl.Message back to the one subscriber dl.Subscriber on
	// dl.Message.Topic, to be delivered again from attempt 1 with
	// Delivery.Redriven true. Its ctx is Publish's (the publish timeout as
	// the deadline, none with a timeout of 0), and a full topic is
	// answered as there.
	Redrive(ctx context.Context, dl DeadLetter) error
	// Close releases the transport. The broker calls it last in Close,
	// after every subscription stopped.
	Close(ctx context.Context) error
}

// TransportSubscriber is what a Transport needs to deliver to one
// subscriber.
type TransportSubscriber struct {
	Topic, Name string
	// Concurrency is the most Deliver calls that may run at once.
	Concurrency int
	// Ordered asks for strict order through retries of keyless messages
	// too (see Ordered); a transport that cannot give it returns an
	// error wrapping ErrInvalidOption.
	Ordered bool
	// Deliver runs the broker's delivery engine for d: on return, d was
	// acknowledged, handed back for a retry, or terminated — or, when
	// the subscription is stopping, handed back at once (Retry(0)).
	Deliver func(d Delivery)
	// Stopping is closed when the subscription must stop at once (its
	// Unsubscribe's or Close's deadline passed): Deliver then hands every
	// delivery back unstarted, and the transport may skip work of its own
	// for them (a lookup before Deliver, say). It is also closed once the
	// subscription ended.
	Stopping <-chan struct{}
}

// TransportSubscription is a running subscription of a Transport.
type TransportSubscription interface {
	// Stop stops fetching and returns once no Deliver call runs, or when
	// ctx ends (with ctx's error). Messages not yet acknowledged stay with
	// the transport, for another process subscribed under the name or for
	// the next subscription.
	Stop(ctx context.Context) error
}

// Delivery is one delivery of a message by a Transport to a subscriber.
// The broker calls exactly one of Ack, Retry and Terminate, once, and
// KeepAlive any number of times before that.
type Delivery interface {
	// Message is the message, with Attempt set to the transport's count
	// of deliveries to this subscriber (1 for the first).
	Message() Message
	// Redriven reports a dead letter sent back by Redrive, on every
	// delivery of it (its retries too): it skips the dedup check. Its
	// Attempt counts the deliveries of the redriven copy, from 1, so it is
	// retried and dead-lettered again under the policy like any message.
	Redriven() bool
	// Ack says the message ended here: delivered, deduplicated or, after
	// Terminate's dead letter was stored, nothing more to do.
	Ack() error
	// Retry hands the message back, to be delivered again (Attempt + 1)
	// no sooner than delay. The ordering key stays held meanwhile where
	// the transport keeps order.
	Retry(delay time.Duration) error
	// Terminate ends the message with a reason after its dead letter was
	// stored: it is not delivered again.
	Terminate(reason string) error
	// KeepAliveEvery is how often a running handler must be reported
	// alive (KeepAlive) for the transport not to deliver the message
	// again meanwhile; 0 means never.
	KeepAliveEvery() time.Duration
	// KeepAlive tells the transport the handler still runs.
	KeepAlive() error
}

// DeadLetterIDer is a Delivery that names its dead letter, so that writing
// it again after a crash (before Terminate reached the transport) replaces
// the first instead of adding a second.
type DeadLetterIDer interface {
	DeadLetterID() string
}

// WithTransport makes the broker carry messages with t instead of its
// in-memory queues (for durability across restarts, or sharing one
// subscriber's work between processes; see module natsjs). The broker
// calls t.Close in Close. nil is refused.
//
// Every SubscribeOption means the same over a transport, with the same
// delivery engine: the retry policy, RetryBudget, HandlerTimeout,
// Concurrency (at most that many handlers at once in this process),
// CircuitBreaker and RateLimit. A delivery waiting for a rate-limit token
// or for an open breaker is held in the process, kept alive, and runs at
// the attempt number it came with; with all Concurrency of them held the
// transport fetches nothing more. Refused by Subscribe: LaneSize and
// WhenLaneFull other than their defaults, since the stream is the buffer
// (bound it with the transport's limits, natsjs's WithQueueSize).
//
// What else changes: Close and Unsubscribe leave unfinished messages with
// the transport (they are not dead-lettered with reasons "shutdown" and
// "unsubscribed"); Stats count what this process did (Queued is what it
// handed back for a retry and was not delivered here again).
func WithTransport(t Transport) Option {
	return func(c *config) error {
		if t == nil || isNilValue(t) {
			return fmt.Errorf("%w: nil transport (%T)", ErrInvalidOption, t)
		}
		c.transport = t
		return nil
	}
}

// remote is the broker's side of its transport: the topics this process
// published to or subscribed on, with their counters.
type remote struct {
	t      Transport
	mu     sync.Mutex
	topics map[string]*remoteTopic
}

type remoteTopic struct {
	tally  *tally // its subs map is guarded by remote.mu
	active map[string]*Subscription
}

func newRemote(t Transport) *remote {
	return &remote{t: t, topics: make(map[string]*remoteTopic)}
}

// topicLocked returns the topic's record, creating it. r.mu must be held.
func (r *remote) topicLocked(name string) *remoteTopic {
	rt := r.topics[name]
	if rt == nil {
		rt = &remoteTopic{tally: newTally(), active: make(map[string]*Subscription)}
		r.topics[name] = rt
	}
	return rt
}

// remoteSub is the transport's part of a Subscription.
type remoteSub struct {
	ts   TransportSubscription
	once sync.Once      // starts stop
	stop *transportCall // the transport's Stop, started by the first stop
}

// Transport returns the transport the broker was built with
// (WithTransport), or nil for the in-memory broker: for what a transport
// offers beyond the interface, such as the backlog across processes of
// natsjs's ConsumerInfo.
func (b *Broker) Transport() Transport {
	if b.remote == nil {
		return nil
	}
	return b.remote.t
}

// publishRemote hands a valid, stamped message to the transport.
func (b *Broker) publishRemote(ctx context.Context, msg Message) error {
	r := b.remote
	pctx, cancel := b.publishCtx(ctx)
	err := b.guard.call("Transport", "Publish", func() error { return r.t.Publish(pctx, msg) })
	cancel()
	return b.remoteOutcome(ctx, msg, err)
}

// publishCtx is the context a transport's Publish or Redrive gets: the
// caller's cancellation, and the publish timeout as its deadline (the
// caller's, if sooner). With a timeout of 0 it has no deadline, whatever
// the caller's, so that a full stream fails at once as the in-memory queue
// does; the caller's cancellation (its deadline included) still ends it.
func (b *Broker) publishCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx == nil {
		ctx = context.Background()
	}
	if d := b.cfg.publishTimeout; d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return noDeadline{ctx}, func() {}
}

// noDeadline is ctx without its deadline: its cancellation, error, cause
// and values are ctx's.
type noDeadline struct{ context.Context }

// Deadline reports none.
func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// remoteOutcome records what the transport answered for msg (err), as
// Publish does, and returns Publish's error.
func (b *Broker) remoteOutcome(ctx context.Context, msg Message, err error) error {
	r := b.remote
	r.mu.Lock()
	rt := r.topicLocked(msg.Topic)
	r.mu.Unlock()
	if err == nil {
		rt.tally.published.Add(1)
		if b.obs != nil {
			b.obs.Published(PublishEvent{Topic: msg.Topic, MessageID: msg.ID, PublishedAt: msg.PublishedAt, Duration: b.publishTime(&msg)})
		}
		return nil
	}
	if !errors.Is(err, ErrQueueFull) && ctx != nil && ctx.Err() != nil {
		err = fmt.Errorf("broker: publish %q to %q: %w (%w)", msg.ID, msg.Topic, ctx.Err(), err)
	} else {
		err = fmt.Errorf("broker: publish %q to %q: %w", msg.ID, msg.Topic, err)
	}
	if errors.Is(err, ErrQueueFull) || (ctx != nil && ctx.Err() != nil) {
		rt.tally.rejected.Add(1)
		if b.obs != nil {
			b.obs.Rejected(RejectEvent{Topic: msg.Topic, MessageID: msg.ID, Err: err, Duration: b.publishTime(&msg)})
		}
	}
	return err
}

// subscribeRemote subscribes through the transport.
func (b *Broker) subscribeRemote(topicName, name string, sc subConfig, policy RetryPolicy, h Handler, obs Observer) (*Subscription, error) {
	switch {
	case sc.laneSize != b.cfg.laneSize:
		return nil, fmt.Errorf("%w: LaneSize is the in-memory lane's: over a transport the stream is the buffer; bound it with the transport's stream limits (natsjs: WithQueueSize) (subscribe %q to %q)", ErrInvalidOption, name, topicName)
	case sc.whenFull != Block:
		return nil, fmt.Errorf("%w: WhenLaneFull is the in-memory lane's: over a transport a full stream refuses the publish (ErrQueueFull); size it with the transport's stream limits (natsjs: WithQueueSize) (subscribe %q to %q)", ErrInvalidOption, name, topicName)
	}
	r := b.remote
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	r.mu.Lock()
	rt := r.topicLocked(topicName)
	if _, dup := rt.active[name]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %q on topic %q", ErrDuplicateSubscriber, name, topicName)
	}
	c := rt.tally.counter(name)
	r.mu.Unlock()

	s := &Subscription{b: b, topicName: topicName, name: name, c: c, workers: sc.concurrency,
		unsubbed: make(chan struct{}),
		stopped:  make(chan struct{}),
		remote:   &remoteSub{},
	}
	s.hold = newHold(s, sc)
	s.ctx, s.cancel = context.WithCancelCause(b.abortCtx)
	s.pipe = b.newPipeline(topicName, name, c, h, obs, policy, sc, func(string, bool) {}, s.ctx)
	s.pipe.held, s.pipe.maxAttempts = true, policy.maxAttempts()
	s.pipe.rec.keep = true
	var ts TransportSubscription
	err := b.guard.call("Transport", "Subscribe", func() (err error) {
		ts, err = r.t.Subscribe(TransportSubscriber{
			Topic: topicName, Name: name, Concurrency: sc.concurrency, Ordered: sc.ordered,
			Deliver: s.deliverRemote, Stopping: s.ctx.Done(),
		})
		return err
	})
	if err != nil {
		s.cancel(errReleased)
		return nil, fmt.Errorf("broker: subscribe %q to %q: %w", name, topicName, err)
	}
	s.remote.ts = ts
	r.mu.Lock()
	rt.active[name] = s
	r.mu.Unlock()
	return s, nil
}

// maxAttempts is the most attempts the policy allows any code.
func (p RetryPolicy) maxAttempts() int {
	n := max(p.MaxRetries, 0)
	for _, r := range p.ByCode {
		n = max(n, r.MaxRetries)
	}
	return n + 1
}

// deliverRemote runs the delivery engine (turn) for a transport's
// Delivery, once the rate limit and the breaker let it (hold), and tells
// the transport the verdict: Ack, Terminate, Retry after the delay, or
// Retry(0) for what a stop at once left unfinished.
func (s *Subscription) deliverRemote(d Delivery) {
	msg := d.Message()
	c := s.c
	if msg.Attempt <= 1 || !s.unpark() {
		c.routed.Add(1) // new to this process
	}
	// In flight until the verdict is counted, and no later: once the
	// transport hears it, the Key is free and the next message may be
	// counted before this goroutine runs on.
	c.inFlight.Add(1)
	inFlight := true
	left := func() {
		if inFlight {
			inFlight = false
			c.inFlight.Add(-1)
		}
	}
	defer left()
	if msg.Attempt < 1 {
		msg.Attempt = 1
	}
	if s.ctx.Err() != nil { // stopping at once: it stays with the transport, no store asked
		s.handBack(d, 0, left)
		return
	}
	probe := false
	if s.hold != nil {
		var ok bool
		if probe, ok = s.hold.wait(s.ctx, d); !ok { // stopping at once while held: not attempted
			s.handBack(d, 0, left)
			return
		}
	}
	// Redriven skips dedup; Attempt is the transport's count, from 1 again after Redrive.
	it := laneItem{env: envelope{msg: msg}, redriven: d.Redriven()}
	r := s.pipe.turn(s.ctx, &it, nil, 0, d)
	if s.hold != nil {
		s.hold.done(r.health, probe)
	}
	switch {
	case r.cutOff:
		s.handBack(d, 0, left)
	case !r.ended:
		s.handBack(d, r.delay, left)
	case r.reason == "":
		left() // counted by turn
		s.pipe.tell("Ack", d.Ack())
	default:
		left()
		s.pipe.tell("Terminate", d.Terminate(r.reason))
	}
}

// unpark counts a retry delivered back to this process (to any
// subscription of the name); false if none was waiting here (another
// process, or an earlier run, asked for it).
func (s *Subscription) unpark() bool {
	for {
		n := s.c.handedBack.Load()
		if n <= 0 {
			return false
		}
		if s.c.handedBack.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// handBack returns d to the transport, to come back after delay (0 for a
// delivery left unfinished): counted as queued there until it is
// delivered here again (unpark).
func (s *Subscription) handBack(d Delivery, delay time.Duration, left func()) {
	s.c.handedBack.Add(1)
	left()
	s.pipe.tell("Retry", d.Retry(delay))
}

// attemptKeptAlive runs the attempt on a goroutine of its own, telling the
// transport the handler is alive as often as it asks meanwhile. The
// goroutine is what keeps the transport's own goroutine (which called
// Deliver) safe from a handler that calls runtime.Goexit: such an attempt
// fails as a panic would, and the delivery is settled as usual.
func (p *pipeline) attemptKeptAlive(ctx context.Context, d Delivery, m *Message) (error, failure, timing) {
	r := &attemptRun{done: make(chan struct{})}
	go p.runAttempt(ctx, r, m)
	every := d.KeepAliveEvery()
	if every <= 0 {
		<-r.done
		return r.err, r.f, r.took
	}
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return r.err, r.f, r.took
		case <-t.C:
			p.tell("KeepAlive", d.KeepAlive())
			t.Reset(every)
		}
	}
}

// attemptRun is one attempt on a goroutine of its own: its outcome, set
// before done is closed. (One allocation for the three results, which a
// closure captured one by one before; with a timer instead of a ticker,
// two allocations fewer per delivery: 48 -> 46, BenchmarkPhases deliver.)
type attemptRun struct {
	err  error
	f    failure
	took timing
	done chan struct{}
}

// runAttempt runs r's attempt of m and closes r.done, also when the
// handler calls runtime.Goexit (the attempt then fails as a panic).
func (p *pipeline) runAttempt(ctx context.Context, r *attemptRun, m *Message) {
	returned := false
	defer func() {
		if !returned {
			r.err, r.f = goexitFailure()
		}
		close(r.done)
	}()
	r.err, r.f, r.took = p.attempt(ctx, m)
	returned = true
}

// tell logs a transport's refusal of an acknowledgement: the transport
// will deliver the message again, which at-least-once allows.
func (p *pipeline) tell(op string, err error) {
	if err == nil {
		return
	}
	p.rec.log.LogAttrs(context.Background(), slog.LevelWarn, "broker: transport refused "+op+"; the message may be delivered again",
		slog.String("topic", p.rec.topic), slog.String("subscriber", p.rec.subscriber), slog.String("error", err.Error()))
}

// stopRemote is a stop of the transport's subscription (Unsubscribe's,
// or Close's for each subscription): the transport's Stop, started by the
// first stop, is waited for until ctx ends; then the handlers' contexts
// are cancelled (cause ErrUnsubscribed or ErrClosed) and the stop that
// cut the subscription off waits at most grace more (Unsubscribe:
// ShutdownGrace, its deadline; Close: handlerGrace, the rest is for the
// transport's Close), and counts the call abandoned then. Another stop
// waits for the call or that deadline (s.stopped) and counts nothing.
// Unfinished messages stay with the transport.
func (s *Subscription) stopRemote(ctx context.Context, cause error, grace time.Duration) error {
	rs := s.remote
	rs.once.Do(func() {
		rs.stop = s.b.callTransport("Stop", func() error { return rs.ts.Stop(context.WithoutCancel(ctx)) }) // ends when no Deliver runs
	})
	err := s.awaitStop(ctx, cause, grace, rs.stop)
	s.cancel(errReleased)
	s.hold.stop()
	r := s.b.remote
	r.mu.Lock()
	if rt := r.topics[s.topicName]; rt != nil && rt.active[s.name] == s {
		delete(rt.active, s.name)
		rt.tally.left(s.name)
	}
	r.mu.Unlock()
	return err
}

// awaitStop waits for the transport's Stop (call) for the stop of cause,
// as stopRemote says.
func (s *Subscription) awaitStop(ctx context.Context, cause error, grace time.Duration, call *transportCall) error {
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
	case <-s.ctx.Done(): // another stop cut it off (or the call returned and a stop ended)
	}
	s.cancel(cause)
	if context.Cause(s.ctx) != cause { // the other stop's: it counts the call
		if waitOr(call.done, s.stopped) {
			return call.err
		}
		return nil
	}
	defer close(s.stopped)
	gctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if waitOr(call.done, gctx.Done()) {
		return call.err
	}
	// The transport's Stop (a handler that ignores its cancelled context,
	// or the transport itself) is abandoned.
	s.b.cfg.logger.LogAttrs(context.Background(), slog.LevelError,
		"broker: the transport's Stop had not returned in the stop's grace after its ctx ended (a handler ignoring its cancelled context, or the transport): abandoned",
		slog.String("topic", s.topicName), slog.String("subscriber", s.name))
	return &DrainError{Reason: abortReason(s.ctx), Abandoned: 1, Err: ctx.Err()}
}

// transportCall is a call of the transport's (Stop, Close) on a goroutine
// of its own: err is set before done is closed.
type transportCall struct {
	done chan struct{}
	err  error
}

// callTransport runs the transport's method op (f) on a goroutine of its
// own, for a stop to wait for until its deadline; guarded: a panic or a
// runtime.Goexit in it is its error.
func (b *Broker) callTransport(op string, f func() error) *transportCall {
	c := &transportCall{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.err = fmt.Errorf("broker: transport %s called runtime.Goexit", op)
		c.err = b.guard.call("Transport", op, f)
	}()
	return c
}

// closeRemote is Close with a transport: it stops every subscription
// (stopRemote: the Stop calls abandoned by a stop of its own count in its
// DrainError, not those an Unsubscribe that cut one off first abandoned),
// then closes the transport, by ShutdownGrace after ctx ended; a
// transport's Close still running then is abandoned (logged).
func (b *Broker) closeRemote(ctx context.Context) error {
	r := b.remote
	r.mu.Lock()
	var subs []*Subscription
	for _, rt := range r.topics {
		for _, s := range rt.active {
			subs = append(subs, s)
		}
	}
	r.mu.Unlock()
	deadline, cancel := context.WithCancel(context.Background()) // the stop's
	defer cancel()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(ShutdownGrace, cancel) })()
	errs := make([]error, len(subs)+1)
	var wg sync.WaitGroup
	for i, s := range subs {
		wg.Go(func() { errs[i] = s.stopRemote(ctx, errShutdown, handlerGrace) })
	}
	wg.Wait()
	b.abort(errShutdown)
	closed := b.callTransport("Close", func() error { return r.t.Close(ctx) })
	if waitOr(closed.done, deadline.Done()) {
		errs[len(subs)] = closed.err
	} else {
		b.cfg.logger.LogAttrs(context.Background(), slog.LevelError, "broker: transport Close had not returned ShutdownGrace after the ctx of Close ended: abandoned")
		errs[len(subs)] = &DrainError{Reason: ReasonShutdown, Abandoned: 1, Err: ctx.Err()}
	}
	// One DrainError for the stop, with the calls it abandoned added up.
	var abandoned int
	var other []error
	for _, err := range errs {
		var de *DrainError
		if errors.As(err, &de) {
			abandoned += de.Abandoned
		} else if err != nil {
			other = append(other, err)
		}
	}
	if abandoned > 0 {
		other = append([]error{&DrainError{Reason: ReasonShutdown, Abandoned: abandoned, Err: ctx.Err()}}, other...)
	}
	return errors.Join(other...)
}

// statsRemote adds the transport's topics to st.
func (b *Broker) statsRemote(st *Stats) {
	r := b.remote
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, rt := range r.topics {
		ts := TopicStats{
			Published: rt.tally.published.Load(), Rejected: rt.tally.rejected.Load(),
			Subscribers: make(map[string]SubscriberStats, len(rt.tally.subs)),
		}
		for sub, c := range rt.tally.subs {
			ss := c.snapshot()
			// Handed back and not delivered here again: queued with the
			// transport, also once the name left (so Stats still add up;
			// another process may have finished them).
			ss.Queued = int(max(c.handedBack.Load(), 0))
			ss.Parked = ss.Queued
			if s := rt.active[sub]; s != nil {
				ss.Active, ss.Concurrency = true, s.workers
				ss.Breaker, _ = s.hold.state()
				if s.pipe.budget != nil {
					ss.RetryBudgetLeft = s.pipe.budget.left(time.Now())
				}
			}
			ts.Subscribers[sub] = ss
		}
		st.Topics[name] = ts
	}
}

package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"
)

// This file is the delivery pipeline for one message at one subscriber:
// dedup check → attempt (handler with deadline and panic recovery) →
// classify → retry or dead-letter → record. It does not know about queues,
// lanes or goroutines: the in-memory transport (subscription.go) calls
// deliver from a worker, and a transport that redelivers by itself could
// call attempt once per delivery and act on its step.

// pipeline holds everything needed to deliver to one subscriber; the
// recorder holds its topic, name, observer and logger.
type pipeline struct {
	handler Handler
	timeout time.Duration // per-attempt deadline; 0 = none
	policy  RetryPolicy   // normalized
	dedup   IdempotencyStore
	mem     *MemoryIdempotencyStore // dedup, when it is the default kind: hashed once per delivery
	salt    dedupSalt               // mem's hash of (topic, subscriber)
	ids     *idGuard                // nil unless two workers could hold the same ID at once
	budget  *retryBudget            // nil: retries are not budgeted
	plugins guard                   // for the policy's backoffs
	rec     recorder

	// held: a transport carries the messages; it counts their attempts
	// (Message.Attempt comes set, at most maxAttempts run) and keeps what
	// a stop at once cuts off.
	held        bool
	maxAttempts int

	overflowFault fault // the fault of its overflow dead letters, made once
}

// newPipeline is the delivery pipeline of subscriber name on topicName,
// whatever carries its messages: c are its counters, onDeadLetter counts a
// dead letter by reason (and whether the store refused it for good), and
// stop ends when it must stop at once (the subscription's context).
func (b *Broker) newPipeline(topicName, name string, c *subCounters, h Handler, obs Observer, policy RetryPolicy, sc subConfig,
	onDeadLetter func(reason string, lost bool), stop context.Context) pipeline {
	p := pipeline{
		handler: h, timeout: sc.timeout, policy: policy, dedup: b.dedup, plugins: b.guard,
		rec: recorder{
			topic: topicName, subscriber: name, c: c,
			obs: obs, log: b.cfg.logger, limits: b.logs, dlq: b.dlq, newID: b.newDeadLetterID,
			onDeadLetter: onDeadLetter, stop: stop.Done(), storeCtx: storeContext(stop),
		},
	}
	if sc.concurrency > 1 {
		// Two workers (or two copies a transport hands over at once) may
		// otherwise run one ID at the same time.
		p.ids = newIDGuard()
	}
	if sc.budget != nil {
		p.budget = newRetryBudget(*sc.budget)
	}
	if b.mem != nil {
		p.mem, p.salt = b.mem, b.mem.salt(topicName, name)
	}
	return p
}

// newOverflowError is the error of a subscriber's overflow dead letters.
func newOverflowError(topic, subscriber string) error {
	return fmt.Errorf("%w: lane of %q on topic %q is full", ErrLaneFull, subscriber, topic)
}

// envelope is a message on its way to one subscriber: 128 bytes on 64-bit
// platforms, two cache lines, copied once into the topic queue, once into
// each lane and once out of it.
type envelope struct {
	msg Message // Attempt is 0 until a worker attempts it
	idh idHash  // msg.ID hashed for the default dedup store, once for all subscribers
}

// step is what follows a failed attempt.
type step struct {
	fault                 // the failure
	outcome Outcome       // OutcomeRetry or OutcomeDeadLettered
	delay   time.Duration // before the retry
	reason  string        // dead-letter reason
	took    timing        // the attempt, for the observer
}

// turnResult is a turn's verdict: what it left of a message. A transport
// delivery maps it to Ack (ended, no reason), Terminate (ended with a
// dead-letter reason), Retry(delay) (not ended) or Retry(0) (cutOff); the
// in-memory lane to finish or park.
type turnResult struct {
	ended  bool          // delivered, deduplicated or dead-lettered
	reason string        // ended dead-lettered: the reason; "" delivered or deduplicated
	delay  time.Duration // else: park this long, then run the next turn
	cutOff bool          // a stop at once left it unfinished with the transport (held pipelines only)
	health health        // what the attempt says about the subscriber, for its breaker

	abandoned bool  // a stop gave up on the handler while it ran: nothing was recorded
	err       error // what the abandoned handler returned
}

// turn is the delivery engine, the same for every transport: it runs the
// next attempt of it — after the dedup check, which a redriven dead letter
// skips — and records what followed: the message ended (delivered,
// deduplicated, dead-lettered), or it failed and waits delay for its next
// turn (it.last holds that failure). ctx is cancelled, with errShutdown or
// errUnsubscribed as its cause, when the subscription must stop at once:
// then the in-memory lane's message is dead-lettered with that reason
// instead of being attempted or retried, and a transport's is cut off
// (left with the transport).
//
// h, if not nil, is the worker's hand: it says handPlug while plugged-in
// code runs (the handler: handHandler), and a stop that abandons it there
// sets handAbandoned; then turn records nothing more (the stop does) and
// returns as soon as it can. it is message i of h's; h moves to it (at)
// with the first change the turn makes, the handler's start on the plain
// path: two changes of h for a delivery.
//
// d is the transport's delivery (nil in memory, where h is the worker's;
// a transport's delivery has no hand): its handler runs kept alive, its
// dead letter takes the delivery's ID.
func (p *pipeline) turn(ctx context.Context, it *laneItem, h *hand, i int, d Delivery) turnResult {
	msg := &it.env.msg
	if p.ids != nil {
		if !p.ids.acquire(ctx, msg.ID) {
			h.at(i, 0)
			return p.stopped(ctx, it, h) // stopped while another worker ran this ID
		}
		defer p.ids.release(msg.ID)
	}
	var ref dedupRef
	stored := p.dedup != nil && p.mem == nil // the idempotency store is plugged-in code
	if p.dedup != nil {
		ref = p.dedupKey(&it.env, it.redriven)
		// Checked again before a retry: a copy of the message with another
		// Key may have been delivered while this one was parked.
		if stored && !it.redriven && !h.at(i, 0) {
			return turnResult{ended: true}
		}
		if !it.redriven && p.seen(h, &ref) {
			h.at(i, 0) // no-op after the one above
			p.rec.deduplicated(h, msg, nil)
			return turnResult{ended: true}
		}
	}
	if ctx.Err() != nil {
		h.at(i, 0)
		return p.stopped(ctx, it, h)
	}
	if !p.held {
		msg.Attempt++
	} else if msg.Attempt > p.maxAttempts {
		// Delivered more often than any rule allows: earlier attempts
		// ended without an outcome (the process died during them, or the
		// transport lost their acknowledgement). It is not run again. Its
		// dead letter is exhausted as any: the policy's attempts (at most
		// p.maxAttempts ran), retryable; the text says how often it was
		// delivered.
		f := brokerFault(CodeError, fmt.Errorf("broker: delivered %d times, more than the %d attempts the policy allows: earlier attempts ended without an outcome", msg.Attempt, p.maxAttempts))
		f.retryable = true
		msg.Attempt = p.maxAttempts
		return p.deadLetter(d, h, msg, timing{}, ReasonExhausted, f, false, healthNone)
	}
	if p.budget != nil && msg.Attempt == 1 {
		p.budget.first(time.Now())
	}
	if !h.at(i, handPlug|handHandler) {
		return turnResult{ended: true}
	}
	var (
		err  error
		f    failure
		took timing
	)
	actx := ctx
	if it.redriven {
		actx = context.WithValue(ctx, redrivenKey{}, true) // see Redriven
	}
	if d != nil {
		err, f, took = p.attemptKeptAlive(actx, d, msg)
	} else {
		err, f, took = p.attempt(actx, msg)
	}
	if err == nil && !stored {
		if !h.leaveEnded() {
			return turnResult{abandoned: true, err: err}
		}
		if p.mem != nil {
			p.mem.record(ref.slot)
		}
		p.rec.delivered(h, msg, took)
		return turnResult{ended: true, health: healthOK}
	}
	if !h.leave() {
		return turnResult{abandoned: true, err: err}
	}
	if err == nil {
		if p.record(h, &ref); h.end() {
			p.rec.delivered(h, msg, took)
		}
		return turnResult{ended: true, health: healthOK}
	}
	p.rec.c.failed.Add(1)
	return p.after(ctx, it, err, f, took, h, d)
}

// stopped ends a turn a stop at once cut short before the attempt: in
// memory the message is dead-lettered (cutOff); a transport keeps it.
func (p *pipeline) stopped(ctx context.Context, it *laneItem, h *hand) turnResult {
	if p.held {
		return turnResult{cutOff: true}
	}
	p.cutOff(ctx, it, h, nil)
	return turnResult{ended: true, reason: abortReason(ctx)}
}

// after decides and records what follows a failed attempt of it: a retry
// (it.last holds the failure) or a dead letter, with the retry budget
// spent or not; a transport's message whose attempt a stop at once cut
// short is left with the transport.
func (p *pipeline) after(ctx context.Context, it *laneItem, err error, f failure, took timing, h *hand, d Delivery) turnResult {
	msg := &it.env.msg
	s := p.judge(ctx, msg, err, f, took)
	hl := healthNone
	if s.retryable {
		hl = healthFail
	}
	if p.held && ctx.Err() != nil {
		p.rec.retrying(nil, msg, s.took, 0, s.fault)
		return turnResult{cutOff: true, health: hl}
	}
	if s.outcome == OutcomeRetry && p.budget != nil && !p.budget.spend(time.Now()) {
		s.outcome, s.reason = OutcomeDeadLettered, ReasonBudget
	}
	if s.outcome == OutcomeDeadLettered {
		return p.deadLetter(d, h, msg, s.took, s.reason, s.fault, true, hl)
	}
	if !p.held {
		if it.last == nil {
			it.last = new(step)
		}
		*it.last = s               // before the event: a stop that abandons its hook copies it
		h.update(handJudged, 0, 0) // a Goexit in the event parks it (see worker.replace)
	}
	p.rec.retrying(h, msg, s.took, s.delay, s.fault)
	return turnResult{delay: s.delay, health: hl}
}

// deadLetter stores msg's dead letter (under the delivery's ID when d
// names one) and ends the turn; a transport's message whose dead letter
// the store failed until the stop stays with the transport.
func (p *pipeline) deadLetter(d Delivery, h *hand, msg *Message, took timing, reason string, f fault, attempted bool, hl health) turnResult {
	rec := &p.rec
	if ider, ok := d.(DeadLetterIDer); ok {
		if id := ider.DeadLetterID(); id != "" {
			named := p.rec
			named.newID = func() string { return id }
			rec = &named
		}
	}
	if err := rec.deadLetter(msg, took, reason, f, attempted, nil, h); p.held && err != nil && !errors.Is(err, ErrDeadLetterRefused) {
		return turnResult{cutOff: true, health: hl}
	}
	return turnResult{ended: true, reason: reason, health: hl}
}

// errGoexit is the panic value of an attempt whose handler called
// runtime.Goexit.
var errGoexit = errors.New("handler called runtime.Goexit")

// goexitFailure is the outcome of an attempt whose handler called
// runtime.Goexit: a panic.
func goexitFailure() (error, failure) {
	pe := newPanicError(errGoexit)
	return pe, failure{code: CodePanic, text: pe.Error()}
}

// goexited ends the attempt of it whose handler called runtime.Goexit, as
// if it had panicked (in memory: a transport's attempt runs on a goroutine
// of its own, attemptKeptAlive).
func (p *pipeline) goexited(ctx context.Context, it *laneItem, h *hand) turnResult {
	p.rec.c.failed.Add(1)
	err, f := goexitFailure()
	return p.after(ctx, it, err, f, timing{}, h, nil)
}

// cutOff ends it, which a Close or Unsubscribe whose context ended took
// from its lane (or from the worker that ran it), with the stop's reason
// (see unrun).
func (p *pipeline) cutOff(ctx context.Context, it *laneItem, h *hand, counted func()) {
	p.unrun(it, abortReason(ctx), brokerFault(abortCode(ctx), context.Cause(ctx)), counted, h)
}

// unrun ends it without a new attempt: dead-lettered with reason and f —
// or, once it ran, its last attempt's failure (whose event was emitted
// already) — calling counted once it ended. A copy of an ID already
// delivered here is deduplicated instead (redriving its dead letter would
// run a delivered ID again).
func (p *pipeline) unrun(it *laneItem, reason string, f fault, counted func(), h *hand) {
	msg := &it.env.msg
	if it.last != nil && msg.Attempt > 0 {
		f = it.last.fault
	}
	if p.dedup != nil && !it.redriven {
		if d := p.dedupKey(&it.env, false); p.seen(h, &d) {
			p.rec.deduplicated(h, msg, counted)
			return
		}
	}
	p.rec.deadLetter(msg, timing{}, reason, f, false, counted, h)
}

// dedupRef names one message at this subscriber for the idempotency store:
// the key, and its slot when the store is a MemoryIdempotencyStore.
type dedupRef struct {
	key  DeliveryKey
	slot slot
}

// dedupKey names env for the idempotency store. The default store dates it
// by its PublishedAt (the window is in publish time), and a redriven dead
// letter by a clock read: it counts as published again when its redelivery
// starts.
func (p *pipeline) dedupKey(env *envelope, redriven bool) dedupRef {
	if p.mem == nil {
		k := DeliveryKey{Topic: p.rec.topic, Subscriber: p.rec.subscriber, MessageID: env.msg.ID, PublishedAt: env.msg.PublishedAt}
		if redriven {
			k.PublishedAt = time.Now()
		}
		return dedupRef{key: k}
	}
	h := env.idh
	if h == (idHash{}) {
		h = p.mem.hashID(env.msg.ID)
	}
	var now int64
	if redriven {
		now = p.mem.now()
	} else {
		now = p.mem.since(env.msg.PublishedAt)
	}
	return dedupRef{slot: p.mem.slotFor(p.salt, h, now)}
}

// seen asks the idempotency store whether d was delivered, for the
// goroutine whose hand is h: false if a stop abandoned it meanwhile. A
// store error counts as "not seen": a duplicate is within the contract, a
// loss is not. The store gets the subscription's store ctx (see
// storeContext).
func (p *pipeline) seen(h *hand, d *dedupRef) bool {
	if p.mem != nil {
		return p.mem.seen(d.slot)
	}
	if !h.enter() {
		return false
	}
	seen, err := p.dedup.Seen(p.rec.storeCtx, d.key)
	if !h.leave() {
		return false
	}
	if err != nil {
		p.logStoreError("Seen", d.key.MessageID, err)
		return false // whatever it said: a duplicate is allowed, a loss is not
	}
	return seen
}

// record tells the idempotency store that d was delivered, for the
// goroutine whose hand is h.
func (p *pipeline) record(h *hand, d *dedupRef) {
	if p.mem != nil {
		p.mem.record(d.slot)
		return
	}
	if !h.enter() {
		return
	}
	err := p.dedup.Record(p.rec.storeCtx, d.key)
	if h.leave() && err != nil {
		p.logStoreError("Record", d.key.MessageID, err)
	}
}

func (p *pipeline) logStoreError(op, id string, err error) {
	p.rec.log.LogAttrs(context.Background(), slog.LevelError, "broker: idempotency store "+op+" failed",
		slog.String("topic", p.rec.topic), slog.String("message_id", id),
		slog.String("subscriber", p.rec.subscriber), slog.String("error", err.Error()))
}

// attempt runs the handler once for msg (msg.Attempt set): its error, the
// failure it is classified as, and its run time (measured only for the
// observer). A successful attempt is counted with the delivery (one counter
// fewer on the hot path), a failed one by the caller.
func (p *pipeline) attempt(ctx context.Context, msg *Message) (err error, f failure, took timing) {
	timed := p.rec.obs != nil
	if timed {
		took.start = time.Now()
	}
	err, timedOut := p.call(ctx, msg)
	if timed {
		took.d = time.Since(took.start)
	}
	if err != nil {
		err, f = vetError(err, timedOut)
	}
	return err, f, took
}

// judge decides what follows a failed attempt.
func (p *pipeline) judge(ctx context.Context, msg *Message, err error, f failure, took timing) step {
	s := step{fault: fault{code: f.code, err: err, text: f.text}, took: took}
	v := p.policy.decideWith(f, msg.Attempt, p.plugins.safeBackoff)
	s.retryable = v.retryable
	switch {
	case ctx.Err() != nil: // stopped while running: not retried
		s.outcome, s.reason = OutcomeDeadLettered, abortReason(ctx)
	case v.retry:
		s.outcome, s.delay = OutcomeRetry, v.delay
	case v.retryable:
		s.outcome, s.reason = OutcomeDeadLettered, ReasonExhausted
	default:
		s.outcome, s.reason = OutcomeDeadLettered, ReasonPermanent
	}
	return s
}

// call runs the handler with the per-attempt deadline, turning a panic into
// a *PanicError. timedOut reports that the deadline had passed when the
// handler returned an error.
func (p *pipeline) call(ctx context.Context, msg *Message) (err error, timedOut bool) {
	if p.timeout <= 0 {
		return p.safeCall(ctx, msg), false
	}
	hctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err = p.safeCall(hctx, msg)
	if err != nil && ctx.Err() == nil {
		deadline, _ := hctx.Deadline()
		timedOut = errors.Is(hctx.Err(), context.DeadlineExceeded) || !time.Now().Before(deadline)
	}
	return err, timedOut
}

// safeCall runs the handler on its own copy of the message, with its own
// Headers map (it may write to it), turning a panic into a *PanicError.
// A message published without headers gets an empty map: one small
// allocation per call, which the handler may keep (a map reused from call
// to call would be shared with a handler that holds on to its message).
func (p *pipeline) safeCall(ctx context.Context, msg *Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = newPanicError(v)
		}
	}()
	m := *msg
	if m.Headers != nil {
		m.Headers = maps.Clone(m.Headers)
	} else {
		m.Headers = make(map[string]string)
	}
	return p.handler(ctx, m)
}

// vetError classifies a handler's error and reads its text once, so that
// nothing later calls a method of it that might panic. A typed nil (a nil
// *T returned as an error) or an error whose Error, ErrorCode, Is, As or
// Unwrap panics is treated like a panic: a *PanicError, code "panic".
func vetError(err error, timedOut bool) (out error, f failure) {
	if isNilValue(err) { // a typed nil, whose methods may panic
		pe := &PanicError{Value: fmt.Sprintf("handler returned a nil %T as its error", err)}
		return pe, failure{code: CodePanic, text: pe.Error()}
	}
	defer func() {
		if v := recover(); v != nil {
			pe := newPanicError(fmt.Sprintf("a method of the handler's error (%T) panicked: %v", err, v))
			out, f = pe, failure{code: CodePanic, text: pe.Error()}
		}
	}()
	f = classify(err, timedOut)
	f.text = err.Error()
	return err, f
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Causes of a subscription's context being cancelled: a handler sees them
// as context.Cause(ctx), matching ErrClosed or ErrUnsubscribed. errReleased
// marks a subscription that finished gracefully: nothing was cut off.
var (
	errShutdown     = fmt.Errorf("%w before the message was finished", ErrClosed)
	errUnsubscribed = fmt.Errorf("%w before the message was finished", ErrUnsubscribed)
	errReleased     = errors.New("broker: subscription ended")
)

// abandonedFault is the fault of a message whose handler a stop abandoned.
func abandonedFault(ctx context.Context) fault {
	return brokerFault(abortCode(ctx), fmt.Errorf("%w; handler abandoned: it had not returned %v after its context was cancelled",
		context.Cause(ctx), handlerGrace))
}

// stoppedAtOnce reports that ctx, a subscription's context, was cancelled
// by a Close or Unsubscribe whose own context ended.
func stoppedAtOnce(ctx context.Context) bool {
	return ctx.Err() != nil && context.Cause(ctx) != errReleased
}

// abortReason is the dead-letter reason for a message cut off by ctx.
func abortReason(ctx context.Context) string {
	if context.Cause(ctx) == errUnsubscribed {
		return ReasonUnsubscribed
	}
	return ReasonShutdown
}

// abortCode is the error code of a message cut off before any attempt.
func abortCode(ctx context.Context) string {
	if context.Cause(ctx) == errUnsubscribed {
		return CodeUnsubscribed
	}
	return CodeShutdown
}

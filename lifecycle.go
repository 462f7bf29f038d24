package broker

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"
)

// This file is the lifecycle's end: Close and Unsubscribe, how they drain,
// when they cut off (the dead letters they write and count), and how they
// abandon a handler that ignores its cancelled context.

// ShutdownGrace is how long after their context ended Close and
// Unsubscribe return at the latest, whatever plugged-in code does: a
// stop has one deadline, its ctx, then this grace. When ctx ends they
// cancel the handlers' contexts; the handlers then have four fifths of
// the grace to return. A handler still running then is abandoned: its
// message is dead-lettered in the rest of the grace (counted in
// DrainError.Abandoned), and what it returns later is logged and
// ignored. So is other plugged-in code (middleware, a store method, an
// Observer hook) still running then. What still runs at the deadline is
// given up on: each such call counts in DrainError.Abandoned and is
// logged at Error, and the messages it held count as dead letters no
// store took (DrainError.Lost). The stores' calls of a stop get a ctx
// that ends one grace after its deadline. Over a Transport, its Stop and
// Close calls have the same deadline.
const ShutdownGrace = 250 * time.Millisecond

// handlerGrace is the handlers' part of ShutdownGrace; the rest is for the
// dead letters of what the stop abandoned then.
const handlerGrace = ShutdownGrace - ShutdownGrace/5

// Close shuts the broker down accounting for every message: each one ends
// delivered, or as a dead letter with a reason — which is not the same as
// surviving. It refuses new publishes (ErrClosed), then delivers
// everything queued, retries included (under the default policy a failing
// message may take 6 s more), until ctx ends. If ctx ends first, it
// cancels the running handlers' contexts (their context.Cause matches
// ErrClosed), waits a part of ShutdownGrace for them to return, and puts
// every unfinished message into the dead-letter store with reason
// "shutdown"; it then returns a *DrainError saying how many (it unwraps to
// ctx's error). The default store is in memory and goes with the process:
// to keep what a shutdown cut off, give WithDeadLetterStore a durable
// store (natsjs.DeadLetterStore works with the in-memory broker too) and
// redrive them after the restart (RedriveMatching with Reason
// "shutdown"). Like
// http.Server.Shutdown, it honours its context: a handler that ignores its
// own is abandoned, and it returns by ShutdownGrace after ctx ended,
// whatever plugged-in code does (see ShutdownGrace). The calls it
// abandoned are the only goroutines of the broker that may outlive Close
// (with a dispatcher stuck in one).
// Otherwise every goroutine of the broker has ended when Close returns,
// and no attempt starts after it.
//
// Close also waits for the Unsubscribes that stopped their subscription
// at once (until its own deadline), so that no dead letter of theirs
// comes after it returns; their counts are in their own DrainError.
//
// Close must not be called from a handler of this broker without a
// deadline: it would wait for that handler to return. Calling Close again
// is safe: it waits for the first call to finish (or ctx to end) and
// returns the first call's result.
func (b *Broker) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	b.mu.Lock()
	first := !b.closed.Swap(true)
	topics := b.liveTopics() // no topic is created or retired once closed
	b.mu.Unlock()
	if !first {
		select {
		case <-b.closeDone:
			return b.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if b.remote != nil {
		b.closeErr = b.closeRemote(ctx)
		b.logs.flush()
		close(b.closeDone)
		return b.closeErr
	}
	var subs []*Subscription // every subscription: none is added once closed
	for _, t := range topics {
		subs = append(subs, t.activeSubs()...)
	}
	for _, s := range subs {
		s.take(errShutdown)
	}
	for _, t := range topics {
		t.q.Close()
	}
	dispatched := make(chan struct{})
	go func() { // ends when every dispatcher has, and no Redrive runs
		b.wg.Wait()
		b.redrive <- struct{}{} // taken for good: later Redrives see closeDone
		close(dispatched)
	}()
	drained := waitOr(dispatched, ctx.Done())
	for _, s := range subs {
		// One that its Unsubscribe cuts off meanwhile is that stop's, waited
		// for below.
		drained = drained && (s.drain(ctx) || ctx.Err() == nil)
	}
	var deadline <-chan struct{} // the stop's, once ctx ended
	if !drained {
		b.abort(errShutdown)
		handlers, end, release := stopTimes()
		defer release()
		deadline = end
		var own []*Subscription // those Close cut off
		for _, s := range subs {
			if context.Cause(s.ctx) == errShutdown {
				own = append(own, s)
				s.stopNow()
			}
		}
		endCutOff(own, handlers, deadline, dispatched)
	}
	var de DrainError
	for _, s := range subs {
		if context.Cause(s.ctx) == errUnsubscribed {
			waitOr(s.stopped, deadline) // its Unsubscribe cut it off and ends it
		}
		s.addResult(&de, errShutdown)
	}
	b.abort(errReleased) // release the contexts' resources (a graceful end, unless cut off)
	for _, t := range topics {
		t.deactivate()
	}
	if de.DeadLettered > 0 || de.Lost > 0 || de.Abandoned > 0 {
		de.Reason, de.Err = ReasonShutdown, ctx.Err()
		b.closeErr = &de
	}
	b.logs.flush()
	close(b.closeDone)
	return b.closeErr
}

// How Unsubscribe gets the owed messages: those the topic's dispatcher has
// not routed yet, because it waits for room in another subscriber's lane,
// Unsubscribe takes from it and counts in its DrainError; only if the
// dispatcher stays inside plugged-in code (an Observer, a store, the
// logger, or a dead-letter Put retried through a store outage) for the
// whole handlers' part of ShutdownGrace does the dispatcher dead-letter
// them itself, uncounted, after Unsubscribe returned.

// Unsubscribe stops the subscriber and finishes its work. Every message
// accepted by Publish before the call is owed to it, even those the
// topic's dispatcher had not reached yet: Unsubscribe delivers them (with
// their retries) until ctx ends. Then it cancels the running handlers'
// contexts (their cause matches ErrUnsubscribed), waits a part of
// ShutdownGrace for them, and dead-letters every unfinished message with
// reason "unsubscribed", returning a *DrainError that says how many. As
// Close does, it abandons a handler that ignores its context (its message
// is dead-lettered and counted in DrainError.Abandoned), and it returns by
// ShutdownGrace after ctx ended, whatever plugged-in code does (see
// ShutdownGrace).
//
// When it returns, no handler of this subscription runs (an abandoned call
// aside) and its name is free on the topic. Do not call it from one of
// this subscription's handlers without a deadline: it would wait for that
// handler to return (start it in a goroutine instead).
//
// Calling Unsubscribe again, or after Close, is safe: it waits for the first
// call to finish (or ctx to end) and returns the first call's result. While
// Close runs it stops the subscription as usual (by its own ctx); if Close
// stops it at once first, it returns once Close has dead-lettered the
// subscription's messages (counted in Close's DrainError, not its own).
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if s.remote != nil {
		return s.endOnce(ctx, func() error { return s.stopRemote(ctx, errUnsubscribed, ShutdownGrace) })
	}
	return s.endOnce(ctx, func() error { return s.unsubscribeInMemory(ctx) })
}

// endOnce runs end, the subscription's end, once (Unsubscribe, or Close
// with a transport); a second call waits for the first and returns its
// result.
func (s *Subscription) endOnce(ctx context.Context, end func() error) error {
	first := false
	s.unsubOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.unsubbed:
			return s.unsubErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.unsubErr = end()
	close(s.unsubbed)
	return s.unsubErr
}

// unsubscribeInMemory is Unsubscribe with the in-memory transport.
func (s *Subscription) unsubscribeInMemory(ctx context.Context) error {
	t := s.t
	s.take(errUnsubscribed)
	t.leave(s) // owed: every message accepted before this call
	if !s.drain(ctx) {
		s.cancel(errUnsubscribed)
		if context.Cause(s.ctx) == errUnsubscribed { // this stop cut it off
			handlers, deadline, release := stopTimes()
			defer release()
			s.stopNow()
			// Owed messages the dispatcher has not routed yet (it may wait for
			// room in another subscriber's lane) are dead-lettered here, so that
			// the DrainError counts them; if the dispatcher stayed busy (in an
			// Observer or a store) for the handlers' part of the grace, what it
			// routes s from now on it dead-letters itself, after Unsubscribe
			// returned.
			t.claimOwed(s, handlers)
			endCutOff([]*Subscription{s}, handlers, deadline, nil)
		}
	}
	if context.Cause(s.ctx) == errShutdown {
		<-s.stopped // Close cut it off first: it ends it by its deadline
	}
	s.cancel(errReleased) // no-op after an abort; else marks a graceful end
	t.mu.Lock()
	if t.active[s.name] == s {
		delete(t.active, s.name)
		t.tally.left(s.name)
	}
	if len(t.active) == 0 {
		t.kickDispatcher() // it may retire the topic now
	}
	t.mu.Unlock()
	var de DrainError
	if s.addResult(&de, errUnsubscribed); de.DeadLettered > 0 || de.Lost > 0 || de.Abandoned > 0 {
		de.Reason, de.Err = ReasonUnsubscribed, ctx.Err()
		return &de
	}
	return nil
}

// take makes the stop of cause (errShutdown: Close; errUnsubscribed:
// Unsubscribe) the subscription's, unless another stop took it first: its
// counts start now.
func (s *Subscription) take(cause error) {
	s.takeOnce.Do(func() { s.takenBy, s.lostBefore = cause, s.lost.Load() })
}

// addResult adds the subscription's counts to de if the stop of cause
// owns them: the stop that cut it off; if none did, the stop that took it
// first.
func (s *Subscription) addResult(de *DrainError, cause error) {
	owner := context.Cause(s.ctx)
	if owner != errShutdown && owner != errUnsubscribed {
		owner = s.takenBy
	}
	if owner == cause {
		de.DeadLettered += int(s.stopDLs.Load())
		de.Abandoned += int(s.abandoned.Load())
		de.Lost += int(s.lost.Load() - s.lostBefore)
	}
}

// stopTimes returns the times of a stop whose ctx ends now: the end of
// the handlers' part of its grace, and its deadline (ShutdownGrace from
// now); release frees their timers.
func stopTimes() (handlers, deadline <-chan struct{}, release func()) {
	dctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	hctx, hcancel := context.WithTimeout(dctx, handlerGrace)
	return hctx.Done(), dctx.Done(), func() { hcancel(); cancel() }
}

// endCutOff ends subs, which a stop cut off when its ctx ended (their
// contexts cancelled with its cause, their lanes stopped), by the stop's
// deadline: the handlers have until handlers to return, then the workers
// still inside plugged-in code are abandoned and their messages
// dead-lettered; at deadline, what still runs is given up on. Before
// that it waits for others (nil: none; Close: its dispatchers, which may
// claim a cut-off subscription's messages for a cutter, see claimFor)
// until deadline. When it returns, each of subs is stopped (its stopped
// channel closed).
func endCutOff(subs []*Subscription, handlers, deadline, others <-chan struct{}) {
	for _, s := range subs {
		if !s.finish(handlers) {
			s.abandon()
		}
	}
	if others != nil {
		waitOr(others, deadline)
	}
	for _, s := range subs {
		if !s.finish(deadline) {
			s.giveUp()
		}
		close(s.stopped)
	}
}

// waitOr waits until ch or deadline (nil: none) is closed: false if
// deadline was, ch not.
func waitOr(ch, deadline <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-deadline:
		return false
	}
}

// drain is finish until ctx ends or a stop cuts the subscription off:
// false then.
func (s *Subscription) drain(ctx context.Context) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()
	return s.finish(wctx.Done())
}

// finish waits until the goroutines that end the subscription's messages
// are done — its workers and cutters (the shedder too), those a stop gave
// up on aside — or until deadline: false then.
func (s *Subscription) finish(deadline <-chan struct{}) bool {
	for done := s.running(); done != nil; done = s.running() {
		if !waitOr(done, deadline) {
			return false
		}
	}
	return true
}

// running returns the done channel of one of the subscription's workers
// or cutters that no stop gave up on; nil when none is left. (A worker
// or cutter adds the one that takes over from it before it leaves.)
func (s *Subscription) running() <-chan struct{} {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for w := range s.ws {
		if !w.h.abandoned() {
			return w.done
		}
	}
	for c := range s.cutters {
		if !c.h.abandoned() {
			return c.done
		}
	}
	return nil
}

// stopNow hands every message waiting in the lane to a cutter, which
// dead-letters them, after the subscription's context was cancelled with
// the reason: the workers return after their current attempt.
//
// Only the stop that cut the subscription off calls it.
func (s *Subscription) stopNow() {
	items, jobs := s.lane.stop(func(n int) { s.c.inFlight.Add(int64(n)) })
	for i := range items {
		jobs = append(jobs, cutJob{it: items[i], kind: cutQueued})
	}
	s.startCutter(jobs, false)
}

// giveUp gives up, at the stop's deadline, on the subscription's workers
// and cutters still running: what they held counts as dead letters no
// store took (lost), and each one inside plugged-in code as abandoned.
// What they do later is ignored.
func (s *Subscription) giveUp() {
	reason := abortReason(s.ctx)
	for gave := true; gave; { // again while it gave up on one: a Goexit's replacement may have started meanwhile
		gave = false
		s.wmu.Lock()
		cutters := slices.Collect(maps.Keys(s.cutters))
		ws := slices.Collect(maps.Keys(s.ws))
		s.wmu.Unlock()
		for _, c := range cutters {
			gave = s.giveUpOn(&c.h, true, func(k int) (*laneItem, string) {
				if c.jobs[k].kind == cutOverflowed {
					return &c.jobs[k].it, ReasonOverflow
				}
				return &c.jobs[k].it, reason
			}) || gave
		}
		for _, w := range ws { // the worker writes no ID
			gave = s.giveUpOn(&w.h, false, func(k int) (*laneItem, string) { return &w.buf[k], reason }) || gave
		}
	}
}

// giveUpOn gives up on the goroutine whose hand is h (see giveUp): the
// messages it held and had not ended (item k: the message and its
// dead-letter reason) count lost, and out of flight if inFlight says the
// stop counted them in flight (a cutter's).
func (s *Subscription) giveUpOn(h *hand, inFlight bool, item func(k int) (*laneItem, string)) bool {
	w, from, n, ok := h.abandon(false)
	if !ok {
		return false
	}
	var ids []string
	for k := from; k < n; k++ {
		it, why := item(k)
		if inFlight {
			s.c.inFlight.Add(-1)
		}
		s.lostAtDeadline(why)
		ids = append(ids, it.env.msg.ID)
	}
	if w&handPlug != 0 {
		s.abandoned.Add(1)
	}
	if len(ids) > 0 || w&handPlug != 0 {
		s.b.cfg.logger.LogAttrs(context.Background(), slog.LevelError,
			"broker: the stop's deadline passed while plugged-in code (a store, an Observer, a handler or middleware) had not returned: "+
				"abandoned; the messages it held are in no store (counted lost)",
			slog.String("topic", s.topicName), slog.String("subscriber", s.name),
			slog.String("reason", abortReason(s.ctx)), slog.Any("message_ids", ids))
	}
	return true
}

// lostAtDeadline counts a message the stop gave up on at its deadline:
// dead-lettered with reason, in no store.
func (s *Subscription) lostAtDeadline(reason string) {
	s.c.dlErrors.Add(1)
	s.c.deadLettered.Add(1)
	s.countDeadLetter(reason, true)
}

// countDeadLetter counts a dead letter by reason (and whether no store
// took it), for the DrainError of the stop that owns the subscription's
// counts (see addResult).
func (s *Subscription) countDeadLetter(reason string, lost bool) {
	if lost {
		s.lost.Add(1)
	}
	if reason == ReasonShutdown || reason == ReasonUnsubscribed {
		s.stopDLs.Add(1)
	}
}

// abandon gives up on the workers inside plugged-in code (a handler,
// middleware, a store, an Observer) the handlers' part of a stop's grace
// after it cancelled their context: the messages each held and had not
// ended go to a cutter (the one whose handler ran is dead-lettered with
// the stop's reason and the attempt's event), the worker is counted
// abandoned, and the stop waits for it no longer. What it does when its
// call returns is ignored.
func (s *Subscription) abandon() {
	s.wmu.Lock()
	ws := slices.Collect(maps.Keys(s.ws))
	s.wmu.Unlock()
	for _, w := range ws {
		word, from, n, ok := w.h.abandon(true)
		if !ok {
			continue
		}
		// The worker is inside plugged-in code and touches nothing of its
		// own until it returns (then it sees it was abandoned).
		i := int(word >> handIShift & handIMask)
		jobs := make([]cutJob, 0, n-from)
		if word&handEnded != 0 {
			s.lane.dropped() // message i ended; its worker never hands it back
		}
		for k := from; k < n; k++ {
			kind := cutQueued
			switch {
			case k == i && word&handHandler != 0:
				kind = cutAbandoned
				s.c.failed.Add(1) // the attempt ran; its end is never recorded
				s.lane.dropped()
			case k == i:
				s.lane.dropped()
			default: // taken, never started
				s.lane.local.Add(-1)
			}
			s.c.inFlight.Add(1)
			jobs = append(jobs, cutJob{it: w.buf[k], kind: kind})
		}
		s.abandoned.Add(1)
		s.b.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"broker: plugged-in code (a handler, middleware, a store or an Observer) had not returned in the handlers' part of "+
				"ShutdownGrace after the stop cancelled its context: abandoned; the stop dead-letters the messages its worker held, "+
				"and ignores what it returns",
			slog.String("topic", s.topicName), slog.String("subscriber", s.name), slog.String("message_id", w.buf[i].env.msg.ID),
			slog.Bool("handler", word&handHandler != 0), slog.String("reason", abortReason(s.ctx)))
		s.startCutter(jobs, false) // the stops wait for the worker no longer (see finish)
	}
}

// ignored logs what an abandoned handler returned.
func (p *pipeline) ignored(it *laneItem, err error) {
	text := "<nil>"
	if err != nil {
		_, f := vetError(err, false)
		text = f.text
	}
	p.rec.log.LogAttrs(context.Background(), slog.LevelWarn, "broker: abandoned handler returned; its result is ignored",
		slog.String("topic", p.rec.topic), slog.String("message_id", it.env.msg.ID),
		slog.String("subscriber", p.rec.subscriber), slog.Int("attempt", it.env.msg.Attempt),
		slog.String("error", text))
}

// deactivate forgets the topic's subscriptions once Close has stopped them:
// Stats show their counters, not active.
func (t *topic) deactivate() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name := range t.active {
		t.tally.left(name)
	}
	clear(t.active)
}

package broker

import (
	"context"
	"log/slog"
	"time"
)

// This file is the lifecycle's end: Close and Unsubscribe, how they drain,
// when they cut off (the dead letters they write and count), and how they
// abandon a handler that ignores its cancelled context.

// ShutdownGrace is how long Close and Unsubscribe wait, once their context
// ended and they cancelled the handlers' contexts, for the handlers to
// return. A handler still running then is abandoned: its message is
// dead-lettered (counted in DrainError.Abandoned), and what it returns
// later is logged and ignored.
const ShutdownGrace = 250 * time.Millisecond

// Close shuts the broker down accounting for every message: each one ends
// delivered, or as a dead letter with a reason — which is not the same as
// surviving. It refuses new publishes (ErrClosed), then delivers
// everything queued, retries included (under the default policy a failing
// message may take 6 s more), until ctx ends. If ctx ends first, it
// cancels the running handlers' contexts (their context.Cause matches
// ErrClosed), waits at most ShutdownGrace for them to return, and puts
// every unfinished message into the dead-letter store with reason
// "shutdown"; it then returns a *DrainError saying how many (it unwraps to
// ctx's error). The default store is in memory and goes with the process:
// to keep what a shutdown cut off, give WithDeadLetterStore a durable
// store (natsjs.DeadLetterStore works with the in-memory broker too) and
// redrive them after the restart (RedriveMatching with Reason
// "shutdown"). Like
// http.Server.Shutdown, it honours its context: a handler that ignores its
// own is abandoned after the grace, and is the only goroutine of the broker
// that may outlive Close. Otherwise every goroutine of the broker has ended
// when Close returns, and no attempt starts after it.
//
// Close also waits for the Unsubscribes in progress, so that no dead letter
// of theirs comes after it returns.
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
	lostBefore := b.lost.Load()
	for _, t := range topics {
		t.q.Close()
	}
	drained := make(chan struct{})
	go func() { // ends when every dispatcher, shedder, worker and Redrive has (or a worker was abandoned)
		b.wg.Wait()
		for _, t := range topics {
			for _, s := range t.activeSubs() {
				<-s.done
			}
		}
		b.redrive <- struct{}{} // taken for good: later Redrives see closeDone
		close(drained)
	}()
	select {
	case <-drained:
	case <-ctx.Done():
		b.abort(errShutdown)
		for _, t := range topics {
			for _, s := range t.activeSubs() {
				s.stopNow()
			}
		}
		grace := time.NewTimer(ShutdownGrace)
		select {
		case <-drained:
		case <-grace.C:
			for _, t := range topics {
				for _, s := range t.activeSubs() {
					s.abandon()
				}
			}
			<-drained // the workers left return at once: their contexts are cancelled
		}
		grace.Stop()
	}
	b.waitUnsubscribes() // also a cut-off an Unsubscribe began (stopNow runs inside it)
	b.abort(errShutdown) // release the context's resources
	for _, t := range topics {
		t.deactivate()
	}
	if n, lost := b.shutdownDLs.Load(), b.lost.Load()-lostBefore; n > 0 || lost > 0 {
		b.closeErr = &DrainError{Reason: ReasonShutdown, DeadLettered: int(n), Abandoned: int(b.abandoned.Load()), Lost: int(lost), Err: ctx.Err()}
	}
	b.logs.flush()
	close(b.closeDone)
	return b.closeErr
}

// Unsubscribe stops routing messages to the subscriber once the messages
// accepted by Publish before the call are routed to it (they are owed to
// it, even those the dispatcher had not reached), and finishes them (with
// their retries) until ctx ends; then it
// cancels the running handlers' contexts, waits for them to return, and
// dead-letters every unfinished message with reason "unsubscribed",
// returning a *DrainError that says how many (owed messages the topic's
// dispatcher had not reached, because it waits for room in another
// subscriber's lane, included: Unsubscribe takes them from it; only if the
// dispatcher stays inside plugged-in code — an Observer, a store, the
// logger, or a dead-letter Put retried through a store outage — for the
// whole ShutdownGrace does it dead-letter them itself, uncounted, after
// Unsubscribe returned). Handlers see their context's
// cause match ErrUnsubscribed. As Close does, it waits at most ShutdownGrace
// for them, then abandons a handler that ignores its context (its message
// is dead-lettered and counted in DrainError.Abandoned). When it returns,
// no handler of this subscription runs, an abandoned one aside, and its
// name is free on the topic. Unsubscribe must not be called from one of
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
		return s.endOnce(ctx, func() error { return s.stopRemote(ctx, errUnsubscribed) })
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
	s.b.startUnsubscribe()
	s.leaving.Store(true)
	defer s.b.endUnsubscribe()
	lostBefore := s.lost.Load()
	t.leave(s) // owed: every message accepted before this call
	select {
	case <-s.done:
		if stoppedAtOnce(s.ctx) { // Close's deadline passed meanwhile: its dead letters end before this returns
			s.stopNow()
			s.waitCut()
		}
	case <-ctx.Done():
		s.cancel(errUnsubscribed)
		s.stopNow()
		// Owed messages the dispatcher has not routed yet (it may wait for
		// room in another subscriber's lane) are dead-lettered here, so that
		// the DrainError counts them; then the handlers have the rest of
		// the grace to return.
		grace := time.NewTimer(ShutdownGrace)
		owed, claimed := t.claimOwed(s, grace.C)
		for i := range owed {
			s.cutOffUnrouted(&laneItem{env: owed[i]})
		}
		if claimed {
			select {
			case <-s.done:
			case <-grace.C:
				s.abandon()
				<-s.done
			}
		} else {
			// The dispatcher stayed busy (in an Observer or a store) for the
			// whole grace: what it routes s from now on, it dead-letters
			// itself, after Unsubscribe returned.
			s.abandon()
			<-s.done
		}
		grace.Stop()
		s.waitCut() // Close may be cutting it off too
		// The shedder finishes the batch it took before the stop, giving up
		// at once a put the store fails (a loss): wait for it, within a
		// grace of its own, so that the DrainError counts those losses.
		if done := s.lane.shedderDone(); done != nil {
			wait := time.NewTimer(ShutdownGrace)
			select {
			case <-done:
			case <-wait.C:
			}
			wait.Stop()
		}
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
	if n, lost := s.unsubDLs.Load(), s.lost.Load()-lostBefore; n > 0 || lost > 0 {
		return &DrainError{Reason: ReasonUnsubscribed, DeadLettered: int(n), Abandoned: int(s.abandoned.Load()), Lost: int(lost), Err: ctx.Err()}
	}
	return nil
}

// stopNow dead-letters every message waiting in the lane, after its
// context was cancelled with the reason: the workers return after their
// current attempt.
//
// The first call (Close's or Unsubscribe's) does it; a later one returns
// at once (see waitCut).
func (s *Subscription) stopNow() {
	if !s.cutting.CompareAndSwap(false, true) {
		return
	}
	defer close(s.cut)
	items, overflowed := s.lane.stop(func(n int) { s.c.inFlight.Add(int64(n)) })
	for i := range overflowed {
		s.overflowed(&overflowed[i])
	}
	for i := range items {
		s.pipe.cutOff(s.ctx, &items[i])
		s.c.inFlight.Add(-1)
	}
}

// waitCut waits, ShutdownGrace at most (a plug-in the cut-off calls may
// itself be waiting for the caller), until a stop at once that began has
// cut the lane off, so that none of its dead letters comes after the
// caller returns.
func (s *Subscription) waitCut() {
	if !s.cutting.Load() {
		return
	}
	t := time.NewTimer(ShutdownGrace)
	defer t.Stop()
	select {
	case <-s.cut:
	case <-t.C:
	}
}

// startUnsubscribe counts an Unsubscribe in progress, for Close to wait
// for (waitUnsubscribes); endUnsubscribe counts it done.
func (b *Broker) startUnsubscribe() {
	b.unsubMu.Lock()
	b.unsubs++
	b.unsubMu.Unlock()
}

func (b *Broker) endUnsubscribe() {
	b.unsubMu.Lock()
	defer b.unsubMu.Unlock()
	if b.unsubs--; b.unsubs == 0 && b.unsubsIdle != nil {
		close(b.unsubsIdle)
		b.unsubsIdle = nil
	}
}

// waitUnsubscribes waits until no Unsubscribe is in progress, so that none
// of their dead letters comes after Close returns. Each ends within its own
// context and ShutdownGrace, and soon once Close stopped every
// subscription.
func (b *Broker) waitUnsubscribes() {
	b.unsubMu.Lock()
	if b.unsubs == 0 {
		b.unsubMu.Unlock()
		return
	}
	if b.unsubsIdle == nil {
		b.unsubsIdle = make(chan struct{})
	}
	idle := b.unsubsIdle
	b.unsubMu.Unlock()
	<-idle
}

// countAbandoned counts a handler a stop abandoned, for its DrainError.
func (s *Subscription) countAbandoned() {
	if abortReason(s.ctx) == ReasonUnsubscribed {
		s.abandoned.Add(1)
	} else {
		s.b.abandoned.Add(1)
	}
}

// countDeadLetter counts a dead letter by reason, and a lost one for the
// one stop it belongs to: the stop that cut the subscription off, else its
// Unsubscribe if one runs, else Close.
func (s *Subscription) countDeadLetter(reason string, lost bool) {
	if lost {
		if stoppedAtOnce(s.ctx) && abortReason(s.ctx) == ReasonUnsubscribed || !stoppedAtOnce(s.ctx) && s.leaving.Load() {
			s.lost.Add(1)
		} else {
			s.b.lost.Add(1)
		}
	}
	switch reason {
	case ReasonUnsubscribed:
		s.unsubDLs.Add(1)
	case ReasonShutdown:
		s.b.shutdownDLs.Add(1)
	}
}

// abandon gives up on the workers whose handlers still run after a stop's
// grace: each such message is dead-lettered with the stop's reason (and
// counted apart, as abandoned), with the messages its worker had taken and
// not started, and the worker stops counting as live. It returns how many
// handlers it abandoned.
func (s *Subscription) abandon() int {
	s.wmu.Lock()
	var stuck []*worker
	for w := range s.ws {
		if w.state.CompareAndSwap(workerAttempting, workerAbandoned) {
			stuck = append(stuck, w)
		}
	}
	s.wmu.Unlock()
	for _, w := range stuck {
		// The worker is inside the handler and touches nothing else of its
		// own until it returns (then it sees it was abandoned).
		it := &w.buf[w.i]
		s.c.failed.Add(1) // the attempt ran; its end is never recorded
		s.c.inFlight.Add(1)
		s.lane.dropped()
		s.pipe.rec.deadLetter(&it.env.msg, timing{}, abortReason(s.ctx), abandonedFault(s.ctx), true) // the attempt ran: its event too
		s.c.inFlight.Add(-1)
		s.countAbandoned()
		for k := w.i + 1; k < w.n; k++ { // taken, never started
			s.c.inFlight.Add(1)
			s.lane.local.Add(-1)
			s.pipe.cutOff(s.ctx, &w.buf[k])
			s.c.inFlight.Add(-1)
		}
		s.dropWorker(w) // given up on: the stops wait for it no longer
	}
	return len(stuck)
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

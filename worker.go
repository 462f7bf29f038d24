package broker

import (
	"slices"
	"sync/atomic"
)

// This file is a subscription's workers: each takes messages from the lane
// and runs their turns. A worker survives what a handler can do to its
// goroutine (a panic is recovered in the pipeline; runtime.Goexit ends the
// goroutine, and a new worker takes over), and a worker whose handler
// ignores a cancelled context is abandoned by Close or Unsubscribe (see
// abandon, in lifecycle.go): they stop waiting for it, and it drops itself
// when its call returns.

// hand is what one goroutine that ends a subscription's messages (a
// worker, or a stop's cutter) holds, told to a stop without a lock: n
// messages, of which the first i have ended (i's own end too, with
// handEnded), and whether the goroutine is inside plugged-in code (the
// handler, with handHandler). Only its goroutine changes it, by a CAS
// from what it last set, except that a stop may set handAbandoned: from
// then on the goroutine records nothing (each change fails) and returns,
// the stop having counted what it held. A nil *hand (a transport's
// delivery) changes nothing and is never abandoned.
type hand struct{ word atomic.Uint64 }

const (
	handPlug      = 1 << iota // inside plugged-in code
	handHandler               // that code is the handler (middleware included)
	handEnded                 // message i has ended: its counters moved
	handAbandoned             // a stop gave up on it
	handJudged                // message i's failed attempt was judged a retry (its event may run)
	handIShift    = 5
	handNShift    = 32
	handIMask     = 1<<27 - 1
)

// update sets and clears flags and adds addI to i, unless a stop
// abandoned h: false then.
func (h *hand) update(set, clear, addI uint64) bool {
	if h == nil {
		return true
	}
	w := h.word.Load()
	return w&handAbandoned == 0 && h.word.CompareAndSwap(w, (w&^clear|set)+addI<<handIShift)
}

// hold says h holds n messages, none ended.
func (h *hand) hold(n int) bool {
	if h == nil {
		return true
	}
	w := h.word.Load()
	return w&handAbandoned == 0 && h.word.CompareAndSwap(w, uint64(n)<<handNShift)
}

// at moves h to message i, none of its flags set, with set: a worker's
// first change for a message (until then h shows the one before it, ended).
func (h *hand) at(i int, set uint64) bool {
	if h == nil {
		return true
	}
	w := h.word.Load()
	return w&handAbandoned == 0 && h.word.CompareAndSwap(w, w>>handNShift<<handNShift|uint64(i)<<handIShift|set)
}

func (h *hand) enter() bool { return h.update(handPlug, 0, 0) }
func (h *hand) leave() bool { return h.update(0, handPlug|handHandler, 0) }

// leaveEnded is leave, then end.
func (h *hand) leaveEnded() bool { return h.update(handEnded, handPlug|handHandler, 0) }

// end claims the end of message i: its counters may move (false: a stop
// counted it).
func (h *hand) end() bool { return h.update(handEnded, 0, 0) }

// next moves on to message i+1 (a cutter's; a worker's moves with at).
func (h *hand) next() bool { return h.update(0, handEnded, 1) }

func (h *hand) abandoned() bool { return h != nil && h.word.Load()&handAbandoned != 0 }

// abandon gives up on h — if it is inside plugged-in code, or whatever it
// does when any — and returns the word it had: what it held that had not
// ended is messages from to n. ok is false if it was abandoned already, or
// (plugOnly) runs the broker's own code.
func (h *hand) abandon(plugOnly bool) (w uint64, from, n int, ok bool) {
	for {
		w = h.word.Load()
		if w&handAbandoned != 0 || plugOnly && w&handPlug == 0 {
			return w, 0, 0, false
		}
		if h.word.CompareAndSwap(w, w|handAbandoned) {
			from, n = int(w>>handIShift&handIMask), int(w>>handNShift)
			if w&handEnded != 0 {
				from++
			}
			return w, from, n, true
		}
	}
}

// cutJob is a message for a cutter to end.
type cutJob struct {
	it   laneItem
	kind int
}

// What a cutJob's message is.
const (
	cutQueued     = iota // a stop took it from the lane (or a worker's batch, or never routed), counted in flight
	cutOverflowed        // shed, counted in flight, for an overflow dead letter
	cutAbandoned         // its handler was abandoned: dead-lettered with the attempt's event
)

// cutter is a goroutine that dead-letters the messages it holds: a
// stop's (what it took from the lane, from the workers it abandoned, and
// owed messages never routed), with the stop's reason; or, with shed,
// the subscription's shedder, which goes on with what the lane sheds
// (takeShed, up to laneBatch at a time) until nothing is left, so that
// the topic's dispatcher, which sheds, never waits on the dead-letter
// store: a slow store costs the topic nothing until capacity shed
// messages wait. Its hand lets a stop give up on it at its deadline.
type cutter struct {
	jobs []cutJob // the batch it ends: fixed, but a shedder's next is taken once it ended
	shed bool
	h    hand
	done chan struct{}
}

// startCutter ends jobs, counted in flight, in a cutter, a goroutine of
// its own (with shed, the shedder: the lane calls it under its lock
// while it is open, or a shedder ended by runtime.Goexit does). The
// stops wait for it (finish), and give up on it at their deadline: it
// joins no WaitGroup, so that a later stop never waits for one given up
// on.
func (s *Subscription) startCutter(jobs []cutJob, shed bool) {
	if len(jobs) == 0 && !shed {
		return
	}
	c := &cutter{jobs: jobs, shed: shed, done: make(chan struct{})}
	c.h.hold(len(jobs))
	s.wmu.Lock()
	s.cutters[c] = struct{}{}
	s.wmu.Unlock()
	go s.cut(c)
}

func (s *Subscription) cut(c *cutter) {
	finished := false
	defer func() {
		// runtime.Goexit in a store or an Observer hook: a new cutter takes
		// over the messages not ended (and the shedding), before this one
		// leaves cutters; unless a stop gave up on this one.
		if !finished {
			if _, from, n, ok := c.h.abandon(false); ok {
				s.startCutter(slices.Clone(c.jobs[from:n]), c.shed)
			}
		}
		s.wmu.Lock()
		delete(s.cutters, c)
		s.wmu.Unlock()
		close(c.done)
	}()
	for {
		for i := range c.jobs {
			s.cutOne(&c.jobs[i], &c.h)
			if !c.h.next() {
				finished = true // a stop gave up on it and counted the rest
				return
			}
		}
		if !c.shed {
			break
		}
		clear(c.jobs) // drop references for the garbage collector
		if c.jobs = s.lane.takeShed(c.jobs[:0]); len(c.jobs) == 0 {
			break
		}
		if !c.h.hold(len(c.jobs)) {
			// A stop gave up on it between two batches: these it took after.
			for range c.jobs {
				s.c.inFlight.Add(-1)
				s.lostAtDeadline(ReasonOverflow)
			}
			break
		}
	}
	finished = true
}

// cutOne dead-letters j's message, as the goroutine whose hand is h.
func (s *Subscription) cutOne(j *cutJob, h *hand) {
	switch j.kind {
	case cutOverflowed: // its ordering key is free once it ended
		s.pipe.unrun(&j.it, ReasonOverflow, s.pipe.overflowFault, func() { s.c.inFlight.Add(-1); s.lane.shedEnded(&j.it) }, h)
	case cutAbandoned:
		s.pipe.rec.deadLetter(&j.it.env.msg, timing{}, abortReason(s.ctx), abandonedFault(s.ctx), true,
			func() { s.c.inFlight.Add(-1) }, h)
	default:
		s.pipe.cutOff(s.ctx, &j.it, h, func() { s.c.inFlight.Add(-1) })
	}
}

// worker is one of a subscription's workers. Its batch lives in the
// worker (on the heap, allocated once), so that a stop can read the
// messages of a worker it abandons.
type worker struct {
	s    *Subscription
	buf  [laneBatch]laneItem
	n    int           // messages of the batch in buf
	i    int           // the one being run
	h    hand          // buf[i:n] as a stop sees it
	done chan struct{} // closed when its goroutine ends (deferred in run)
}

// startWorker starts a worker in place of old (nil: none) with carry,
// messages old, ended by Goexit, had taken and not started. The worker
// takes old's place in ws under one lock, and old's hand is marked given
// up there, so that a stop sees old or the new worker, never neither, and
// counts carry once (the new hand holds it before it is seen); unless a
// stop gave up on old first (it took carry).
func (s *Subscription) startWorker(old *worker, carry []laneItem) {
	w := &worker{s: s, done: make(chan struct{})}
	w.n = copy(w.buf[:], carry)
	w.h.hold(w.n)
	if old != nil && testHookReplace != nil {
		testHookReplace()
	}
	s.wmu.Lock()
	ok := old == nil
	if !ok {
		_, _, _, ok = old.h.abandon(false)
	}
	if ok {
		delete(s.ws, old)
		s.ws[w] = struct{}{}
	}
	s.wmu.Unlock()
	if ok {
		go w.run()
	}
}

// testHookReplace, when a test sets it, runs as a worker ended by
// runtime.Goexit is being replaced (startWorker).
var testHookReplace func()

// run takes batches from the lane and runs each message's turn until the
// lane says to return.
func (w *worker) run() {
	s := w.s
	var probe, started, handing, returned bool
	defer func() { // also if runtime.Goexit cut replace short
		s.dropWorker(w)
		close(w.done)
	}()
	defer func() {
		if !returned {
			w.replace(started, handing, probe)
		}
	}()
	for {
		if w.n == 0 {
			batch, p, ok := s.lane.take(w.buf[:0])
			if !ok {
				returned = true
				return
			}
			w.n, probe = len(batch), p
		}
		if !w.h.hold(w.n) {
			return // abandoned: the stop counted what it held
		}
		for w.i = 0; w.i < w.n; w.i++ {
			if k := w.i + 2; k < w.n && s.pipe.mem != nil {
				s.pipe.mem.prefetch(s.pipe.salt, w.buf[k].env.idh)
			}
			it := &w.buf[w.i]
			s.lane.start()
			started = true
			if s.limiter != nil {
				s.limiter.wait(s.ctx) // cut short by a stop: the turn dead-letters it
				if s.lane.br != nil && !s.lane.mayRun(it, probe) {
					started = false
					if !w.h.at(w.i, handEnded) {
						return
					}
					continue // the breaker opened while it waited: back in the queue
				}
			}
			r := s.pipe.turn(s.ctx, it, &w.h, w.i, nil)
			if r.abandoned {
				s.pipe.ignored(it, r.err)
			}
			if !r.ended && !w.h.end() || w.h.abandoned() {
				return // the stop that abandoned it did the bookkeeping
			}
			handing = true // a Goexit in a breaker hook of end: the lane has it back
			s.end(it, r, probe)
			started, handing = false, false
		}
		clear(w.buf[:w.n]) // drop references for the garbage collector
		w.n = 0
	}
}

// replace is a worker's end by runtime.Goexit (what t.FailNow does), in a
// handler most likely: its message ends as a panic would end it, and a
// new worker takes over the rest of the batch and this worker's place in
// ws; unless a stop abandoned the worker (the stop did its bookkeeping).
// A Goexit after the message ended (in an Observer hook of its delivered
// or dead-letter event) only hands it back to the lane, ended; one after
// its retry was decided (in its retry event) parks it; one while it was
// handed back (in a breaker hook, handing) leaves it be.
func (w *worker) replace(started, handing, probe bool) {
	s := w.s
	if w.h.abandoned() {
		return
	}
	var rest []laneItem
	if w.n > 0 {
		rest = append(rest, w.buf[w.i+1:w.n]...)
		switch {
		case handing:
		case started:
			if !w.h.leave() {
				return // abandoned meanwhile: the stop took the batch
			}
			if word := w.h.word.Load(); int(word>>handIShift&handIMask) == w.i && word&(handEnded|handJudged) != 0 {
				it := &w.buf[w.i]
				if word&handEnded != 0 { // its counters moved: it ended
					s.end(it, turnResult{ended: true}, probe)
					break
				}
				// Its retry was decided (the Goexit was in its event): it parks.
				if !w.h.end() {
					return
				}
				hl := healthNone
				if it.last.retryable {
					hl = healthFail
				}
				s.end(it, turnResult{delay: it.last.delay, health: hl}, probe)
				break
			}
			// Its dead letter's Put and events are plugged-in code too: a
			// stop may abandon the worker inside them, and then did the
			// bookkeeping (as in run's loop).
			r := s.pipe.goexited(s.ctx, &w.buf[w.i], &w.h)
			if !r.ended && !w.h.end() || w.h.abandoned() {
				return
			}
			s.end(&w.buf[w.i], r, probe)
		default:
			rest = append([]laneItem{w.buf[w.i]}, rest...)
		}
	}
	s.startWorker(w, rest)
}

// end hands a message back to the lane after its turn: it ended, or it
// parks for its retry; if a stop at once stopped the lane meanwhile, a
// cutter dead-letters it.
func (s *Subscription) end(it *laneItem, r turnResult, probe bool) {
	from, to, orphan := s.lane.finish(it, r.ended, r.delay, r.health, probe)
	if to != "" {
		s.breakerChanged(from, to)
		if to == BreakerOpen {
			s.lane.br.arm()
		}
	}
	if orphan { // a cutter dead-letters it: a Goexit or a stuck call there costs no message
		s.c.inFlight.Add(1)
		s.lane.dropped()
		s.startCutter([]cutJob{{it: *it, kind: cutQueued}}, false)
	}
}

// dropWorker is a worker's end, deferred in its goroutine: it leaves ws
// (if a worker that replaced it did not take its place).
func (s *Subscription) dropWorker(w *worker) {
	s.wmu.Lock()
	delete(s.ws, w)
	s.wmu.Unlock()
}

package broker

import (
	"sync/atomic"
)

// This file is a subscription's workers: each takes messages from the lane
// and runs their turns. A worker survives what a handler can do to its
// goroutine (a panic is recovered in the pipeline; runtime.Goexit ends the
// goroutine, and a new worker takes over), and a worker whose handler
// ignores a cancelled context is abandoned at Close's or Unsubscribe's
// deadline (see abandon, in lifecycle.go).

// A worker's state, for abandonment: only an attempt (the handler running)
// can be abandoned, and only once.
const (
	workerIdle       int32 = iota // not in an attempt
	workerAttempting              // a handler runs for buf[i]
	workerAbandoned               // given up on by a stop; whatever the handler returns is ignored
)

// worker is one of a subscription's workers. Its batch lives in the
// worker (on the heap, allocated once), so that a stop can read the
// message of a handler it abandons.
type worker struct {
	s     *Subscription
	buf   [laneBatch]laneItem
	n     int          // messages of the batch in buf
	i     int          // the one being run
	state atomic.Int32 // workerIdle, workerAttempting or workerAbandoned
}

// startWorker starts a worker in place of old (nil: none) with carry,
// messages old, ended by Goexit, had taken and not started. ws changes
// under one lock, so it is never empty while a worker runs.
func (s *Subscription) startWorker(old *worker, carry []laneItem) {
	w := &worker{s: s}
	w.n = copy(w.buf[:], carry)
	s.wmu.Lock()
	delete(s.ws, old)
	s.ws[w] = struct{}{}
	s.wmu.Unlock()
	go w.run()
}

// run takes batches from the lane and runs each message's turn until the
// lane says to return.
func (w *worker) run() {
	s := w.s
	var probe, started, returned bool
	defer func() {
		switch {
		case returned:
			s.dropWorker(w)
		case w.state.Load() == workerAbandoned:
			// The stop that abandoned it did its bookkeeping.
		default:
			// runtime.Goexit (what t.FailNow does) ended this goroutine, in
			// a handler most likely: its message ends as a panic would end
			// it, and a new worker takes over the rest of the batch (and
			// this worker's place in ws).
			var rest []laneItem
			if w.n > 0 {
				rest = append(rest, w.buf[w.i+1:w.n]...)
				if started {
					w.state.Store(workerIdle)
					s.end(&w.buf[w.i], s.pipe.goexited(s.ctx, &w.buf[w.i]), probe)
				} else {
					rest = append([]laneItem{w.buf[w.i]}, rest...)
				}
			}
			s.startWorker(w, rest)
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
					continue // the breaker opened while it waited: back in the queue
				}
			}
			r := s.pipe.turn(s.ctx, it, &w.state)
			if r.abandoned {
				s.pipe.ignored(it, r.err)
				return // the stop that abandoned it did the bookkeeping
			}
			s.end(it, r, probe)
			started = false
		}
		clear(w.buf[:w.n]) // drop references for the garbage collector
		w.n = 0
	}
}

// end hands a message back to the lane after its turn: it ended, or it
// parks for its retry.
func (s *Subscription) end(it *laneItem, r turnResult, probe bool) {
	from, to, orphan := s.lane.finish(it, r.ended, r.delay, r.health, probe)
	if to != "" {
		s.breakerChanged(from, to)
		if to == BreakerOpen {
			s.lane.armHalfOpen()
		}
	}
	if orphan {
		s.pipe.cutOff(s.ctx, it)
		s.lane.dropped()
	}
}

// dropWorker is a worker's end, deferred in its goroutine (or a stop's
// giving up on it, see abandon): it leaves ws, and the last one out closes
// s.done.
func (s *Subscription) dropWorker(w *worker) {
	s.wmu.Lock()
	_, in := s.ws[w]
	delete(s.ws, w)
	last := in && len(s.ws) == 0
	s.wmu.Unlock()
	if last {
		close(s.done)
	}
}

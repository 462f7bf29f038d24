// Package queue provides the bounded FIFO used for topic queues (many
// producers, one consumer at a time, a bounded wait for room, and a close
// that refuses new items while the consumer drains the rest) and Room, the
// wait for room that subscriber lanes use too.
//
// Stepping in: a producer whose item lands in an otherwise empty queue
// while the consumer sleeps is told so (TryPush's idle) and may consume it
// itself, if the caller's serialisation of consumers lets it, instead of
// waking the consumer goroutine: one goroutine hand-off fewer on an idle
// queue.
//
// It is a ring buffer under a mutex rather than a channel because the broker
// needs what a channel cannot give: the oldest waiting item (for its age in
// Stats), a batch of items copied out under one lock that still count as
// queued until the consumer has taken them (routed them, or started their
// delivery), and closing the producer side without a send-on-closed panic.
package queue

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/fifo"
)

var (
	// ErrFull is returned by TryPush when the queue has no room.
	ErrFull = errors.New("queue: full")
	// ErrClosed is returned by pushes after Close.
	ErrClosed = errors.New("queue: closed")
	// ErrStopped is returned by PushWait when its stop channel closed first.
	ErrStopped = errors.New("queue: wait stopped")
	// ErrTimeout is returned by PushWait when its deadline channel fired first.
	ErrTimeout = errors.New("queue: wait timed out")
)

// Queue is a bounded FIFO. Any number of goroutines may push; one
// consumer at a time may use Peek and TakenN (the caller serialises
// consumers; one of them sleeps in Wait).
// Cap, Snapshot and Close are safe from any goroutine.
//
// The consumer copies a batch of the oldest items out under one lock
// (Peek); they stay in the ring, and count as queued, until it marks
// them taken. (It once read them in place, without the copy: in
// alternating runs the copy cost nothing measurable, W1–W3 -0.6% geomean,
// so the plain version it is.)
type Queue[T any] struct {
	mu sync.Mutex // guards every field
	// ring holds the items. It grows by doubling up to the capacity as
	// the queue fills, so idle queues with a large bound cost little
	// memory; like a channel's buffer it then keeps its size: giving it
	// back when the queue emptied made queues that fill and drain
	// repeatedly reallocate on every cycle (twice the time per message).
	ring     fifo.Ring[T] // ring.Max is the capacity
	closed   bool         // no more pushes
	sleeping bool         // the consumer waits on ready
	ready    chan struct{}
	room     Room   // producers waiting for room
	pushed   uint64 // items ever pushed
	idleGap  int64  // see New
	lastAt   int64  // when the last TryPush pushed, on its caller's clock
}

// Room is where producers wait for room in a bounded queue: the topic
// queue's and a subscriber lane's. Its owner's lock guards it, except
// Wanted, which a consumer that makes room without the lock (a lane's
// worker starting a message) reads after making it: a producer says Want
// before its last look for room, so one of the two sees the other and no
// wake-up is missed. The topic queue's consumer makes room under the lock,
// so its producers need neither Want nor Found.
type Room struct {
	ch     chan struct{} // closed when room appears; nil while no producer waits
	wanted atomic.Bool
}

// Want says, before a producer's last look, that it is about to wait.
func (r *Room) Want() { r.wanted.Store(true) }

// Found says that the last look found room after all.
func (r *Room) Found() {
	if r.ch == nil {
		r.wanted.Store(false) // no producer waits
	}
}

// Wait returns the channel a producer that found no room waits on.
func (r *Room) Wait() <-chan struct{} {
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

// Waiting reports whether a producer waits.
func (r *Room) Waiting() bool { return r.ch != nil }

// Wanted reports, without the lock, whether a producer waits or is about
// to.
func (r *Room) Wanted() bool { return r.wanted.Load() }

// Open wakes the producers waiting: they look again.
func (r *Room) Open() {
	if r.ch != nil {
		close(r.ch)
		r.ch = nil
		r.wanted.Store(false)
	}
}

// New returns an empty queue that holds at most capacity items (at least
// 1). A TryPush is idle only idleGap or more after the one before: a
// producer steps in only when items come that far apart, so that a busy
// queue keeps its consumer, which takes items in batches.
func New[T any](capacity int, idleGap int64) *Queue[T] {
	if capacity < 1 {
		capacity = 1
	}
	return &Queue[T]{
		ring:    fifo.Ring[T]{Max: capacity},
		ready:   make(chan struct{}, 1),
		idleGap: idleGap,
	}
}

// TryPush appends v, pushed at at (nanoseconds on the caller's clock), if
// there is room, without waiting; it returns ErrFull or ErrClosed
// otherwise. idle reports that the queue was idle: v is the only item, the
// consumer sleeps (in Wait), and the previous push was at least
// the queue's idle gap (see New) before at. TryPush then did not wake the
// consumer, and the caller either handles v as the consumer would (see the
// package doc's note on stepping in) or calls Wake.
func (q *Queue[T]) TryPush(v T, at int64) (idle bool, err error) {
	q.mu.Lock()
	err = q.pushLocked(v)
	if err == nil {
		idle = q.sleeping && q.ring.Len() == 1 && at-q.lastAt >= q.idleGap
		q.lastAt = max(q.lastAt, at) // publishers stamp at before the lock, in any order
	}
	if idle {
		q.mu.Unlock()
		return true, nil
	}
	q.unlockAfterPush(err == nil)
	return false, err
}

// Wake wakes the consumer if it sleeps in Wait.
func (q *Queue[T]) Wake() {
	q.mu.Lock()
	q.unlockAfterPush(true)
}

// PushWait appends v, waiting for room until stop1 or stop2 is closed
// (ErrStopped), deadline fires (ErrTimeout) or the queue is closed
// (ErrClosed). Any channel may be nil to wait without that bound.
func (q *Queue[T]) PushWait(v T, stop1, stop2 <-chan struct{}, deadline <-chan time.Time) error {
	for {
		q.mu.Lock()
		err := q.pushLocked(v)
		if err != ErrFull {
			q.unlockAfterPush(err == nil)
			return err
		}
		room := q.room.Wait()
		q.mu.Unlock()
		select {
		case <-room:
		case <-stop1:
			return ErrStopped
		case <-stop2:
			return ErrStopped
		case <-deadline:
			return ErrTimeout
		}
	}
}

// pushLocked appends v unless the queue is closed or full.
func (q *Queue[T]) pushLocked(v T) error {
	if q.closed {
		return ErrClosed
	}
	if q.ring.Len() == q.ring.Max {
		return ErrFull
	}
	q.ring.Push(v)
	q.pushed++
	return nil
}

// unlockAfterPush releases the lock and, if something was pushed while the
// consumer sleeps, wakes it.
func (q *Queue[T]) unlockAfterPush(pushed bool) {
	wake := pushed && q.sleeping
	if wake {
		q.sleeping = false
	}
	q.mu.Unlock()
	if wake {
		q.wake()
	}
}

func (q *Queue[T]) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Wait waits until the queue holds an item and reports true, or
// reports false when the queue is closed and empty or stop is closed.
func (q *Queue[T]) Wait(stop <-chan struct{}) bool {
	for {
		q.mu.Lock()
		if q.ring.Len() > 0 {
			q.mu.Unlock()
			return true
		}
		if q.closed {
			q.mu.Unlock()
			return false
		}
		q.sleeping = true
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-stop:
			q.mu.Lock()
			q.sleeping = false
			q.mu.Unlock()
			return false
		}
	}
}

// Peek copies up to len(buf) of the oldest items into buf,
// in order, and returns them, without removing them from the queue; it
// does not wait. The consumer handles them and then calls TakenN, in
// order, which removes them.
func (q *Queue[T]) Peek(buf []T) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ring.PeekN(buf[:0], len(buf))
}

// Range appends to buf, in order, the items still in the queue that were the from-th to the (to-1)-th pushed, counting every push
// from 0, and returns it. Items no longer in the queue are skipped.
func (q *Queue[T]) Range(from, to uint64, buf []T) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	first := q.pushed - uint64(q.ring.Len()) // the oldest item in the ring
	for seq := max(from, first); seq < min(to, q.pushed); seq++ {
		buf = append(buf, *q.ring.At(int(seq - first)))
	}
	return buf
}

// TakenN removes the k oldest items (see Peek), once the consumer has
// read them: only the consumer may call it, for items it peeked. (More
// than are queued would be a consumer bug: it removes what there is.)
func (q *Queue[T]) TakenN(k int) {
	if k <= 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ring.DropN(k)
	q.room.Open()
}

// Close refuses further pushes and wakes every waiting producer (ErrClosed)
// and the consumer. Items already queued stay for the consumer to drain.
// Close is idempotent.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		q.room.Open()
		q.sleeping = false
	}
	q.mu.Unlock()
	q.wake()
}

// CloseIfEmpty closes the queue if it holds nothing and no producer waits
// for room; it reports whether this call closed it.
func (q *Queue[T]) CloseIfEmpty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.ring.Len() > 0 || q.room.Waiting() {
		return false
	}
	q.closed = true
	return true
}

// Closed reports whether Close (or CloseIfEmpty) closed the queue.
func (q *Queue[T]) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// Cap returns the queue's capacity.
func (q *Queue[T]) Cap() int { return q.ring.Max }

// Snapshot is a queue's state at one moment.
type Snapshot[T any] struct {
	Head   T      // a copy of the oldest item; zero when Len is 0
	Len    int    // items queued
	Pushed uint64 // items ever pushed
}

// Snapshot returns the queue's state, under one lock.
func (q *Queue[T]) Snapshot() Snapshot[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := Snapshot[T]{Len: q.ring.Len(), Pushed: q.pushed}
	if h := q.ring.Front(); h != nil {
		st.Head = *h
	}
	return st
}

package broker

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/queue"
)

// Subscription is one subscriber on one topic: a name, a handler, a lane of
// messages routed to it and its workers. It is created by Subscribe and
// ended by Unsubscribe or Broker.Close.
type Subscription struct {
	b     *Broker
	t     *topic
	name  string
	lanes []*queue.Queue[envelope] // one per worker
	seed  maphash.Seed
	pipe  pipeline
	c     *subCounters

	ctx    context.Context         // handlers' base context; cancelled to stop at once
	cancel context.CancelCauseFunc // with errShutdown or errUnsubscribed

	removed   atomic.Bool   // out of the routing snapshot: route nothing more to it
	live      atomic.Int32  // workers still running
	done      chan struct{} // closed when the last worker returned
	unsubOnce sync.Once
	unsubbed  chan struct{} // closed when Unsubscribe finished
	unsubErr  error         // Unsubscribe's result, set before unsubbed is closed
	unsubDLs  atomic.Int64  // dead letters with reason "unsubscribed"
}

// Topic returns the subscription's topic.
func (s *Subscription) Topic() string { return s.t.name }

// Name returns the subscriber's name.
func (s *Subscription) Name() string { return s.name }

// Subscribe registers h as subscriber name on topic and starts its workers.
// The subscriber sees the messages dispatched after it joined. A topic has at
// most one active subscriber of a name (ErrDuplicateSubscriber); the name is
// free again when Unsubscribe returns.
func (b *Broker) Subscribe(topicName, name string, h Handler, opts ...SubscribeOption) (*Subscription, error) {
	switch {
	case topicName == "":
		return nil, fmt.Errorf("%w: subscribe: empty topic", ErrInvalidOption)
	case name == "":
		return nil, fmt.Errorf("%w: subscribe to %q: empty subscriber name", ErrInvalidOption, topicName)
	case h == nil:
		return nil, fmt.Errorf("%w: subscribe %q to %q: nil handler", ErrInvalidOption, name, topicName)
	}
	sc := subConfig{concurrency: 1, laneSize: b.cfg.queueSize}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&sc); err != nil {
			return nil, fmt.Errorf("subscribe %q to %q: %w", name, topicName, err)
		}
	}
	policy := b.cfg.policy
	if sc.policy != nil {
		policy = sc.policy.normalized()
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	t := b.topicLocked(topicName)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.active[name]; dup {
		return nil, fmt.Errorf("%w: %q on topic %q", ErrDuplicateSubscriber, name, topicName)
	}
	c := t.counters[name]
	if c == nil {
		c = new(subCounters)
		t.counters[name] = c
	}
	s := &Subscription{
		b: b, t: t, name: name, seed: b.seed, c: c,
		lanes:    make([]*queue.Queue[envelope], sc.concurrency),
		done:     make(chan struct{}),
		unsubbed: make(chan struct{}),
	}
	per := sc.laneSize / sc.concurrency
	if sc.laneSize%sc.concurrency != 0 {
		per++
	}
	for i := range s.lanes {
		s.lanes[i] = queue.New[envelope](per)
	}
	s.ctx, s.cancel = context.WithCancelCause(b.abortCtx)
	s.pipe = pipeline{
		handler: h, timeout: sc.timeout, policy: policy, dedup: b.cfg.dedup,
		rec: recorder{
			topic: topicName, subscriber: name, c: c,
			obs: b.cfg.obs, log: b.cfg.logger, dlq: b.cfg.dlq, newID: b.newDeadLetterID,
			onDeadLetter: s.countDeadLetter,
		},
	}
	if sc.concurrency > 1 {
		s.pipe.guard = newIDGuard()
	}
	if b.mem != nil {
		s.pipe.mem, s.pipe.salt = b.mem, b.mem.salt(topicName, name)
	}
	t.active[name] = s
	t.addSubLocked(s)
	s.live.Store(int32(sc.concurrency))
	b.wg.Add(sc.concurrency)
	for _, lane := range s.lanes {
		go s.work(lane)
	}
	return s, nil
}

// workBatch is how many messages a worker takes from its lane under one
// lock.
const workBatch = 64

// prefetchAhead is how many messages ahead of the one it delivers a worker
// asks for the dedup store's memory.
const prefetchAhead = 2

// work is one worker: it delivers what its lane holds until the lane is
// closed and empty, or the subscription is stopped at once; then it
// dead-letters what is left.
func (s *Subscription) work(lane *queue.Queue[envelope]) {
	defer s.b.wg.Done()
	defer func() {
		if s.live.Add(-1) == 0 {
			close(s.done)
		}
	}()
	stop := s.ctx.Done()
	for {
		// Up to a batch of messages under one lock, delivered from the lane
		// in place; each leaves the lane's count as its delivery starts.
		view, ok := lane.TakeWait(stop, workBatch)
		if !ok {
			break
		}
		for i := range view {
			if i+prefetchAhead < len(view) {
				s.pipe.prefetch(&view[i+prefetchAhead])
			}
			env := view[i] // the pipeline writes Attempt: a copy of its own
			lane.Taken()   // out of the lane's count, in flight (in its hands)
			s.pipe.deliver(s.ctx, &env)
			lane.Done() // no longer in flight
		}
	}
	if s.ctx.Err() == nil {
		return // closed and drained
	}
	lane.Close() // no more pushes: what is queued now is all that is left
	for {
		env, ok := lane.Pop()
		if !ok {
			return
		}
		s.c.inFlight.Add(1)
		s.pipe.deliver(s.ctx, &env) // ctx is done: dead-letters at once
		s.c.inFlight.Add(-1)
	}
}

// lane picks the worker lane for msg: by Key, or by ID without one.
func (s *Subscription) lane(msg *Message) *queue.Queue[envelope] {
	if len(s.lanes) == 1 {
		return s.lanes[0]
	}
	return s.lanes[maphash.String(s.seed, msg.orderingKey())%uint64(len(s.lanes))]
}

// route hands env to the subscriber, waiting for room in its lane until
// cancel is closed or deadline fires (either may be nil); beforeWait, if not
// nil, runs before it waits. It returns nil once
// the message is the subscriber's responsibility: queued in its lane, or
// dead-lettered because the subscription is stopping at once. A queue error
// means it was not routed.
func (s *Subscription) route(env *envelope, cancel <-chan struct{}, deadline <-chan time.Time, beforeWait func()) error {
	s.c.routed.Add(1)
	lane := s.lane(&env.msg)
	err := lane.TryPush(*env)
	if err == queue.ErrFull {
		if beforeWait != nil {
			beforeWait()
		}
		err = lane.PushWait(*env, s.ctx.Done(), cancel, deadline)
	}
	if err != nil && err != queue.ErrTimeout && !s.removed.Load() && stoppedAtOnce(s.ctx) {
		// Stopped at once while this message was on its way: it is this
		// subscriber's, so it ends as a dead letter rather than vanishing.
		own := *env // env may be in the topic queue, which deliver must not write
		s.c.inFlight.Add(1)
		s.pipe.deliver(s.ctx, &own)
		s.c.inFlight.Add(-1)
		return nil
	}
	if err != nil {
		s.c.routed.Add(^uint64(0))
	}
	return err
}

// tryRouteN hands the subscriber as many of envs, in order, as fit in its
// lanes without waiting, and returns how many; it stops at the first that
// does not fit (or meets a closed lane), leaving it to route.
func (s *Subscription) tryRouteN(envs []envelope) int {
	s.c.routed.Add(uint64(len(envs)))
	k := 0
	if len(s.lanes) == 1 {
		k, _ = s.lanes[0].TryPushN(envs)
	} else {
		for k < len(envs) && s.lane(&envs[k].msg).TryPush(envs[k]) == nil {
			k++
		}
	}
	s.c.routed.Add(-uint64(len(envs) - k))
	return k
}

func (s *Subscription) closeLanes() {
	for _, lane := range s.lanes {
		lane.Close()
	}
}

func (s *Subscription) countDeadLetter(reason string) {
	switch reason {
	case ReasonUnsubscribed:
		s.unsubDLs.Add(1)
	case ReasonShutdown:
		s.b.shutdownDLs.Add(1)
	}
}

// fill adds the subscription's queues to st.
func (s *Subscription) fill(st *SubscriberStats, now time.Time) {
	st.Active = true
	st.Concurrency = len(s.lanes)
	for _, lane := range s.lanes {
		q := lane.Snapshot()
		st.Queued += q.Len
		st.InFlight += q.InHand
		st.Capacity += lane.Cap()
		st.OldestAge = max(st.OldestAge, age(now, q.Head.msg.PublishedAt, q.Len))
	}
}

// Unsubscribe stops routing messages to the subscriber and finishes the
// messages already routed to it (with their retries) until ctx ends; then it
// cancels the running handlers' contexts, waits for them to return, and
// dead-letters every unfinished message with reason "unsubscribed",
// returning a *DrainError that says how many. When it returns, no handler of
// this subscription runs and its name is free on the topic. A handler that
// ignores its context holds Unsubscribe up, and Unsubscribe must not be
// called from one of this subscription's handlers: it would wait for that
// handler to return (start it in a goroutine instead).
//
// Calling Unsubscribe again, or after Close, is safe: it waits for the first
// call to finish (or ctx to end) and returns nil.
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	first := false
	s.unsubOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.unsubbed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t := s.t
	t.mu.Lock()
	t.removeSubLocked(s)
	t.mu.Unlock()
	s.closeLanes()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.cancel(errUnsubscribed)
		<-s.done
	}
	s.cancel(errReleased) // no-op after an abort; else marks a graceful end
	t.mu.Lock()
	if t.active[s.name] == s {
		delete(t.active, s.name)
	}
	t.mu.Unlock()
	if n := s.unsubDLs.Load(); n > 0 {
		s.unsubErr = &DrainError{Reason: ReasonUnsubscribed, DeadLettered: int(n), Err: ctx.Err()}
	}
	close(s.unsubbed)
	return s.unsubErr
}

// idGuard keeps two workers of one subscriber from running the same message
// ID at once. It is only needed with several workers, where two messages
// with one ID but different Keys can reach different workers.
type idGuard struct {
	mu   sync.Mutex
	cond sync.Cond
	busy map[string]struct{} // IDs being delivered
}

func newIDGuard() *idGuard {
	g := &idGuard{busy: make(map[string]struct{})}
	g.cond.L = &g.mu
	return g
}

func (g *idGuard) acquire(id string) {
	g.mu.Lock()
	for {
		if _, held := g.busy[id]; !held {
			break
		}
		g.cond.Wait()
	}
	g.busy[id] = struct{}{}
	g.mu.Unlock()
}

func (g *idGuard) release(id string) {
	g.mu.Lock()
	delete(g.busy, id)
	g.mu.Unlock()
	g.cond.Broadcast()
}

package broker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Subscription is one subscriber on one topic: a name, a handler, a lane of
// messages routed to it (queued, running, parked for a retry, or held
// behind their key) and its workers. It is created by Subscribe and ended
// by Unsubscribe or Broker.Close.
type Subscription struct {
	b         *Broker
	t         *topic // nil with a transport
	topicName string
	name      string
	remote    *remoteSub // with a transport; nil: in-memory
	hold      *hold      // with a transport: its rate limit and breaker; nil: neither
	lane      *lane
	workers   int
	limiter   *tokenBucket // nil: no rate limit
	pipe      pipeline
	c         *subCounters

	ctx    context.Context         // handlers' base context; cancelled to stop at once
	cancel context.CancelCauseFunc // with errShutdown or errUnsubscribed

	leaveAt   atomic.Uint64        // once Unsubscribe was called: messages accepted before (in push order) are owed to it
	startAt   uint64               // the first message it is owed, when a subscription of its name was still leaving
	left      chan struct{}        // closed when it left the routing snapshot, every owed message routed
	wmu       sync.Mutex           // guards ws and cutters
	ws        map[*worker]struct{} // running workers, abandoned ones included (each drops itself)
	cutters   map[*cutter]struct{} // running cutters (the shedder too), given-up ones included (each drops itself)
	unsubOnce sync.Once
	unsubbed  chan struct{} // closed when Unsubscribe finished
	unsubErr  error         // Unsubscribe's result, set before unsubbed is closed

	// The counts of its stop (see addResult): the one that cut it off, else
	// the one that took it first.
	takeOnce   sync.Once
	takenBy    error         // errShutdown or errUnsubscribed: the first stop
	lostBefore int64         // lost when it was taken
	stopped    chan struct{} // closed when the stop that cut it off has ended it
	stopDLs    atomic.Int64  // dead letters with the stop's reason
	abandoned  atomic.Int64  // calls its stop abandoned
	lost       atomic.Int64  // dead letters no store took
}

// Topic returns the subscription's topic.
func (s *Subscription) Topic() string { return s.topicName }

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
	sc := subConfig{concurrency: 1, laneSize: b.cfg.laneSize, laneReady: b.cfg.queueSize}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&sc); err != nil {
			return nil, fmt.Errorf("%w (subscribe %q to %q)", err, name, topicName)
		}
	}
	policy := b.cfg.policy
	if sc.policy != nil {
		policy = sc.policy.over(policy)
	}
	policy = policy.normalized()
	h, err := chain(b.guard, SubscriberInfo{Topic: topicName, Name: name}, h, b.cfg.middleware, sc.middleware)
	if err != nil {
		return nil, fmt.Errorf("%w (subscribe %q to %q)", err, name, topicName)
	}
	// The Observer's ForSubscriber is user code: asked before any lock is
	// taken (it may call Stats, which takes the topic's lock).
	obs := b.observerFor(topicName, name)
	if b.remote != nil {
		return b.subscribeRemote(topicName, name, sc, policy, h, obs)
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
	c := t.tally.counter(name)
	s := &Subscription{
		b: b, t: t, topicName: topicName, name: name, c: c, workers: sc.concurrency,
		unsubbed: make(chan struct{}),
		stopped:  make(chan struct{}),
		left:     make(chan struct{}),
		ws:       make(map[*worker]struct{}),
		cutters:  make(map[*cutter]struct{}),
	}
	for _, l := range t.leaving { // a name unsubscribed, still owed messages: they stay its
		if l.name == name {
			s.startAt = max(s.startAt, l.leaveAt.Load())
		}
	}
	var br *breaker
	if sc.breaker != nil {
		br = newBreaker(*sc.breaker)
	}
	s.lane = newLane(sc.laneSize, sc.laneReady, sc.concurrency, sc.whenFull, sc.ordered, br, sc.rate > 0)
	s.lane.shed, s.lane.routed = &c.inFlight, &c.routed
	if br != nil {
		br.report = s.breakerChanged
	}
	s.lane.startShedder = func() { s.startCutter(make([]cutJob, 0, laneBatch), true) }
	if sc.rate > 0 {
		s.limiter = newTokenBucket(sc.rate, sc.burst)
	}
	s.ctx, s.cancel = context.WithCancelCause(b.abortCtx)
	s.pipe = b.newPipeline(topicName, name, c, h, obs, policy, sc, s.countDeadLetter, s.ctx)
	if sc.whenFull != Block {
		s.pipe.overflowFault = brokerFault(CodeOverflow, newOverflowError(topicName, name))
	}
	t.active[name] = s
	t.addSubLocked(s)
	for range sc.concurrency {
		s.startWorker(nil, nil)
	}
	return s, nil
}

// breakerChanged reports a transition of the subscriber's circuit breaker.
func (s *Subscription) breakerChanged(from, to BreakerState) {
	ev := BreakerEvent{Topic: s.topicName, Subscriber: s.name, From: from, To: to, At: time.Now()}
	level := slog.LevelInfo
	if to == BreakerOpen {
		level = slog.LevelWarn
		if s.hold != nil {
			_, ev.OpenFor = s.hold.state()
		} else {
			s.lane.mu.Lock()
			ev.OpenFor = s.lane.br.openFor
			s.lane.mu.Unlock()
		}
	}
	s.b.cfg.logger.LogAttrs(context.Background(), level, "broker: circuit breaker "+string(to),
		slog.String("topic", s.topicName), slog.String("subscriber", s.name),
		slog.String("from", string(from)), slog.String("to", string(to)), slog.Duration("open_for", ev.OpenFor))
	if o, ok := s.b.obs.(BreakerObserver); ok {
		o.BreakerChanged(ev)
	}
}

// routeDispatched is the dispatcher's route: under Block it waits for room
// as long as it takes (backpressure), holding the topic's role and
// serving the requests sent to it meanwhile (claimOwed); before it waits
// it releases the batch's routed prefix, and its waits are the
// subscriber's BlockedFor. A subscriber stopped at once while the message
// was on its way gets it, and the rest it is owed, as dead letters
// (claimFor): they are its, and must not vanish.
func (s *Subscription) routeDispatched(env *envelope) error {
	t := s.t
	err := s.lane.pushWait(laneItem{env: *env}, false, s.ctx.Done(), nil, nil, t.serve,
		func(start time.Time) {
			t.freePrefix()
			t.blockStart(s, start)
		},
		func(d time.Duration) {
			if testHookWaited != nil {
				testHookWaited()
			}
			t.blockEnd(s, d)
		})
	if err != nil && stoppedAtOnce(s.ctx) && slices.Contains(*t.subs.Load(), s) {
		t.claimFor(s)
		return nil
	}
	return err
}

// testHookWaited, when a test sets it, runs when the dispatcher's wait for
// room ended (where it could be preempted).
var testHookWaited func()

// routeRedriven is Redrive's route: it never sheds, whatever the policy; a
// full lane makes it wait until cancel is closed or deadline fires. The
// message skips the dedup check and is attempted from 1 again.
func (s *Subscription) routeRedriven(msg Message, cancel <-chan struct{}, deadline <-chan time.Time) error {
	msg.Attempt = 0
	it := laneItem{env: envelope{msg: msg}, redriven: true}
	return s.lane.pushWait(it, true, s.ctx.Done(), cancel, deadline, nil, nil, func(time.Duration) {})
}

// tryRouteN hands the subscriber as many of envs, in order, as fit in its
// lane without waiting or shedding, and returns how many; it stops at the
// first that does not fit (or meets a closed lane), leaving it to route.
func (s *Subscription) tryRouteN(envs []envelope) int { return s.lane.pushN(envs) }

func (s *Subscription) closeLanes() { s.lane.close() }

// fill adds the subscription's lane to st.
func (s *Subscription) fill(st *SubscriberStats, now time.Time) {
	ls := s.lane.stats()
	st.Active = true
	st.Concurrency = s.workers
	st.Queued = ls.queued + ls.held + ls.parked
	st.Held, st.Parked = ls.held, ls.parked
	st.InFlight += ls.running
	st.Capacity = s.lane.capacity
	st.OldestAge = age(now, ls.oldest, 1)
	st.Breaker = ls.breaker
	if s.pipe.budget != nil {
		st.RetryBudgetLeft = s.pipe.budget.left(now)
	}
}

// idGuard keeps two workers of one subscriber from running the same message
// ID at once. It is only needed with several workers, where two messages
// with one ID but different Keys can be taken by different workers.
type idGuard struct {
	mu   sync.Mutex
	busy map[string]chan struct{} // IDs being delivered → closed when released (nil until someone waits)
}

func newIDGuard() *idGuard { return &idGuard{busy: make(map[string]chan struct{})} }

// acquire takes id, waiting while another worker holds it; false if ctx
// ended first.
func (g *idGuard) acquire(ctx context.Context, id string) bool {
	for {
		g.mu.Lock()
		ch, held := g.busy[id]
		if !held {
			g.busy[id] = nil
			g.mu.Unlock()
			return true
		}
		if ch == nil {
			ch = make(chan struct{})
			g.busy[id] = ch
		}
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

func (g *idGuard) release(id string) {
	g.mu.Lock()
	ch := g.busy[id]
	delete(g.busy, id)
	g.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

package broker

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/queue"
)

// topic is one topic's queue, its dispatcher and its subscribers.
//
// Routing (taking messages out of the queue, in order, and handing each
// to every subscriber) is done by whoever holds the topic's role: its
// dispatcher goroutine, one batch per hold; a publisher whose message
// landed in the empty queue of a sleeping dispatcher (stepping in, see
// routeIdle); or an Unsubscribe claiming what it is owed (claimOwed). The
// holder owns route. The dispatcher keeps the role while it waits for room
// in a lane (backpressure) and serves, in that wait, the requests sent on
// serve, so that no one else needs the role then.
type topic struct {
	b    *Broker
	name string
	q    *queue.Queue[envelope]
	subs atomic.Pointer[[]*Subscription] // routing snapshot, copy on write under mu

	dispatched atomic.Uint64 // messages taken out of the queue (routed), ever

	role  chan struct{} // capacity 1: a send takes the role, a receive gives it back
	serve chan func()   // requests the dispatcher runs while it waits for room, holding the role
	route batchRoute    // owned by the role's holder

	leaving []*Subscription // unsubscribing, still owed messages (guarded by mu)

	blockMu sync.Mutex // guards blocked, and the move of a wait into its subscriber's total
	blocked blockedOn  // whose full lane the dispatcher waits for, since when; s is nil when it does not

	mu     sync.Mutex               // guards active, the tally's subscriber counters and writes to subs
	active map[string]*Subscription // by name, until Unsubscribe returns
	tally  *tally                   // counters that outlive the topic's goroutine
	kick   chan struct{}            // wakes the dispatcher to see whether the topic can retire
}

// blockedOn is a dispatcher's wait for room in a subscriber's lane.
type blockedOn struct {
	s     *Subscription
	since time.Time
}

// blockStart notes that the dispatcher waits, since start, for room in s's
// lane. It allocates nothing: a fan-out whose lanes are full waits often.
func (t *topic) blockStart(s *Subscription, start time.Time) {
	t.blockMu.Lock()
	t.blocked = blockedOn{s: s, since: start}
	t.blockMu.Unlock()
}

// holder says, for an ErrQueueFull, which subscriber's full lane holds the
// topic's dispatcher (TopicStats.BlockedOn), if one does.
func (t *topic) holder() string {
	t.blockMu.Lock()
	s := t.blocked.s
	t.blockMu.Unlock()
	if s == nil {
		return ""
	}
	if l := s.lane; l.ready < l.capacity {
		return fmt.Sprintf(": subscriber %q holds it, its lane has %d messages ready to run, the most it takes (of %d in all, retries included) (Stats: BlockedOn; LaneSize, WhenLaneFull)", s.name, l.ready, l.capacity)
	}
	return fmt.Sprintf(": subscriber %q holds it, its lane of %d is full (Stats: BlockedOn; LaneSize, WhenLaneFull)", s.name, s.lane.capacity)
}

// blockEnd moves the dispatcher's wait of d for s into s's total.
func (t *topic) blockEnd(s *Subscription, d time.Duration) {
	t.blockMu.Lock()
	s.c.blocked.Add(int64(d))
	t.blocked = blockedOn{}
	t.blockMu.Unlock()
}

func newTopic(b *Broker, name string, tl *tally) *topic {
	t := &topic{
		b: b, name: name,
		q:      queue.New[envelope](b.cfg.queueSize, int64(stepInGap)),
		active: make(map[string]*Subscription),
		tally:  tl,
		kick:   make(chan struct{}, 1),
		role:   make(chan struct{}, 1),
		serve:  make(chan func()),
	}
	t.subs.Store(new([]*Subscription))
	return t
}

// dispatchBatch is how many messages the dispatcher takes from the topic
// queue under one lock.
const dispatchBatch = 64

// dispatch is the topic's goroutine: it takes messages in FIFO order and
// routes each to every subscriber, a batch per hold of the role, until the
// queue is closed and drained; then it closes the subscribers' lanes so
// their workers can finish.
func (t *topic) dispatch() {
	defer t.b.wg.Done()
	for {
		queued := t.q.Wait(t.kick) // false: kicked (the last subscriber left), or closed and drained
		t.role <- struct{}{}
		routed := t.routeNext(true)
		end := t.q.Closed() && t.q.Snapshot().Len == 0
		if end {
			t.finishLeaving(true)
			for _, s := range *t.subs.Load() {
				s.closeLanes()
			}
		}
		<-t.role
		if end {
			return
		}
		if !queued || routed && len(*t.subs.Load()) == 0 {
			t.tryRetire() // the last subscriber left, or routed to nobody: retire if nothing else came
		}
	}
}

// stepInGap is how long after the topic's previous publish a publisher may
// step in (routeIdle): messages that come closer together are left to the
// dispatcher, which takes them in batches. Stepping in saves a goroutine
// hand-off, which is what latency at moderate rates is made of (a paced
// publisher at 10k and 100k messages/s, one subscriber: p50 from about
// 1.5 µs to about 1.0 µs), but moves the routing onto the publishers: on
// every message, a busy topic lost throughput with it (16 topics, 4
// publishers: +12–20% ns per message).
const stepInGap = 5 * time.Microsecond

// routeIdle is a publisher stepping in for the sleeping dispatcher, its
// message alone in the queue (TryPush's idle): if the role is free, it
// routes the message itself, as far as it goes without waiting, so that
// the message reaches its subscribers' workers in one goroutine hand-off
// instead of two; the dispatcher routes what is left, if anything.
func (t *topic) routeIdle() {
	select {
	case t.role <- struct{}{}:
	default:
		t.q.Wake() // someone routes (or claims): the dispatcher takes it after them
		return
	}
	t.routeNext(false)
	left := len(t.route.envs) > 0
	<-t.role
	switch {
	case left:
		t.q.Wake()
	case len(*t.subs.Load()) == 0:
		t.kickDispatcher() // routed to nobody: the dispatcher sees whether the topic retires
	}
}

// batchRoute is the role holder's view of the subscribers while it routes
// a batch; its slices are reused from batch to batch. A batch a publisher
// stepping in could not finish without waiting stays in progress (envs not
// empty) for the dispatcher to finish.
type batchRoute struct {
	base uint64           // the batch's first message, counted in push order
	snap *[]*Subscription // the routing snapshot subs follows
	subs []place          // each subscriber's place in the batch

	buf      [dispatchBatch]envelope
	envs     []envelope // the batch being routed (in buf); empty between batches
	pos      int        // the message of envs being routed
	accepted [dispatchBatch]bool
	done     int // messages of the batch taken out of the topic queue
}

// span returns the part [lo, hi) of a batch of n that s is owed: from the
// first message dispatched after it joined (its startAt, when a
// subscription of its name was still leaving) to the last one accepted
// before its Unsubscribe (its leaveAt).
func (r *batchRoute) span(s *Subscription, n int) (lo, hi int) {
	hi = n
	if w := s.leaveAt.Load(); w > 0 {
		hi = int(min(uint64(n), w-min(w, r.base)))
	}
	if s.startAt > r.base {
		lo = int(min(uint64(n), s.startAt-r.base))
	}
	return lo, max(lo, hi)
}

// place is a subscriber's place in the batch: it has (or skips) the
// messages before got, and is owed the part [lo, hi).
type place struct {
	s           *Subscription
	got, lo, hi int
}

// follow brings r up to date with the routing snapshot when message i of
// the batch is next: a subscriber that joined meanwhile gets the batch from
// message i on (those were still queued in the topic), one that left gets
// no more of it.
func (r *batchRoute) follow(snap *[]*Subscription, i, n int) {
	if snap == r.snap {
		return
	}
	subs := make([]place, 0, len(*snap))
	for _, s := range *snap {
		subs = append(subs, r.place(s, i, n))
	}
	r.snap, r.subs = snap, subs
}

// place is where s stands in the batch of n when message i is next: as r
// keeps it, or, for a subscriber r has not seen (it joined meanwhile), the
// batch from message i on (got is n when it gets none of it).
func (r *batchRoute) place(s *Subscription, i, n int) place {
	for _, p := range r.subs {
		if p.s == s {
			return p
		}
	}
	lo, hi := r.span(s, n)
	p := place{s: s, got: max(lo, i), lo: max(lo, i), hi: hi}
	if p.got >= hi {
		p.got = n
	}
	return p
}

// reset starts a batch of n with the current snapshot.
func (r *batchRoute) reset(snap *[]*Subscription, base uint64, n int) {
	r.base, r.snap, r.subs = base, snap, r.subs[:0]
	for _, s := range *snap {
		lo, hi := r.span(s, n)
		r.subs = append(r.subs, place{s: s, got: lo, lo: lo, hi: hi})
	}
}

// least is the first message of the batch of n that some subscriber does
// not have yet (n when all have it all).
func (r *batchRoute) least(n int) int {
	for _, p := range r.subs {
		n = min(n, p.got)
	}
	return n
}

// routeNext routes a batch: the one in progress, else the next one
// queued, and reports whether there was one. With wait, it hands the batch,
// in order, to every current subscriber, waiting for room (backpressure)
// where a lane is full. Without (a publisher stepping in), it routes what
// fits and leaves the rest in progress.
//
// Each subscriber first takes what fits in its lane under one lock; where
// a lane is full (or closed) the batch goes on message by message, waiting
// for room, and following subscribers who join or leave meanwhile. A
// message counts as queued in the topic until every subscriber has it:
// before each wait the fully routed prefix is taken out of the queue. A
// subscriber stopping at once gets its messages as dead letters. A leaving
// subscriber gets every message accepted before its Unsubscribe, and no
// later one.
func (t *topic) routeNext(wait bool) bool {
	r := &t.route
	if len(r.envs) == 0 {
		envs := t.q.Peek(r.buf[:])
		if len(envs) == 0 {
			return false
		}
		t.startBatch(envs)
	}
	n := len(r.envs)
	if !wait {
		if r.pos = r.least(n); r.pos == n {
			t.endBatch()
		}
		return true
	}
	for i := r.least(n); i < n; i++ {
		r.pos = i
		for more := true; more; {
			// Until no subscriber is owed message i: one that joins while
			// the dispatcher waits for room gets it too.
			r.follow(t.subs.Load(), i, n)
			more = false
			for si := range r.subs {
				if r.subs[si].got > i {
					continue
				}
				more = true
				if r.subs[si].s.routeDispatched(&r.envs[i]) == nil {
					r.accepted[i] = true
				}
				t.tryRoute(si, i+1)
			}
		}
	}
	t.endBatch()
	return true
}

// startBatch starts routing envs with the current snapshot: each
// subscriber takes, from the start of its part, what fits.
func (t *topic) startBatch(envs []envelope) {
	r := &t.route
	r.reset(t.subs.Load(), t.dispatched.Load(), len(envs))
	r.envs, r.pos, r.done = envs, 0, 0
	clear(r.accepted[:])
	for si := range r.subs {
		t.tryRoute(si, r.subs[si].lo)
	}
}

// tryRoute hands subscriber si of the batch, from message from on, what
// fits in its lane without waiting.
func (t *topic) tryRoute(si, from int) {
	r := &t.route
	p := &r.subs[si]
	k := p.s.tryRouteN(r.envs[from:p.hi])
	markAccepted(r.accepted[:], from, from+k)
	if p.got = from + k; p.got >= p.hi {
		p.got = len(r.envs)
	}
}

// release takes the batch's messages before p out of the topic queue:
// every subscriber has them (or skips them).
func (t *topic) release(p int) {
	r := &t.route
	for i := r.done; i < p; i++ {
		if !r.accepted[i] {
			t.unrouted(&r.envs[i].msg)
		}
	}
	t.q.TakenN(p - r.done)
	t.dispatched.Add(uint64(p - r.done))
	r.done = p
	t.finishLeaving(false)
}

// freePrefix releases the fully routed prefix of the batch, before the
// dispatcher waits.
func (t *topic) freePrefix() {
	r := &t.route
	if p := r.least(len(r.envs)); p > r.done {
		t.release(p)
	}
}

// endBatch releases the whole batch, routed.
func (t *topic) endBatch() {
	r := &t.route
	t.release(len(r.envs))
	clear(r.envs) // drop references for the garbage collector
	r.envs = nil
}

// leave starts s's leaving: it is owed every message accepted so far, and
// leaves the routing snapshot (its lanes closed) once the dispatcher has
// routed them, or at once if it has.
func (t *topic) leave(s *Subscription) {
	t.mu.Lock()
	w := t.q.Snapshot().Pushed
	if t.dispatched.Load() >= w {
		t.removeSubLocked(s)
		t.mu.Unlock()
		s.closeLanes()
		close(s.left)
		return
	}
	// The dispatcher adds to dispatched, then looks at leaving under mu:
	// it sees s, or this saw what it added.
	s.leaveAt.Store(w)
	t.leaving = append(t.leaving, s)
	t.mu.Unlock()
}

// finishLeaving takes out of the routing snapshot the leaving subscribers
// whose messages have all been dispatched (all of them, at the end).
func (t *topic) finishLeaving(all bool) {
	var gone []*Subscription
	t.mu.Lock()
	if len(t.leaving) == 0 {
		t.mu.Unlock()
		return
	}
	kept := t.leaving[:0]
	for _, s := range t.leaving {
		if all || t.dispatched.Load() >= s.leaveAt.Load() {
			t.removeSubLocked(s)
			gone = append(gone, s)
			continue
		}
		kept = append(kept, s)
	}
	clear(t.leaving[len(kept):])
	t.leaving = kept
	t.mu.Unlock()
	for _, s := range gone {
		s.closeLanes()
		close(s.left)
	}
}

// claimOwed is s's Unsubscribe at its deadline (s stopped at once)
// claiming the messages s is owed that have not been routed to it yet
// (claimFor). It takes the role when it is free, or has the dispatcher
// serve it while it waits for room holding the role; it gives up when
// stop is closed first (the holder is inside plugged-in code); nothing is
// owed once left is closed.
func (t *topic) claimOwed(s *Subscription, stop <-chan struct{}) {
	served := make(chan struct{})
	select {
	case t.role <- struct{}{}:
		t.claimFor(s)
		<-t.role
	case t.serve <- func() { t.claimFor(s); close(served) }:
		<-served
	case <-s.left:
	case <-stop:
	}
}

// claimFor is the role's holder claiming for s, stopped at once, what it
// is owed and has not been routed to it — the batch in progress from s's
// place on, and what is still queued and accepted before its Unsubscribe
// (all of it at Close) — for a cutter to dead-letter, so that the stop
// counts them and no Put runs on the routing path. From then on routing
// hands s nothing (its lane is claimed).
func (t *topic) claimFor(s *Subscription) {
	select {
	case <-s.left:
		return
	default:
	}
	if s.lane.claimed.Load() {
		return
	}
	r := &t.route
	var owed []envelope
	from := max(t.dispatched.Load(), s.startAt) // the queue's oldest message, between batches
	if n := len(r.envs); n > 0 {
		p := r.place(s, r.pos, n) // not seen yet: it would be followed from the message being routed
		if p.got < p.hi {
			owed = append(owed, r.envs[p.got:p.hi]...)
		}
		from = max(r.base+uint64(n), s.startAt)
	}
	to := s.leaveAt.Load()
	if to == 0 {
		to = math.MaxUint64 // not leaving: stopped by Close, whose queue is closed
	}
	s.lane.claim()
	owed = t.q.Range(from, to, owed)
	jobs := make([]cutJob, len(owed))
	for i := range owed {
		jobs[i] = cutJob{it: laneItem{env: owed[i]}}
	}
	s.c.routed.Add(uint64(len(jobs)))
	s.c.inFlight.Add(int64(len(jobs)))
	s.startCutter(jobs, false)
}

// unrouted counts a message that no subscriber got.
func (t *topic) unrouted(msg *Message) {
	t.tally.unrouted.Add(1)
	if t.b.obs != nil {
		t.b.obs.Unrouted(UnroutedEvent{Topic: t.name, MessageID: msg.ID})
	}
	if log := t.b.cfg.logger; log.Enabled(context.Background(), slog.LevelInfo) && t.b.logs.unrouted.allow(logKey{topic: t.name}) {
		log.LogAttrs(context.Background(), slog.LevelInfo,
			"broker: message published to a topic without a subscriber, counted Unrouted and dropped; subscribe before publishing",
			slog.String("topic", t.name), slog.String("message_id", msg.ID))
	}
}

func markAccepted(a []bool, from, to int) {
	for i := from; i < to; i++ {
		a[i] = true
	}
}

// activeSubs returns the subscriptions that hold a name on the topic
// (leaving ones included).
func (t *topic) activeSubs() []*Subscription {
	t.mu.Lock()
	defer t.mu.Unlock()
	subs := make([]*Subscription, 0, len(t.active))
	for _, s := range t.active {
		subs = append(subs, s)
	}
	return subs
}

// addSubLocked publishes a routing snapshot with s added.
func (t *topic) addSubLocked(s *Subscription) {
	old := *t.subs.Load()
	subs := make([]*Subscription, len(old), len(old)+1)
	copy(subs, old)
	subs = append(subs, s)
	t.subs.Store(&subs)
}

// tryRetire ends the topic when it has no subscriber and nothing queued:
// its queue closes (a Publish that meets it looks the topic up again, and
// creates a new one), it leaves the broker's map, and its counters go to
// the broker's bounded store of gone topics. It serialises with topic
// creation and Subscribe through the broker's mutex. A closing broker
// retires nothing: Close drains every topic.
func (t *topic) tryRetire() {
	b := t.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return
	}
	t.mu.Lock()
	idle := len(t.active) == 0 && len(t.leaving) == 0 && len(*t.subs.Load()) == 0
	t.mu.Unlock()
	if !idle || !t.q.CloseIfEmpty() {
		return
	}
	b.statsMu.Lock() // Stats see the topic live or gone, never neither nor both
	b.topics.CompareAndDelete(t.name, t)
	t.tally.published.Add(t.q.Snapshot().Pushed)
	b.gone.add(t.name, t.tally)
	b.statsMu.Unlock()
}

// removeSubLocked takes s out of the routing snapshot (it stays in active
// until its Unsubscribe returns, keeping the name taken).
func (t *topic) removeSubLocked(s *Subscription) {
	old := *t.subs.Load()
	subs := make([]*Subscription, 0, len(old))
	for _, x := range old {
		if x != s {
			subs = append(subs, x)
		}
	}
	t.subs.Store(&subs)
	if len(subs) == 0 {
		t.kickDispatcher()
	}
}

// kickDispatcher wakes the dispatcher to see whether the topic can retire.
func (t *topic) kickDispatcher() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func (t *topic) stats(now time.Time) TopicStats {
	q := t.q.Snapshot()
	ts := TopicStats{
		Published: t.tally.published.Load() + q.Pushed, // a publish is accepted when it is queued
		Rejected:  t.tally.rejected.Load(),
		Unrouted:  t.tally.unrouted.Load(),
		Queued:    q.Len,
		Capacity:  t.q.Cap(),
		OldestAge: age(now, q.Head.msg.PublishedAt, q.Len),
	}
	t.blockMu.Lock() // held while the counters are read: a wait is in the total or going on, once
	defer t.blockMu.Unlock()
	bl := t.blocked
	if bl.s != nil {
		ts.BlockedOn = bl.s.name
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ts.ForgottenSubscribers = t.tally.forgotten
	ts.Subscribers = make(map[string]SubscriberStats, len(t.tally.subs))
	for name, c := range t.tally.subs {
		ss := c.snapshot()
		if s := t.active[name]; s != nil {
			s.fill(&ss, now)
			if bl.s == s {
				ss.BlockedFor += max(now.Sub(bl.since), 0) // the wait going on
			}
		}
		ts.Subscribers[name] = ss
	}
	return ts
}

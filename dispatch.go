package broker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/queue"
)

// topic is one topic's queue, its dispatcher and its subscribers.
type topic struct {
	b    *Broker
	name string
	q    *queue.Queue[envelope]
	c    topicCounters
	subs atomic.Pointer[[]*Subscription] // routing snapshot, copy on write under mu

	blockMu sync.Mutex // guards blocked, and the move of a wait into its subscriber's total
	blocked *blockedOn // whose full lane the dispatcher waits for, since when; nil when it does not

	mu       sync.Mutex               // guards active, counters and writes to subs
	active   map[string]*Subscription // by name, until Unsubscribe returns
	counters map[string]*subCounters  // by name, kept forever
}

// blockedOn is a dispatcher's wait for room in a subscriber's lane.
type blockedOn struct {
	s     *Subscription
	since time.Time
}

// blockStart notes that the dispatcher waits for room in s's lane.
func (t *topic) blockStart(s *Subscription) {
	t.blockMu.Lock()
	t.blocked = &blockedOn{s: s, since: time.Now()}
	t.blockMu.Unlock()
}

// blockEnd moves the dispatcher's wait of d for s into s's total.
func (t *topic) blockEnd(s *Subscription, d time.Duration) {
	t.blockMu.Lock()
	s.c.blocked.Add(int64(d))
	t.blocked = nil
	t.blockMu.Unlock()
}

func newTopic(b *Broker, name string) *topic {
	t := &topic{
		b: b, name: name,
		q:        queue.New[envelope](b.cfg.queueSize),
		active:   make(map[string]*Subscription),
		counters: make(map[string]*subCounters),
	}
	t.subs.Store(new([]*Subscription))
	return t
}

// dispatchBatch is how many messages the dispatcher takes from the topic
// queue under one lock.
const dispatchBatch = 64

// dispatch is the topic's goroutine: it takes messages in FIFO order and
// routes each to every subscriber, until the queue is closed and drained;
// then it closes the subscribers' lanes so their workers can finish.
func (t *topic) dispatch() {
	defer t.b.wg.Done()
	var r batchRoute
	for {
		envs, ok := t.q.TakeWait(nil, dispatchBatch)
		if !ok {
			break
		}
		t.routeBatch(envs, &r)
	}
	for _, s := range *t.subs.Load() {
		s.closeLanes()
	}
}

// batchRoute is the dispatcher's view of the subscribers while it routes a
// batch; its slices are reused from batch to batch.
type batchRoute struct {
	snap *[]*Subscription // the routing snapshot subs follows
	subs []*Subscription
	got  []int // per subscriber: how many of the batch it has (or skips)
}

// follow brings r up to date with the routing snapshot when message i of
// the batch is next: a subscriber that joined meanwhile gets the batch from
// message i on, one that left gets no more of it.
func (r *batchRoute) follow(snap *[]*Subscription, i int) {
	if snap == r.snap {
		return
	}
	subs := make([]*Subscription, 0, len(*snap))
	got := make([]int, 0, len(*snap))
	for _, s := range *snap {
		g := i
		for k, old := range r.subs {
			if old == s {
				g = r.got[k]
				break
			}
		}
		subs, got = append(subs, s), append(got, g)
	}
	r.snap, r.subs, r.got = snap, subs, got
}

// reset starts a batch with the current snapshot.
func (r *batchRoute) reset(snap *[]*Subscription) {
	r.snap = snap
	r.subs = append(r.subs[:0], *snap...)
	r.got = r.got[:0]
	for range r.subs {
		r.got = append(r.got, 0)
	}
}

// routeBatch hands a batch of messages, in order, to every current
// subscriber, then takes them from the topic queue (envs is its view:
// read only, and not after they are taken). Each subscriber first
// takes what fits in its lane under one lock; where a lane is full (or
// closed) the batch goes on message by message, waiting for room
// (backpressure), and following subscribers who join or leave meanwhile. A
// message counts as queued in the topic until every subscriber has it:
// before each wait the fully routed prefix is removed. A subscriber
// stopping at once gets its messages as dead letters; one leaving does not
// get them.
func (t *topic) routeBatch(envs []envelope, r *batchRoute) {
	n := len(envs)
	r.reset(t.subs.Load())
	var accepted [dispatchBatch]bool
	for si, s := range r.subs {
		r.got[si] = s.tryRouteN(envs)
		markAccepted(accepted[:], 0, r.got[si])
	}
	done := 0                // taken from the topic queue
	release := func(p int) { // messages before p are routed: out of the queue
		for i := done; i < p; i++ {
			if !accepted[i] {
				t.unrouted(&envs[i].msg)
			}
		}
		t.q.TakenN(p - done)
		done = p
	}
	freePrefix := func() {
		if p := minOf(r.got, n); p > done {
			release(p)
		}
	}
	for i := range n {
		r.follow(t.subs.Load(), i)
		for si, s := range r.subs {
			if r.got[si] > i {
				continue
			}
			if s.route(&envs[i], nil, nil, freePrefix) == nil {
				accepted[i] = true
			}
			k := s.tryRouteN(envs[i+1:])
			markAccepted(accepted[:], i+1, i+1+k)
			r.got[si] = i + 1 + k
		}
	}
	release(n)
}

// unrouted counts a message that no subscriber got.
func (t *topic) unrouted(msg *Message) {
	t.c.unrouted.Add(1)
	if t.b.obs != nil {
		t.b.obs.Unrouted(UnroutedEvent{Topic: t.name, MessageID: msg.ID})
	}
}

func markAccepted(a []bool, from, to int) {
	for i := from; i < to; i++ {
		a[i] = true
	}
}

// minOf returns the smallest of xs, or n if xs is empty.
func minOf(xs []int, n int) int {
	m := n
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

// deactivate forgets the topic's subscriptions once Close has stopped them:
// Stats show their counters, not active.
func (t *topic) deactivate() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.active)
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

// removeSubLocked takes s out of the routing snapshot (it stays in active
// until its Unsubscribe returns, keeping the name taken). A dispatcher that
// still holds an older snapshot sees s.removed and routes nothing more to it.
func (t *topic) removeSubLocked(s *Subscription) {
	s.removed.Store(true)
	old := *t.subs.Load()
	subs := make([]*Subscription, 0, len(old))
	for _, x := range old {
		if x != s {
			subs = append(subs, x)
		}
	}
	t.subs.Store(&subs)
}

func (t *topic) stats(now time.Time) TopicStats {
	q := t.q.Snapshot()
	ts := TopicStats{
		Published: q.Pushed, // a publish is accepted when it is queued
		Rejected:  t.c.rejected.Load(),
		Unrouted:  t.c.unrouted.Load(),
		Queued:    q.Len,
		Capacity:  t.q.Cap(),
		OldestAge: age(now, q.Head.msg.PublishedAt, q.Len),
	}
	t.blockMu.Lock() // held while the counters are read: a wait is in the total or going on, once
	defer t.blockMu.Unlock()
	bl := t.blocked
	if bl != nil {
		ts.BlockedOn = bl.s.name
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ts.Subscribers = make(map[string]SubscriberStats, len(t.counters))
	for name, c := range t.counters {
		ss := c.snapshot()
		if s := t.active[name]; s != nil {
			s.fill(&ss, now)
			if bl != nil && bl.s == s {
				ss.BlockedFor += max(now.Sub(bl.since), 0) // the wait going on
			}
		}
		ts.Subscribers[name] = ss
	}
	return ts
}

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

	mu       sync.Mutex               // guards active, counters and writes to subs
	active   map[string]*Subscription // by name, until Unsubscribe returns
	counters map[string]*subCounters  // by name, kept forever
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
	var (
		envs [dispatchBatch]envelope
		got  []int // per subscriber: how many of the batch it has
	)
	for t.q.Wait(nil) {
		n := t.q.PeekN(envs[:])
		got = t.routeBatch(envs[:n], got)
		clear(envs[:n]) // drop references for the garbage collector
	}
	for _, s := range *t.subs.Load() {
		s.closeLanes()
	}
}

// routeBatch hands a batch of messages, in order, to every current
// subscriber, then removes them from the topic queue. Each subscriber first
// takes what fits in its lane under one lock; where a lane is full (or
// closed) the batch goes on message by message, waiting for room
// (backpressure). A message counts as queued in the topic until every
// subscriber has it: before each wait the fully routed prefix is removed.
// A subscriber stopping at once gets its messages as dead letters; one
// leaving gracefully does not get them. got is scratch space, returned for
// reuse.
func (t *topic) routeBatch(envs []envelope, got []int) []int {
	n := len(envs)
	subs := *t.subs.Load()
	if cap(got) < len(subs) {
		got = make([]int, len(subs))
	}
	got = got[:len(subs)]
	var accepted [dispatchBatch]bool
	for si, s := range subs {
		got[si] = s.tryRouteN(envs)
		markAccepted(accepted[:], 0, got[si])
	}
	done := 0 // removed from the topic queue
	freePrefix := func() {
		if p := minOf(got, n); p > done {
			t.q.AdvanceN(p - done)
			done = p
		}
	}
	for i := range n {
		for si, s := range subs {
			if got[si] > i {
				continue
			}
			if s.route(&envs[i], nil, nil, freePrefix) == nil {
				accepted[i] = true
			}
			k := s.tryRouteN(envs[i+1:])
			markAccepted(accepted[:], i+1, i+1+k)
			got[si] = i + 1 + k
		}
	}
	t.q.AdvanceN(n - done)
	for i := range n {
		if !accepted[i] {
			t.c.unrouted.Add(1)
			if t.b.cfg.obs != nil {
				t.b.cfg.obs.Unrouted(UnroutedEvent{Topic: t.name, MessageID: envs[i].msg.ID})
			}
		}
	}
	return got
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

// addSubLocked publishes a routing snapshot with s added.
func (t *topic) addSubLocked(s *Subscription) {
	old := *t.subs.Load()
	subs := make([]*Subscription, len(old), len(old)+1)
	copy(subs, old)
	subs = append(subs, s)
	t.subs.Store(&subs)
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
}

func (t *topic) stats(now time.Time) TopicStats {
	head, n := t.q.Head()
	ts := TopicStats{
		Published: t.c.published.Load(),
		Rejected:  t.c.rejected.Load(),
		Unrouted:  t.c.unrouted.Load(),
		Queued:    n,
		Capacity:  t.q.Cap(),
		OldestAge: age(now, head.msg.PublishedAt, n),
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ts.Subscribers = make(map[string]SubscriberStats, len(t.counters))
	for name, c := range t.counters {
		ss := c.snapshot()
		if s := t.active[name]; s != nil {
			s.fill(&ss, now)
		}
		ts.Subscribers[name] = ss
	}
	return ts
}

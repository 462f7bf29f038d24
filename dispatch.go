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
	q    *queue.Queue[Message]
	c    topicCounters
	subs atomic.Pointer[[]*Subscription] // routing snapshot, copy on write under mu

	mu       sync.Mutex               // guards active, counters and writes to subs
	active   map[string]*Subscription // by name, until Unsubscribe returns
	counters map[string]*subCounters  // by name, kept forever
}

func newTopic(b *Broker, name string) *topic {
	t := &topic{
		b: b, name: name,
		q:        queue.New[Message](b.cfg.queueSize),
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
// then it closes the subscribers' lanes so their workers can finish. A
// message counts as queued in the topic until it has been routed: the
// dispatcher peeks a batch, and removes the routed prefix before it waits
// for room in a lane and at the end of the batch.
func (t *topic) dispatch() {
	defer t.b.wg.Done()
	var buf [dispatchBatch]Message
	for t.q.Wait(nil) {
		n := t.q.PeekN(buf[:])
		done := 0
		for i := range n {
			t.route(&buf[i], func() { // about to wait: free the routed prefix
				t.q.AdvanceN(i - done)
				done = i
			})
		}
		t.q.AdvanceN(n - done)
		clear(buf[:n]) // drop references for the garbage collector
	}
	for _, s := range *t.subs.Load() {
		s.closeLanes()
	}
}

// route hands msg to every current subscriber, waiting for room in each
// lane (backpressure); beforeWait runs before the first wait. A subscriber
// stopping at once gets the message as a dead letter; one that is leaving
// gracefully does not get it.
func (t *topic) route(msg *Message, beforeWait func()) {
	env := envelope{msg: *msg}
	routed := false
	for _, s := range *t.subs.Load() {
		if s.route(&env, nil, nil, beforeWait) == nil {
			routed = true
		}
	}
	if routed {
		return
	}
	t.c.unrouted.Add(1)
	if t.b.cfg.obs != nil {
		t.b.cfg.obs.Unrouted(UnroutedEvent{Topic: t.name, MessageID: msg.ID})
	}
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
		OldestAge: age(now, head.PublishedAt, n),
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

package broker

import (
	"slices"
	"sync"
	"sync/atomic"
)

// This file is the broker's topics as resources: a topic exists (with its
// queue and dispatcher goroutine) while it has subscribers or messages, and
// retires when it has neither (see topic.tryRetire); its counters are kept
// for Stats, up to a bound, after it is gone.

// Bounds on the counters Stats keep of what is gone.
const (
	// MaxGoneTopics is how many retired topics (no subscriber, nothing
	// queued) Stats keep counters for; beyond it the one retired longest
	// ago is forgotten (Stats.ForgottenTopics). Publishing to it again
	// brings its counters back while they are kept.
	MaxGoneTopics = 1024
	// MaxGoneSubscribers is how many unsubscribed names a topic keeps
	// counters for; beyond it the one idle longest is forgotten
	// (TopicStats.ForgottenSubscribers). Subscribing the name again brings
	// its counters back while they are kept.
	MaxGoneSubscribers = 64
)

// tally is a topic's counters: they outlive its goroutine and queue.
type tally struct {
	published atomic.Uint64 // accepted by retired queues of the topic
	rejected  atomic.Uint64
	unrouted  atomic.Uint64

	// Guarded by the topic's mu (by gone's when the topic is gone).
	subs      map[string]*subCounters // by subscriber name
	idle      []string                // unsubscribed names, longest idle first
	forgotten uint64                  // names whose counters were dropped
}

func newTally() *tally { return &tally{subs: make(map[string]*subCounters)} }

// counter returns name's counters, creating them; it is no longer idle.
func (tl *tally) counter(name string) *subCounters {
	if i := slices.Index(tl.idle, name); i >= 0 {
		tl.idle = slices.Delete(tl.idle, i, i+1)
	}
	c := tl.subs[name]
	if c == nil {
		c = new(subCounters)
		tl.subs[name] = c
	}
	return c
}

// left notes that name unsubscribed, forgetting the longest idle names
// beyond MaxGoneSubscribers.
func (tl *tally) left(name string) {
	tl.idle = append(tl.idle, name)
	for len(tl.idle) > MaxGoneSubscribers {
		delete(tl.subs, tl.idle[0])
		tl.idle = tl.idle[1:]
		tl.forgotten++
	}
}

// goneTopics keeps the tallies of retired topics, bounded.
type goneTopics struct {
	mu        sync.Mutex
	byName    map[string]*tally
	order     []string // the names in byName, retired longest ago first
	forgotten atomic.Uint64
}

func newGoneTopics() *goneTopics {
	return &goneTopics{byName: make(map[string]*tally)}
}

// add keeps a retired topic's tally, forgetting the oldest beyond
// MaxGoneTopics.
func (g *goneTopics) add(name string, tl *tally) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.byName[name] = tl
	g.order = append(g.order, name)
	for len(g.order) > MaxGoneTopics {
		delete(g.byName, g.order[0])
		g.order = g.order[1:]
		g.forgotten.Add(1)
	}
}

// take returns (and no longer keeps) the tally of a gone topic, or a new
// one.
func (g *goneTopics) take(name string) *tally {
	g.mu.Lock()
	defer g.mu.Unlock()
	tl, ok := g.byName[name]
	if !ok {
		return newTally()
	}
	delete(g.byName, name)
	i := slices.Index(g.order, name)
	g.order = slices.Delete(g.order, i, i+1)
	return tl
}

// stats adds the gone topics to st.
func (g *goneTopics) stats(st *Stats) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, tl := range g.byName {
		ts := TopicStats{
			Published:            tl.published.Load(),
			Rejected:             tl.rejected.Load(),
			Unrouted:             tl.unrouted.Load(),
			ForgottenSubscribers: tl.forgotten,
			Subscribers:          make(map[string]SubscriberStats, len(tl.subs)),
		}
		for sub, c := range tl.subs {
			ts.Subscribers[sub] = c.snapshot()
		}
		st.Topics[name] = ts
	}
	st.ForgottenTopics = g.forgotten.Load()
}

// topic returns the named topic, creating it (and its dispatcher) on first
// use. It fails with ErrClosed after Close.
func (b *Broker) topic(name string) (*topic, error) {
	if b.closed.Load() {
		return nil, ErrClosed
	}
	if t, ok := b.topics.Load(name); ok {
		return t.(*topic), nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, ErrClosed
	}
	return b.topicLocked(name), nil
}

// topicLocked is topic with b.mu held and the broker open.
func (b *Broker) topicLocked(name string) *topic {
	if t, ok := b.topics.Load(name); ok {
		return t.(*topic)
	}
	b.statsMu.Lock() // from gone to live in one step for Stats
	t := newTopic(b, name, b.gone.take(name))
	b.topics.Store(name, t)
	b.statsMu.Unlock()
	b.wg.Add(1)
	go t.dispatch()
	return t
}

// liveTopics returns the topics that exist now.
func (b *Broker) liveTopics() []*topic {
	var ts []*topic
	b.topics.Range(func(_, v any) bool {
		ts = append(ts, v.(*topic))
		return true
	})
	return ts
}

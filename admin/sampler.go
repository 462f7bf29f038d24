package admin

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inproc/broker"
)

// The chart box of Chart.Points, in SVG user units.
const (
	ChartWidth  = 240
	ChartHeight = 40
)

// sampler keeps, per live topic, a bounded ring of backlog samples and the
// counters of the last sample, from which it derives rates. What it keeps
// follows what is live: a topic that is not live at a sample is dropped.
type sampler struct {
	interval time.Duration
	size     int // samples per topic

	mu     sync.Mutex // guards the fields below
	last   time.Time  // when the latest sample was taken; zero before the first
	topics map[string]*topicHistory
}

type topicHistory struct {
	ring      []Sample // at most size; oldest at start once full
	start     int
	published uint64
	rate      *float64
	subs      map[string]*subHistory
}

type subHistory struct {
	delivered uint64
	rate      *float64
}

func newSampler(interval time.Duration, size int) *sampler {
	return &sampler{interval: interval, size: size, topics: make(map[string]*topicHistory)}
}

// live reports whether a topic has a queue: an active subscriber or
// messages waiting. Retired topics (counters only) report a capacity of 0.
func live(t broker.TopicStats) bool {
	if t.Capacity > 0 || t.Queued > 0 {
		return true
	}
	for _, s := range t.Subscribers {
		if s.Active || s.Backlog() > 0 {
			return true
		}
	}
	return false
}

// observe records st, read at now, as a sample if the latest one is at
// least interval old.
func (s *sampler) observe(st broker.Stats, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observeLocked(st, now)
}

func (s *sampler) observeLocked(st broker.Stats, now time.Time) {
	if !s.last.IsZero() && now.Sub(s.last) < s.interval {
		return
	}
	// A rate spans the time since the previous sample, if that is recent
	// enough to say something about now.
	dt := now.Sub(s.last).Seconds()
	rated := !s.last.IsZero() && dt > 0 && now.Sub(s.last) <= 5*s.interval
	for name, ts := range st.Topics {
		if !live(ts) {
			delete(s.topics, name)
			continue
		}
		th, seen := s.topics[name]
		if !seen {
			th = &topicHistory{subs: make(map[string]*subHistory)}
			s.topics[name] = th
		}
		th.push(Sample{At: now, Backlog: ts.Backlog()}, s.size)
		th.rate = rate(seen && rated, th.published, ts.Published, dt)
		th.published = ts.Published
		for sn, ss := range ts.Subscribers {
			sh, ok := th.subs[sn]
			if !ok {
				sh = new(subHistory)
				th.subs[sn] = sh
			}
			sh.rate = rate(ok && rated, sh.delivered, ss.Delivered, dt)
			sh.delivered = ss.Delivered
		}
		for sn := range th.subs {
			if _, ok := ts.Subscribers[sn]; !ok {
				delete(th.subs, sn)
			}
		}
	}
	for name := range s.topics {
		if _, ok := st.Topics[name]; !ok {
			delete(s.topics, name)
		}
	}
	s.last = now
}

// rate is (to-from)/dt, or nil when unknown (no earlier sample, or the
// counter went back: the topic was forgotten and created anew).
func rate(ok bool, from, to uint64, dt float64) *float64 {
	if !ok || to < from {
		return nil
	}
	r := float64(to-from) / dt
	return &r
}

func (th *topicHistory) push(x Sample, size int) {
	if len(th.ring) < size {
		th.ring = append(th.ring, x)
		return
	}
	th.ring[th.start] = x
	th.start = (th.start + 1) % size
}

// samples returns the ring, oldest first.
func (th *topicHistory) samples() []Sample {
	out := make([]Sample, 0, len(th.ring))
	out = append(out, th.ring[th.start:]...)
	return append(out, th.ring[:th.start]...)
}

// snapshot samples st (read at now) if due, and returns it with the rates
// and charts.
func (s *sampler) snapshot(st broker.Stats, now time.Time) Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observeLocked(st, now)
	snap := Snapshot{
		SampledAt:         now,
		IntervalSeconds:   s.interval.Seconds(),
		DeadLetterEvicted: st.DeadLetterEvicted,
		PluginPanics:      st.PluginPanics,
		ForgottenTopics:   st.ForgottenTopics,
		Dedup: DedupSnapshot{
			Capacity:               st.Dedup.Capacity,
			Entries:                st.Dedup.Entries,
			WindowSeconds:          st.Dedup.Window.Seconds(),
			ForgottenEarly:         st.Dedup.ForgottenEarly,
			EffectiveWindowSeconds: st.Dedup.EffectiveWindow.Seconds(),
		},
		Topics: make([]TopicSnapshot, 0, len(st.Topics)),
	}
	for _, name := range slices.Sorted(maps.Keys(st.Topics)) {
		ts := st.Topics[name]
		t := TopicSnapshot{
			Name:                 name,
			Live:                 live(ts),
			Published:            ts.Published,
			Rejected:             ts.Rejected,
			Unrouted:             ts.Unrouted,
			Queued:               ts.Queued,
			Capacity:             ts.Capacity,
			OldestAgeSeconds:     ts.OldestAge.Seconds(),
			BlockedOn:            ts.BlockedOn,
			Backlog:              ts.Backlog(),
			ForgottenSubscribers: ts.ForgottenSubscribers,
			Chart:                Chart{Samples: []Sample{}},
			Subscribers:          make([]SubscriberSnapshot, 0, len(ts.Subscribers)),
		}
		th := s.topics[name]
		if th != nil && t.Live {
			t.PublishRate = th.rate
			t.Chart = chart(th.samples(), s.size)
		}
		if t.Live {
			snap.LiveTopics++
			snap.Backlog += t.Backlog
		}
		for _, sn := range slices.Sorted(maps.Keys(ts.Subscribers)) {
			ss := ts.Subscribers[sn]
			sub := SubscriberSnapshot{
				Name:              sn,
				Active:            ss.Active,
				Concurrency:       ss.Concurrency,
				Backlog:           ss.Backlog(),
				Queued:            ss.Queued,
				Held:              ss.Held,
				Parked:            ss.Parked,
				InFlight:          ss.InFlight,
				Capacity:          ss.Capacity,
				OldestAgeSeconds:  ss.OldestAge.Seconds(),
				Breaker:           string(ss.Breaker),
				RetryBudgetLeft:   ss.RetryBudgetLeft,
				BlockedForSeconds: ss.BlockedFor.Seconds(),
				Routed:            ss.Routed,
				Delivered:         ss.Delivered,
				Attempts:          ss.Attempts,
				Retries:           ss.Retries,
				DeadLettered:      ss.DeadLettered,
				Deduplicated:      ss.Deduplicated,
				DeadLetterErrors:  ss.DeadLetterErrors,
				RetryRate:         ss.RetryRate(),
				FailureRate:       ss.FailureRate(),
			}
			if th != nil && t.Live {
				if sh := th.subs[sn]; sh != nil {
					sub.DeliveredRate = sh.rate
				}
			}
			t.DeadLettered += ss.DeadLettered
			t.Subscribers = append(t.Subscribers, sub)
		}
		snap.Topics = append(snap.Topics, t)
	}
	return snap
}

// chart draws samples (oldest first) in the chart box: one step per sample
// of a full ring, the newest at the right edge, the largest backlog at the
// top (a backlog of 0 throughout draws a line along the bottom).
func chart(samples []Sample, size int) Chart {
	c := Chart{Samples: samples, Max: 0}
	for _, x := range samples {
		c.Max = max(c.Max, x.Backlog)
	}
	top := max(c.Max, 1)
	step := float64(ChartWidth)
	if size > 1 {
		step = float64(ChartWidth) / float64(size-1)
	}
	const pad = 1.0 // keep the stroke inside the box
	var b strings.Builder
	n := len(samples)
	for i, x := range samples {
		px := float64(ChartWidth) - float64(n-1-i)*step
		py := pad + (float64(ChartHeight)-2*pad)*(1-float64(x.Backlog)/float64(top))
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", px, py)
	}
	c.Points = b.String()
	return c
}

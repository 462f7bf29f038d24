package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/inproc/broker"
)

// percentile returns the p-th percentile (0..100) of xs by the nearest-rank
// method: the smallest value with at least p% of the values at or below it.
// It returns 0 for no values; xs is not modified.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// slope returns the least-squares slope of ys over xs (0 with fewer than
// two distinct xs).
func slope(xs, ys []float64) float64 {
	n := float64(len(xs))
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0
	}
	var sx, sy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
	}
	mx, my := sx/n, sy/n
	var sxy, sxx float64
	for i := range xs {
		dx := xs[i] - mx
		sxy += dx * (ys[i] - my)
		sxx += dx * dx
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// totals sums a Stats snapshot over topics and subscribers.
type totals struct {
	Published, Rejected                   uint64
	Delivered, Deduplicated, DeadLettered uint64
	Attempts, Retries                     uint64
	Backlog                               int
}

func sum(st broker.Stats) totals {
	var t totals
	for _, ts := range st.Topics {
		t.Published += ts.Published
		t.Rejected += ts.Rejected
		t.Backlog += ts.Backlog()
		for _, ss := range ts.Subscribers {
			t.Delivered += ss.Delivered
			t.Deduplicated += ss.Deduplicated
			t.DeadLettered += ss.DeadLettered
			t.Attempts += ss.Attempts
			t.Retries += ss.Retries
		}
	}
	return t
}

// sample is one Stats snapshot, at a time since the monitor started.
type sample struct {
	At time.Duration
	St broker.Stats
}

func (s sample) backlog() int { return sum(s.St).Backlog }

func (s sample) sub(topic, name string) broker.SubscriberStats {
	return s.St.Topics[topic].Subscribers[name]
}

// backlogs returns the time (s) and backlog of the samples taken in
// [from, to) (to <= 0: no upper bound).
func backlogs(samples []sample, from, to time.Duration) (ts, bs []float64) {
	for _, s := range samples {
		if s.At < from || (to > 0 && s.At >= to) {
			continue
		}
		ts = append(ts, s.At.Seconds())
		bs = append(bs, float64(s.backlog()))
	}
	return ts, bs
}

// points turns samples into a chart polyline of the backlog.
func points(samples []sample) []point {
	ps := make([]point, len(samples))
	for i, s := range samples {
		ps[i] = point{s.At.Seconds(), float64(s.backlog())}
	}
	return ps
}

// monitor polls a broker's Stats every interval, keeps the samples and
// prints a progress line every progress interval.
type monitor struct {
	b        *broker.Broker
	out      io.Writer
	label    string
	every    time.Duration
	progress time.Duration
	start    time.Time

	mu      sync.Mutex
	samples []sample
	phase   string
	printed time.Duration // when the last progress line was printed; -1 before the first

	stop chan struct{}
	done chan struct{}
}

func startMonitor(b *broker.Broker, out io.Writer, label string, cfg *config) *monitor {
	m := &monitor{
		b: b, out: out, label: label, every: cfg.Sample, progress: cfg.Progress,
		start: time.Now(), stop: make(chan struct{}), done: make(chan struct{}), printed: -1,
	}
	m.take()
	go m.run()
	return m
}

func (m *monitor) run() {
	defer close(m.done)
	tick := time.NewTicker(m.every)
	defer tick.Stop()
	next := m.progress
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
		s := m.take()
		if s.At >= next {
			m.print(s)
			for next <= s.At {
				next += m.progress
			}
		}
	}
}

// take records a sample now and returns it.
func (m *monitor) take() sample {
	s := sample{At: time.Since(m.start), St: m.b.Stats()}
	m.mu.Lock()
	m.samples = append(m.samples, s)
	m.mu.Unlock()
	return s
}

func (m *monitor) print(s sample) {
	t := sum(s.St)
	m.mu.Lock()
	phase := m.phase
	m.printed = s.At
	m.mu.Unlock()
	if phase != "" {
		phase = " " + phase
	}
	fmt.Fprintf(m.out, "  [%s %5.1fs%s] published=%d delivered=%d backlog=%d retries=%d dead=%d rejected=%d\n",
		m.label, s.At.Seconds(), phase, t.Published, t.Delivered, t.Backlog, t.Retries, t.DeadLettered, t.Rejected)
}

// setPhase names the phase shown in progress lines.
func (m *monitor) setPhase(p string) {
	m.mu.Lock()
	m.phase = p
	m.mu.Unlock()
}

// last returns the latest sample.
func (m *monitor) last() sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.samples[len(m.samples)-1]
}

// sofar returns the samples taken so far.
func (m *monitor) sofar() []sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.samples)
}

// Stop ends the polling, takes a last sample, prints it unless a progress
// line was just printed, and returns all samples.
func (m *monitor) Stop() []sample {
	close(m.stop)
	<-m.done
	s := m.take()
	m.mu.Lock()
	printed := m.printed
	m.mu.Unlock()
	if printed < 0 || s.At-printed >= m.progress/2 {
		m.print(s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// take may run on two goroutines (the poller and a check's own
	// snapshots), so keep the samples in time order.
	slices.SortStableFunc(m.samples, func(a, b sample) int { return cmp.Compare(a.At, b.At) })
	return m.samples
}

// observer records successful handler durations (to measure μ) and dead
// letter events. It runs on the broker's hot path: a mutex and an append.
type observer struct {
	broker.NopObserver

	mu        sync.Mutex
	durations map[string][]time.Duration // by subscriber, successful attempts
	dead      []broker.DeadLetterEvent
}

const maxDurations = 1 << 18

func newObserver() *observer {
	return &observer{durations: make(map[string][]time.Duration)}
}

func (o *observer) Attempted(e broker.AttemptEvent) {
	if e.Outcome != broker.OutcomeDelivered {
		return
	}
	o.mu.Lock()
	if d := o.durations[e.Subscriber]; len(d) < maxDurations {
		o.durations[e.Subscriber] = append(d, e.Duration)
	}
	o.mu.Unlock()
}

func (o *observer) DeadLettered(e broker.DeadLetterEvent) {
	o.mu.Lock()
	o.dead = append(o.dead, e)
	o.mu.Unlock()
}

// serviceTimes returns the handler durations of sub's deliveries so far,
// in seconds.
func (o *observer) serviceTimes(sub string) []float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	ds := o.durations[sub]
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = d.Seconds()
	}
	return xs
}

func (o *observer) deadLetters() []broker.DeadLetterEvent {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.dead)
}

// workerRate is μ = 1/mean service time; 0 without data.
func workerRate(times []float64) float64 {
	if m := mean(times); m > 0 {
		return 1 / m
	}
	return 0
}

// workersFor is the article's W >= ceil(λ/μ), raised if need be so that
// the utilisation λ/(W·μ) is at most maxUtil (a queue at ρ = 1 never
// settles). It also returns how W was chosen, for printing.
func workersFor(lambda, mu, maxUtil float64) (int, string) {
	w := max(1, ceilDiv(lambda, mu))
	if hot := max(1, int(math.Ceil(lambda/(mu*maxUtil)-1e-9))); hot > w {
		return hot, fmt.Sprintf("ceil(λ/μ) = %d, raised to keep ρ <= %.2f", w, maxUtil)
	}
	return w, "= ceil(λ/μ), the article's rule"
}

// rateP95 is the 95th percentile of the publish rate over sliding windows
// of length win (the article's λ_p95).
func rateP95(samples []sample, win time.Duration) float64 {
	var rates []float64
	j := 0
	for i, s := range samples {
		for j < i && s.At-samples[j+1].At >= win {
			j++
		}
		if d := s.At - samples[j].At; d >= win {
			rates = append(rates, float64(sum(s.St).Published-sum(samples[j].St).Published)/d.Seconds())
		}
	}
	return percentile(rates, 95)
}

// ceilDiv is ceil(a/b) for rates.
func ceilDiv(a, b float64) int { return int(math.Ceil(a/b - 1e-9)) }

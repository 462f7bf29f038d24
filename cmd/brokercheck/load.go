package main

import (
	"context"
	"errors"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// serve is a handler's work: it takes d (a timer, so it uses no CPU) and
// gives up early, with ctx's error, when ctx ends.
func serve(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// serviceHandler is a handler that takes d per message and succeeds.
func serviceHandler(d time.Duration) broker.Handler {
	return func(ctx context.Context, _ broker.Message) error { return serve(ctx, d) }
}

// measureService returns how long serve(d) really takes here, on average
// over n runs: timers overshoot, so a handler of service time d runs at a
// little less than 1/d.
func measureService(ctx context.Context, d time.Duration, n int) time.Duration {
	start := time.Now()
	for range n {
		_ = serve(ctx, d)
	}
	return time.Since(start) / time.Duration(n)
}

// loadGen publishes to one topic at rate λ: a pacer goroutine emits
// arrivals on an absolute schedule (Poisson or evenly spaced) and a pool of
// publisher goroutines publishes them. An arrival that finds every publisher
// busy and the hand-off buffer full is shed (counted), as a request to a
// service whose workers are all blocked would be; the schedule never
// stretches, so a blocked Publish does not turn into a burst later.
type loadGen struct {
	b      *broker.Broker
	topic  string
	prefix string
	rate   float64
	rng    *rand.Rand // nil: evenly spaced arrivals

	tokens chan uint64
	stop   chan struct{}
	wg     sync.WaitGroup
	done   chan struct{}

	arrivals, shed  atomic.Uint64
	ok, full, other atomic.Uint64
	busySince       []atomic.Int64 // per publisher: start of the Publish in progress (UnixNano), 0 when idle
	mu              sync.Mutex
	latencies       []time.Duration
	firstErr        error
	stopOnce        sync.Once
}

// startLoad starts publishing at rate msgs/s with the given number of
// publishers. IDs are prefix + sequence number.
func startLoad(b *broker.Broker, topic, prefix string, rate float64, publishers int, cfg *config) *loadGen {
	l := &loadGen{
		b: b, topic: topic, prefix: prefix, rate: rate,
		tokens:    make(chan uint64, 8*publishers),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		busySince: make([]atomic.Int64, publishers),
	}
	if cfg.Poisson {
		h := fnv.New64a()
		h.Write([]byte(prefix))
		l.rng = rand.New(rand.NewPCG(cfg.Seed, h.Sum64()))
	}
	l.wg.Add(publishers)
	for i := range publishers {
		go l.publish(i)
	}
	go func() {
		l.wg.Wait()
		close(l.done)
	}()
	go l.pace()
	return l
}

// gap returns the time to the next arrival.
func (l *loadGen) gap() time.Duration {
	mean := float64(time.Second) / l.rate
	if l.rng != nil {
		return time.Duration(l.rng.ExpFloat64() * mean)
	}
	return time.Duration(mean)
}

func (l *loadGen) pace() {
	defer close(l.tokens)
	start := time.Now()
	var due time.Duration // offset of the next arrival from start
	var seq uint64
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		now := time.Since(start)
		for due <= now {
			select {
			case l.tokens <- seq:
			default:
				l.shed.Add(1)
			}
			l.arrivals.Add(1)
			seq++
			due += l.gap()
		}
		timer.Reset(due - now)
		select {
		case <-l.stop:
			return
		case <-timer.C:
		}
	}
}

func (l *loadGen) publish(i int) {
	defer l.wg.Done()
	var lats []time.Duration
	for seq := range l.tokens {
		msg := broker.Message{ID: l.prefix + strconv.FormatUint(seq, 10), Topic: l.topic}
		t0 := time.Now()
		l.busySince[i].Store(t0.UnixNano())
		err := l.b.Publish(context.Background(), msg)
		l.busySince[i].Store(0)
		lats = append(lats, time.Since(t0))
		switch {
		case err == nil:
			l.ok.Add(1)
		case errors.Is(err, broker.ErrQueueFull):
			l.full.Add(1)
		default:
			l.other.Add(1)
			l.mu.Lock()
			if l.firstErr == nil {
				l.firstErr = err
			}
			l.mu.Unlock()
		}
	}
	l.mu.Lock()
	l.latencies = append(l.latencies, lats...)
	l.mu.Unlock()
}

// Stop ends the arrivals; publishers finish what was handed to them.
func (l *loadGen) Stop() { l.stopOnce.Do(func() { close(l.stop) }) }

// Wait waits at most timeout for every publisher to return; false means a
// Publish is still blocked.
func (l *loadGen) Wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-l.done:
		return true
	case <-t.C:
		return false
	}
}

// oldestBusy is how long the longest Publish still in progress has run.
func (l *loadGen) oldestBusy() time.Duration {
	var oldest time.Duration
	now := time.Now().UnixNano()
	for i := range l.busySince {
		if s := l.busySince[i].Load(); s != 0 {
			oldest = max(oldest, time.Duration(now-s))
		}
	}
	return oldest
}

// loadReport sums up a finished load.
type loadReport struct {
	Arrivals, Shed, OK, Full, Other uint64
	FirstErr                        error
	P50, P99, Max                   time.Duration // Publish latency
}

func (l *loadGen) report() loadReport {
	l.mu.Lock()
	lats := slices.Clone(l.latencies)
	firstErr := l.firstErr
	l.mu.Unlock()
	r := loadReport{
		Arrivals: l.arrivals.Load(), Shed: l.shed.Load(),
		OK: l.ok.Load(), Full: l.full.Load(), Other: l.other.Load(), FirstErr: firstErr,
	}
	if len(lats) > 0 {
		xs := make([]float64, len(lats))
		for i, d := range lats {
			xs[i] = float64(d)
		}
		r.P50 = time.Duration(percentile(xs, 50))
		r.P99 = time.Duration(percentile(xs, 99))
		r.Max = slices.Max(lats)
	}
	return r
}

// pause waits d or until ctx ends (false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

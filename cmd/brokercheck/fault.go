package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/inproc/broker"
)

// Retry backoff of check 2.
const (
	faultBackoffBase = 10 * time.Millisecond
	faultBackoffMax  = 100 * time.Millisecond
)

// recoveredAt finds when, after from, the backlog came back to level: the
// first sample at or below level that starts a stretch of hold whose p95
// is at or below level. It returns the time from from to that sample.
func recoveredAt(samples []sample, from time.Duration, level float64, hold time.Duration) (time.Duration, bool) {
	for i, s := range samples {
		if s.At <= from || float64(s.backlog()) > level {
			continue
		}
		var window []float64
		j := i
		for ; j < len(samples) && samples[j].At <= s.At+hold; j++ {
			window = append(window, float64(samples[j].backlog()))
		}
		if j == len(samples) && samples[j-1].At < s.At+hold {
			return 0, false // the stretch is not over yet
		}
		if percentile(window, 95) <= level {
			return s.At - from, true
		}
	}
	return 0, false
}

// checkFault is check 2: one of two subscribers times out during a fault
// window. Publishers must always return, the retry rate must stay within
// its bounds and the backlog must come back to its steady level.
func checkFault(ctx context.Context, cfg *config, r *result) {
	f := cfg.Fault
	const topic, healthy, flaky = "orders", "audit", "webhook"
	healthySvc := max(f.Service/2, time.Millisecond)
	const healthyWorkers = 2
	var faulty atomic.Bool

	obs := newObserver()
	b, err := broker.New(
		broker.WithQueueSize(f.Queue),
		broker.WithPublishTimeout(f.PublishTimeout),
		broker.WithRetryPolicy(broker.RetryPolicy{
			MaxRetries: retries(f.MaxRetries),
			Backoff:    broker.ExponentialBackoff(faultBackoffBase, faultBackoffMax),
		}),
		broker.WithLogger(discard),
		broker.WithObserver(obs),
	)
	if err != nil {
		r.fatal(err)
		return
	}
	whenFull, _ := lanePolicy(f.WhenFull)
	_, err = b.Subscribe(topic, healthy, serviceHandler(healthySvc), broker.Concurrency(healthyWorkers))
	if err == nil {
		_, err = b.Subscribe(topic, flaky, func(ctx context.Context, m broker.Message) error {
			if faulty.Load() && (f.FailProb >= 1 || rand.Float64() < f.FailProb) {
				// The downstream answers after twice the deadline; the
				// handler honours ctx, so it returns at the deadline.
				return serve(ctx, 2*f.HandlerTimeout)
			}
			return serve(ctx, f.Service)
		}, broker.Concurrency(f.Workers), broker.HandlerTimeout(f.HandlerTimeout), broker.WhenLaneFull(whenFull))
	}
	if err != nil {
		r.fatal(err)
		_ = closeBroker(b, cfg.CloseTimeout)
		return
	}

	latBound := f.PublishTimeout + f.Margin
	capRate := float64(f.MaxRetries) / float64(f.MaxRetries+1)
	recoverBound := cfg.recoverBound()
	settle := f.HandlerTimeout + faultBackoffMax + f.Service + 100*time.Millisecond
	r.printf("λ = %.0f/s into topic %q (%s arrivals, %d publishers), publish timeout %v, queue and lanes of %d",
		f.Rate, topic, arrivalName(cfg), cfg.Publishers, f.PublishTimeout, f.Queue)
	r.printf("subscribers: %s (W=%d, service %v) and %s (W=%d, service %v, HandlerTimeout %v, %d retries, backoff %v→%v, full lane: %v)",
		healthy, healthyWorkers, healthySvc, flaky, f.Workers, f.Service, f.HandlerTimeout, f.MaxRetries, faultBackoffBase, faultBackoffMax, whenFull)
	r.printf("timeline: steady %v, then %s times out on %.0f%% of attempts for %v, then recovers",
		f.Warmup, flaky, 100*f.FailProb, f.Duration)

	mon := startMonitor(b, r.out, "c2", cfg)
	mon.setPhase("steady")
	load := startLoad(b, topic, "o-", f.Rate, cfg.Publishers, cfg)
	pause(ctx, f.Warmup)
	s0 := mon.take()
	faulty.Store(true)
	mon.setPhase("fault")
	pause(ctx, f.Duration)
	faulty.Store(false)
	mon.setPhase("recovering")
	s1 := mon.take()
	faultStart, faultEnd := s0.At, s1.At

	_, steadyBs := backlogs(mon.sofar(), f.Warmup/5, faultStart)
	steadyP95 := percentile(steadyBs, 95)
	level := max(2*steadyP95, 10)

	// Wait for the backlog to come back to its level and hold there; take
	// the end of the retry window once every message caught by the fault
	// has had time to finish.
	recovered := time.Duration(-1)
	var winEnd *sample
	tick := time.NewTicker(cfg.Sample)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		s := mon.last()
		since := s.At - faultEnd
		if winEnd == nil && since >= settle {
			winEnd = &s
		}
		if recovered < 0 {
			if d, ok := recoveredAt(mon.sofar(), faultEnd, level, f.Hold); ok {
				recovered = d
				mon.setPhase("recovered")
			}
		}
		if winEnd != nil && (recovered >= 0 || since > recoverBound+f.Hold) {
			break
		}
	}
	tick.Stop()
	load.Stop()
	returned := load.Wait(latBound + time.Second)
	hung := load.oldestBusy()
	samples := mon.Stop()
	closeErr := closeBroker(b, cfg.CloseTimeout)
	rep := load.report()
	final := b.Stats().Topics[topic].Subscribers[flaky]
	if winEnd == nil {
		winEnd = &samples[len(samples)-1]
	}

	_, faultBs := backlogs(samples, faultStart, faultEnd+time.Nanosecond)
	peak := slices.Max(append(faultBs, 0))
	endBacklog := float64(s1.backlog())
	muFlaky := workerRate(obs.serviceTimes(flaky))
	drain := float64(f.Workers)*muFlaky - f.Rate
	a0, a1 := s0.sub(topic, flaky), winEnd.sub(topic, flaky)
	winAttempts, winRetries := a1.Attempts-a0.Attempts, a1.Retries-a0.Retries
	winRate := ratio(winRetries, winAttempts)
	var holdP95 float64
	if recovered >= 0 {
		_, holdBs := backlogs(samples, faultEnd+recovered, faultEnd+recovered+f.Hold+time.Nanosecond)
		holdP95 = percentile(holdBs, 95)
	}

	r.printf("publish: %d arrivals, %d accepted, %d ErrQueueFull, %d other errors, %d shed (every publisher blocked)",
		rep.Arrivals, rep.OK, rep.Full, rep.Other, rep.Shed)
	r.printf("publish latency p50 %v, p99 %v, max %v", rep.P50.Round(time.Microsecond), rep.P99.Round(time.Microsecond), rep.Max.Round(time.Microsecond))
	if rep.Full == 0 {
		r.printf("note: the queue never stayed full, so backpressure was not exercised (lengthen -fault-duration or lower -fault-queue)")
	}
	r.expect(returned && rep.Max <= latBound, "publishers always return: longest Publish %v (bound <= %v = publish timeout %v + margin %v)%s",
		rep.Max.Round(time.Microsecond), latBound, f.PublishTimeout, f.Margin, hangNote(returned, hung))
	r.expect(rep.Other == 0, "every refused Publish says ErrQueueFull (%d other errors%s)", rep.Other, errNote(rep.FirstErr))
	r.printf("%s in the fault window [%.2fs, %.2fs]: %d attempts, %d retries; over the run: %d attempts, %d retries, %d dead-lettered",
		flaky, faultStart.Seconds(), (faultEnd + settle).Seconds(), winAttempts, winRetries, final.Attempts, final.Retries, final.DeadLettered)
	r.expect(winRate <= capRate+1e-9, "fault-window retry rate %.1f%% (bound <= %.1f%% = r/(r+1), the most %d retries per message allow)",
		100*winRate, 100*capRate, f.MaxRetries)
	r.expect(final.RetryRate() < f.MaxRetryRate, "overall retry rate %.1f%% (bound < %.0f%%)", 100*final.RetryRate(), 100*f.MaxRetryRate)
	h0, h1 := s0.sub(topic, healthy), s1.sub(topic, healthy)
	why := fmt.Sprintf("%s's retries park, but its workers are busy for the whole HandlerTimeout; once its lane is full the topic's dispatcher waits for it (-fault-when-full dead_letter_newest sheds there instead)", flaky)
	if whenFull != broker.Block {
		why = fmt.Sprintf("%s's full lane sheds with reason overflow (%d dead-lettered), so the topic flows", flaky, final.DeadLettered)
	}
	r.printf("%s delivered %.0f/s during the fault (λ = %.0f/s): %s; the dispatcher waited %v in all for %s",
		healthy, float64(h1.Delivered-h0.Delivered)/(faultEnd-faultStart).Seconds(), f.Rate, why,
		final.BlockedFor.Round(time.Millisecond), flaky)
	r.printf("backlog: steady p95 %.0f, so steady level <= %.0f (2 × p95, at least 10); peak %.0f in the fault, %.0f when it ended",
		steadyP95, level, peak, endBacklog)
	model := "n/a"
	if drain > 0 {
		model = fmt.Sprintf("%.2fs", endBacklog/drain)
	}
	r.printf("drain model: %.0f / (W·μ − λ) = %.0f / (%d × %.0f − %.0f) = %s", endBacklog, endBacklog, f.Workers, muFlaky, f.Rate, model)
	if recovered >= 0 {
		r.expect(recovered <= recoverBound, "backlog back to its steady level %.2fs after the fault ended, p95 %.0f over the next %v (bound %v)",
			recovered.Seconds(), holdP95, f.Hold, recoverBound)
	} else {
		r.expect(false, "backlog not back to its steady level %.0f (for %v) within %v of the fault's end", level, f.Hold, recoverBound)
	}
	r.expectClosed(closeErr)
	r.expectBalanced(b)

	rec := "not recovered"
	vlines := []vline(nil)
	if recovered >= 0 {
		rec = fmt.Sprintf("recovered in %.2fs", recovered.Seconds())
		vlines = append(vlines, vline{X: (faultEnd + recovered).Seconds(), Label: rec, Color: colorGood})
	}
	r.Headline = fmt.Sprintf("max Publish %v, retry rate %.1f%%, %s",
		rep.Max.Round(time.Millisecond), 100*final.RetryRate(), rec)
	r.Panel = panel{
		Title:  fmt.Sprintf("Check 2: %s times out for %v, λ = %.0f/s, queue and lanes of %d", flaky, f.Duration, f.Rate, f.Queue),
		YLabel: "backlog (messages); delivered/s",
		Series: []series{
			{Name: "backlog", Color: colorMain, Points: points(samples)},
			{Name: healthy + " delivered/s", Color: colorGood, Dashed: true, Points: deliveryRate(samples, topic, healthy, 200*time.Millisecond)},
		},
		Bands:  []band{{X0: faultStart.Seconds(), X1: faultEnd.Seconds(), Label: "fault", Color: colorBad}},
		HLines: []hline{{Y: level, Label: fmt.Sprintf("steady level %.0f", level), Color: colorGood}},
		VLines: vlines,
	}
}

// lanePolicy parses -fault-when-full.
func lanePolicy(name string) (broker.FullLanePolicy, bool) {
	for _, p := range []broker.FullLanePolicy{broker.Block, broker.DeadLetterNewest, broker.DeadLetterOldest} {
		if p.String() == name {
			return p, true
		}
	}
	return broker.Block, false
}

// deliveryRate returns a subscriber's delivery rate (messages per second)
// over the samples, each point averaged over the window before it.
func deliveryRate(samples []sample, topic, name string, window time.Duration) []point {
	var ps []point
	j := 0
	for i, s := range samples {
		for j < i && s.At-samples[j].At > window {
			j++
		}
		if j == i {
			continue
		}
		d := s.sub(topic, name).Delivered - samples[j].sub(topic, name).Delivered
		ps = append(ps, point{s.At.Seconds(), float64(d) / (s.At - samples[j].At).Seconds()})
	}
	return ps
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func hangNote(returned bool, hung time.Duration) string {
	if returned {
		return ""
	}
	return fmt.Sprintf("; a Publish has not returned after %v", hung.Round(time.Millisecond))
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	return "; first: " + err.Error()
}

// retries is the policy's MaxRetries for -fault-retries n: 0 is
// broker.NoRetries (a zero MaxRetries would mean the default).
func retries(n int) int {
	if n == 0 {
		return broker.NoRetries
	}
	return n
}

package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/inproc/broker"
)

// checkModel is check 5, the article's backlog model: with W·μ < λ the
// backlog grows at λ − W·μ; with W >= ceil(λ/μ) it stays bounded.
func checkModel(ctx context.Context, cfg *config, r *result) {
	m := cfg.Model
	muNominal := 1 / m.Service.Seconds()

	// Phase A: under-provisioned.
	r.printf("phase A: λ = %.0f/s (%s arrivals), W = %d, service %v (μ = %.0f/s nominal): predicted growth λ − W·μ = %.0f/s",
		m.Rate, arrivalName(cfg), m.Workers, m.Service, muNominal, m.Rate-float64(m.Workers)*muNominal)
	a, ok := runModelPhase(ctx, cfg, r, "c5A", m.Workers, 100*time.Millisecond)
	if !ok {
		return
	}
	from := m.Duration / 10
	ts, bs := backlogs(a.samples, from, 0)
	growth := slope(ts, bs)
	var pubs []float64
	for _, s := range a.samples {
		if s.At >= from {
			pubs = append(pubs, float64(sum(s.St).Published))
		}
	}
	lambda := slope(ts, pubs)
	mu := workerRate(a.times)
	muP50 := 1 / percentile(a.times, 50)
	predicted := lambda - float64(m.Workers)*mu
	predictedNominal := m.Rate - float64(m.Workers)*muNominal
	relErr := (growth - predicted) / predicted
	last := a.samples[len(a.samples)-1]
	r.printf("measured: λ = %.0f/s, μ = %.1f/s per worker (mean handler %v, median %v)",
		lambda, mu, secs(mean(a.times)), secs(percentile(a.times, 50)))
	r.printf("backlog growth (least squares over [%.1fs, %.1fs]) = %.1f/s; B(%.1fs) = %d, (λ − W·μ)·t = %.0f",
		from.Seconds(), last.At.Seconds(), growth, last.At.Seconds(), last.backlog(), predicted*last.At.Seconds())
	r.printf("with the nominal μ = %.0f/s the formula says %.0f/s (%+.1f%%)", muNominal, predictedNominal,
		100*(growth-predictedNominal)/predictedNominal)
	r.expect(predicted > 0 && math.Abs(relErr) <= m.Tol,
		"growth %.1f/s vs λ − W·μ = %.0f − %d × %.1f = %.1f/s: error %+.1f%% (bound ±%.0f%%)",
		growth, lambda, m.Workers, mu, predicted, 100*relErr, 100*m.Tol)
	r.expect(a.rejected == 0, "the buffer (%d) never filled in phase A: %d publishes refused", a.buffer, a.rejected)
	r.expect(a.conserved, "nothing lost in phase A: every message delivered, or dead-lettered by the cut-short Close (%d)", a.shutdownDead)
	if mu <= 0 {
		return
	}

	// Phase B: provisioned by the article's rule from what phase A
	// measured, W >= ceil(λ_p95/μ_p50).
	win := min(time.Second, (m.Duration / 3).Round(time.Millisecond))
	lambdaP95 := max(rateP95(a.samples, win), lambda)
	wB, sizing := workersFor(lambdaP95, muP50, cfg.MaxUtil)
	r.printf("phase B: λ_p95 = %.0f/s (over %v windows), μ_p50 = %.1f/s: W = %d (%s); capacity %.0f/s, ρ = λ/(W·μ_p50) = %.2f",
		lambdaP95, win, muP50, wB, strings.Replace(sizing, "λ/μ", "λ_p95/μ_p50", 1), float64(wB)*muP50, m.Rate/(float64(wB)*muP50))
	pb, ok := runModelPhase(ctx, cfg, r, "c5B", wB, cfg.CloseTimeout)
	if !ok {
		return
	}
	tsB, bsB := backlogs(pb.samples, 0, 0)
	p50, p95, top := percentile(bsB, 50), percentile(bsB, 95), slices.Max(bsB)
	trend := slope(tsB, bsB)
	trendBound := m.Trend * m.Rate
	r.printf("backlog p50 = %.0f, p95 = %.0f, max = %.0f; trend %+.1f msgs/s", p50, p95, top, trend)
	r.expect(p95 < float64(pb.buffer)/2 && math.Abs(trend) <= trendBound,
		"bounded: backlog p95 = %.0f (bound < %d = buffer/2), trend %+.1f/s (bound |trend| <= %.0f/s, %.0f%% of λ)",
		p95, pb.buffer/2, trend, trendBound, 100*m.Trend)
	r.expect(pb.rejected == 0, "no publish refused in phase B (%d)", pb.rejected)
	r.expect(pb.conserved && pb.shutdownDead == 0, "phase B drained on Close, nothing lost (%d dead-lettered)", pb.shutdownDead)

	r.Headline = fmt.Sprintf("growth %.0f/s vs λ−W·μ %.0f/s (%+.1f%%); W=%d bounded (p95 %.0f)", growth, predicted, 100*relErr, wB, p95)
	end := last.At.Seconds()
	r.Panel = panel{
		Title: fmt.Sprintf("Check 5: backlog model, λ = %.0f/s, μ = %.0f/s per worker", m.Rate, mu),
		Series: []series{
			{Name: fmt.Sprintf("A: W=%d (W·μ < λ)", m.Workers), Color: colorBad, Points: points(a.samples)},
			{Name: fmt.Sprintf("predicted (λ − W·μ)·t = %.0f/s", predicted), Color: colorModel, Dashed: true,
				Points: []point{{0, 0}, {end, predicted * end}}},
			{Name: fmt.Sprintf("B: W=%d >= ceil(λ_p95/μ_p50) (bounded)", wB), Color: colorGood, Points: points(pb.samples)},
		},
	}
}

// modelPhase is what one phase of check 5 measured.
type modelPhase struct {
	samples      []sample
	times        []float64 // handler durations of deliveries, in seconds
	buffer       int
	rejected     uint64
	conserved    bool   // the broker's Stats balanced after Close
	shutdownDead uint64 // dead-lettered by a cut-short Close
}

// runModelPhase runs the model's load against w workers for the phase's
// duration, then closes the broker, waiting at most closeTimeout for it to
// drain. Phase A does not wait (its backlog would take as long again to
// drain): what is left is dead-lettered with reason shutdown and must be
// accounted for.
func runModelPhase(ctx context.Context, cfg *config, r *result, label string, w int, closeTimeout time.Duration) (modelPhase, bool) {
	m := cfg.Model
	const topic, name = "model", "worker"
	var p modelPhase
	obs := newObserver()
	b, err := broker.New(broker.WithQueueSize(m.Queue), broker.WithLogger(discard), broker.WithObserver(obs))
	if err != nil {
		r.fatal(err)
		return p, false
	}
	if _, err := b.Subscribe(topic, name, serviceHandler(m.Service), broker.Concurrency(w)); err != nil {
		r.fatal(err)
		_ = closeBroker(b, cfg.CloseTimeout)
		return p, false
	}
	st := b.Stats().Topics[topic]
	p.buffer = st.Capacity + st.Subscribers[name].Capacity
	mon := startMonitor(b, r.out, label, cfg)
	load := startLoad(b, topic, label+"-", m.Rate, cfg.Publishers, cfg)
	pause(ctx, m.Duration)
	load.Stop()
	load.Wait(broker.DefaultPublishTimeout + time.Second)
	p.samples = mon.Stop()
	p.times = obs.serviceTimes(name)
	_ = closeBroker(b, closeTimeout) // a DrainError is expected in phase A
	final := b.Stats().Topics[topic]
	ss := final.Subscribers[name]
	p.rejected = final.Rejected
	p.shutdownDead = ss.DeadLettered
	p.conserved = ss.Routed == final.Published && ss.Delivered+ss.DeadLettered == ss.Routed && ss.Queued == 0 && ss.InFlight == 0
	return p, true
}

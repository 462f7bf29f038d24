package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/inproc/broker"
)

// checkSteady is check 1: input at 1.2× the target traffic into a
// subscriber provisioned for it; the backlog must stay in a stable range
// with p95 below half the buffer.
func checkSteady(ctx context.Context, cfg *config, r *result) {
	c := cfg.Steady
	const topic, name = "steady", "worker"
	lambda := c.Rate * c.Load
	took := measureService(ctx, c.Service, 25)
	mu := 1 / took.Seconds()
	w, sizing := c.Workers, "set by -steady-workers"
	if w == 0 {
		w, sizing = workersFor(lambda, mu, cfg.MaxUtil)
	}

	obs := newObserver()
	b, err := broker.New(broker.WithQueueSize(c.Queue), broker.WithLogger(discard), broker.WithObserver(obs))
	if err != nil {
		r.fatal(err)
		return
	}
	if _, err := b.Subscribe(topic, name, serviceHandler(c.Service), broker.Concurrency(w)); err != nil {
		r.fatal(err)
		_ = closeBroker(b, cfg.CloseTimeout)
		return
	}
	st0 := b.Stats().Topics[topic]
	queueCap, laneCap := st0.Capacity, st0.Subscribers[name].Capacity
	buffer := queueCap + laneCap
	r.printf("λ0 = %.0f/s target, λ = %.0f/s (%.1f×), %s arrivals", c.Rate, lambda, c.Load, arrivalName(cfg))
	r.printf("service %v, which takes %v here: μ = %.0f/s per worker (%.0f/s nominal)",
		c.Service, took.Round(time.Microsecond), mu, 1/c.Service.Seconds())
	r.printf("W = %d (%s); capacity W·μ = %.0f/s, ρ = λ/(W·μ) = %.2f", w, sizing, float64(w)*mu, lambda/(float64(w)*mu))
	r.printf("buffer = %d (topic queue %d + lane %d); bound: backlog p95 < %d", buffer, queueCap, laneCap, buffer/2)

	mon := startMonitor(b, r.out, "c1", cfg)
	load := startLoad(b, topic, "s-", lambda, cfg.Publishers, cfg)
	pause(ctx, c.Duration)
	load.Stop()
	returned := load.Wait(broker.DefaultPublishTimeout + time.Second)
	samples := mon.Stop()
	closeErr := closeBroker(b, cfg.CloseTimeout)
	rep := load.report()

	ts, bs := backlogs(samples, 0, 0)
	p50, p95, top := percentile(bs, 50), percentile(bs, 95), slices.Max(bs)
	trend := slope(ts, bs)
	trendBound := cfg.Model.Trend * lambda
	times := obs.serviceTimes(name)
	muRun := workerRate(times)
	elapsed := samples[len(samples)-1].At.Seconds()
	r.printf("published %d in %.1fs (%.0f/s); μ in the run = %.0f/s per worker (mean handler %v), ρ = %.2f",
		rep.OK, elapsed, float64(rep.OK)/elapsed, muRun, secs(mean(times)), lambda/(float64(w)*muRun))
	r.printf("backlog p50 = %.0f, p95 = %.0f, max = %.0f over %d samples; trend %+.1f msgs/s", p50, p95, top, len(bs), trend)
	r.expect(p95 < float64(buffer)/2, "backlog p95 = %.0f (bound < %d = buffer/2)", p95, buffer/2)
	r.expect(math.Abs(trend) <= trendBound, "backlog converges: trend %+.1f/s (bound |trend| <= %.0f/s, %.0f%% of λ)",
		trend, trendBound, 100*cfg.Model.Trend)
	r.expect(returned && rep.Full+rep.Other+rep.Shed == 0, "every arrival published: %d refused, %d other errors, %d shed",
		rep.Full, rep.Other, rep.Shed)
	r.expectClosed(closeErr)
	r.expectBalanced(b)

	r.Headline = fmt.Sprintf("λ=%.0f/s W=%d: backlog p95 %.0f (bound < %d)", lambda, w, p95, buffer/2)
	r.Panel = panel{
		Title:  fmt.Sprintf("Check 1: steady state, λ = %.0f/s (1.2 × %.0f), W = %d, μ = %.0f/s", lambda, c.Rate, w, muRun),
		Series: []series{{Name: "backlog", Color: colorMain, Points: points(samples)}},
		HLines: []hline{
			{Y: p95, Label: fmt.Sprintf("p95 = %.0f", p95), Color: colorGood},
			{Y: float64(buffer) / 2, Label: fmt.Sprintf("bound: buffer/2 = %d", buffer/2), Color: colorBad},
		},
	}
}

func arrivalName(cfg *config) string {
	if cfg.Poisson {
		return "Poisson"
	}
	return "evenly spaced"
}

// secs turns seconds into a Duration rounded for printing.
func secs(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond)
}

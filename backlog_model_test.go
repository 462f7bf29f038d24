package broker

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBacklogModel checks the article's backlog formula on the broker: with
// input rate λ and W workers of rate μ each, backlog(t) = produced(t) −
// acked(t) grows at λ − W·μ per second when that is positive, and stays
// bounded when W ≥ ceil(λ/μ). Time is fake (synctest), so the rates are
// exact and the check does not depend on the machine.
func TestBacklogModel(t *testing.T) {
	tests := []struct {
		lambda, mu float64 // messages per second
		workers    int
	}{
		{300, 80, 1}, // the article's example: +220/s
		{120, 35, 2}, // its deepening example: +50/s
		{1000, 150, 4},
		{300, 80, 4}, // W = ceil(300/80): bounded
		{120, 35, 4}, // W = ceil(120/35): bounded
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("λ=%v μ=%v W=%d", tt.lambda, tt.mu, tt.workers), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				const run = 10 * time.Second
				b := newTestBroker(t, WithQueueSize(1<<14), WithIdempotencyStore(nil))
				service := time.Duration(float64(time.Second) / tt.mu)
				_, err := b.Subscribe("t", "w", func(context.Context, Message) error {
					time.Sleep(service)
					return nil
				}, Concurrency(tt.workers))
				require.NoError(t, err)

				backlog := func() float64 {
					ts := b.Stats().Topics["t"]
					return float64(ts.Published - ts.Subscribers["w"].Delivered)
				}
				interval := time.Duration(float64(time.Second) / tt.lambda)
				start := time.Now()
				var samples []float64
				next := time.Second
				for i := 0; ; i++ { // publish on an absolute schedule
					at := start.Add(time.Duration(i) * interval)
					if at.Sub(start) >= run {
						break
					}
					time.Sleep(time.Until(at))
					if time.Since(start) >= next {
						samples = append(samples, backlog())
						next += time.Second
					}
					require.NoError(t, b.Publish(context.Background(), Message{ID: strconv.Itoa(i), Topic: "t"}))
				}
				samples = append(samples, backlog())

				predicted := tt.lambda - float64(tt.workers)*tt.mu
				if predicted > 0 {
					// growth over the run, skipping the first second's start-up
					measured := (samples[len(samples)-1] - samples[0]) / (run.Seconds() - 1)
					t.Logf("growth: measured %.1f/s, predicted λ−W·μ = %.1f/s", measured, predicted)
					assert.InEpsilon(t, predicted, measured, 0.15)
					return
				}
				// Bounded: no trend, and never more than a fraction of a second's
				// input (keys spread unevenly over workers, so some queueing
				// comes and goes).
				peak := 0.0
				for _, s := range samples {
					peak = math.Max(peak, s)
				}
				trend := (samples[len(samples)-1] - samples[0]) / (run.Seconds() - 1)
				t.Logf("bounded: peak backlog %.0f, trend %.1f/s over %v (W=%d >= ceil(λ/μ)=%v)",
					peak, trend, run, tt.workers, math.Ceil(tt.lambda/tt.mu))
				assert.Less(t, math.Abs(trend), 0.05*tt.lambda, "no growth")
				assert.Less(t, peak, 0.25*tt.lambda, "backlog stays small")
			})
		})
	}
}

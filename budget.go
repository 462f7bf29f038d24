package broker

import (
	"cmp"
	"math"
	"sync"
	"time"

	"github.com/inproc/broker/internal/slide"
)

// RetryBudgetPolicy limits a subscriber's retries to a share of its first
// attempts over a sliding window (see RetryBudget): at any moment, retries
// in the last Window may be at most Ratio × first attempts in that window +
// MinPerSecond × Window in seconds.
type RetryBudgetPolicy struct {
	Ratio        float64       // retries per first attempt, 0 <= r (0.05: 5%)
	Window       time.Duration // the sliding window (> 0)
	MinPerSecond float64       // retries always allowed per second of Window, so a quiet subscriber can still retry
}

// DefaultRetryBudget is the recommended setting, the design article's rule
// of thumb turned into a guard: retries at most 5% of first attempts over
// 10 minutes, plus one retry a second.
func DefaultRetryBudget() RetryBudgetPolicy {
	return RetryBudgetPolicy{Ratio: 0.05, Window: 10 * time.Minute, MinPerSecond: 1}
}

// RetryBudget caps the subscriber's retries (Finagle's RetryBudget, Envoy's
// retry budgets and gRPC's retry throttling work the same way): a
// retryable failure when the budget is spent is dead-lettered with reason
// "budget" instead of being retried, so a failing dependency sees at most
// the budget's share of extra load. What is left of the budget is in
// SubscriberStats.RetryBudgetLeft. Over a transport it is the same, per
// process: the transport is told to terminate the message.
func RetryBudget(p RetryBudgetPolicy) SubscribeOption {
	err := cmp.Or(
		invalidIf(p.Ratio < 0 || math.IsNaN(p.Ratio) || math.IsInf(p.Ratio, 0), "retry budget Ratio %v < 0", p.Ratio),
		invalidIf(p.Window <= 0, "retry budget Window %v <= 0", p.Window),
		invalidIf(p.MinPerSecond < 0 || math.IsNaN(p.MinPerSecond) || math.IsInf(p.MinPerSecond, 0),
			"retry budget MinPerSecond %v < 0", p.MinPerSecond))
	return option(err, func(c *subConfig) { c.budget = &p })
}

// retryBudget counts first attempts and retries over the window.
type retryBudget struct {
	p  RetryBudgetPolicy
	mu sync.Mutex
	w  *slide.Window // retries (A) and first attempts (B)
}

func newRetryBudget(p RetryBudgetPolicy) *retryBudget {
	return &retryBudget{p: p, w: slide.New(p.Window)}
}

// first counts a first attempt.
func (r *retryBudget) first(now time.Time) {
	r.mu.Lock()
	r.w.Add(now, 0, 1)
	r.mu.Unlock()
}

// spend takes one retry from the budget, or reports false when it is spent.
func (r *retryBudget) spend(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leftLocked(now) < 1 {
		return false
	}
	r.w.Add(now, 1, 0)
	return true
}

// left returns how many retries the budget allows now.
func (r *retryBudget) left(now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int(max(math.Floor(r.leftLocked(now)), 0))
}

func (r *retryBudget) leftLocked(now time.Time) float64 {
	retries, firsts := r.w.Sums(now)
	allowed := r.p.Ratio*float64(firsts) + r.p.MinPerSecond*r.p.Window.Seconds()
	return allowed - float64(retries)
}

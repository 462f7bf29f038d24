package broker

import (
	"context"
	"sync"
	"time"
)

// This file is what a transport's delivery waits for before its turn: the
// subscriber's rate limit, then its circuit breaker, the same decision code
// as the in-memory lane's (tokenBucket, breaker). A delivery held here is
// kept alive; since a transport runs at most Concurrency Deliver calls at
// once, a subscriber whose deliveries all wait fetches nothing more, and
// nothing held uses up an attempt: it runs when the breaker lets it, at
// the attempt number it came with.

// hold is a transport subscription's rate limit and breaker. br, its
// timer and changed are guarded by mu.
type hold struct {
	limiter *tokenBucket // nil: no rate limit
	mu      sync.Mutex
	br      *breaker      // nil: no breaker
	changed chan struct{} // closed (and replaced) when the breaker may let a held delivery run
}

func newHold(s *Subscription, sc subConfig) *hold {
	h := &hold{changed: make(chan struct{})}
	if sc.rate > 0 {
		h.limiter = newTokenBucket(sc.rate, sc.burst)
	}
	if sc.breaker != nil {
		h.br = newBreaker(*sc.breaker)
		h.br.mu, h.br.wake, h.br.report = &h.mu, h.wakeLocked, s.breakerChanged
	}
	if h.limiter == nil && h.br == nil {
		return nil
	}
	return h
}

// wait holds d until the rate limit and the breaker let it run; probe
// reports that it runs as the half-open breaker's probe. ok is false when
// ctx ended first (a stop at once): d did not run, and the caller hands it
// back. After a true ok the caller calls done, whatever followed.
func (h *hold) wait(ctx context.Context, d Delivery) (probe, ok bool) {
	if h.limiter != nil {
		if w := h.limiter.reserve(time.Now()); w > 0 {
			t := time.NewTimer(w)
			ok := heldUntil(ctx, d, t.C)
			t.Stop()
			if !ok {
				return false, false
			}
		}
	}
	if h.br == nil {
		return false, true
	}
	for {
		h.mu.Lock()
		if h.br.allows() {
			probe = h.br.took()
			h.mu.Unlock()
			return probe, true
		}
		ch := h.changed
		h.mu.Unlock()
		if !heldUntil(ctx, d, ch) {
			return false, false
		}
	}
}

// heldUntil waits for ch, telling the transport d is alive meanwhile as
// often as it asks; false if ctx ended first.
func heldUntil[T any](ctx context.Context, d Delivery, ch <-chan T) bool {
	var alive <-chan time.Time
	every := d.KeepAliveEvery()
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		alive = t.C
	}
	for {
		select {
		case <-ch:
			return true
		case <-ctx.Done():
			return false
		case <-alive:
			_ = d.KeepAlive() // refused: it may come again, which at-least-once allows
		}
	}
}

// done records what the delivery that wait let through said about the
// subscriber (hl: none if it did not run), and reports a transition.
func (h *hold) done(hl health, probe bool) {
	if h.br == nil {
		return
	}
	h.mu.Lock()
	from := h.br.state
	to := h.br.record(hl, probe, time.Now())
	switch {
	case to == BreakerOpen:
		h.br.stopTimer() // armed again once its opening was reported
	case to == BreakerClosed || probe:
		h.wakeLocked() // closed, or no verdict: another delivery probes
	}
	h.mu.Unlock()
	if to == "" {
		return
	}
	h.br.report(from, to)
	if to == BreakerOpen {
		h.br.arm()
	}
}

func (h *hold) wakeLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// stop disarms the breaker's timer for good (the subscription ended).
func (h *hold) stop() {
	if h == nil || h.br == nil {
		return
	}
	h.mu.Lock()
	h.br.stopped = true
	h.br.stopTimer()
	h.mu.Unlock()
}

// state is the breaker's state and current open interval.
func (h *hold) state() (BreakerState, time.Duration) {
	if h == nil || h.br == nil {
		return BreakerNone, 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.br.state, h.br.openFor
}

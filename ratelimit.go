package broker

import (
	"cmp"
	"context"
	"math"
	"sync"
	"time"
)

// RateLimit lets the subscriber start at most perSecond attempts per
// second, with bursts of up to burst (a token bucket; burst >= 1). The rate
// must be finite and large enough that one token's interval (1/perSecond
// seconds) fits a time.Duration (about 292 years): a smaller rate, NaN or
// an infinity is refused with ErrInvalidOption. A worker
// that has taken a message waits for a token before the attempt: the wait
// burns no attempt, and the message counts as in flight meanwhile. Close
// and Unsubscribe whose context ends cut the wait short (the message is
// dead-lettered with their reason). Over a transport the delivery waits
// in the process the same way, kept alive, and a stop at once hands it
// back unstarted.
func RateLimit(perSecond float64, burst int) SubscribeOption {
	err := cmp.Or(
		invalidIf(!(perSecond > 0) || math.IsInf(perSecond, 0) || float64(time.Second)/perSecond >= math.MaxInt64,
			"rate limit %v per second must be finite and its interval must fit a time.Duration", perSecond),
		invalidIf(burst < 1, "rate limit burst %d < 1", burst))
	return option(err, func(c *subConfig) { c.rate, c.burst = perSecond, burst })
}

// tokenBucket hands out attempts at rate per second, burst at once. Tokens
// may go negative: a worker reserves the next token and waits for its time,
// so workers queue up fairly without polling.
type tokenBucket struct {
	rate  float64 // tokens per second
	burst float64
	mu    sync.Mutex
	avail float64   // tokens at last
	last  time.Time // when avail was computed
}

func newTokenBucket(rate float64, burst int) *tokenBucket {
	return &tokenBucket{rate: rate, burst: float64(burst), avail: float64(burst)}
}

// reserve takes a token and returns how long to wait before using it.
func (b *tokenBucket) reserve(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		b.avail = min(b.avail+now.Sub(b.last).Seconds()*b.rate, b.burst)
	}
	b.last = now
	b.avail--
	if b.avail >= 0 {
		return 0
	}
	// Several reservations ahead at a tiny rate can overflow a Duration:
	// clamp (a wait of centuries), never wrap to a negative wait.
	wait := math.Ceil(-b.avail / b.rate * float64(time.Second))
	if wait >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(wait)
}

// wait takes a token, waiting for it until ctx ends.
func (b *tokenBucket) wait(ctx context.Context) {
	sleep(ctx, b.reserve(time.Now()))
}

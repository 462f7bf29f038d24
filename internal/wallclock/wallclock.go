// Package wallclock reads the time at about half the cost of time.Now on
// machines where a clock read is slow, for timestamps taken on a hot path.
//
// time.Now reads two clocks, the wall clock and the monotonic one. A Clock
// reads the system's wall clock at most about once per Refresh and in
// between adds the monotonic time elapsed since then to that reading, which
// costs one clock read. Its times carry a monotonic reading like time.Now's,
// so durations between them are exact; their wall clock reading misses a
// step of the system clock (a manual set, an NTP step, or the time a
// suspended machine slept, which the monotonic clock does not count) until
// the next refresh.
package wallclock

import (
	"sync/atomic"
	"time"
)

// Refresh is how often a Clock reads the system's wall clock again.
const Refresh = time.Second

// Clock is a time source; the zero value is ready to use and it is safe for
// concurrent use.
type Clock struct {
	base atomic.Pointer[time.Time] // the last reading of both clocks
}

// Now returns the current time, like time.Now.
func (c *Clock) Now() time.Time {
	if b := c.base.Load(); b != nil {
		if d := time.Since(*b); d >= 0 && d < Refresh {
			return b.Add(d)
		}
	}
	now := time.Now()
	c.base.Store(&now)
	return now
}

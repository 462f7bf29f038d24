// Package slide counts events over a sliding window of time, in buckets: a
// count covers the last window, give or take one bucket (a tenth of it).
// It is plain arithmetic over ten buckets and takes no lock: its owner
// holds one.
package slide

import "time"

// buckets is how many slices a window is cut into.
const buckets = 10

// Window sums two counters (A and B: failures and attempts, retries and
// first attempts) over the last span of time. The zero value is unusable;
// make one with New.
type Window struct {
	width int64 // one bucket's span in nanoseconds
	slots [buckets]slot
}

type slot struct {
	index int64 // which bucket of time it holds (time / width)
	a, b  uint64
}

// New returns a window of span (at least 10 ns).
func New(span time.Duration) *Window {
	return &Window{width: max(int64(span)/buckets, 1)}
}

// Add counts a and b at time now.
func (w *Window) Add(now time.Time, a, b uint64) {
	i := now.UnixNano() / w.width
	s := &w.slots[mod(i)]
	if s.index != i {
		*s = slot{index: i}
	}
	s.a += a
	s.b += b
}

// Sums returns the counts of the window that ends at now.
func (w *Window) Sums(now time.Time) (a, b uint64) {
	i := now.UnixNano() / w.width
	for k := range w.slots {
		s := &w.slots[k]
		if s.index > i-buckets && s.index <= i {
			a += s.a
			b += s.b
		}
	}
	return a, b
}

// Reset forgets every count.
func (w *Window) Reset() { w.slots = [buckets]slot{} }

func mod(i int64) int {
	m := i % buckets
	if m < 0 {
		m += buckets
	}
	return int(m)
}

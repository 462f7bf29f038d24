package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// LatencyCell is one cell of the latency table: one topic, Subs
// subscribers with no-op handlers, and one publisher pacing Rate messages
// a second (64 B payload).
type LatencyCell struct {
	Name string // the shape: "L1" (1 subscriber) or "L2" (4)
	Subs int    // subscribers of the topic
	Rate int    // messages published per second
}

// Label names the cell, e.g. "L1@10k".
func (c LatencyCell) Label() string { return c.Name + "@" + siLabel(float64(c.Rate)) }

// LatencyCells are the latency table's columns, in order.
var LatencyCells = []LatencyCell{
	{Name: "L1", Subs: 1, Rate: 10_000},
	{Name: "L1", Subs: 1, Rate: 100_000},
	{Name: "L2", Subs: 4, Rate: 10_000},
	{Name: "L2", Subs: 4, Rate: 100_000},
}

// LatencyCellByLabel returns the cell called label (see Label).
func LatencyCellByLabel(label string) (LatencyCell, bool) {
	for _, c := range LatencyCells {
		if c.Label() == label {
			return c, true
		}
	}
	return LatencyCell{}, false
}

// LatencyImpls are the latency table's implementations, in order.
var LatencyImpls = []string{"floor", "naive", "broker", "broker-nodedup", "watermill", "nats"}

// Saturation: a cell is saturated when the rate it reached is below
// MinRateShare of its target, or when its backlog grew: the measured
// messages are cut into LatencyWindows windows in publish order, and the
// median latency of the last window exceeds the first's by more than
// BacklogGrowth and by a factor of more than BacklogFactor, rising from
// one window to the next at all steps but at most one (a queue that
// grows makes every window later than the one before; a stall of the
// machine lifts one or two windows and then drains); or every window's
// median exceeds that of the first tenth of the warm-up by as much (a
// backlog that formed in the warm-up and never drained).
const (
	MinRateShare   = 0.95
	LatencyWindows = 10
	BacklogGrowth  = time.Millisecond
	BacklogFactor  = 2
)

// LatencyResult is one latency cell's measurement.
type LatencyResult struct {
	Impl string
	Cell LatencyCell
	// Messages is how many messages were measured (after the warm-up);
	// Samples the deliveries measured, Messages × Cell.Subs.
	Messages, Samples int
	// Latency from a message's intended send time to the entry of each
	// subscriber's handler: percentiles (nearest rank) and the largest.
	P50, P99, P999, Max time.Duration
	// Rate is the rate reached, messages per second, from the middle of
	// the first window to the middle of the last (see Windows): the
	// messages between the two middle messages over the time between
	// their median deliveries (intended send time plus the window's
	// median latency). A backlog that grows stretches that time; a stall
	// that drains before the last window does not, nor does the drain of
	// a stall at the very end. (When the first window's median delivery
	// is not before the last's, it is the measured messages over the time
	// from the first one's intended send to the last delivery.)
	Rate float64
	// Start is the median latency of the first tenth of the warm-up (a
	// backlog that forms there and never drains shows against it).
	Start time.Duration
	// SubP50 is each subscriber's median latency, in subscription order
	// (nil with one subscriber).
	SubP50 []time.Duration
	// Windows are the median latencies of LatencyWindows windows of the
	// measured messages, in publish order (a growing backlog shows here).
	Windows []time.Duration
	// Saturated says why the cell could not sustain its rate ("" when it
	// could); its latencies then measure the backlog, not the
	// implementation.
	Saturated string
	Err       error
}

// pacer is the publisher's schedule: message i is due at start + i/rate
// (nanoseconds on the harness's clock).
type pacer struct {
	start int64
	rate  int
}

// due is message i's intended send time.
func (p pacer) due(i int) int64 {
	return p.start + int64(i)*int64(time.Second)/int64(p.rate)
}

// pace calls send(i) for i = 0..n-1, each no earlier than p.due(i). It is
// an open loop: a send that returns late does not move the schedule, so
// the messages it held up go at once, one after another, until the
// schedule is caught up. While early it calls wait with the time left. It
// stops at send's first error.
func pace(n int, p pacer, now func() int64, wait func(time.Duration), send func(i int) error) error {
	for i := range n {
		due := p.due(i)
		for {
			t := now()
			if t >= due {
				break
			}
			wait(time.Duration(due - t))
		}
		if err := send(i); err != nil {
			return err
		}
	}
	return nil
}

// paceSpinBelow: a publisher with less than this left to wait spins
// (yielding its processor to other goroutines at each turn) instead of
// sleeping, because a short time.Sleep lasts up to about a millisecond.
const paceSpinBelow = 2 * time.Millisecond

// paceWait is the publisher's wait: sleep while far from the due time,
// then spin with runtime.Gosched, so the publisher's processor runs
// whatever its sends woke (as a publisher blocked on something else would
// let it).
func paceWait(left time.Duration) {
	if left > paceSpinBelow {
		time.Sleep(left - paceSpinBelow/2)
		return
	}
	runtime.Gosched()
}

// nanotime is the harness's clock: nanoseconds since epoch0, monotonic.
func nanotime() int64 { return int64(time.Since(epoch0)) }

// percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest sample with at least p% of the
// samples at or below it. It returns 0 for no samples.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	// The rank is computed in integers (per 1000) so that, for example,
	// 99.9% of 1000 samples is rank 999, not 999.0000000000001 → 1000.
	k := (int64(len(sorted))*int64(p*1000+0.5) + 100_000 - 1) / 100_000
	return sorted[min(max(k, 1), int64(len(sorted)))-1]
}

// median of samples (sorted in place).
func median(samples []int64) int64 {
	slices.Sort(samples)
	return percentile(samples, 50)
}

// saturation says why a cell with target rate target that reached rate,
// with start the median latency of the first tenth of its warm-up and
// windows its median latencies per window in publish order, is saturated,
// or "" when it is not.
func saturation(target, rate float64, start time.Duration, windows []time.Duration) string {
	if rate < MinRateShare*target {
		return fmt.Sprintf("reached %s/s of %s/s", siLabel(rate), siLabel(target))
	}
	if len(windows) < 2 {
		return ""
	}
	grew := func(from, to time.Duration) bool { return to-from > BacklogGrowth && to > BacklogFactor*from }
	first, last := windows[0], windows[len(windows)-1]
	falls := 0
	for i := 1; i < len(windows); i++ {
		if windows[i] <= windows[i-1] {
			falls++
		}
	}
	if grew(first, last) && falls <= 1 {
		return fmt.Sprintf("backlog grew: median %s in the first window, %s in the last", fmtDur(first), fmtDur(last))
	}
	if low := slices.Min(windows); grew(start, low) {
		return fmt.Sprintf("backlog grew in the warm-up and never drained: median %s at the start, at least %s in every window", fmtDur(start), fmtDur(low))
	}
	return ""
}

// fmtDur formats a latency in µs (ms from 10 ms up).
func fmtDur(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case us >= 10_000:
		return fmt.Sprintf("%.0f ms", us/1000)
	case us >= 10:
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.1f µs", us)
}

// RunLatency runs impl on cell with measured messages (at least 10),
// after a warm-up tenth at the same pace whose messages are not measured.
// Every subscriber must get every message, as in RunCell; the cell is
// bounded by timeout (60 s if 0).
func RunLatency(impl Impl, cell LatencyCell, measured int, timeout time.Duration) LatencyResult {
	res, _ := runLatency(impl, cell, measured, timeout)
	return res
}

// runLatency is RunLatency, also returning the sorted latencies (ns) of
// the measured deliveries.
func runLatency(impl Impl, cell LatencyCell, measured int, timeout time.Duration) (res LatencyResult, lat []int64) {
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	res = LatencyResult{Impl: impl.Name, Cell: cell}
	if cell.Rate <= 0 || cell.Subs <= 0 {
		res.Err = fmt.Errorf("bad latency cell %+v", cell)
		return res, nil
	}
	measured = max(measured, 10)
	warm := measured / 10
	total := warm + measured
	w := Workload{Name: cell.Label(), Title: "latency", Topics: 1, Subs: cell.Subs, Publishers: 1, Concurrency: 1, PayloadSize: 64}
	env := newEnv(w, total)
	env.payload = make([]byte, env.PayloadSize)
	tr := newTracker(env)
	arrived := make([]atomic.Int64, cell.Subs*total) // handler entry of (sub, seq) at [sub*total+seq], 0 until then
	env.fail = tr.fail
	env.handle = func(sub, seq int) error {
		now := nanotime()
		if sub >= 0 && sub < cell.Subs && seq >= 0 && seq < total {
			arrived[sub*total+seq].CompareAndSwap(0, now)
		}
		return tr.handle(sub, seq)
	}

	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	inst, err := newInstance(ctx, impl, env)
	if err != nil {
		res.Err = err
		return res, nil
	}
	defer func() {
		if err := closeInstance(inst, deadline); err != nil && res.Err == nil {
			res.Err = err
		}
	}()

	runtime.GC()
	p := pacer{start: nanotime(), rate: cell.Rate}
	tr.started.Store(p.start)
	published := make(chan struct{})
	go func() {
		defer close(published)
		err := pace(total, p, nanotime, paceWait, func(i int) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			return inst.Publish(ctx, 0, 0, i)
		})
		if err != nil {
			tr.fail(fmt.Errorf("publish: %w", err))
		}
	}()
	defer func() { // the publisher ends before the instance closes (Publish returns when ctx ends)
		cancel()
		select {
		case <-published:
		case <-time.After(10 * time.Second):
		}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-tr.done:
	case <-tr.failed:
		res.Err = fmt.Errorf("%w (%s)", tr.failErr, tr.missing())
		return res, nil
	case <-timer.C:
		res.Err = fmt.Errorf("%w after %v (%s)", ErrTimeout, timeout, tr.missing())
		return res, nil
	}

	res.Messages, res.Samples = measured, measured*cell.Subs
	lat = make([]int64, 0, res.Samples)
	windows := make([][]int64, LatencyWindows)
	last := int64(0) // the last handler entry
	for seq := warm; seq < total; seq++ {
		due := p.due(seq)
		win := &windows[(seq-warm)*LatencyWindows/measured]
		for sub := range cell.Subs {
			at := arrived[sub*total+seq].Load()
			last = max(last, at)
			lat = append(lat, at-due)
			*win = append(*win, at-due)
		}
	}
	for _, win := range windows {
		res.Windows = append(res.Windows, time.Duration(median(win)))
	}
	if cell.Subs > 1 {
		mine := make([]int64, 0, measured)
		for sub := range cell.Subs {
			mine = mine[:0]
			for seq := warm; seq < total; seq++ {
				mine = append(mine, arrived[sub*total+seq].Load()-p.due(seq))
			}
			res.SubP50 = append(res.SubP50, time.Duration(median(mine)))
		}
	}
	slices.Sort(lat)
	res.P50 = time.Duration(percentile(lat, 50))
	res.P99 = time.Duration(percentile(lat, 99))
	res.P999 = time.Duration(percentile(lat, 99.9))
	res.Max = time.Duration(lat[len(lat)-1])
	res.Rate = reachedRate(p, warm, measured, res.Windows)
	if res.Rate == 0 { // the first window was late by more than the run between the middles: end to end instead
		res.Rate = float64(measured-1) / time.Duration(last-p.due(warm)).Seconds()
	}
	startLat := make([]int64, 0, cell.Subs*max(warm/10, 1))
	for seq := range max(warm/10, 1) {
		for sub := range cell.Subs {
			startLat = append(startLat, arrived[sub*total+seq].Load()-p.due(seq))
		}
	}
	res.Start = time.Duration(median(startLat))
	res.Saturated = saturation(float64(cell.Rate), res.Rate, res.Start, res.Windows)
	return res, lat
}

// reachedRate is the rate a cell reached (see LatencyResult.Rate): p its
// schedule, the measured messages seq warm..warm+measured-1 cut into
// len(windows) windows as runLatency cuts them, windows their median
// latencies. It is 0 when there are fewer than two windows, or when the
// first window's median delivery is not before the last's (the first
// window was late by more than the run between them).
func reachedRate(p pacer, warm, measured int, windows []time.Duration) float64 {
	k := len(windows)
	if k < 2 {
		return 0
	}
	mid := func(w int) int { // the middle message of window w: offsets o with o*k/measured == w
		first, next := (w*measured+k-1)/k, ((w+1)*measured+k-1)/k
		return (first + next - 1) / 2
	}
	a, b := mid(0), mid(k-1)
	span := time.Duration(p.due(warm+b)-p.due(warm+a)) + windows[k-1] - windows[0]
	if b <= a || span <= 0 {
		return 0
	}
	return float64(b-a) / span.Seconds()
}

// LatencySummary is a one-line account of r, for progress output.
func LatencySummary(r LatencyResult) string {
	switch {
	case r.Err != nil:
		return "FAIL: " + r.Err.Error()
	case r.Saturated != "":
		return fmt.Sprintf("saturated (%s); p50 %s p99 %s", r.Saturated, fmtDur(r.P50), fmtDur(r.P99))
	}
	return fmt.Sprintf("p50 %s p99 %s p99.9 %s max %s, %s/s (%d msgs × %d subs)",
		fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.P999), fmtDur(r.Max), siLabel(r.Rate), r.Messages, r.Cell.Subs)
}

// fmtUs formats d as a number of µs, without the unit.
func fmtUs(d time.Duration) string {
	v := float64(d) / float64(time.Microsecond)
	if v < 10 {
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// latencyCellText is r's cell in the report's latency table.
func latencyCellText(r LatencyResult) string {
	if r.Saturated != "" {
		return "saturated (" + siLabel(r.Rate) + "/s)"
	}
	return strings.Join([]string{fmtUs(r.P50), fmtUs(r.P99), fmtUs(r.P999)}, " · ")
}

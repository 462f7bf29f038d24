package bench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Table holds a run's results for the markdown report.
type Table struct {
	Impls     []string
	Workloads []Workload
	Cells     map[string]Result // by Key(workload, impl)
	Queued    []QueuedResult
	Sweeps    []Panel // the chart's panels, also written as tables
	BaseN     int
	Elapsed   time.Duration // the whole run
	Command   string        // how it was run

	Latency     []LatencyResult // the latency table's cells
	LatencyTime time.Duration   // measured traffic per latency cell
}

// Key is a cell's key in Table.Cells.
func Key(workload, impl string) string { return workload + "\x00" + impl }

// Machine describes the machine, for the report's header.
func Machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d), %s, %s",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), model, runtime.Version())
}

func fmtNs(ns float64) string {
	switch {
	case ns >= 100:
		return fmt.Sprintf("%.0f", ns)
	case ns >= 10:
		return fmt.Sprintf("%.1f", ns)
	}
	return fmt.Sprintf("%.2f", ns)
}

func fmtRatio(r float64) string {
	switch {
	case math.IsNaN(r) || math.IsInf(r, 0):
		return "?"
	case r >= 100:
		return fmt.Sprintf("×%.0f", r)
	case r >= 10:
		return fmt.Sprintf("×%.1f", r)
	}
	return fmt.Sprintf("×%.2f", r)
}

func fmtNum(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func fmtBytes(v float64) string {
	switch {
	case math.Abs(v) < 8:
		return "≈0 B" // measurement noise
	case math.Abs(v) >= 10<<20:
		return fmt.Sprintf("%.0f MiB", v/(1<<20))
	case math.Abs(v) >= 10<<10:
		return fmt.Sprintf("%.0f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

// Write writes the report as markdown.
func (t *Table) Write(w io.Writer) {
	var notes, failures []string
	note := func(s string) {
		for _, n := range notes {
			if n == s {
				return
			}
		}
		notes = append(notes, s)
	}
	failure := func(s string) string {
		for i, f := range failures {
			if f == s {
				return fmt.Sprintf("FAIL (F%d)", i+1)
			}
		}
		failures = append(failures, s)
		return fmt.Sprintf("FAIL (F%d)", len(failures))
	}
	fail := func(r Result) string {
		if errors.Is(r.Err, ErrNotMeasured) {
			note(fmt.Sprintf("%s %s: %v", r.Workload, r.Impl, r.Err))
			return "n/a"
		}
		return failure(fmt.Sprintf("%s %s: %v", r.Workload, r.Impl, r.Err))
	}
	cell := func(w Workload, impl string) (Result, bool) {
		r, ok := t.Cells[Key(w.Name, impl)]
		return r, ok
	}
	header := func(first string) {
		fmt.Fprintf(w, "| %s |", first)
		for _, impl := range t.Impls {
			fmt.Fprintf(w, " %s |", impl)
		}
		fmt.Fprint(w, "\n|---|")
		for range t.Impls {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w)
	}
	rowName := func(wl Workload) string {
		return fmt.Sprintf("%s %s (%d msgs)", wl.Name, wl.Title, wl.Messages(t.BaseN))
	}

	fmt.Fprintf(w, "Machine: %s.  \n", Machine())
	fmt.Fprintf(w, "Run: `%s`, %s, took %v.\n\n", t.Command, time.Now().UTC().Format("2006-01-02 15:04 UTC"), t.Elapsed.Round(time.Second))

	// workloadTable writes one table with a row per workload and a column
	// per implementation; text formats a cell that ran without error.
	workloadTable := func(title, intro string, text func(wl Workload, impl string, r Result) string) {
		if len(t.Workloads) == 0 {
			return
		}
		fmt.Fprintln(w, title)
		fmt.Fprintln(w)
		fmt.Fprintln(w, intro)
		fmt.Fprintln(w)
		header("workload")
		for _, wl := range t.Workloads {
			fmt.Fprintf(w, "| %s |", rowName(wl))
			for _, impl := range t.Impls {
				r, ok := cell(wl, impl)
				switch {
				case !ok:
					fmt.Fprint(w, " – |")
				case r.Err != nil:
					fmt.Fprintf(w, " %s |", fail(r))
				default:
					fmt.Fprintf(w, " %s |", text(wl, impl, r))
				}
			}
			fmt.Fprintln(w)
		}
	}

	workloadTable("### Time per published message: ns/msg (× floor)",
		"End to end: first publish to the last message handled by every subscriber, divided by the messages published (fan-out counts a message once, however many subscribers got it). Lower is better. The row says how many messages a cell publishes; a cell faster than -min-time was run again with more (see the message counts in the order table).",
		func(wl Workload, impl string, r Result) string {
			if im, ok := ImplByName(impl); ok && im.Note != nil {
				if s := im.Note(wl); s != "" {
					note(wl.Name + " " + s)
				}
			}
			if floor, ok := cell(wl, "floor"); ok && floor.Err == nil && floor.NsPerMsg > 0 {
				return fmt.Sprintf("%s (%s)", fmtNs(r.NsPerMsg), fmtRatio(r.NsPerMsg/floor.NsPerMsg))
			}
			return fmtNs(r.NsPerMsg)
		})

	t.writeLatency(w, failure)

	fmt.Fprintln(w)
	workloadTable("### Allocations per published message: allocs/msg · B/msg",
		"Every heap allocation in the process during the cell (publishers, broker, subscribers, and for NATS the embedded server), divided by the messages published. Payloads are allocated once per cell, not per message.",
		func(_ Workload, _ string, r Result) string {
			return fmt.Sprintf("%s · %s", fmtNum(r.AllocsPerMsg), fmtNum(r.BytesPerMsg))
		})

	fmt.Fprintln(w)
	workloadTable("### Order and redelivery: out-of-order deliveries (share of deliveries)",
		"A delivery is out of order when its subscriber already had a later message of the topic. With Concurrency 8 (W4) order is not promised by anyone. `dup` counts deliveries of a message the subscriber already had; `pub-retry` counts publishes retried after a backpressure refusal (ErrQueueFull, JetStream's stalled async publish).",
		func(wl Workload, _ string, r Result) string {
			s := "0"
			if r.OutOfOrder > 0 {
				s = fmt.Sprintf("%d (%.1f%%)", r.OutOfOrder, 100*float64(r.OutOfOrder)/float64(r.Deliveries))
			}
			if r.Duplicates > 0 {
				s += fmt.Sprintf(", dup %d", r.Duplicates)
			}
			if r.PublishRetries > 0 {
				s += fmt.Sprintf(", pub-retry %d", r.PublishRetries)
			}
			if r.Messages != wl.Messages(t.BaseN) {
				s += fmt.Sprintf(" [%s msgs]", siLabel(float64(r.Messages)))
			}
			return s
		})

	if len(t.Queued) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "### Memory per queued message (W6q): B/queued msg (idle instance)")
		fmt.Fprintln(w)
		n := t.Queued[0].Queued
		fmt.Fprintf(w, "%d messages, each with its own payload (allocated before measuring), published to one topic whose one subscriber's handler is blocked; heap + stack held afterwards, per message, beyond the payloads themselves (after GC). In brackets: what the idle instance holds after setup. Channels (floor, naive) allocate their buffers at setup, so they show up there, not per message.\n\n", n)
		header("payload")
		sizes := []int{}
		for _, q := range t.Queued {
			if !containsInt(sizes, q.Payload) {
				sizes = append(sizes, q.Payload)
			}
		}
		for _, size := range sizes {
			fmt.Fprintf(w, "| %s |", fmtBytes(float64(size)))
			for _, impl := range t.Impls {
				var q *QueuedResult
				for i := range t.Queued {
					if t.Queued[i].Impl == impl && t.Queued[i].Payload == size {
						q = &t.Queued[i]
					}
				}
				switch {
				case q == nil:
					fmt.Fprint(w, " – |")
				case q.Err != nil:
					fmt.Fprintf(w, " %s |", failure(fmt.Sprintf("W6q %s %s: %v", fmtBytes(float64(size)), impl, q.Err)))
				default:
					fmt.Fprintf(w, " %s (%s) |", fmtBytes(q.PerMsg), fmtBytes(q.Idle))
				}
			}
			fmt.Fprintln(w)
		}
	}

	for _, p := range t.Sweeps {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "### %s: deliveries/s (chart.svg)\n\n", p.Title)
		var xs []float64
		for _, s := range p.Series {
			for _, pt := range s.Points {
				if !containsFloat(xs, pt.X) {
					xs = append(xs, pt.X)
				}
			}
		}
		header(p.XLabel)
		for _, x := range xs {
			fmt.Fprintf(w, "| %g |", x)
			for _, impl := range t.Impls {
				v := "–"
				for _, s := range p.Series {
					if s.Name != impl {
						continue
					}
					for _, pt := range s.Points {
						if pt.X == x {
							switch {
							case pt.Err != "":
								v = failure(fmt.Sprintf("%s %s=%g: %s", impl, p.XLabel, x, pt.Err))
							case pt.Y > 0:
								v = siLabel(pt.Y)
							}
						}
					}
				}
				fmt.Fprintf(w, " %s |", v)
			}
			fmt.Fprintln(w)
		}
	}

	if len(failures) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Failures:")
		fmt.Fprintln(w)
		for i, f := range failures {
			fmt.Fprintf(w, "- F%d: %s\n", i+1, f)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "How each implementation maps the workloads (see README.md):")
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// writeLatency writes the latency tables (nothing without latency cells);
// failure numbers a failed cell's reason as the other tables do.
func (t *Table) writeLatency(w io.Writer, failure func(string) string) {
	if len(t.Latency) == 0 {
		return
	}
	var cells []LatencyCell
	var impls []string
	for _, r := range t.Latency {
		if !slices.Contains(cells, r.Cell) {
			cells = append(cells, r.Cell)
		}
		if !slices.Contains(impls, r.Impl) {
			impls = append(impls, r.Impl)
		}
	}
	find := func(impl string, c LatencyCell) (LatencyResult, bool) {
		for _, r := range t.Latency {
			if r.Impl == impl && r.Cell == c {
				return r, true
			}
		}
		return LatencyResult{}, false
	}
	table := func(text func(LatencyResult) string) {
		fmt.Fprint(w, "| |")
		for _, c := range cells {
			fmt.Fprintf(w, " %s: %d sub%s @%s/s |", c.Name, c.Subs, map[bool]string{true: "s"}[c.Subs > 1], siLabel(float64(c.Rate)))
		}
		fmt.Fprint(w, "\n|---|")
		for range cells {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w)
		for _, impl := range impls {
			fmt.Fprintf(w, "| %s |", impl)
			for _, c := range cells {
				r, ok := find(impl, c)
				switch {
				case !ok:
					fmt.Fprint(w, " – |")
				case r.Err != nil:
					fmt.Fprintf(w, " %s |", failure(fmt.Sprintf("latency %s %s: %v", c.Label(), impl, r.Err)))
				default:
					fmt.Fprintf(w, " %s |", text(r))
				}
			}
			fmt.Fprintln(w)
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Latency, paced publisher: µs from intended send to handler entry, p50 · p99 · p99.9")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "One topic, no-op handlers, 64 B; one publisher sends message i at start + i/rate whatever happened before (open loop), and a delivery's latency is from that intended time to its handler's entry, so a publisher held up by backpressure adds its delay to every message it held up (no coordinated omission). With 4 subscribers every delivery is a sample. %v of traffic per cell after a warm-up tenth that is not measured. A cell that reached less than %.0f%% of its rate, or whose backlog grew (the median latency of each tenth of the run higher than the one before, at all steps but one, and the last more than %[3]v and %[4]d× above the first; or every tenth's more than %[3]v and %[4]d× above that at the start of the warm-up), is **saturated**: its latencies measure the backlog, so the table shows the rate it reached instead. Lower is better.\n\n",
		t.LatencyTime, 100*MinRateShare, BacklogGrowth, BacklogFactor)
	table(latencyCellText)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Rate reached (messages/s) · largest latency · with several subscribers, each one's p50 in µs in subscription order; for a saturated cell, why:")
	fmt.Fprintln(w)
	table(func(r LatencyResult) string {
		s := fmt.Sprintf("%s · %s", siLabel(r.Rate), fmtDur(r.Max))
		if len(r.SubP50) > 0 {
			var p50s []string
			for _, d := range r.SubP50 {
				p50s = append(p50s, fmtUs(d))
			}
			s += " · " + strings.Join(p50s, "/")
		}
		if r.Saturated != "" {
			s += " · " + r.Saturated
		}
		return s
	})
}

// Command benchtable runs every workload on every implementation, one cell
// at a time, and prints a markdown report (time per message and its ratio
// to the channel floor, allocations, ordering, memory per queued message);
// it can also write an SVG chart of throughput against the number of
// subscribers and of topics.
//
//	go run ./cmd/benchtable -n 50000 -out RESULTS.md -chart chart.svg
//
// Every cell has a timeout and comes back as FAIL rather than hanging.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inproc/broker/bench"
)

func main() {
	var (
		n           = flag.Int("n", 50000, "messages per cell (W4 and W6/64KiB publish 0.4×; fan-out counts a message once)")
		sweepN      = flag.Int("sweep-n", 100000, "deliveries per chart point (subscriber sweep publishes sweep-n/subs; topic sweep publishes sweep-n)")
		implList    = flag.String("impls", "all", "comma-separated implementations: "+strings.Join(implNames(), ",")+` ("all": those without "-" in the name)`)
		workList    = flag.String("workloads", "all", "comma-separated workloads: "+strings.Join(workloadNames(), ",")+` ("all": the W rows; "none": no throughput table)`)
		timeout     = flag.Duration("timeout", 30*time.Second, "limit per cell, setup to close; a cell past it is reported as FAIL")
		minTime     = flag.Duration("min-time", 250*time.Millisecond, "a cell that took less is run again with proportionally more messages (0: never)")
		maxDeliv    = flag.Int("max-deliveries", 2_000_000, "cap on messages × subscribers when -min-time scales a cell up")
		warmup      = flag.Bool("warmup", true, "run each cell once at n/10 messages before measuring it")
		queued      = flag.Int("queued", 1000, "messages queued behind a blocked handler for the memory table (0: skip)")
		queuedSizes = flag.String("queued-sizes", "64,4096,65536", "payload sizes for the memory table")
		sweep       = flag.Bool("sweep", true, "run the subscriber and topic sweeps for the chart (and its tables)")
		out         = flag.String("out", "-", "markdown report file (- for stdout)")
		chart       = flag.String("chart", "", "SVG chart file (empty: none; needs -sweep)")
		quiet       = flag.Bool("q", false, "no progress on stderr")
		count       = flag.Int("count", 1, "runs per table cell; the report shows the one with the median ns/msg (any failure shows as FAIL)")
		latency     = flag.Bool("latency", false, "run the latency cells: a paced publisher, µs from intended send to handler entry (p50/p99/p99.9)")
		latImpls    = flag.String("latency-impls", strings.Join(bench.LatencyImpls, ","), "comma-separated implementations for the latency cells")
		latCells    = flag.String("latency-cells", "all", "comma-separated latency cells: "+strings.Join(latencyLabels(), ","))
		latTime     = flag.Duration("latency-time", time.Second, "measured traffic per latency cell (rate × this messages, after a warm-up tenth)")
		handler     = flag.String("handler", "spin", "W4's 50 µs handler: spin (busy-wait, CPU-bound) or sleep (time.Sleep, I/O-like; a short sleep lasts up to ~1 ms on Linux)")
	)
	flag.Parse()
	start := time.Now()
	progress := func(format string, args ...any) {
		if !*quiet {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}

	impls, err := pickImpls(*implList)
	if err != nil {
		fatal(err)
	}
	workloads, err := pickWorkloads(*workList)
	if err != nil {
		fatal(err)
	}
	var latencyImpls []bench.Impl
	var latencyCells []bench.LatencyCell
	if *latency {
		if latencyImpls, err = pick("implementation", *latImpls, nil, implNames(), bench.ImplByName); err != nil {
			fatal(err)
		}
		if latencyCells, err = pick("latency cell", *latCells, bench.LatencyCells, latencyLabels(), bench.LatencyCellByLabel); err != nil {
			fatal(err)
		}
	}
	opts := bench.Options{Timeout: *timeout}
	progress("%s", bench.Machine())
	switch *handler {
	case "spin":
	case "sleep":
		for i := range workloads {
			if workloads[i].Work > 0 {
				workloads[i].SleepWork = true
				workloads[i].Title = strings.Replace(workloads[i].Title, "µs handler", "µs sleeping handler", 1)
			}
		}
	default:
		fatal(fmt.Errorf("-handler must be spin or sleep, not %q", *handler))
	}

	t := &bench.Table{Workloads: workloads, Cells: map[string]bench.Result{}, BaseN: *n, Command: commandLine()}
	for _, impl := range impls {
		t.Impls = append(t.Impls, impl.Name)
	}
	for _, w := range workloads {
		for _, impl := range impls {
			m := w.Messages(*n)
			if *warmup {
				bench.RunCell(impl, w, max(m/10, 1000), opts)
			}
			var runs []bench.Result
			for range max(*count, 1) {
				runs = append(runs, measure(impl, w, m, opts, *minTime, *maxDeliv))
			}
			r := median(runs)
			t.Cells[bench.Key(w.Name, impl.Name)] = r
			progress("%-9s %-10s %s", w.Name, impl.Name, summary(r))
		}
	}

	progress("-- table done at %v", time.Since(start).Round(time.Second))
	t.LatencyTime = *latTime
	for _, c := range latencyCells {
		for _, impl := range latencyImpls {
			runtime.GC()
			r := bench.RunLatency(impl, c, int(latTime.Seconds()*float64(c.Rate)), *timeout)
			t.Latency = append(t.Latency, r)
			progress("%-9s %-10s %s", c.Label(), impl.Name, bench.LatencySummary(r))
		}
	}
	if *latency {
		progress("-- latency done at %v", time.Since(start).Round(time.Second))
	}
	if *queued > 0 {
		for _, s := range strings.Split(*queuedSizes, ",") {
			size, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || size < 8 {
				fatal(fmt.Errorf("bad -queued-sizes entry %q", s))
			}
			for _, impl := range impls {
				runtime.GC()
				q := bench.RunQueued(impl, size, *queued, *timeout)
				t.Queued = append(t.Queued, q)
				if q.Err != nil {
					progress("W6q %-6d %-10s FAIL: %v", size, impl.Name, q.Err)
				} else {
					progress("W6q %-6d %-10s %.0f B/queued msg, idle %.0f B", size, impl.Name, q.PerMsg, q.Idle)
				}
			}
		}
	}

	progress("-- memory table done at %v", time.Since(start).Round(time.Second))
	var panels []bench.Panel
	if *sweep {
		subs := bench.Panel{Title: "Fan-out: 1 topic, N subscribers", XLabel: "subscribers"}
		topics := bench.Panel{Title: "Topics: N topics, 1 subscriber each", XLabel: "topics (min(4, N) publishers)"}
		for _, impl := range impls {
			if *warmup {
				bench.RunCell(impl, bench.SubsWorkload(1), 2000, opts)
			}
			s := bench.Series{Name: impl.Name}
			for _, k := range bench.SweepSubs {
				r := measure(impl, bench.SubsWorkload(k), max(*sweepN/k, 500), opts, *minTime, *maxDeliv)
				s.Points = append(s.Points, point(k, r))
				progress("%-9s %-10s %s", bench.SubsWorkload(k).Name, impl.Name, summary(r))
			}
			subs.Series = append(subs.Series, s)
			s = bench.Series{Name: impl.Name}
			for _, k := range bench.SweepTopics {
				r := measure(impl, bench.TopicsWorkload(k), max(*sweepN, 2*k), opts, *minTime, *maxDeliv)
				s.Points = append(s.Points, point(k, r))
				progress("%-9s %-10s %s", bench.TopicsWorkload(k).Name, impl.Name, summary(r))
			}
			topics.Series = append(topics.Series, s)
		}
		panels = []bench.Panel{subs, topics}
		t.Sweeps = panels
	}

	t.Elapsed = time.Since(start)
	var w io.Writer = os.Stdout
	if *out != "-" && *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fatal(err)
		}
		defer f.Close()
		w = f
	}
	t.Write(w)
	if *chart != "" {
		if len(panels) == 0 {
			fatal(fmt.Errorf("-chart needs -sweep"))
		}
		f, err := os.Create(*chart)
		if err != nil {
			fatal(err)
		}
		if err := bench.WriteChart(f, "Throughput, 64 B messages, no-op handlers ("+strconv.Itoa(runtime.NumCPU())+" CPUs)", panels); err != nil {
			fatal(err)
		}
		if err := f.Close(); err != nil {
			fatal(err)
		}
	}
	progress("done in %v", time.Since(start).Round(time.Second))
}

// measure runs one cell with m messages; if it took less than minTime it
// runs it again (the first run was one more warm-up) with enough messages
// to take about minTime, at most maxDeliveries deliveries.
func measure(impl bench.Impl, w bench.Workload, m int, opts bench.Options, minTime time.Duration, maxDeliveries int) bench.Result {
	runtime.GC()
	r := bench.RunCell(impl, w, m, opts)
	if r.Err != nil || minTime <= 0 || r.Elapsed >= minTime || r.Elapsed <= 0 {
		return r
	}
	f := 1.1 * float64(minTime) / float64(r.Elapsed)
	m2 := min(int(float64(r.Messages)*f), maxDeliveries/max(w.Subs, 1))
	if m2 <= r.Messages {
		return r
	}
	runtime.GC()
	return bench.RunCell(impl, w, m2, opts)
}

// median returns the run with the median ns/msg, or the first failure.
func median(runs []bench.Result) bench.Result {
	for _, r := range runs {
		if r.Err != nil {
			return r
		}
	}
	slices.SortFunc(runs, func(a, b bench.Result) int { return cmp.Compare(a.NsPerMsg, b.NsPerMsg) })
	return runs[len(runs)/2]
}

func point(x int, r bench.Result) bench.Point {
	if r.Err != nil {
		return bench.Point{X: float64(x), Err: r.Err.Error()}
	}
	return bench.Point{X: float64(x), Y: r.DeliveriesPerSec()}
}

func summary(r bench.Result) string {
	if r.Err != nil {
		return "FAIL: " + r.Err.Error()
	}
	return fmt.Sprintf("%8.0f ns/msg %6.2f allocs/msg %8.0f B/msg  %7d msgs in %-8v ooo=%d dup=%d pub-retry=%d",
		r.NsPerMsg, r.AllocsPerMsg, r.BytesPerMsg, r.Messages, r.Elapsed.Round(time.Millisecond), r.OutOfOrder, r.Duplicates, r.PublishRetries)
}

func pickImpls(list string) ([]bench.Impl, error) {
	return pick("implementation", list, bench.Impls(), implNames(), bench.ImplByName)
}

func pickWorkloads(list string) ([]bench.Workload, error) {
	if list == "none" {
		return nil, nil
	}
	return pick("workload", list, bench.Workloads, workloadNames(), bench.WorkloadByName)
}

func implNames() []string {
	return names(bench.AllImpls(), func(i bench.Impl) string { return i.Name })
}

func latencyLabels() []string {
	return names(bench.LatencyCells, bench.LatencyCell.Label)
}

func workloadNames() []string {
	return names(append(bench.Workloads[:len(bench.Workloads):len(bench.Workloads)], bench.Shapes...), func(w bench.Workload) string { return w.Name })
}

// pick resolves a comma-separated list of names ("all" or "" for the
// defaults), failing on an unknown name with the list of known ones.
func pick[T any](kind, list string, defaults []T, known []string, byName func(string) (T, bool)) ([]T, error) {
	if list == "all" || list == "" {
		return defaults, nil
	}
	var out []T
	for _, n := range strings.Split(list, ",") {
		v, ok := byName(strings.TrimSpace(n))
		if !ok {
			return nil, fmt.Errorf("unknown %s %q (have %s)", kind, n, strings.Join(known, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

func names[T any](xs []T, name func(T) string) []string {
	var s []string
	for _, x := range xs {
		s = append(s, name(x))
	}
	return s
}

// commandLine is how the runner was invoked, less where it writes.
func commandLine() string {
	args := []string{"benchtable"}
	skip := false
	for _, a := range os.Args[1:] {
		if skip {
			skip = false
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "out" || name == "chart") {
			skip = !hasValue
			continue
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchtable:", err)
	os.Exit(2)
}

package bench

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPacerDue(t *testing.T) {
	tests := []struct {
		rate int
		i    int
		want int64 // ns after start
	}{
		{10_000, 0, 0},
		{10_000, 1, 100_000},
		{10_000, 10_000, 1_000_000_000},
		{100_000, 1, 10_000},
		{100_000, 123_456, 1_234_560_000},
		{3, 1, 333_333_333}, // rounded down, never early...
		{3, 2, 666_666_666},
		{3, 3, 1_000_000_000}, // ...and not drifting
	}
	for _, tt := range tests {
		p := pacer{start: 5000, rate: tt.rate}
		if got := p.due(tt.i) - 5000; got != tt.want {
			t.Errorf("rate %d: due(%d) = start+%d, want start+%d", tt.rate, tt.i, got, tt.want)
		}
	}
}

// TestPaceOpenLoop drives pace with a fake clock: a send never goes before
// its due time, a slow send does not move the schedule (the messages it
// held up go at once, back to back), and pacing resumes once caught up.
func TestPaceOpenLoop(t *testing.T) {
	now := int64(1000)
	p := pacer{start: 1000, rate: 10_000} // 100 µs apart
	var sent []int64
	wait := func(d time.Duration) {
		if d <= 0 {
			t.Fatalf("wait(%v): asked to wait when not early", d)
		}
		now += int64(d) + 7 // the wait overshoots by 7 ns
	}
	send := func(i int) error {
		sent = append(sent, now)
		if i == 3 {
			now += 450_000 // send 3 takes 450 µs
		}
		return nil
	}
	if err := pace(10, p, func() int64 { return now }, wait, send); err != nil {
		t.Fatal(err)
	}
	want := []int64{
		1000, 101_007, 201_007, 301_007, // on schedule (plus the overshoot)
		751_007, 751_007, 751_007, 751_007, // 4–7 were due while send 3 ran: at once
		801_007, 901_007, // caught up: on schedule again
	}
	if !slices.Equal(sent, want) {
		t.Fatalf("sent at %v, want %v", sent, want)
	}
	for i, at := range sent {
		if at < p.due(i) {
			t.Errorf("message %d sent at %d, before its due time %d", i, at, p.due(i))
		}
	}

	// It stops at the first error.
	sent = nil
	errStop := context.Canceled
	err := pace(10, p, func() int64 { return now }, wait, func(i int) error {
		sent = append(sent, now)
		if i == 5 {
			return errStop
		}
		return nil
	})
	if err != errStop || len(sent) != 6 {
		t.Fatalf("pace returned %v after %d sends, want %v after 6", err, len(sent), errStop)
	}
}

func TestPercentile(t *testing.T) {
	seq := func(n int) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(i + 1)
		}
		return s
	}
	tests := []struct {
		name    string
		samples []int64
		p       float64
		want    int64
	}{
		{"empty", nil, 50, 0},
		{"one", []int64{7}, 50, 7},
		{"one p99.9", []int64{7}, 99.9, 7},
		{"four p25", []int64{10, 20, 30, 40}, 25, 10},
		{"four p50", []int64{10, 20, 30, 40}, 50, 20},
		{"four p75", []int64{10, 20, 30, 40}, 75, 30},
		{"four p99", []int64{10, 20, 30, 40}, 99, 40},
		{"ten p50", seq(10), 50, 5},
		{"ten p90", seq(10), 90, 9},
		{"ten p99.9", seq(10), 99.9, 10},
		{"1000 p50", seq(1000), 50, 500},
		{"1000 p99", seq(1000), 99, 990},
		{"1000 p99.9", seq(1000), 99.9, 999},
		{"1000 p100", seq(1000), 100, 1000},
		{"1001 p50", seq(1001), 50, 501},
		{"100000 p99.9", seq(100_000), 99.9, 99_900},
		{"100001 p99.9", seq(100_001), 99.9, 99_901},
	}
	for _, tt := range tests {
		if got := percentile(tt.samples, tt.p); got != tt.want {
			t.Errorf("%s: percentile(p%g) = %d, want %d", tt.name, tt.p, got, tt.want)
		}
	}
	// median sorts first.
	s := seq(1001)
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	if got := median(s); got != 501 {
		t.Errorf("median of shuffled 1..1001 = %d, want 501", got)
	}
}

func TestSaturation(t *testing.T) {
	us := time.Microsecond
	ms := time.Millisecond
	flat := []time.Duration{5 * us, 6 * us, 5 * us, 4 * us, 5 * us, 7 * us, 5 * us, 5 * us, 6 * us, 5 * us}
	rising := []time.Duration{10 * us, 300 * us, 600 * us, 900 * us, 1200 * us, 1500 * us, 1800 * us, 2100 * us, 2400 * us, 2700 * us}
	oneDip := slices.Clone(rising)
	oneDip[4] = 500 * us
	twoDips := slices.Clone(oneDip)
	twoDips[7] = 1000 * us
	stall := slices.Clone(flat)
	stall[5], stall[6] = 50*ms, 20*ms
	stallAtEnd := slices.Clone(flat)
	stallAtEnd[9] = 30 * ms
	small := []time.Duration{100 * us, 200 * us, 300 * us, 400 * us, 500 * us, 600 * us, 700 * us, 800 * us, 900 * us, 1000 * us}
	slow := []time.Duration{2 * ms, 2100 * us, 2200 * us, 2400 * us, 2600 * us, 2800 * us, 3 * ms, 3200 * us, 3300 * us, 3500 * us}
	plateau := []time.Duration{130 * ms, 134 * ms, 131 * ms, 136 * ms, 133 * ms, 135 * ms, 132 * ms, 134 * ms, 133 * ms, 134 * ms}
	lowPlateau := make([]time.Duration, len(plateau))
	for i, d := range plateau {
		lowPlateau[i] = d / 200 // 650–680 µs
	}
	plateauDrained := slices.Clone(plateau)
	plateauDrained[9] = 8 * us
	tests := []struct {
		name    string
		rate    float64 // reached, of 100k/s
		windows []time.Duration
		start   time.Duration // median latency at the start of the warm-up (0: 5 µs)
		want    string        // substring of the reason; "" for not saturated
	}{
		{"at rate, flat", 100_000, flat, 0, ""},
		{"short of rate", 94_000, flat, 0, "reached 94k/s of 100k/s"},
		{"within 5%", 96_000, flat, 0, ""},
		{"backlog rising", 100_000, rising, 0, "backlog grew"},
		{"backlog with one dip", 99_000, oneDip, 0, "backlog grew"},
		{"two dips: noise", 100_000, twoDips, 0, ""},
		{"a stall that drained", 100_000, stall, 0, ""},
		{"a stall in the last window only", 100_000, stallAtEnd, 0, ""},
		{"rising under 1 ms", 100_000, small, 0, ""},
		{"rising under 2×", 100_000, slow, 1900 * us, ""},
		{"no windows", 100_000, nil, 0, ""},
		{"standing backlog from the warm-up", 100_000, plateau, 0, "never drained"},
		{"standing but under 1 ms", 100_000, lowPlateau, 0, ""},
		{"as slow from the start", 100_000, plateau, 100 * ms, ""},
		{"one window drained", 100_000, plateauDrained, 0, ""},
	}
	for _, tt := range tests {
		start := tt.start
		if start == 0 {
			start = 5 * us
		}
		got := saturation(100_000, tt.rate, start, tt.windows)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: saturation = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestReachedRate(t *testing.T) {
	flat := make([]time.Duration, LatencyWindows)
	for i := range flat {
		flat[i] = 5 * time.Microsecond
	}
	grew := slices.Clone(flat)
	grew[LatencyWindows-1] += 10 * time.Millisecond
	faster := slices.Clone(flat)
	faster[0] += 9 * time.Millisecond // a stall in the first window that drained
	p := pacer{start: 12345, rate: 10_000}
	tests := []struct {
		name           string
		warm, measured int
		windows        []time.Duration
		want           float64
	}{
		{"flat", 100, 1000, flat, 10_000},                   // messages 49..949: 900 over 90 ms
		{"last window 10 ms later", 100, 1000, grew, 9_000}, // 900 over 100 ms
		{"first window 9 ms late", 100, 1000, faster, 900 / 0.081},
		{"ten messages", 1, 10, flat, 10_000},     // one message a window: 0..9
		{"fifteen messages", 1, 15, flat, 10_000}, // windows of 2 or 1: middles 0 and 14
		{"one window", 1, 15, flat[:1], 0},
		{"first window later than the last", 1, 10, append([]time.Duration{time.Millisecond}, flat[1:]...), 0}, // 9 intervals are 0.9 ms
	}
	for _, tt := range tests {
		got := reachedRate(p, tt.warm, tt.measured, tt.windows)
		if math.Abs(got-tt.want) > 1e-6*tt.want || (tt.want == 0) != (got == 0) {
			t.Errorf("%s: rate %v, want %v", tt.name, got, tt.want)
		}
	}
}

// inlineImpl delivers each message to every subscriber inside Publish,
// after calling before(seq): a test implementation whose delays are known.
func inlineImpl(before func(seq int)) Impl {
	return Impl{Name: "inline", New: func(env *Env) (Instance, error) { return &inlineInst{env, before}, nil }}
}

type inlineInst struct {
	env    *Env
	before func(seq int)
}

func (in *inlineInst) Publish(_ context.Context, _, topic, seq int) error {
	in.before(seq)
	for j := range in.env.Subs {
		if err := in.env.Handle(in.env.Sub(topic, j), seq); err != nil {
			return err
		}
	}
	return nil
}

func (in *inlineInst) Close(context.Context) error { return nil }

// TestLatencyFromIntendedTime: a publish that stalls 5 ms at 10k/s holds
// up the ~50 messages due meanwhile; measured from their intended send
// times they are late by 5 ms down to 0 (no coordinated omission), so at
// least 31 samples are 2 ms or more. Measured from the actual send, only
// the stalled one would be.
func TestLatencyFromIntendedTime(t *testing.T) {
	const stalled = 100 // within the measured messages (the warm-up is 40)
	impl := inlineImpl(func(seq int) {
		if seq == 40+stalled {
			spin(5 * time.Millisecond)
		}
	})
	r, lat := runLatency(impl, LatencyCell{Name: "T", Subs: 1, Rate: 10_000}, 400, 30*time.Second)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	late := 0
	for _, l := range lat {
		if l >= int64(2*time.Millisecond) {
			late++
		}
	}
	if late < 31 {
		t.Errorf("%d samples ≥ 2 ms, want at least 31 (the messages the stall held up): latency is not measured from the intended send time", late)
	}
	if r.Max < 5*time.Millisecond || r.P99 < 2*time.Millisecond {
		t.Errorf("max %v, p99 %v: want ≥ 5 ms and ≥ 2 ms", r.Max, r.P99)
	}
	if r.Messages != 400 || r.Samples != 400 || len(lat) != 400 {
		t.Errorf("%d messages, %d samples, %d latencies: want 400 each", r.Messages, r.Samples, len(lat))
	}
}

// TestLatencySaturated: an implementation that takes 200 µs per message
// cannot sustain 10k/s; the cell says so instead of giving latencies.
func TestLatencySaturated(t *testing.T) {
	impl := inlineImpl(func(int) { spin(200 * time.Microsecond) })
	r := RunLatency(impl, LatencyCell{Name: "T", Subs: 1, Rate: 10_000}, 200, 30*time.Second)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if !strings.Contains(r.Saturated, "reached") || r.Rate > 5_000 {
		t.Errorf("saturated %q at %.0f/s: want saturated, at most 5k/s", r.Saturated, r.Rate)
	}
	if !strings.HasPrefix(latencyCellText(r), "saturated") {
		t.Errorf("report cell %q, want it to say saturated", latencyCellText(r))
	}
}

// TestLatencyCells runs every implementation of the latency table on each
// latency cell for 10 ms of traffic: every subscriber gets every message
// and the result is complete.
func TestLatencyCells(t *testing.T) {
	for _, c := range LatencyCells {
		for _, name := range LatencyImpls {
			impl, ok := ImplByName(name)
			if !ok {
				t.Fatalf("latency implementation %q is not registered", name)
			}
			t.Run(c.Label()+"/"+name, func(t *testing.T) {
				n := c.Rate / 100
				r := RunLatency(impl, c, n, 30*time.Second)
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				subP50s := 0 // one per subscriber, none with one
				if c.Subs > 1 {
					subP50s = c.Subs
				}
				if r.Messages != n || r.Samples != n*c.Subs || len(r.Windows) != LatencyWindows || len(r.SubP50) != subP50s {
					t.Fatalf("%d messages, %d samples, %d windows, %d subscriber p50s: want %d, %d, %d, %d",
						r.Messages, r.Samples, len(r.Windows), len(r.SubP50), n, n*c.Subs, LatencyWindows, subP50s)
				}
				if !(0 < r.P50 && r.P50 <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max) || r.Rate <= 0 {
					t.Fatalf("inconsistent result %+v", r)
				}
				t.Log(LatencySummary(r))
			})
		}
	}
}

// BenchmarkLatency runs the latency cells with b.N measured messages
// (ns/op is then about 1/rate) and reports the latencies in µs, the rate
// reached and whether the cell was saturated (1) or not (0).
//
//	go test -run '^$' -bench 'Latency/L1@10k/' -benchtime 20000x
func BenchmarkLatency(b *testing.B) {
	for _, c := range LatencyCells {
		for _, impl := range AllImpls() {
			b.Run(c.Label()+"/"+impl.Name, func(b *testing.B) {
				r := RunLatency(impl, c, b.N, 5*time.Minute)
				if r.Err != nil {
					b.Fatal(r.Err)
				}
				us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
				b.ReportMetric(us(r.P50), "p50-µs")
				b.ReportMetric(us(r.P99), "p99-µs")
				b.ReportMetric(us(r.P999), "p99.9-µs")
				b.ReportMetric(r.Rate, "msgs/s")
				sat := 0.0
				if r.Saturated != "" {
					sat = 1
				}
				b.ReportMetric(sat, "saturated")
			})
		}
	}
}

// TestLatencyReport: the report's latency tables show p50 · p99 · p99.9
// in µs, "saturated" with the rate reached, and a failure as FAIL (Fn)
// with its reason listed.
func TestLatencyReport(t *testing.T) {
	us := time.Microsecond
	l1 := LatencyCells[0]
	l2 := LatencyCells[3]
	tab := &Table{LatencyTime: time.Second, Latency: []LatencyResult{
		{Impl: "floor", Cell: l1, P50: 1800 * time.Nanosecond, P99: 21 * us, P999: 1045 * us, Max: 1244 * us, Rate: 10_000},
		{Impl: "broker", Cell: l1, P50: 5300 * time.Nanosecond, P99: 40 * us, P999: 90 * us, Max: 100 * us, Rate: 9_990},
		{Impl: "floor", Cell: l2, P50: 3 * us, P99: 30 * us, P999: 300 * us, Max: 400 * us, Rate: 99_800, SubP50: []time.Duration{2 * us, 3 * us, 3 * us, 12 * us}},
		{Impl: "broker", Cell: l2, Rate: 61_450, Saturated: "reached 61.45k/s of 100k/s"},
		{Impl: "watermill", Cell: l2, Err: ErrTimeout},
	}}
	var b strings.Builder
	tab.Write(&b)
	out := b.String()
	for _, want := range []string{
		"| | L1: 1 sub @10k/s | L2: 4 subs @100k/s |",
		"| floor | 1.8 · 21 · 1045 | 3.0 · 30 · 300 |",
		"| broker | 5.3 · 40 · 90 | saturated (61.45k/s) |",
		"| watermill | – | FAIL (F1) |",
		"| broker | 9.99k · 100 µs | 61.45k · 0.0 µs · reached 61.45k/s of 100k/s |",
		"| floor | 10k · 1244 µs | 99.8k · 400 µs · 2.0/3.0/3.0/12 |",
		"- F1: latency L2@100k watermill: timeout",
		"1s of traffic per cell",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "### Time per published message") {
		t.Errorf("report has a throughput table without workloads:\n%s", out)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPercentile(t *testing.T) {
	xs := []float64{15, 20, 35, 40, 50}
	for _, tc := range []struct{ p, want float64 }{
		{0, 15}, {5, 15}, {20, 15}, {30, 20}, {40, 20}, {50, 35}, {95, 50}, {100, 50},
	} {
		assert.Equal(t, tc.want, percentile(xs, tc.p), "p%v", tc.p)
	}
	assert.Equal(t, []float64{15, 20, 35, 40, 50}, xs, "input untouched")
	assert.Equal(t, 0.0, percentile(nil, 95))
	assert.Equal(t, 7.0, percentile([]float64{7}, 50))

	var hundred []float64
	for i := 100; i >= 1; i-- { // unsorted on purpose
		hundred = append(hundred, float64(i))
	}
	assert.Equal(t, 95.0, percentile(hundred, 95))
	assert.Equal(t, 50.0, percentile(hundred, 50))
	assert.Equal(t, 1.0, percentile(hundred, 0.5))
}

func TestSlope(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4}
	assert.InDelta(t, 2.5, slope(xs, []float64{1, 3.5, 6, 8.5, 11}), 1e-12)
	assert.InDelta(t, 0, slope(xs, []float64{3, 3, 3, 3, 3}), 1e-12)
	assert.Equal(t, 0.0, slope([]float64{1}, []float64{1}))
	assert.Equal(t, 0.0, slope([]float64{2, 2}, []float64{1, 5}))
}

func TestWorkersFor(t *testing.T) {
	w, _ := workersFor(1200, 500, 0.95) // 2.4 → 3, ρ 0.8
	assert.Equal(t, 3, w)
	w, how := workersFor(1000, 250, 0.95) // ceil is exactly 4, ρ 1: raised
	assert.Equal(t, 5, w)
	assert.Contains(t, how, "raised")
	w, _ = workersFor(10, 500, 0.95)
	assert.Equal(t, 1, w)
}

// backlogSamples makes samples 10 ms apart with the given backlogs (as
// topic queue depths).
func backlogSamples(bs ...int) []sample {
	out := make([]sample, len(bs))
	for i, b := range bs {
		out[i] = sample{
			At: time.Duration(i) * 10 * time.Millisecond,
			St: broker.Stats{Topics: map[string]broker.TopicStats{"t": {Queued: b}}},
		}
	}
	return out
}

func TestRecoveredAt(t *testing.T) {
	ms := time.Millisecond
	//                        0   10  20  30  40  50  60  70  80  90  100 110
	samples := backlogSamples(90, 80, 60, 40, 5, 30, 4, 3, 5, 2, 20, 3)
	d, ok := recoveredAt(samples, 0, 10, 0)
	require.True(t, ok)
	assert.Equal(t, 40*ms, d, "first crossing without a hold")
	// With a hold of 30 ms the dip at 40 ms is followed by 30: p95 of
	// [5 30 4 3] is 30; the stretch from 60 ms holds.
	d, ok = recoveredAt(samples, 0, 10, 30*ms)
	require.True(t, ok)
	assert.Equal(t, 60*ms, d)
	d, ok = recoveredAt(samples, 15*ms, 10, 30*ms)
	require.True(t, ok)
	assert.Equal(t, 45*ms, d, "measured from the fault's end")
	// A stretch that is not over yet is not a recovery.
	_, ok = recoveredAt(samples, 0, 10, 500*ms)
	assert.False(t, ok)
	_, ok = recoveredAt(backlogSamples(50, 50, 50), 0, 10, 0)
	assert.False(t, ok)
}

func TestParseChecks(t *testing.T) {
	ids, err := parseChecks("all")
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4, 5}, ids)
	ids, err = parseChecks("5, 2,2")
	require.NoError(t, err)
	assert.Equal(t, []int{2, 5}, ids)
	for _, bad := range []string{"0", "6", "x", "1,,2"} {
		_, err := parseChecks(bad)
		assert.Error(t, err, bad)
	}
}

func TestDefaultsValid(t *testing.T) {
	cfg := defaultConfig()
	require.NoError(t, cfg.validate())
	cfg.Model.Workers = 4 // 4 × 250/s is not below λ = 1000/s
	assert.Error(t, cfg.validate())
}

func TestRunUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	assert.Equal(t, 0, run([]string{"-h"}, &out, &errOut))
	assert.Contains(t, errOut.String(), "-chart file")
	assert.Contains(t, errOut.String(), "-check list")
	assert.Equal(t, 2, run([]string{"-no-such-flag"}, &out, io.Discard))
	assert.Equal(t, 2, run([]string{"-check", "9"}, &out, io.Discard))
	assert.Equal(t, 2, run([]string{"-model-workers", "9"}, &out, io.Discard))
}

// svgDoc parses an SVG document and counts its elements by name.
func svgDoc(t *testing.T, data []byte) map[string]int {
	t.Helper()
	counts := map[string]int{}
	d := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "well-formed XML")
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
			if counts["svg"] == 1 && se.Name.Local == "svg" {
				assert.Equal(t, "http://www.w3.org/2000/svg", se.Name.Space)
			}
		}
	}
	return counts
}

func TestWriteSVG(t *testing.T) {
	c := chart{
		Title: `backlog <over> time & "more"`,
		Panels: []panel{
			{
				Title: "Check 1 & <co>",
				Series: []series{
					{Name: "backlog", Color: colorMain, Points: []point{{0, 0}, {0.5, 3}, {1, 12.5}, {2, 7}}},
					{Name: "model λ − W·μ", Color: colorModel, Dashed: true, Points: []point{{0, 0}, {2, 20}}},
				},
				Bands:  []band{{X0: 0.5, X1: 1.5, Label: "fault", Color: colorBad}},
				HLines: []hline{{Y: 10, Label: "level", Color: colorGood}, {Y: 1e6, Label: "bound 1000000", Color: colorBad}},
				VLines: []vline{{X: 1.7, Label: "recovered", Color: colorGood}},
			},
			{Title: "empty"}, // no data at all must still draw axes
			{Title: "flat", Series: []series{{Name: "zero", Color: colorMain, Points: []point{{0, 0}, {0, 0}}}}},
		},
	}
	var buf bytes.Buffer
	require.NoError(t, c.WriteSVG(&buf))
	out := buf.Bytes()
	counts := svgDoc(t, out)
	assert.Equal(t, 1, counts["svg"])
	assert.Equal(t, 3, counts["g"], "one group per panel")
	// Per panel one axis polyline; plus one per series with points.
	assert.Equal(t, 3+3, counts["polyline"])
	s := string(out)
	assert.Contains(t, s, "backlog &lt;over&gt; time &amp; &#34;more&#34;")
	assert.Contains(t, s, "Check 1 &amp; &lt;co&gt;")
	assert.Contains(t, s, "model λ − W·μ")
	assert.Contains(t, s, "bound 1000000 (above the scale)")
	assert.Contains(t, s, "time (s)")
	assert.Contains(t, s, "backlog (messages)")
	assert.Contains(t, s, `stroke-dasharray="8 5"`)
	assert.NotContains(t, s, "NaN")
	assert.NotContains(t, s, "Inf")
}

func TestNiceStep(t *testing.T) {
	for _, tc := range []struct{ raw, want float64 }{
		{0.7, 1}, {1, 1}, {1.2, 2}, {3, 5}, {7, 10}, {130, 200}, {0.013, 0.02}, {0, 1}, {math.NaN(), 1},
	} {
		assert.InDelta(t, tc.want, niceStep(tc.raw), 1e-12, "raw %v", tc.raw)
	}
	assert.Equal(t, "0.25", tickLabel(0.25, 0.05))
	assert.Equal(t, "200", tickLabel(200, 100))
}

// smokeConfig is every check at a tiny scale with generous bounds, for a
// loaded machine and the race detector.
func smokeConfig() config {
	cfg := defaultConfig()
	cfg.Poisson = false
	cfg.Progress = 100 * time.Millisecond
	cfg.Publishers = 2

	cfg.Steady.Rate = 200
	cfg.Steady.Duration = 300 * time.Millisecond

	f := &cfg.Fault
	f.Rate = 300
	f.Warmup = 300 * time.Millisecond
	f.Duration = 300 * time.Millisecond
	f.Hold = 200 * time.Millisecond
	f.Recover = 3 * time.Second
	f.HandlerTimeout = 30 * time.Millisecond
	f.Queue = 16
	f.PublishTimeout = 100 * time.Millisecond
	f.Margin = 900 * time.Millisecond
	f.MaxRetryRate = 0.6

	m := &cfg.Model
	m.Rate = 500
	m.Workers = 1
	m.Duration = 500 * time.Millisecond
	m.Queue = 2048
	m.Tol = 0.5
	m.Trend = 1
	return cfg
}

func TestSmokeAllChecks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every check for about 3 s")
	}
	cfg := smokeConfig()
	require.NoError(t, cfg.validate())
	var out bytes.Buffer
	results := runChecks(context.Background(), &cfg, &out)
	require.Len(t, results, numChecks)
	for _, r := range results {
		assert.True(t, r.Pass(), "check %d %s failed: %v", r.ID, r.Name, r.Failures)
		assert.NotEmpty(t, r.Headline, "check %d", r.ID)
		assert.NotEmpty(t, r.Panel.Series, "check %d", r.ID)
	}
	text := out.String()
	assert.Contains(t, text, "PASS check 1")
	assert.Contains(t, text, "published=")
	if t.Failed() {
		t.Log(text)
	}

	// The chart of a real run is well-formed, one panel per check.
	c := chart{Title: "smoke"}
	for _, r := range results {
		c.Panels = append(c.Panels, r.Panel)
	}
	var svg bytes.Buffer
	require.NoError(t, c.WriteSVG(&svg))
	assert.Equal(t, numChecks, svgDoc(t, svg.Bytes())["g"])
	assert.True(t, strings.HasPrefix(svg.String(), "<?xml"))
}

func TestInterrupted(t *testing.T) {
	cfg := smokeConfig()
	cfg.Checks = []int{1, 3}
	cfg.Steady.Duration = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	results := runChecks(ctx, &cfg, io.Discard)
	assert.Less(t, time.Since(start), 5*time.Second)
	require.Len(t, results, 1, "stops after the interrupted check")
	assert.False(t, results[0].Pass())
}

package main

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// A chart is a column of panels, each a line plot with labelled axes,
// written as a self-contained SVG document.
type chart struct {
	Title  string
	Panels []panel
}

// panel is one plot: backlog (y) over time in seconds (x) by default.
type panel struct {
	Title          string
	XLabel, YLabel string // defaults: "time (s)", "backlog (messages)"
	Series         []series
	Bands          []band  // shaded x ranges, such as a fault window
	HLines         []hline // horizontal reference lines, such as a bound
	VLines         []vline // vertical markers, such as a recovery time
}

type series struct {
	Name   string
	Color  string
	Dashed bool
	Points []point
}

type point struct{ X, Y float64 }

type band struct {
	X0, X1       float64
	Label, Color string
}

type hline struct {
	Y            float64
	Label, Color string
}

type vline struct {
	X            float64
	Label, Color string
}

// Colours of the checks' charts.
const (
	colorMain  = "#1f77b4"
	colorGood  = "#2ca02c"
	colorBad   = "#d62728"
	colorModel = "#7f7f7f"
)

// Layout, in SVG user units (pixels).
const (
	svgWidth    = 960
	headerH     = 44
	panelH      = 300
	plotLeft    = 84
	plotRight   = 24
	plotTop     = 48
	plotBottom  = 56
	maxYOnScale = 2.5 // a reference line more than this × the data's top is noted, not drawn
)

// WriteSVG writes the chart to w.
func (c *chart) WriteSVG(w io.Writer) error {
	bw := bufio.NewWriter(w)
	height := headerH + len(c.Panels)*panelH
	fmt.Fprintf(bw, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(bw, `<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", svgWidth, height)
	fmt.Fprintf(bw, `<text x="%d" y="28" font-size="18" font-weight="bold">%s</text>`+"\n", plotLeft, esc(c.Title))
	for i := range c.Panels {
		c.Panels[i].render(bw, float64(headerH+i*panelH))
	}
	fmt.Fprintf(bw, "</svg>\n")
	return bw.Flush()
}

// render draws the panel with its top edge at top.
func (p *panel) render(w io.Writer, top float64) {
	xl, xr := float64(plotLeft), float64(svgWidth-plotRight)
	yt, yb := top+plotTop, top+panelH-plotBottom

	// Ranges: x from 0 to the last point, marker or band; y from 0 to a
	// round number above the data's top, and above the reference lines
	// that are not far higher.
	var xMax, dataTop float64
	for _, s := range p.Series {
		for _, pt := range s.Points {
			xMax = math.Max(xMax, pt.X)
			dataTop = math.Max(dataTop, pt.Y)
		}
	}
	for _, b := range p.Bands {
		xMax = math.Max(xMax, b.X1)
	}
	for _, v := range p.VLines {
		xMax = math.Max(xMax, v.X)
	}
	yMax := math.Max(dataTop, 5)
	var offScale []string
	for _, h := range p.HLines {
		if h.Y <= maxYOnScale*math.Max(dataTop, 2) {
			yMax = math.Max(yMax, h.Y)
		} else {
			offScale = append(offScale, h.Label)
		}
	}
	if xMax <= 0 {
		xMax = 1
	}
	xStep, yStep := niceStep(xMax/8), niceStep(yMax/5)
	yMax = math.Ceil(yMax*1.05/yStep-1e-9) * yStep
	sx := func(x float64) float64 { return xl + (xr-xl)*x/xMax }
	sy := func(y float64) float64 { return yb - (yb-yt)*y/yMax }

	fmt.Fprintf(w, "<g>\n")
	fmt.Fprintf(w, `<text x="%d" y="%.1f" font-size="14" font-weight="bold">%s</text>`+"\n", plotLeft, top+22, esc(p.Title))
	for _, b := range p.Bands {
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.12"/>`+"\n",
			sx(b.X0), yt, math.Max(sx(b.X1)-sx(b.X0), 0), yb-yt, b.Color)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" fill="%s">%s</text>`+"\n", sx(b.X0)+4, yt+14, b.Color, esc(b.Label))
	}
	// Grid, ticks and tick labels.
	for y := 0.0; y <= yMax+yStep/2; y += yStep {
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", xl, sy(y), xr, sy(y))
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", xl-6, sy(y)+4, tickLabel(y, yStep))
	}
	for x := 0.0; x <= xMax*(1+1e-9); x += xStep {
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333333"/>`+"\n", sx(x), yb, sx(x), yb+5)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", sx(x), yb+18, tickLabel(x, xStep))
	}
	fmt.Fprintf(w, `<polyline points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="none" stroke="#333333"/>`+"\n", xl, yt, xl, yb, xr, yb)
	xLabel, yLabel := p.XLabel, p.YLabel
	if xLabel == "" {
		xLabel = "time (s)"
	}
	if yLabel == "" {
		yLabel = "backlog (messages)"
	}
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", (xl+xr)/2, yb+40, esc(xLabel))
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
		xl-56, (yt+yb)/2, xl-56, (yt+yb)/2, esc(yLabel))

	for _, h := range p.HLines {
		if h.Y > yMax {
			continue
		}
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/>`+"\n", xl, sy(h.Y), xr, sy(h.Y), h.Color)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end" fill="%s">%s</text>`+"\n", xr-4, sy(h.Y)-4, h.Color, esc(h.Label))
	}
	for _, v := range p.VLines {
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="4 3"/>`+"\n", sx(v.X), yt, sx(v.X), yb, v.Color)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" fill="%s">%s</text>`+"\n", sx(v.X)+4, yt+28, v.Color, esc(v.Label))
	}
	for _, s := range p.Series {
		if len(s.Points) == 0 {
			continue
		}
		var pts strings.Builder
		for i, pt := range s.Points {
			if i > 0 {
				pts.WriteByte(' ')
			}
			fmt.Fprintf(&pts, "%.1f,%.1f", sx(pt.X), sy(math.Min(pt.Y, yMax)))
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="8 5"`
		}
		fmt.Fprintf(w, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"%s/>`+"\n", pts.String(), s.Color, dash)
	}
	// Legend in the plot's top left corner (where backlogs start low),
	// then notes about reference lines off the scale.
	var rows []string
	var colors []string
	var dashed []bool
	for _, s := range p.Series {
		rows, colors, dashed = append(rows, s.Name), append(colors, s.Color), append(dashed, s.Dashed)
	}
	if len(offScale) > 0 {
		rows, colors, dashed = append(rows, strings.Join(offScale, "; ")+" (above the scale)"), append(colors, ""), append(dashed, false)
	}
	if len(rows) > 0 {
		width := 0
		for _, r := range rows {
			width = max(width, len([]rune(r)))
		}
		lx, ly := xl+8, yt+6
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="#ffffff" fill-opacity="0.85" stroke="#cccccc"/>`+"\n",
			lx, ly, 40+6.6*float64(width), 16*len(rows)+6)
		for i, r := range rows {
			y := ly + 16*float64(i+1)
			if colors[i] != "" {
				dash := ""
				if dashed[i] {
					dash = ` stroke-dasharray="5 3"`
				}
				fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.5"%s/>`+"\n", lx+6, y-4, lx+28, y-4, colors[i], dash)
			}
			fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+34, y, esc(r))
		}
	}
	fmt.Fprintf(w, "</g>\n")
}

// niceStep returns 1, 2 or 5 times a power of ten, at least raw.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw*(1-1e-9) {
			return m * mag
		}
	}
	return 10 * mag
}

// tickLabel formats v with as many decimals as step needs.
func tickLabel(v, step float64) string {
	decimals := 0
	if step < 1 {
		decimals = int(math.Ceil(-math.Log10(step) - 1e-9))
	}
	return strconv.FormatFloat(v, 'f', decimals, 64)
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

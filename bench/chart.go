package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Point is one measurement on a chart: X (subscribers or topics) and Y
// (deliveries per second); a failed cell has Y <= 0 and is left out.
type Point struct {
	X, Y float64
	Err  string // why the cell failed (Y is then 0)
}

// Series is one implementation's line.
type Series struct {
	Name   string
	Points []Point
}

// Panel is one of the chart's panels.
type Panel struct {
	Title  string
	XLabel string
	Series []Series
}

var seriesColors = map[string]string{
	"floor":          "#888888",
	"naive":          "#9467bd",
	"broker":         "#d62728",
	"broker-nodedup": "#ff9896",
	"watermill":      "#2ca02c",
	"nats":           "#1f77b4",
	"jetstream":      "#ff7f0e",
}

var fallbackColors = []string{"#8c564b", "#e377c2", "#17becf", "#bcbd22"}

// WriteChart writes panels side by side as a standalone SVG: log-scale x
// (ticks at the measured x values), log-scale y in deliveries per second,
// one line per series and a shared legend.
func WriteChart(w io.Writer, title string, panels []Panel) error {
	const (
		pw, ph                  = 460.0, 340.0 // panel size
		ml, mr, mt, mb          = 70.0, 20.0, 40.0, 50.0
		legendH                 = 40.0
		titleH                  = 30.0
		fontFamily              = "Helvetica, Arial, sans-serif"
		axisColor, gridColor    = "#333333", "#e5e5e5"
		plotW, plotH            = pw - ml - mr, ph - mt - mb
		strokeWidth, markRadius = 2.0, 3.0
		legendSwatch            = 24.0
	)
	width := pw * float64(len(panels))
	height := titleH + ph + legendH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="%s" font-size="12">`+"\n",
		width, height, width, height, fontFamily)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", width/2, html.EscapeString(title))

	color := func(name string, i int) string {
		if c, ok := seriesColors[name]; ok {
			return c
		}
		return fallbackColors[i%len(fallbackColors)]
	}
	var names []string
	for pi, p := range panels {
		x0, y0 := float64(pi)*pw+ml, titleH+mt // plot area's top left
		// ranges
		xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
		var xs []float64
		for _, s := range p.Series {
			if !containsStr(names, s.Name) {
				names = append(names, s.Name)
			}
			for _, pt := range s.Points {
				if pt.X <= 0 {
					continue
				}
				xmin, xmax = math.Min(xmin, pt.X), math.Max(xmax, pt.X)
				if !containsFloat(xs, pt.X) {
					xs = append(xs, pt.X)
				}
				if pt.Y > 0 {
					ymin, ymax = math.Min(ymin, pt.Y), math.Max(ymax, pt.Y)
				}
			}
		}
		if math.IsInf(xmin, 0) || xmin == xmax {
			xmin, xmax = 1, 10
		}
		if math.IsInf(ymin, 0) {
			ymin, ymax = 1e3, 1e6
		}
		lymin, lymax := math.Floor(math.Log10(ymin)), math.Ceil(math.Log10(ymax))
		if lymin == lymax {
			lymax++
		}
		lxmin, lxmax := math.Log10(xmin), math.Log10(xmax)
		pad := (lxmax - lxmin) * 0.04
		lxmin, lxmax = lxmin-pad, lxmax+pad
		px := func(x float64) float64 { return x0 + (math.Log10(x)-lxmin)/(lxmax-lxmin)*plotW }
		py := func(y float64) float64 { return y0 + plotH - (math.Log10(y)-lymin)/(lymax-lymin)*plotH }

		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="13" font-weight="bold">%s</text>`+"\n",
			x0+plotW/2, y0-12, html.EscapeString(p.Title))
		// y grid: decades, labelled, with 2 and 5 as light lines
		for d := lymin; d <= lymax; d++ {
			y := py(math.Pow(10, d))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x0, y, x0+plotW, y, gridColor)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", x0-6, y, siLabel(math.Pow(10, d)))
			if d < lymax {
				for _, m := range []float64{2, 5} {
					y := py(m * math.Pow(10, d))
					fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="2,3"/>`+"\n", x0, y, x0+plotW, y, gridColor)
				}
			}
		}
		// x ticks at the measured values
		for _, x := range xs {
			X := px(x)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", X, y0, X, y0+plotH, gridColor)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", X, y0+plotH+16, x)
		}
		// axes
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="%s"/>`+"\n", x0, y0, plotW, plotH, axisColor)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s (log scale)</text>`+"\n", x0+plotW/2, y0+plotH+36, html.EscapeString(p.XLabel))
		fmt.Fprintf(&b, `<text transform="translate(%.1f,%.1f) rotate(-90)" text-anchor="middle">deliveries / s (log scale)</text>`+"\n", x0-52, y0+plotH/2)
		// lines
		for _, s := range p.Series {
			c := color(s.Name, indexStr(names, s.Name))
			dash := ""
			if s.Name == "floor" {
				dash = ` stroke-dasharray="6,4"`
			}
			var path []string
			flush := func() {
				if len(path) > 1 {
					fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f"%s/>`+"\n", strings.Join(path, " "), c, strokeWidth, dash)
				}
				path = path[:0]
			}
			for _, pt := range s.Points {
				if pt.X <= 0 || pt.Y <= 0 {
					flush() // a failed cell breaks the line
					continue
				}
				path = append(path, fmt.Sprintf("%.1f,%.1f", px(pt.X), py(pt.Y)))
			}
			flush()
			for _, pt := range s.Points {
				if pt.X > 0 && pt.Y > 0 {
					fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"><title>%s: %g → %s/s</title></circle>`+"\n",
						px(pt.X), py(pt.Y), markRadius, c, html.EscapeString(s.Name), pt.X, siLabel(pt.Y))
				}
			}
		}
	}
	// legend
	ly := titleH + ph + legendH/2
	itemW := func(name string) float64 { return legendSwatch + 6 + 7*float64(len(name)) + 24 }
	total := 0.0
	for _, name := range names {
		total += itemW(name)
	}
	x := (width - total) / 2
	for i, name := range names {
		if i > 0 {
			x += itemW(names[i-1])
		}
		dash := ""
		if name == "floor" {
			dash = ` stroke-dasharray="6,4"`
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`+"\n", x, ly, x+legendSwatch, ly, color(name, i), dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`+"\n", x+legendSwatch+6, ly, html.EscapeString(name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// siLabel formats v with a k/M/G suffix.
func siLabel(v float64) string {
	switch {
	case v >= 1e9:
		return trimZero(v/1e9) + "G"
	case v >= 1e6:
		return trimZero(v/1e6) + "M"
	case v >= 1e3:
		return trimZero(v/1e3) + "k"
	}
	return trimZero(v)
}

func trimZero(v float64) string {
	if v >= 100 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

func containsStr(s []string, v string) bool { return indexStr(s, v) >= 0 }

func indexStr(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func containsFloat(s []float64, v float64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

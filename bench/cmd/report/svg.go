package main

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// The charts are plain SVG written by hand: no dependency, readable diffs,
// and they render on any code host.

var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#9c755f"}

// bar is one bar of a group: a median with its confidence interval.
type bar struct {
	series string
	s      summary
}

// barGroup is one implementation: its bars (serial, parallel).
type barGroup struct {
	label     string
	highlight bool
	bars      []bar
}

// barChart draws horizontal grouped bars with confidence whiskers.
func barChart(title, unit string, series []string, groups []barGroup) string {
	const (
		width   = 760
		left    = 150
		right   = 90
		top     = 46
		barH    = 14
		gap     = 12
		legendH = 24
	)
	groupH := len(series)*barH + gap
	height := top + len(groups)*groupH + legendH + 30
	maxV := 0.0
	for _, g := range groups {
		for _, b := range g.bars {
			if b.s.ok {
				maxV = math.Max(maxV, math.Max(b.s.center, finite(b.s.hi, b.s.center)))
			}
		}
	}
	if maxV == 0 {
		maxV = 1
	}
	maxV = niceCeil(maxV)
	plotW := float64(width - left - right)
	x := func(v float64) float64 { return float64(left) + v/maxV*plotW }

	var w strings.Builder
	fmt.Fprintf(&w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&w, `<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(title))
	// Grid.
	axisY := top + len(groups)*groupH
	for i := 0; i <= 5; i++ {
		v := maxV * float64(i) / 5
		fmt.Fprintf(&w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(v), top-6, x(v), axisY)
		fmt.Fprintf(&w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x(v), axisY+14, fmtNum(v))
	}
	fmt.Fprintf(&w, `<text x="%d" y="%d" text-anchor="end" fill="#555">%s</text>`+"\n", width-right+60, axisY+14, esc(unit))
	for gi, g := range groups {
		y0 := top + gi*groupH
		weight := "normal"
		if g.highlight {
			weight = "bold"
		}
		fmt.Fprintf(&w, `<text x="%d" y="%d" text-anchor="end" font-weight="%s">%s</text>`+"\n",
			left-8, y0+len(series)*barH/2+4, weight, esc(g.label))
		for bi, b := range g.bars {
			if !b.s.ok {
				continue
			}
			y := y0 + bi*barH
			color := palette[bi%len(palette)]
			fmt.Fprintf(&w, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s %s</title></rect>`+"\n",
				left, y+1, x(b.s.center)-float64(left), barH-2, color, esc(g.label), esc(b.series), fmtNum(b.s.center), esc(unit))
			if lo, hi := finite(b.s.lo, b.s.center), finite(b.s.hi, b.s.center); hi > lo {
				cy := float64(y) + barH/2
				fmt.Fprintf(&w, `<path d="M%.1f %.1fH%.1fM%.1f %.1fV%.1fM%.1f %.1fV%.1f" stroke="#222" fill="none"/>`+"\n",
					x(lo), cy, x(hi), x(lo), cy-4, cy+4, x(hi), cy-4, cy+4)
			}
			fmt.Fprintf(&w, `<text x="%.1f" y="%d" fill="#222">%s</text>`+"\n", x(finite(b.s.hi, b.s.center))+6, y+barH-3, fmtNum(b.s.center))
		}
	}
	// Legend.
	ly := axisY + 34
	lx := left
	for i, s := range series {
		fmt.Fprintf(&w, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, ly-10, palette[i%len(palette)], lx+16, ly, esc(s))
		lx += 16 + 8*len(s) + 24
	}
	fmt.Fprintf(&w, `<text x="%d" y="%d" fill="#555">bars: median; whiskers: 95%% confidence interval</text>`+"\n", lx+10, ly)
	w.WriteString("</svg>\n")
	return w.String()
}

// line is one series of a line chart; NaN values leave a gap.
type line struct {
	label string
	ys    []float64
	color string
	width float64
}

// hline is a labelled horizontal reference line.
type hline struct {
	y     float64
	label string
}

// logLineChart draws series over x in [0, xMax] with a logarithmic y axis
// spanning the decades [yMin, yMax].
func logLineChart(title, xUnit, yUnit string, xMax, yMin, yMax float64, lines []line, refs []hline) string {
	const (
		width  = 760
		height = 360
		left   = 70
		right  = 20
		top    = 40
		bottom = 70
	)
	plotW := float64(width - left - right)
	plotH := float64(height - top - bottom)
	ly0, ly1 := math.Log10(yMin), math.Log10(yMax)
	xp := func(i, n int) float64 { return float64(left) + (float64(i)+0.5)/float64(n)*plotW }
	yp := func(v float64) float64 {
		v = math.Min(math.Max(v, yMin), yMax)
		return float64(top) + (ly1-math.Log10(v))/(ly1-ly0)*plotH
	}

	var w strings.Builder
	fmt.Fprintf(&w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&w, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(title))
	for d := ly0; d <= ly1+1e-9; d++ {
		v := math.Pow(10, d)
		fmt.Fprintf(&w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, yp(v), width-right, yp(v))
		fmt.Fprintf(&w, `<text x="%d" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", left-6, yp(v)+4, fmtDuration(v))
	}
	for i := 0; i <= 6; i++ {
		xv := xMax * float64(i) / 6
		px := float64(left) + float64(i)/6*plotW
		fmt.Fprintf(&w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", px, top, px, height-bottom)
		fmt.Fprintf(&w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", px, height-bottom+16, fmtNum(xv))
	}
	fmt.Fprintf(&w, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", float64(left)+plotW/2, height-bottom+32, esc(xUnit))
	fmt.Fprintf(&w, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle" fill="#555">%s</text>`+"\n", float64(top)+plotH/2, esc(yUnit))
	for _, r := range refs {
		fmt.Fprintf(&w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#c00" stroke-dasharray="5 4"/>`+"\n", left, yp(r.y), width-right, yp(r.y))
		fmt.Fprintf(&w, `<text x="%d" y="%.1f" text-anchor="end" fill="#c00">%s</text>`+"\n", width-right-4, yp(r.y)-4, esc(r.label))
	}
	for _, l := range lines {
		var d strings.Builder
		pen := false
		for i, v := range l.ys {
			if math.IsNaN(v) {
				pen = false
				continue
			}
			cmd := "L"
			if !pen {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f", cmd, xp(i, len(l.ys)), yp(v))
			pen = true
		}
		fmt.Fprintf(&w, `<path d="%s" stroke="%s" stroke-width="%.1f" fill="none" stroke-linejoin="round"/>`+"\n", d.String(), l.color, l.width)
	}
	lx := left
	for _, l := range lines {
		fmt.Fprintf(&w, `<rect x="%d" y="%d" width="14" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, height-18, l.color, lx+18, height-12, esc(l.label))
		lx += 18 + 7*len(l.label) + 24
	}
	w.WriteString("</svg>\n")
	return w.String()
}

// fmtDuration prints a value in µs as µs, ms or s.
func fmtDuration(us float64) string {
	switch {
	case us >= 1e6:
		return fmtNum(us/1e6) + " s"
	case us >= 1e3:
		return fmtNum(us/1e3) + " ms"
	default:
		return fmtNum(us) + " µs"
	}
}

func finite(v, fallback float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return fallback
	}
	return v
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func esc(s string) string { return html.EscapeString(s) }

package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The storm chart: one run of part f, time across, in two panels that
// share the time axis. Above, the calls the downstream serves at once for
// each configuration, the adaptive bound (Stats.LoadLimit) and the
// downstream's capacity; below, the loads waiting for a slot
// (Stats.QueuedLoads), which is what the bound trades the failures for.

// The storm chart's layout, in pixels.
const (
	stWidth  = 760
	stLeft   = 64
	stRight  = 24
	stTop    = 74
	stPanelH = 200 // the calls panel
	stQueueH = 110 // the queue panel
	stGap    = 40  // between the panels: the time labels of the first
)

// stSeries is one line of a panel: points (time, value), drawn as steps
// (each value holds until the next sample) or straight.
type stSeries struct {
	label string
	color string
	width float64
	dash  string // an SVG stroke-dasharray, or ""
	pts   [][2]float64
}

// stPanel is one panel: its place, its scale and its lines.
type stPanel struct {
	y0, h  float64 // top and height, in pixels
	yMax   float64
	yLabel string
	lines  []stSeries
	refs   []hline // labelled horizontal lines (a capacity)
}

// stormSVG draws the chart of the median run among runs.
func stormSVG(runs []*stormResult) string {
	run, idx := medianRun(runs)
	var calls, queue []stSeries
	colors := map[string]string{"none": "#e15759", "fixed": "#f28e2b", "adaptive": "#4e79a7"}
	xMax, yMax, qMax := 0.0, float64(run.Capacity), 0.0
	for i := range run.Rows {
		r := &run.Rows[i]
		inFlight, queued, bound := r.series()
		for _, pt := range inFlight {
			xMax, yMax = max(xMax, pt[0]), max(yMax, pt[1])
		}
		for _, pt := range queued {
			qMax = max(qMax, pt[1])
		}
		k := r.kind()
		calls = append(calls, stSeries{label: r.Config + ": calls at once", color: colors[k], width: 1.4, pts: inFlight})
		if k == "adaptive" {
			calls = append(calls, stSeries{label: r.Config + ": its bound", color: "#1f3b5c", width: 2.4, pts: bound})
		}
		if k != "none" {
			queue = append(queue, stSeries{label: r.Config, color: colors[k], width: 1.6, pts: queued})
		}
	}
	cTop, _ := axis(yMax*1.05, 4)
	qTop, _ := axis(qMax, 4)
	panels := []stPanel{
		{y0: stTop, h: stPanelH, yMax: cTop, yLabel: "downstream calls at once", lines: calls,
			refs: []hline{{float64(run.Capacity), fmt.Sprintf("capacity %d: calls past it fail", run.Capacity)}}},
		{y0: stTop + stPanelH + stGap, h: stQueueH, yMax: qTop, yLabel: "loads queued", lines: queue},
	}
	height := stTop + stPanelH + stGap + stQueueH + 96
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", stWidth, height, stWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", stLeft, esc(fmt.Sprintf("A storm of %s cold keys: the adaptive bound and the calls at once", fmtNum(float64(run.Keys)))))
	which, down := stormCaption(run, idx, len(runs))
	fmt.Fprintf(&b, `<text x="%d" y="40" fill="#555">%s</text>`+"\n", stLeft, esc(which))
	fmt.Fprintf(&b, `<text x="%d" y="56" fill="#555">%s</text>`+"\n", stLeft, esc(down))
	xTop, xStep := axis(xMax, 8)
	for i, p := range panels {
		p.draw(&b, xTop, xStep, i == len(panels)-1)
	}
	stLegend(&b, append(calls, stSeries{label: "capacity", color: "#c00", width: 1, dash: "5 4"}), float64(height-40))
	b.WriteString("</svg>\n")
	return b.String()
}

// series is the row's trace as three lines over time in milliseconds: the
// calls in flight at the downstream, the loads queued, and the bound
// (absent without a limit).
func (r *stormRow) series() (inFlight, queued, bound [][2]float64) {
	for _, pt := range r.Trace {
		at := float64(pt.At) / float64(time.Millisecond)
		inFlight = append(inFlight, [2]float64{at, float64(pt.InFlight)})
		queued = append(queued, [2]float64{at, float64(pt.Queued)})
		if pt.Bound > 0 {
			bound = append(bound, [2]float64{at, float64(pt.Bound)})
		}
	}
	return inFlight, queued, bound
}

// stormCaption is the two lines under the title: which run, and the
// downstream.
func stormCaption(run *stormResult, idx, n int) (which, down string) {
	which = "examples/burst part f, one run"
	if n > 1 {
		which = fmt.Sprintf("examples/burst part f, run %d of %d (%s), the median by the adaptive storm's wall time", idx+1, n, run.name)
	}
	return which, fmt.Sprintf("%s keys at once; a downstream call takes %v × (1 + n/%d)² with n in flight, and fails past %d at once",
		fmtNum(float64(run.Keys)), run.Base, run.Knee, run.Capacity)
}

// draw draws p: its grid, its lines and its references; the time axis's
// labels under it, and its title when last.
func (p stPanel) draw(b *strings.Builder, xMax, xStep float64, last bool) {
	plotW := float64(stWidth - stLeft - stRight)
	x := func(v float64) float64 { return stLeft + v/xMax*plotW }
	y := func(v float64) float64 { return p.y0 + p.h - math.Min(v, p.yMax)/p.yMax*p.h }
	for i := 0; i <= 4; i++ {
		v := p.yMax * float64(i) / 4
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", stLeft, y(v), stWidth-stRight, y(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", stLeft-6, y(v)+4, fmtNum(v))
	}
	for v := 0.0; v <= xMax*(1+1e-9); v += xStep {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x(v), p.y0, x(v), p.y0+p.h)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", x(v), p.y0+p.h+15, fmtNum(v))
	}
	if last {
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">time since the storm began (ms)</text>`+"\n", stLeft+plotW/2, p.y0+p.h+31)
	}
	fmt.Fprintf(b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle" fill="#555">%s</text>`+"\n", p.y0+p.h/2, esc(p.yLabel))
	for _, r := range p.refs {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#c00" stroke-dasharray="5 4"/>`+"\n", stLeft, y(r.y), stWidth-stRight, y(r.y))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" fill="#c00">%s</text>`+"\n", stWidth-stRight-4, y(r.y)-4, esc(r.label))
	}
	for _, l := range p.lines {
		if len(l.pts) == 0 {
			continue
		}
		var d strings.Builder
		for i, pt := range l.pts {
			if i == 0 {
				fmt.Fprintf(&d, "M%.1f %.1f", x(pt[0]), y(pt[1]))
				continue
			}
			fmt.Fprintf(&d, "H%.1fV%.1f", x(pt[0]), y(pt[1])) // a sample holds until the next
		}
		dash := ""
		if l.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, l.dash)
		}
		fmt.Fprintf(b, `<path d="%s" stroke="%s" stroke-width="%.1f" fill="none"%s><title>%s</title></path>`+"\n",
			d.String(), l.color, l.width, dash, esc(l.label))
	}
}

// stLegend draws one entry per line, wrapping, from y down.
func stLegend(b *strings.Builder, lines []stSeries, y float64) {
	x := float64(stLeft)
	for _, l := range lines {
		w := 18 + 6.6*float64(len([]rune(l.label))) + 22
		if x+w > stWidth-stRight {
			x, y = stLeft, y+18
		}
		dash := ""
		if l.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, l.dash)
		}
		fmt.Fprintf(b, `<path d="M%.1f %.1fh14" stroke="%s" stroke-width="%.1f"%s/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			x, y-4, l.color, max(l.width, 1.5), dash, x+18, y, esc(l.label))
		x += w
	}
}

// axis is the top of an axis that shows v in n steps, and the step: v
// rounded up so that a step is 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a
// power of ten.
func axis(v float64, n int) (top, step float64) {
	if v <= 0 {
		return float64(n), 1
	}
	q := v / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(q)))
	step = 10 * p
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8} {
		if q <= m*p*(1+1e-9) {
			step = m * p
			break
		}
	}
	return step * float64(n), step
}

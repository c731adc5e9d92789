package main

import (
	"fmt"
	"strings"
	"time"
)

// The waterfall's colours: a request (any span of the application), a
// Get's wait, a load that succeeded or failed, and a span under a load
// (the LoadFunc's own calls).
const (
	colRequest = "#4e79a7"
	colWait    = "#f28e2b"
	colLoadOK  = "#59a14f"
	colLoadErr = "#e15759"
	colInner   = "#b07aa1"
)

// color is the fill of s's bar; inLoad says whether s is under a load.
func color(s *span, inLoad bool) string {
	switch {
	case s.Name == "flightcache.get":
		return colWait
	case s.Name == "flightcache.load" && s.failed():
		return colLoadErr
	case s.Name == "flightcache.load":
		return colLoadOK
	case inLoad:
		return colInner
	}
	return colRequest
}

// svg draws the waterfall: one row per span, time across, and a dashed
// arc from every wait that links to the load to the load's row.
func (w *waterfall) svg() string {
	const (
		width  = 960
		left   = 300
		right  = 80
		top    = 64
		rowH   = 20
		barH   = 12
		labelN = 36 // characters of a span's name before it is cut
	)
	height := top + len(w.rows)*rowH + 56
	total := max(w.end.Sub(w.start), time.Microsecond)
	plotW := float64(width - left - right)
	x := func(t time.Time) float64 { return float64(left) + float64(t.Sub(w.start))/float64(total)*plotW }
	y := func(i int) float64 { return float64(top + i*rowH) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	title, sub := w.captions()
	fmt.Fprintf(&b, `<text x="16" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc(title))
	fmt.Fprintf(&b, `<text x="16" y="40" fill="#555">%s</text>`+"\n", esc(sub))

	// Time grid, in milliseconds from the first span's start.
	ms := float64(total) / float64(time.Millisecond)
	step := niceCeil(ms / 6)
	for v := 0.0; v <= ms+1e-9; v += step {
		px := float64(left) + v/ms*plotW
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", px, top-8, px, y(len(w.rows)))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s ms</text>`+"\n", px, y(len(w.rows))+14, fmtNum(v))
	}

	loadRow := -1
	for i, r := range w.rows {
		if r.s == w.load {
			loadRow = i
		}
		s := r.s
		cy := y(i) + rowH/2
		name := s.Name
		if len(name) > labelN {
			name = name[:labelN-1] + "…"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#222">%s</text>`+"\n", 16+14*r.depth, cy+4, esc(name))
		x0, x1 := x(s.StartTime), x(s.EndTime)
		stroke := ""
		if s.failed() {
			stroke = ` stroke="#a00" stroke-width="1.5"`
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" rx="2" fill="%s"%s><title>%s</title></rect>`+"\n",
			x0, cy-barH/2, max(x1-x0, 1.5), barH, color(s, r.inLoad), stroke, esc(tooltip(s)))
		for _, ev := range s.Events { // a retry, a breaker refusal: a tick on the bar
			ex := x(ev.Time)
			fmt.Fprintf(&b, `<path d="M%.1f %.1fv%d" stroke="white" stroke-width="2.5"><title>%s</title></path>`+"\n",
				ex, cy-barH/2, barH, esc(ev.Name))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555">%s</text>`+"\n", max(x1, x0+1.5)+5, cy+4, fmtMs(s.EndTime.Sub(s.StartTime)))
	}

	// An arc in the gutter left of the bars from every wait that links to
	// the load to the load's row, wider the farther apart the rows are, so
	// that they nest rather than cross.
	if loadRow >= 0 {
		gx := float64(left - 6)
		ly := y(loadRow) + rowH/2
		far := 1
		for i := range w.rows {
			far = max(far, abs(i-loadRow))
		}
		for i, r := range w.rows {
			if !linksTo(r.s, w.load) {
				continue
			}
			gy := y(i) + rowH/2
			d := 8 + 36*float64(abs(i-loadRow))/float64(far)
			fmt.Fprintf(&b, `<path d="M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f" stroke="#888" stroke-dasharray="3 3" fill="none"/>`+"\n",
				gx, gy, gx-d, gy, gx-d, ly, gx, ly)
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="#888"/>`+"\n", gx, gy)
		}
	}

	// Legend.
	ly := y(len(w.rows)) + 38
	lx := 16.0
	for _, item := range []struct{ color, label string }{
		{colRequest, "request"}, {colWait, "flightcache.get: a Get's wait"}, {colLoadErr, "flightcache.load, failed"},
		{colLoadOK, "ok"}, {colInner, "inside the load"},
	} {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			lx, ly-10, item.color, lx+16, ly, esc(item.label))
		lx += 16 + 6.5*float64(len(item.label)) + 22
	}
	fmt.Fprintf(&b, `<path d="M%.1f %.1f h24" stroke="#888" stroke-dasharray="3 3"/><text x="%.1f" y="%.1f">link</text>`+"\n", lx, ly-4, lx+28, ly)
	lx += 62
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/><path d="M%.1f %.1fv12" stroke="white" stroke-width="2.5"/><text x="%.1f" y="%.1f">event</text>`+"\n",
		lx, ly-10, colLoadErr, lx+6, ly-10, lx+16, ly)
	b.WriteString("</svg>\n")
	return b.String()
}

// captions are the picture's title and the line under it.
func (w *waterfall) captions() (title, sub string) {
	if w.load == nil {
		return "Spans", fmt.Sprintf("%d spans over %s; no flightcache.get span links to a flightcache.load span", len(w.rows), fmtMs(w.end.Sub(w.start)))
	}
	outcome := w.load.attr("flightcache.load.outcome")
	if outcome == "" {
		outcome = "ended"
	}
	title = fmt.Sprintf("One load, %d waiting Gets", w.waits)
	sub = fmt.Sprintf("flightcache.load: %s after %s, callers %s; %d flightcache.get spans link to it",
		outcome, fmtMs(w.load.EndTime.Sub(w.load.StartTime)), orDash(w.load.attr("flightcache.load.callers")), w.waits)
	if w.requests < w.allReqs {
		sub += fmt.Sprintf(" (%d of their %d requests drawn)", w.requests, w.allReqs)
	}
	return title, sub
}

func abs(n int) int { return max(n, -n) }

// linksTo reports whether s links to t.
func linksTo(s, t *span) bool {
	for _, l := range s.Links {
		if l.SpanContext.id() == t.SpanContext.id() {
			return true
		}
	}
	return false
}

// tooltip is a bar's title: the span's name, duration, status and
// attributes.
func tooltip(s *span) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", s.Name, fmtMs(s.EndTime.Sub(s.StartTime)))
	if s.Status.Code != "" && s.Status.Code != "Unset" {
		fmt.Fprintf(&b, ", %s", s.Status.Code)
	}
	for _, a := range s.Attributes {
		fmt.Fprintf(&b, "\n%s=%v", a.Key, a.Value.Value)
	}
	return b.String()
}

// fmtMs prints d in milliseconds.
func fmtMs(d time.Duration) string {
	return fmtNum(float64(d)/float64(time.Millisecond)) + " ms"
}

package main

import (
	"fmt"
	"slices"
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

// The waterfall's layout, in pixels.
const (
	wfWidth  = 960
	wfLeft   = 300 // the plot's left edge: labels and the arcs' gutter before it
	wfRight  = 80
	wfTop    = 64
	wfRowH   = 20
	wfBarH   = 12
	wfLabelN = 36 // characters of a span's name before it is cut
)

// x is where t falls on the time axis.
func (w *waterfall) x(t time.Time) float64 {
	total := max(w.end.Sub(w.start), time.Microsecond)
	return wfLeft + float64(t.Sub(w.start))/float64(total)*(wfWidth-wfLeft-wfRight)
}

// y is the middle of row i.
func (w *waterfall) y(i int) float64 { return float64(wfTop+i*wfRowH) + wfRowH/2 }

// svg draws the waterfall: one row per span, time across, and a dashed
// arc from every wait that links to the load to the load's row.
func (w *waterfall) svg() string {
	height := wfTop + len(w.rows)*wfRowH + 56
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", wfWidth, height, wfWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	title, sub := w.captions()
	fmt.Fprintf(&b, `<text x="16" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", esc(title))
	fmt.Fprintf(&b, `<text x="16" y="40" fill="#555">%s</text>`+"\n", esc(sub))
	w.grid(&b)
	for i, r := range w.rows {
		w.bar(&b, i, r)
	}
	w.arcs(&b)
	w.legend(&b, w.y(len(w.rows))+28)
	b.WriteString("</svg>\n")
	return b.String()
}

// grid draws the time axis, in milliseconds from the first span's start.
func (w *waterfall) grid(b *strings.Builder) {
	ms := float64(max(w.end.Sub(w.start), time.Microsecond)) / float64(time.Millisecond)
	bottom := float64(wfTop + len(w.rows)*wfRowH)
	for v := 0.0; v <= ms+1e-9; v += niceCeil(ms / 6) {
		px := w.x(w.start.Add(time.Duration(v * float64(time.Millisecond))))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", px, wfTop-8, px, bottom)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s ms</text>`+"\n", px, bottom+14, fmtNum(v))
	}
}

// bar draws row i: its label, its bar with a tick per event (a retry, a
// breaker refusal), and its duration.
func (w *waterfall) bar(b *strings.Builder, i int, r row) {
	s, cy := r.s, w.y(i)
	name := s.Name
	if len(name) > wfLabelN {
		name = name[:wfLabelN-1] + "…"
	}
	fmt.Fprintf(b, `<text x="%d" y="%.1f" fill="#222">%s</text>`+"\n", 16+14*r.depth, cy+4, esc(name))
	x0, x1 := w.x(s.StartTime), max(w.x(s.EndTime), w.x(s.StartTime)+1.5)
	stroke := ""
	if s.failed() {
		stroke = ` stroke="#a00" stroke-width="1.5"`
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" rx="2" fill="%s"%s><title>%s</title></rect>`+"\n",
		x0, cy-wfBarH/2, x1-x0, wfBarH, color(s, r.inLoad), stroke, esc(tooltip(s)))
	for _, ev := range s.Events {
		fmt.Fprintf(b, `<path d="M%.1f %.1fv%d" stroke="white" stroke-width="2.5"><title>%s</title></path>`+"\n",
			w.x(ev.Time), cy-wfBarH/2, wfBarH, esc(ev.Name))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" fill="#555">%s</text>`+"\n", x1+5, cy+4, fmtMs(s.EndTime.Sub(s.StartTime)))
}

// arcs draws, in the gutter left of the bars, an arc from every wait that
// links to the load to the load's row, wider the farther apart the rows
// are, so that they nest rather than cross.
func (w *waterfall) arcs(b *strings.Builder) {
	loadRow := slices.IndexFunc(w.rows, func(r row) bool { return r.s == w.load })
	if w.load == nil || loadRow < 0 {
		return
	}
	gx, ly := float64(wfLeft-6), w.y(loadRow)
	far := max(1, loadRow, len(w.rows)-1-loadRow)
	for i, r := range w.rows {
		if !linksTo(r.s, w.load) {
			continue
		}
		gy := w.y(i)
		d := 8 + 36*float64(abs(i-loadRow))/float64(far)
		fmt.Fprintf(b, `<path d="M%.1f %.1f C%.1f %.1f %.1f %.1f %.1f %.1f" stroke="#888" stroke-dasharray="3 3" fill="none"/>`+"\n",
			gx, gy, gx-d, gy, gx-d, ly, gx, ly)
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="2" fill="#888"/>`+"\n", gx, gy)
	}
}

// legend draws the colours, the link and the event tick on one line at y.
func (w *waterfall) legend(b *strings.Builder, y float64) {
	x := 16.0
	for _, item := range []struct{ color, label string }{
		{colRequest, "request"}, {colWait, "flightcache.get: a Get's wait"}, {colLoadErr, "flightcache.load, failed"},
		{colLoadOK, "ok"}, {colInner, "inside the load"},
	} {
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			x, y-10, item.color, x+16, y, esc(item.label))
		x += 16 + 6.5*float64(len(item.label)) + 22
	}
	fmt.Fprintf(b, `<path d="M%.1f %.1f h24" stroke="#888" stroke-dasharray="3 3"/><text x="%.1f" y="%.1f">link</text>`+"\n", x, y-4, x+28, y)
	x += 62
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/><path d="M%.1f %.1fv12" stroke="white" stroke-width="2.5"/><text x="%.1f" y="%.1f">event</text>`+"\n",
		x, y-10, colLoadErr, x+6, y-10, x+16, y)
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

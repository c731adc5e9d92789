package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// spanLine prints one span as the OpenTelemetry stdout exporter does (the
// fields the waterfall reads, and a few it does not).
func spanLine(name, trace, id, parent string, start, end time.Duration, status string, links []string, attrs map[string]any) string {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ref := func(tr, sp string) map[string]any {
		return map[string]any{"TraceID": tr, "SpanID": sp, "TraceFlags": "01", "TraceState": "", "Remote": false}
	}
	if parent == "" {
		parent = "0000000000000000"
	}
	var ls []any
	for _, l := range links {
		tr, sp, _ := strings.Cut(l, "/")
		ls = append(ls, map[string]any{"SpanContext": ref(tr, sp), "Attributes": nil, "DroppedAttributeCount": 0})
	}
	var as []any
	for k, v := range attrs {
		as = append(as, map[string]any{"Key": k, "Value": map[string]any{"Type": "STRING", "Value": v}})
	}
	b, err := json.Marshal(map[string]any{
		"Name": name, "SpanContext": ref(trace, id), "Parent": ref(trace, parent), "SpanKind": 1,
		"StartTime": t0.Add(start), "EndTime": t0.Add(end), "Attributes": as, "Links": ls,
		"Status": map[string]any{"Code": status, "Description": ""}, "ChildSpanCount": 0,
		"Events": events(name, t0.Add(start+time.Millisecond)),
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// events gives a load span one retry event at t.
func events(name string, t time.Time) []any {
	if name != "flightcache.load" {
		return nil
	}
	return []any{map[string]any{"Name": "flightcache.retry", "Attributes": nil, "DroppedAttributeCount": 0, "Time": t}}
}

// blastTrace is n requests, each waiting on one failed load that the
// first started (and whose LoadFunc made a call of its own), plus a span
// of another trace that waits on nothing.
func blastTrace(n int) string {
	var lines []string
	for i := range n {
		tr := fmt.Sprintf("%032x", i+1)
		req := fmt.Sprintf("%016x", 100+i)
		get := fmt.Sprintf("%016x", 200+i)
		start := time.Duration(i) * time.Millisecond
		lines = append(lines, spanLine("flightcache.get", tr, get, req, start, 82*time.Millisecond, "Error",
			[]string{fmt.Sprintf("%032x/%016x", 1, 999)}, map[string]any{"flightcache.get.source": "shared"}))
		lines = append(lines, spanLine("GET /products/{id}", tr, req, "", start, 83*time.Millisecond, "Error", nil, nil))
	}
	lines = append(lines,
		spanLine("pricing GET /prices/{id}", fmt.Sprintf("%032x", 1), fmt.Sprintf("%016x", 998), fmt.Sprintf("%016x", 999),
			time.Millisecond, 81*time.Millisecond, "Error", nil, nil),
		spanLine("flightcache.load", fmt.Sprintf("%032x", 1), fmt.Sprintf("%016x", 999), fmt.Sprintf("%016x", 100),
			0, 81*time.Millisecond, "Error", nil, map[string]any{"flightcache.load.outcome": "error", "flightcache.load.callers": 10}),
		spanLine("GET /healthz", fmt.Sprintf("%032x", 77), fmt.Sprintf("%016x", 777), "", 0, time.Millisecond, "Unset", nil, nil),
	)
	return strings.Join(lines, "\n") + "\n"
}

func TestWaterfallPicksTheLoadAndItsWaiters(t *testing.T) {
	log := "time=2026-12-01T12:00:00Z level=INFO msg=listening url=http://127.0.0.1:8080\n"
	spans, err := readSpans(strings.NewReader(log + blastTrace(10) + log))
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != 23 {
		t.Fatalf("read %d spans; want 23", len(spans))
	}
	w := newWaterfall(spans, 4)
	if w.load == nil || w.load.Name != "flightcache.load" || w.waits != 10 {
		t.Fatalf("load %v with %d waits; want the flightcache.load span with 10", w.load, w.waits)
	}
	if w.requests != 4 || w.allReqs != 10 {
		t.Errorf("%d of %d requests drawn; want 4 of 10", w.requests, w.allReqs)
	}
	var got []string
	for _, r := range w.rows {
		got = append(got, fmt.Sprintf("%s%s", strings.Repeat(".", r.depth), r.s.Name))
	}
	want := []string{
		"GET /products/{id}", ".flightcache.get", ".flightcache.load", "..pricing GET /prices/{id}",
		"GET /products/{id}", ".flightcache.get",
		"GET /products/{id}", ".flightcache.get",
		"GET /products/{id}", ".flightcache.get",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !w.rows[3].inLoad || w.rows[1].inLoad {
		t.Errorf("only the LoadFunc's call is inside the load")
	}
	if !w.start.Equal(w.rows[0].s.StartTime) || w.end.Sub(w.start) != 83*time.Millisecond {
		t.Errorf("time span %v to %v; want 83 ms from the first request", w.start, w.end)
	}

	svg := w.svg()
	for _, want := range []string{
		"One load, 10 waiting Gets",
		"flightcache.load: error after 81 ms, callers 10; 10 flightcache.get spans link to it (4 of their 10 requests drawn)",
		`stroke-dasharray="3 3" fill="none"`,
		`<title>flightcache.retry</title>`,
		colLoadErr, colWait, colRequest, colInner,
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if n := strings.Count(svg, `stroke-dasharray="3 3" fill="none"`); n != 4 {
		t.Errorf("%d link lines; want one per wait drawn, 4", n)
	}
	if strings.Contains(svg, "healthz") {
		t.Errorf("a span that waits on nothing was drawn")
	}
}

// Without a load that waits link to, every span is drawn; pretty-printed
// input reads as well.
func TestWaterfallWithoutLoads(t *testing.T) {
	var pretty strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(spanLine("a", fmt.Sprintf("%032x", 1), "00000000000000aa", "", 0, time.Millisecond, "Unset", nil, nil)+"\n"+
		spanLine("b", fmt.Sprintf("%032x", 1), "00000000000000bb", "00000000000000aa", 0, time.Millisecond, "Unset", nil, nil)), "\n") {
		var v any
		json.Unmarshal([]byte(l), &v)
		b, _ := json.MarshalIndent(v, "", "\t")
		pretty.Write(b)
		pretty.WriteString("\n")
	}
	spans, err := readSpans(strings.NewReader(pretty.String()))
	if err != nil {
		t.Fatal(err)
	}
	w := newWaterfall(spans, 12)
	if w.load != nil || len(w.rows) != 2 || w.rows[1].depth != 1 {
		t.Fatalf("rows %+v, load %v; want a and b under it", w.rows, w.load)
	}
	if !strings.Contains(w.svg(), "no flightcache.get span links to a flightcache.load span") {
		t.Errorf("the SVG does not say there is no load")
	}
	if _, err := readSpans(strings.NewReader("{not json")); err == nil {
		t.Errorf("readSpans of bad JSON: nil error")
	}
}

func TestTraceMainWritesTheSVG(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "spans.jsonl"), filepath.Join(dir, "trace.svg")
	if err := os.WriteFile(in, []byte(blastTrace(3)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := traceMain([]string{"-o", out, in}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil || !strings.HasPrefix(string(b), "<svg") || !strings.Contains(string(b), "One load, 3 waiting Gets") {
		t.Errorf("wrote %.80q, %v; want the waterfall", b, err)
	}
	if err := traceMain([]string{"-o", out}); err == nil {
		t.Errorf("traceMain without a spans file: nil error")
	}
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// The trace subcommand draws one load's blast radius as a waterfall: the
// flightcache.load span that the most flightcache.get spans link to, each
// of those wait spans under the request span it belongs to, and a line
// from every wait to the load it waited on. The spans are read as the
// OpenTelemetry stdout exporter prints them (the httpserver example's
// -trace stdout): one JSON object per span, as lines or pretty-printed,
// among other lines (the server's log) that are skipped.
//
//	go run ./cmd/report trace [-o ../docs/img/trace.svg] [-requests 12] spans.jsonl

// traceMain runs the trace subcommand with args (those after "trace").
func traceMain(args []string) error {
	fs := flag.NewFlagSet("report trace", flag.ContinueOnError)
	out := fs.String("o", "../docs/img/trace.svg", "the SVG to write")
	requests := fs.Int("requests", 12, "at most this many request spans are drawn (the load's starter first)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: report trace [flags] spans.jsonl\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *requests < 1 {
		fs.Usage()
		return errors.New("one spans file and -requests >= 1 are needed")
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	spans, err := readSpans(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	w := newWaterfall(spans, *requests)
	if len(w.rows) == 0 {
		return fmt.Errorf("%s has no spans", fs.Arg(0))
	}
	return os.WriteFile(*out, []byte(w.svg()), 0o644)
}

// spanID names a span: its trace and span IDs, as hex.
type spanID struct{ trace, span string }

// spanRef is how the exporter prints a span context.
type spanRef struct{ TraceID, SpanID string }

func (r spanRef) id() spanID { return spanID{r.TraceID, r.SpanID} }

// valid reports whether r names a span (a root's parent is all zeros).
func (r spanRef) valid() bool { return strings.Trim(r.SpanID, "0") != "" }

// span is the part of an exported span the waterfall draws.
type span struct {
	Name        string
	SpanContext spanRef
	Parent      spanRef
	StartTime   time.Time
	EndTime     time.Time
	Status      struct{ Code string }
	Links       []struct{ SpanContext spanRef }
	Events      []struct {
		Name string
		Time time.Time
	}
	Attributes []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s *span) failed() bool { return s.Status.Code == "Error" }

// attr returns the value of the attribute key as text, or "".
func (s *span) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return fmt.Sprint(a.Value.Value)
		}
	}
	return ""
}

// readSpans reads every span in r: JSON objects, one a line or
// pretty-printed over several. Lines outside them (a server's log lines,
// printed to the same output) are skipped.
func readSpans(r io.Reader) ([]*span, error) {
	var spans []*span
	var obj []byte // the lines of the object being read
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(obj) == 0 && !bytes.HasPrefix(bytes.TrimSpace(line), []byte("{")) {
			continue
		}
		obj = append(append(obj, line...), '\n')
		if !json.Valid(obj) {
			continue // more lines to come, or a broken object: see EOF
		}
		s := new(span)
		if err := json.Unmarshal(obj, s); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		spans = append(spans, s)
		obj = obj[:0]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(obj)) > 0 {
		return nil, fmt.Errorf("a span that is not valid JSON: %.60q", obj)
	}
	return spans, nil
}

// row is one bar of the waterfall.
type row struct {
	s      *span
	depth  int
	inLoad bool // s is under the focal load: the LoadFunc's own spans
}

// waterfall is what the picture shows.
type waterfall struct {
	rows       []row
	load       *span // the focal load; nil when no span links to a load
	waits      int   // wait spans linking to load, drawn or not
	requests   int   // request spans drawn
	allReqs    int   // request spans with a wait on load
	start, end time.Time
}

// newWaterfall picks the load most waits link to, and the requests that
// waited on it, at most maxReqs of them; with no such load, every span.
func newWaterfall(spans []*span, maxReqs int) *waterfall {
	t := indexSpans(spans)
	w := &waterfall{}
	waitsOn := map[spanID][]*span{} // by load
	for _, s := range spans {
		for _, l := range s.Links {
			if d := t.byID[l.SpanContext.id()]; d != nil && d.Name == "flightcache.load" && s.Name == "flightcache.get" {
				waitsOn[d.SpanContext.id()] = append(waitsOn[d.SpanContext.id()], s)
			}
		}
	}
	for _, s := range spans {
		if n := len(waitsOn[s.SpanContext.id()]); s.Name == "flightcache.load" &&
			(n > w.waits || n == w.waits && n > 0 && s.StartTime.Before(w.load.StartTime)) {
			w.load, w.waits = s, n
		}
	}
	var roots []*span
	if w.load == nil {
		roots = t.roots(spans)
	} else {
		// The load's starter first, then the others by start.
		roots = t.roots(append([]*span{w.load}, waitsOn[w.load.SpanContext.id()]...))
		slices.SortStableFunc(roots[1:], func(a, b *span) int { return a.StartTime.Compare(b.StartTime) })
		w.allReqs = len(roots)
		roots = roots[:min(len(roots), maxReqs)]
		w.requests = len(roots)
	}
	for _, r := range roots {
		w.walk(t, r, 0, false)
	}
	for i, r := range w.rows {
		if i == 0 || r.s.StartTime.Before(w.start) {
			w.start = r.s.StartTime
		}
		w.end = later(w.end, r.s.EndTime)
	}
	return w
}

// walk adds s and the spans under it, depth first, each level by start.
func (w *waterfall) walk(t spanTree, s *span, depth int, inLoad bool) {
	w.rows = append(w.rows, row{s, depth, inLoad})
	for _, c := range t.children[s.SpanContext.id()] {
		w.walk(t, c, depth+1, inLoad || s == w.load)
	}
}

// spanTree is the spans by ID, and their children by start.
type spanTree struct {
	byID     map[spanID]*span
	children map[spanID][]*span
}

func indexSpans(spans []*span) spanTree {
	t := spanTree{byID: make(map[spanID]*span, len(spans)), children: map[spanID][]*span{}}
	for _, s := range spans {
		t.byID[s.SpanContext.id()] = s
	}
	for _, s := range spans {
		if p := s.Parent.id(); s.Parent.valid() && t.byID[p] != nil {
			t.children[p] = append(t.children[p], s)
		}
	}
	for _, c := range t.children {
		slices.SortStableFunc(c, func(a, b *span) int { return a.StartTime.Compare(b.StartTime) })
	}
	return t
}

// root returns the topmost span above s among those read.
func (t spanTree) root(s *span) *span {
	for s.Parent.valid() && t.byID[s.Parent.id()] != nil {
		s = t.byID[s.Parent.id()]
	}
	return s
}

// roots returns the roots of spans, each once, in the order of spans.
func (t spanTree) roots(spans []*span) []*span {
	var roots []*span
	seen := map[*span]bool{}
	for _, s := range spans {
		if r := t.root(s); !seen[r] {
			seen[r] = true
			roots = append(roots, r)
		}
	}
	return roots
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

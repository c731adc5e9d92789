package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stormJSON is one run of part f as the burst example prints it with
// -json: 100 keys, three storms whose walls are the ones given (no limit,
// MaxLoads 10, Adaptive), each traced at four points. The adaptive bound
// goes 20, 24, 30, 28; a field the report does not read is there too.
func stormJSON(t *testing.T, walls [3]time.Duration) string {
	t.Helper()
	row := func(config string, limit map[string]any, answered, breakerOpen int, peak int, wall time.Duration, bounds [4]int) map[string]any {
		var trace []map[string]any
		for i, b := range bounds {
			trace = append(trace, map[string]any{
				"at_ns": int64(wall) * int64(i) / 3, "load_limit": b, "queued_loads": 60 - 20*i, "in_flight": min(peak, 5+10*i),
			})
		}
		return map[string]any{
			"config": config, "limit": limit, "gets": 100, "answered": answered, "limited": 0, "breaker_open": breakerOpen,
			"downstream_calls": answered + 5, "overloaded_calls": 0, "peak_concurrent_calls": peak,
			"wall_ns": int64(wall), "p99_wait_ns": int64(wall) * 9 / 10, "trace": trace, "stats": map[string]any{"Gets": 100},
		}
	}
	doc := map[string]any{"f": map[string]any{
		"keys": 100, "base_latency_ns": int64(2 * time.Millisecond), "knee": 50, "capacity": 40,
		"rows": []any{
			row("no limit", map[string]any{"MaxLoads": 0, "Adaptive": false}, 10, 90, 41, walls[0], [4]int{0, 0, 0, 0}),
			row("MaxLoads 10", map[string]any{"MaxLoads": 10, "Adaptive": false, "MaxQueue": 400}, 100, 0, 10, walls[1], [4]int{10, 10, 10, 10}),
			row("Adaptive", map[string]any{"MaxLoads": 0, "Adaptive": true, "MaxQueue": 400}, 100, 0, 30, walls[2], [4]int{20, 24, 30, 28}),
		},
	}, "a": nil}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writeStorms writes three runs into dir, the second the median by the
// adaptive wall, and returns their paths.
func writeStorms(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	for i, walls := range [][3]time.Duration{
		{20 * time.Millisecond, 100 * time.Millisecond, 110 * time.Millisecond},
		{30 * time.Millisecond, 100 * time.Millisecond, 120 * time.Millisecond},
		{25 * time.Millisecond, 200 * time.Millisecond, 200 * time.Millisecond},
	} {
		p := filepath.Join(dir, "run"+strconv.Itoa(i+1)+".json")
		if err := os.WriteFile(p, []byte(stormJSON(t, walls)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

func TestReadStorm(t *testing.T) {
	run, err := readStorm(strings.NewReader(stormJSON(t, [3]time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond})))
	if err != nil {
		t.Fatal(err)
	}
	if run.Keys != 100 || run.Base != 2*time.Millisecond || len(run.Rows) != 3 || run.row("adaptive") != &run.Rows[2] || run.row("fixed").Limit.MaxLoads != 10 {
		t.Errorf("readStorm = %+v; want the three rows of part f", run)
	}
	if tr := run.Rows[2].Trace; len(tr) != 4 || tr[3].Bound != 28 || tr[0].Queued != 60 || tr[3].At != 3*time.Millisecond {
		t.Errorf("the adaptive trace = %+v", tr)
	}
	for _, bad := range []string{`{"a": {}}`, `{"f": {"rows": []}}`, `{not json`} {
		if _, err := readStorm(strings.NewReader(bad)); err == nil {
			t.Errorf("readStorm(%q): nil error", bad)
		}
	}
}

// The table gives each cell's median and range over the runs, the ratio
// to the fixed bound's wall run by run, and where the adaptive bound went.
func TestStormTable(t *testing.T) {
	runs, err := readStormFiles(writeStorms(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	table := stormTable(runs)
	for _, want := range []string{
		"| no limit | 10 of 100 | 90 | 0 | 15 | 0 | 41 | 25 ms (20–30) | — |",
		"| **MaxLoads 10** | 100 of 100 | 0 | 0 | 105 | 0 | 10 | 100 ms (100–200) | 1.00× |",
		"| **Adaptive** | 100 of 100 | 0 | 0 | 105 | 0 | 30 | 120 ms (110–200) | 1.10× (1.00–1.20) | 108 ms (99–180) |",
		"started at 20 and, past the first tenth of the storm, stayed within 24–30, 24–30, 24–30 (run by run)",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if run, i := medianRun(runs); i != 1 || run.name != "run2.json" {
		t.Errorf("medianRun = %s (%d); want run2.json, the median adaptive wall", run.name, i)
	}
}

// The chart is well-formed SVG, names the run it shows, and draws every
// line inside its panel.
func TestStormSVG(t *testing.T) {
	runs, err := readStormFiles(writeStorms(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	svg := stormSVG(runs)
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
	}
	for _, want := range []string{
		"A storm of 100 cold keys", "run 2 of 3 (run2.json)", "fails past 40 at once", "capacity 40",
		"<title>Adaptive: its bound</title>", "<title>MaxLoads 10: calls at once</title>", "<title>no limit: calls at once</title>",
		"time since the storm began (ms)", "loads queued",
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	// Four lines in the calls panel, two in the queue panel; every point of
	// each within the plot.
	paths := regexp.MustCompile(`<path d="(M[^"]*)" stroke="[^"]*" stroke-width="[^"]*" fill="none"[^>]*><title>([^<]*)</title>`).FindAllStringSubmatch(svg, -1)
	if len(paths) != 6 {
		t.Fatalf("%d lines; want 6 (three storms' calls, the bound, two queues)", len(paths))
	}
	num := regexp.MustCompile(`[-\d.]+`)
	for _, p := range paths {
		vs := num.FindAllString(p[1], -1)
		for i, v := range vs {
			f, _ := strconv.ParseFloat(v, 64)
			// M x y, then H x V y pairs: even positions are x, odd are y.
			if i%2 == 0 && (f < stLeft-0.1 || f > stWidth-stRight+0.1) || i%2 == 1 && (f < stTop-0.1 || f > stTop+stPanelH+stGap+stQueueH+0.1) {
				t.Errorf("line %q: coordinate %v outside the plot", p[2], f)
			}
		}
	}
	// One run alone: no "run i of n".
	if one := stormSVG(runs[:1]); !strings.Contains(one, "part f, one run<") {
		t.Errorf("the chart of one run does not say so")
	}
}

func TestStormMain(t *testing.T) {
	dir := t.TempDir()
	paths := writeStorms(t, dir)
	out := filepath.Join(dir, "storm.svg")
	if err := stormMain(append([]string{"-o", out}, paths...), io.Discard); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
		t.Errorf("wrote %.40q, %v; want the chart", b, err)
	}
	var table bytes.Buffer
	if err := stormMain(append([]string{"-table"}, paths...), &table); err != nil || !strings.HasPrefix(table.String(), "| limit |") {
		t.Errorf("-table wrote %.40q, %v; want the Markdown table", table.String(), err)
	}
	if err := stormMain(nil, io.Discard); err == nil {
		t.Errorf("stormMain without a file: nil error")
	}
	if err := stormMain([]string{filepath.Join(dir, "missing.json")}, io.Discard); err == nil {
		t.Errorf("stormMain of a missing file: nil error")
	}
}

// The report has the storm section, and its chart, when -storm holds
// runs; none when it holds nothing.
func TestReportStormSection(t *testing.T) {
	res, err := readResults(strings.NewReader(raw), "raw.txt")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeStorms(t, dir)
	r := &report{res: res, chartRel: "benchmarks", wallDir: t.TempDir(), stormDir: dir}
	charts := r.build()
	md := r.w.String()
	for _, want := range []string{"## A storm of many keys", "run 3 times", "| **Adaptive** |", "](benchmarks/storm.svg)", "run 2 (`run2.json`)",
		"no call went past capacity and every Get was answered", "both with `MaxQueue` 400, which holds every Get"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if !strings.HasPrefix(charts["storm.svg"], "<svg") {
		t.Errorf("no storm.svg among the charts")
	}
	var f stormResult
	f.Rows = []stormRow{{}, {}}
	f.Rows[1].Limit.MaxLoads = 50
	if got, want := f.queueNote(), "both with the default queue, which holds every Get"; got != want {
		t.Errorf("queueNote of runs without MaxQueue = %q; want %q", got, want)
	}
	r = &report{res: res, chartRel: "benchmarks", wallDir: t.TempDir(), stormDir: t.TempDir()}
	if charts := r.build(); strings.Contains(r.w.String(), "storm") || charts["storm.svg"] != "" {
		t.Errorf("a storm section without runs")
	}
}

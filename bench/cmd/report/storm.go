package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The storm subcommand reads part f of the burst example (a storm of many
// cold keys, with no limit, Options.Limit.MaxLoads and an adaptive limit;
// `go run ./examples/burst -only f -json`), one file per run, and writes
// either a chart of one run (the adaptive bound over time, the calls the
// downstream serves at once, the loads waiting for a slot) or, with
// -table, the Markdown table of every run: medians, with the range over
// the runs.
//
//	go run ./cmd/report storm [-o storm.svg] [-table] run1.json [run2.json ...]
//
// The main report includes the same table and chart when its -storm
// directory holds such files.

// stormMain runs the storm subcommand with args (those after "storm"),
// writing to stdout unless -o names a file.
func stormMain(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("report storm", flag.ContinueOnError)
	out := fs.String("o", "", "the file to write (default: standard output)")
	table := fs.Bool("table", false, "write the Markdown table of the runs instead of the chart")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: report storm [flags] run.json...\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("at least one run of examples/burst -only f -json is needed")
	}
	runs, err := readStormFiles(fs.Args())
	if err != nil {
		return err
	}
	text := stormTable(runs)
	if !*table {
		text = stormSVG(runs)
	}
	if *out == "" {
		_, err = io.WriteString(stdout, text)
		return err
	}
	return os.WriteFile(*out, []byte(text), 0o644)
}

// stormResult is part f as the burst example prints it with -json (the
// fields the report reads).
type stormResult struct {
	Keys     int           `json:"keys"`
	Base     time.Duration `json:"base_latency_ns"`
	Knee     int           `json:"knee"`
	Capacity int           `json:"capacity"`
	Rows     []stormRow    `json:"rows"`

	name string // the file it was read from
}

// stormRow is one configuration's storm.
type stormRow struct {
	Config string `json:"config"`
	Limit  struct {
		MaxLoads int
		Adaptive bool
		MaxQueue int // 0: the default queue, which holds every Get
	} `json:"limit"`
	Gets        int           `json:"gets"`
	Answered    int           `json:"answered"`
	Limited     int           `json:"limited"`
	BreakerOpen int           `json:"breaker_open"`
	Calls       int64         `json:"downstream_calls"`
	Overloaded  int64         `json:"overloaded_calls"`
	Peak        int           `json:"peak_concurrent_calls"`
	Wall        time.Duration `json:"wall_ns"`
	P99         time.Duration `json:"p99_wait_ns"`
	Trace       []stormPoint  `json:"trace"`
}

// stormPoint is one sample of a storm's trace.
type stormPoint struct {
	At       time.Duration `json:"at_ns"`
	Bound    int64         `json:"load_limit"`
	Queued   int64         `json:"queued_loads"`
	InFlight int           `json:"in_flight"`
}

// kind is what the row's limit is: "none", "fixed" or "adaptive".
func (r *stormRow) kind() string {
	switch {
	case r.Limit.Adaptive:
		return "adaptive"
	case r.Limit.MaxLoads > 0:
		return "fixed"
	}
	return "none"
}

// readStorm reads one run: the burst example's -json document, whose part
// f it takes.
func readStorm(r io.Reader) (*stormResult, error) {
	var doc struct {
		F *stormResult `json:"f"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, err
	}
	if doc.F == nil || len(doc.F.Rows) == 0 {
		return nil, errors.New("no part f in it: run examples/burst with -only f -json")
	}
	return doc.F, nil
}

// readStormFiles reads every run, each named after its file.
func readStormFiles(paths []string) ([]*stormResult, error) {
	var runs []*stormResult
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		run, err := readStorm(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		run.name = filepath.Base(p)
		runs = append(runs, run)
	}
	return runs, nil
}

// row returns run's row of the given kind, or nil.
func (s *stormResult) row(kind string) *stormRow {
	for i := range s.Rows {
		if s.Rows[i].kind() == kind {
			return &s.Rows[i]
		}
	}
	return nil
}

// queueNote says which queue the limited storms of s waited in: an
// explicit MaxQueue (runs made before the default queue held every Get
// set one), or the default.
func (s *stormResult) queueNote() string {
	if fixed := s.row("fixed"); fixed != nil && fixed.Limit.MaxQueue > 0 {
		return fmt.Sprintf("both with `MaxQueue` %s, which holds every Get", fmtNum(float64(fixed.Limit.MaxQueue)))
	}
	return "both with the default queue, which holds every Get"
}

// medianRun is the run the chart shows: the one whose adaptive storm (or,
// without one, whose last storm) took the median wall time. It also
// returns its index.
func medianRun(runs []*stormResult) (*stormResult, int) {
	wall := func(s *stormResult) time.Duration {
		if r := s.row("adaptive"); r != nil {
			return r.Wall
		}
		return s.Rows[len(s.Rows)-1].Wall
	}
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(wall(runs[a]), wall(runs[b])) })
	i := order[(len(order)-1)/2]
	return runs[i], i
}

// spread is a value over the runs: its median and range.
type spread struct{ med, lo, hi float64 }

func spreadOf(vs []float64) spread {
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return spread{med, s[0], s[n-1]}
}

// cell prints the median with suffix (a unit, or "of 2,000"), and the
// range in parentheses when the runs differ, each number with f.
func (s spread) cell(f func(float64) string, suffix string) string {
	if s.lo == s.hi {
		return f(s.med) + suffix
	}
	return fmt.Sprintf("%s%s (%s–%s)", f(s.med), suffix, f(s.lo), f(s.hi))
}

func count(v float64) string { return fmtNum(v) }
func ms(v float64) string    { return fmtNum(v / float64(time.Millisecond)) }
func times(v float64) string { return fmt.Sprintf("%.2f", v) }
func msec(v float64) string  { return ms(v) + " ms" }

// over is the spread of f over the runs' rows of one configuration (by
// its index among each run's rows).
func over(runs []*stormResult, i int, f func(r *stormRow, run *stormResult) float64) spread {
	var vs []float64
	for _, run := range runs {
		if i < len(run.Rows) {
			vs = append(vs, f(&run.Rows[i], run))
		}
	}
	return spreadOf(vs)
}

// wallRatio is the wall time of each run's i-th storm over its fixed
// bound's, over the runs.
func wallRatio(runs []*stormResult, i int) spread {
	return over(runs, i, func(r *stormRow, run *stormResult) float64 {
		if f := run.row("fixed"); f != nil && f.Wall > 0 {
			return float64(r.Wall) / float64(f.Wall)
		}
		return 0
	})
}

// stormTable is the Markdown table of the runs, one line per
// configuration, and a line on the adaptive bound.
func stormTable(runs []*stormResult) string {
	var b strings.Builder
	b.WriteString("| limit | Gets answered | ErrBreakerOpen | ErrLimited | downstream calls | past capacity | calls at once | wall time | × MaxLoads wall | p99 wait |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for i, row := range runs[0].Rows {
		ratio := "—"
		if row.kind() != "none" {
			ratio = wallRatio(runs, i).cell(times, "×")
		}
		name := row.Config
		if row.kind() != "none" {
			name = "**" + name + "**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name,
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.Answered) }).cell(count, " of "+fmtNum(float64(row.Gets))),
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.BreakerOpen) }).cell(count, ""),
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.Limited) }).cell(count, ""),
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.Calls) }).cell(count, ""),
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.Overloaded) }).cell(count, ""),
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.Peak) }).cell(count, ""),
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.Wall) }).cell(ms, " ms"),
			ratio,
			over(runs, i, func(r *stormRow, _ *stormResult) float64 { return float64(r.P99) }).cell(ms, " ms"))
	}
	if line := boundLine(runs); line != "" {
		fmt.Fprintf(&b, "\n%s\n", line)
	}
	return b.String()
}

// boundLine says where the adaptive bound started and, past the first
// tenth of the storm (while the queue drains), between which values it
// stayed, run by run; "" without an adaptive storm.
func boundLine(runs []*stormResult) string {
	var start, ranges []string
	for _, run := range runs {
		r := run.row("adaptive")
		if r == nil || len(r.Trace) == 0 {
			continue
		}
		lo, hi := settled(r)
		start = append(start, fmt.Sprint(r.Trace[0].Bound))
		ranges = append(ranges, fmt.Sprintf("%d–%d", lo, hi))
	}
	if len(ranges) == 0 {
		return ""
	}
	slices.Sort(start)
	start = slices.Compact(start)
	return fmt.Sprintf("The adaptive bound (Stats.LoadLimit, sampled every %s) started at %s and, past the first tenth of the storm, stayed within %s (run by run).",
		sampled(runs), strings.Join(start, " or "), strings.Join(ranges, ", "))
}

// sampled is how often the runs' traces were sampled: the median interval.
func sampled(runs []*stormResult) string {
	var every []float64
	for _, run := range runs {
		for _, r := range run.Rows {
			if n := len(r.Trace); n > 1 {
				every = append(every, float64(r.Trace[n-1].At-r.Trace[0].At)/float64(n-1))
			}
		}
	}
	if len(every) == 0 {
		return "—"
	}
	return msec(spreadOf(every).med)
}

// settled is the least and the most the row's bound was once a tenth of
// its storm had passed.
func settled(r *stormRow) (lo, hi int64) {
	lo, hi = -1, -1
	for _, pt := range r.Trace {
		if pt.At < r.Wall/10 {
			continue
		}
		if lo < 0 || pt.Bound < lo {
			lo = pt.Bound
		}
		hi = max(hi, pt.Bound)
	}
	if lo < 0 {
		lo, hi = r.Trace[len(r.Trace)-1].Bound, r.Trace[len(r.Trace)-1].Bound
	}
	return lo, hi
}

// limitedOutcome says what the limited storms of every run did: whether
// any call went past capacity, and whether every Get was answered.
func limitedOutcome(runs []*stormResult) string {
	var over, failed int64
	for _, run := range runs {
		for _, r := range run.Rows {
			if r.kind() != "none" {
				over += r.Overloaded
				failed += int64(r.Gets - r.Answered)
			}
		}
	}
	s := "no call went past capacity"
	if over > 0 {
		s = fmt.Sprintf("%d calls in all went past capacity", over)
	}
	if failed == 0 {
		return s + " and every Get was answered"
	}
	return s + fmt.Sprintf(", and %d Gets in all failed", failed)
}

// stormSection is the report's section on part f, from the runs in
// r.stormDir (none: no section), with its chart.
func (r *report) stormSection(charts map[string]string) {
	if r.stormDir == "" {
		return
	}
	paths, _ := filepath.Glob(filepath.Join(r.stormDir, "*.json"))
	if len(paths) == 0 {
		return
	}
	runs, err := readStormFiles(paths)
	if err != nil {
		r.printf("## A storm of many keys\n\n(%v)\n\n", err)
		return
	}
	f := runs[0]
	r.printf("## A storm of many keys\n\n")
	r.printf("Part f of `examples/burst` ([docs/examples.md](examples.md)), run %d times one after the other: %s distinct cold keys asked for at once, which single-flight cannot collapse, ", len(runs), fmtNum(float64(f.Keys)))
	r.printf("from a downstream whose calls take %s × (1 + n/%d)² with n calls in flight and fail at once past %d (a database out of connections). ", fmtMs(f.Base), f.Knee, f.Capacity)
	r.printf("Each way starts cold, with a Loader and a downstream of its own and default options but for `Options.Limit`: none, `Limit{MaxLoads: 50}` and `Limit{Adaptive: true}` (%s). ", f.queueNote())
	r.printf("Each cell is the median over the runs, with their range in parentheses when they differ; × MaxLoads wall divides each run's wall time by the fixed bound's in the same run. ")
	r.printf("ErrBreakerOpen and ErrLimited count the Gets that failed so; past capacity and calls at once are the downstream's own counts.\n\n")
	r.printf("Commands, from the repository root and then in `bench/` (the report reads `%s` itself):\n\n", filepath.ToSlash(r.stormDir))
	r.printf("```sh\nfor i in 1 2 3; do go run ./examples/burst -only f -json > bench/%s/run$i.json; done\n", filepath.ToSlash(r.stormDir))
	r.printf("go run ./cmd/report storm %s/run*.json > ../docs/benchmarks/storm.svg\n```\n\n", filepath.ToSlash(r.stormDir))
	r.printf("%s\n", stormTable(runs))
	charts["storm.svg"] = stormSVG(runs)
	run, idx := medianRun(runs)
	r.printf("![A storm of many keys: the adaptive bound, the calls at once and the queue over time](%s)\n\n", filepath.ToSlash(filepath.Join(r.chartRel, "storm.svg")))
	r.printf("The chart is run %d (`%s`), the median by the adaptive storm's wall time, sampled every %s: above, the calls the downstream served at once in each way and the adaptive bound; below, the loads waiting for a slot. ", idx+1, run.name, sampled(runs))
	r.printf("Without a limit the downstream is past its capacity within milliseconds, the breaker opens after five failures in a row, and nearly every Get fails with ErrBreakerOpen. ")
	if fixed := f.row("fixed"); fixed != nil {
		n := float64(fixed.Limit.MaxLoads)
		r.printf("With a limit %s: the fixed bound keeps %d calls in flight, each taking %s; ", limitedOutcome(runs),
			fixed.Limit.MaxLoads, fmtMs(time.Duration(float64(f.Base)*(1+n/float64(f.Knee))*(1+n/float64(f.Knee)))))
	}
	if i := slices.IndexFunc(f.Rows, func(r stormRow) bool { return r.kind() == "adaptive" }); i >= 0 {
		r.printf("the adaptive bound grows from 20 while the latency stays within twice the lowest seen, and settles where the downstream's own slowdown stops it: fewer calls at once, each faster, for %s the fixed bound's wall time.",
			wallRatio(runs, i).cell(times, "×"))
	}
	r.printf("\n\n")
}

// Command report turns the raw output of the bench module's benchmarks into
// docs/benchmarks.md and its SVG charts.
//
// Usage, from the bench directory:
//
//	go run ./cmd/report [-o ../docs/benchmarks.md] [-wall results/wall] [-storm results/storm] [-notes findings.md] [-before results/before.txt] results/raw.txt
//
// With -before, the report opens its results with a before → after
// section: the same benchmarks on an earlier core (the runs in that file)
// against the runs in raw.txt, which should have been interleaved with them
// round by round (see bench/README.md).
//
// Medians and 95% confidence intervals are computed with
// golang.org/x/perf/benchmath, as benchstat computes them, so a 95% interval
// needs at least 6 runs (-count 6). The charts are written next to the
// report, in a directory named after it (docs/benchmarks/).
//
// The trace subcommand draws spans recorded in a real run (the httpserver
// example's -trace stdout) as a waterfall SVG: one load, the requests that
// waited on it and their wait spans, linked to it (see trace.go):
//
//	go run ./cmd/report trace [-o ../docs/img/trace.svg] [-requests 12] spans.jsonl
//
// The storm subcommand reads part f of the burst example, a storm of many
// cold keys (`go run ./examples/burst -only f -json`, one file per run),
// and writes the chart of its median run (the adaptive bound over time,
// the calls the downstream serves at once, the loads queued) or, with
// -table, the Markdown table of the runs (see storm.go); the report itself
// includes both when -storm names a directory of such files:
//
//	go run ./cmd/report storm [-o storm.svg] [-table] run1.json [run2.json ...]
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("report: ")
	if len(os.Args) > 1 && os.Args[1] == "trace" {
		if err := traceMain(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "storm" {
		if err := stormMain(os.Args[2:], os.Stdout); err != nil {
			log.Fatal(err)
		}
		return
	}
	out := flag.String("o", "../docs/benchmarks.md", "the Markdown report to write; charts go to a directory of the same name without .md")
	wallDir := flag.String("wall", "results/wall", "directory of the expiry-wall traces written by -walltrace")
	stormDir := flag.String("storm", "results/storm", "directory of examples/burst -only f -json runs, for the storm section (skipped if empty)")
	notes := flag.String("notes", "findings.md", "Markdown appended to the report as the findings section (skipped if missing)")
	beforeRaw := flag.String("before", "", "raw output of the same benchmarks on the earlier core, for the before → after section (optional)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: report [flags] raw.txt\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	raw := flag.Arg(0)
	f, err := os.Open(raw)
	if err != nil {
		log.Fatal(err)
	}
	res, err := readResults(f, raw)
	f.Close()
	if err != nil {
		log.Fatal(err)
	}
	if len(res.order) == 0 {
		log.Fatalf("%s has no benchmark results", raw)
	}

	chartDir := strings.TrimSuffix(*out, filepath.Ext(*out))
	if err := os.MkdirAll(chartDir, 0o755); err != nil {
		log.Fatal(err)
	}
	r := &report{res: res, chartRel: filepath.Base(chartDir), wallDir: *wallDir, stormDir: *stormDir}
	if *beforeRaw != "" {
		f, err := os.Open(*beforeRaw)
		if err != nil {
			log.Fatal(err)
		}
		r.before, err = readResults(f, *beforeRaw)
		f.Close()
		if err != nil {
			log.Fatal(err)
		}
	}
	charts := r.build()
	for name, svg := range charts {
		if err := os.WriteFile(filepath.Join(chartDir, name), []byte(svg), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if b, err := os.ReadFile(*notes); err == nil {
		r.w.WriteString("\n")
		r.w.Write(b)
	} else if !os.IsNotExist(err) {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out, []byte(r.w.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s and %d charts in %s", *out, len(charts), chartDir)
}

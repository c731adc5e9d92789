// Burst runs the experiments flightcache grew from, live, and prints what
// a Loader did, read from its Stats, its LoadEvents and each Get's Info:
//
//   - a. downstream calls for a burst of identical requests: with no
//     coordination, through a Loader, and with a TTL behind it;
//   - b. the blast radius of one failed load: how many readers queued
//     behind it got its error, and how StaleIfError brings that to zero;
//     counted from LoadEvent, and again by an Observer that links every
//     waiting Get to its load (WaitEvent.Load);
//   - c. the expiry wall of a hot key: how long readers wait when it
//     expires, with a TTL only, with stale-while-revalidate and with early
//     refresh;
//   - d. freshness from the data: tokens with their own expiry (one TTL for
//     all serves some past it; Options.Freshness none), and what reloading
//     with ErrNotModified saves over full reloads;
//   - e. the N+1 problem: a page of 100 ids through Get one by one, through
//     GetMany without LoadMany, and with LoadMany, and through a Get per id
//     at once without and with Options.BatchWindow: downstream calls and
//     wall time;
//   - f. a storm of many keys: 2,000 distinct cold keys at once against a
//     downstream that slows with its concurrency and fails past 100 calls
//     at once, with no limit, with Options.Limit.MaxLoads 50 and with an
//     adaptive Limit: Gets answered, calls past capacity, calls at once,
//     wall time, p99 wait, and the adaptive bound over time;
//   - g. a warm restart: downstream calls in the first moments of a new
//     process, started cold and restored from what the old one saved at
//     shutdown (Loader.Entries, gob, Loader.Restore).
//
// Usage:
//
//	go run ./examples/burst [-duration 3s] [-readers 8] [-keys 3] [-only abcdefg] [-json]
//
// It needs no server and, with the defaults, takes about 13 seconds. A
// progress line is drawn on stderr; the tables (or, with -json, one JSON
// document) go to stdout.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// config holds every knob of the parts. The flags set the first
// four; the rest are the experiments' fixed settings (tests shrink them).
type config struct {
	duration time.Duration // c's runs; b's reader runs last twice as long, its control run a third
	readers  int           // concurrent readers in b and c
	keys     int           // hot keys in b
	only     string        // which parts to run: letters of "abcdefg"

	// Part b: the downstream of the blast-radius experiment.
	loadMin, loadMax time.Duration // each load takes a duration in [loadMin, loadMax)
	loadTimeout      time.Duration // a hanging load ends here
	failEvery        int64         // every failEvery-th load hangs
	minLoads         int           // a run of b goes on past its duration until this many loads have finished

	// Part c: the expiry wall.
	wallTTL  time.Duration
	wallLoad time.Duration
	swr      time.Duration // the StaleWhileRevalidate window
	betas    []float64     // one EarlyRefresh run per β
	think    time.Duration // each reader's pause between Gets
	slow     time.Duration // a Get slower than this is counted as slow

	// Part e: the N+1 problem.
	page       int           // ids on the page
	roundTrip  time.Duration // each downstream call takes this...
	perRow     time.Duration // ...plus this per row it reads
	smallBatch int           // the MaxBatch of the fourth way
	window     time.Duration // the BatchWindow of the last way, whose MaxBatch is the page

	// Part f: the storm of many keys.
	stormKeys     int           // distinct cold keys, all asked for at once
	stormBase     time.Duration // a call alone takes about this...
	stormKnee     int           // ...× (1 + n/stormKnee)² with n calls in flight
	stormCapacity int           // past this many calls at once, a call fails at once
	stormMaxLoads int           // the fixed Limit.MaxLoads
	traceEvery    time.Duration // the bound is read this often during a storm

	// Part g: the warm restart (its loads take roundTrip to twice that).
	restartKeys   int           // keys the process served before it restarted
	restartWindow time.Duration // how long the readers read after the restart
}

func defaultConfig() config {
	return config{
		duration: 3 * time.Second,
		readers:  8,
		keys:     3,
		only:     "abcdefg",

		loadMin:     100 * time.Millisecond,
		loadMax:     120 * time.Millisecond,
		loadTimeout: 150 * time.Millisecond,
		failEvery:   10,
		minLoads:    10, // so that even the control run has a failed load

		wallTTL:  200 * time.Millisecond,
		wallLoad: 50 * time.Millisecond,
		swr:      time.Second,
		betas:    []float64{1, 0.5},
		think:    5 * time.Millisecond,
		slow:     40 * time.Millisecond,

		page:       100,
		roundTrip:  5 * time.Millisecond,
		perRow:     20 * time.Microsecond,
		smallBatch: 25,
		window:     10 * time.Millisecond,

		stormKeys:     2000,
		stormBase:     2 * time.Millisecond,
		stormKnee:     50,
		stormCapacity: 100,
		stormMaxLoads: 50,
		traceEvery:    2 * time.Millisecond,

		restartKeys:   2000,
		restartWindow: time.Second,
	}
}

// results is everything one run measured; -json prints it.
type results struct {
	A *coalesceResult  `json:"a,omitempty"`
	B *blastResult     `json:"b,omitempty"`
	C *wallResult      `json:"c,omitempty"`
	D *freshnessResult `json:"d,omitempty"`
	E *nPlusOneResult  `json:"e,omitempty"`
	F *stormResult     `json:"f,omitempty"`
	G *restartResult   `json:"g,omitempty"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "burst:", err)
		}
		os.Exit(2)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("burst", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.duration, "duration", cfg.duration, "length of part c's runs; part b's reader runs last twice as long, its control run a third, part d's runs half")
	fs.IntVar(&cfg.readers, "readers", cfg.readers, "concurrent readers in parts b and c")
	fs.IntVar(&cfg.keys, "keys", cfg.keys, "hot keys in part b")
	fs.StringVar(&cfg.only, "only", cfg.only, "parts to run: any of a, b, c, d, e, f, g (e.g. -only b or -only a,c)")
	asJSON := fs.Bool("json", false, "print one JSON document instead of tables")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.duration <= 0:
		return fmt.Errorf("-duration must be > 0, got %v", cfg.duration)
	case cfg.readers < 1:
		return fmt.Errorf("-readers must be >= 1, got %d", cfg.readers)
	case cfg.keys < 1:
		return fmt.Errorf("-keys must be >= 1, got %d", cfg.keys)
	case strings.Trim(cfg.only, "abcdefg, ") != "" || strings.Trim(cfg.only, ", ") == "":
		return fmt.Errorf("-only takes letters of a, b, c, d, e, f, g; got %q", cfg.only)
	}

	res, err := measure(cfg, newProgress(stderr))
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	res.print(stdout)
	return nil
}

// measure runs the parts cfg.only names.
func measure(cfg config, p *progress) (*results, error) {
	res := &results{}
	var err error
	if strings.Contains(cfg.only, "a") {
		if res.A, err = runCoalesce(p); err != nil {
			return nil, err
		}
	}
	if strings.Contains(cfg.only, "b") {
		if res.B, err = runBlast(cfg, p); err != nil {
			return nil, err
		}
	}
	if strings.Contains(cfg.only, "c") {
		if res.C, err = runWall(cfg, p); err != nil {
			return nil, err
		}
	}
	if strings.Contains(cfg.only, "d") {
		if res.D, err = runFreshness(cfg, p); err != nil {
			return nil, err
		}
	}
	if strings.Contains(cfg.only, "e") {
		if res.E, err = runNPlusOne(cfg, p); err != nil {
			return nil, err
		}
	}
	if strings.Contains(cfg.only, "f") {
		if res.F, err = runStorm(cfg, p); err != nil {
			return nil, err
		}
	}
	if strings.Contains(cfg.only, "g") {
		if res.G, err = runRestart(cfg, p); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (r *results) print(w io.Writer) {
	sep := ""
	if r.A != nil {
		r.A.print(w)
		sep = "\n"
	}
	if r.B != nil {
		fmt.Fprint(w, sep)
		r.B.print(w)
		sep = "\n"
	}
	if r.C != nil {
		fmt.Fprint(w, sep)
		r.C.print(w)
		sep = "\n"
	}
	if r.D != nil {
		fmt.Fprint(w, sep)
		r.D.print(w)
		sep = "\n"
	}
	if r.E != nil {
		fmt.Fprint(w, sep)
		r.E.print(w)
		sep = "\n"
	}
	if r.F != nil {
		fmt.Fprint(w, sep)
		r.F.print(w)
		sep = "\n"
	}
	if r.G != nil {
		fmt.Fprint(w, sep)
		r.G.print(w)
	}
}

package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The "Core v2: before → after" section: the performance targets of the
// core v2 redesign, measured on the last commit before it (-before) and on
// the core the report is generated for, from runs interleaved round by
// round (see bench/README.md).

// v2Target is one row of the section's table.
type v2Target struct {
	measure, target string
	cell            func(res *results) string // the measured cell, for one tree
	met             func(res *results) (met, straddles, known bool)
}

// ratioTarget is a row judged on flightcache's paired ratio to a peer, and
// optionally on its allocations.
func ratioTarget(measure, target, name, base, peer string, maxRatio float64, maxAllocs float64) v2Target {
	return v2Target{
		measure: measure,
		target:  target,
		cell: func(res *results) string {
			ns := res.get(name, "ns/op")
			if !ns.ok {
				return "not measured"
			}
			s := fmtNum(ns.center) + " ns " + ns.spread
			if al := res.get(name, "allocs/op"); al.ok {
				s += ", " + fmtNum(al.center) + " allocs"
			}
			return s + "; " + pairedRatio(res, name, base, "ns/op").ratioCell() + " " + peer
		},
		met: func(res *results) (bool, bool, bool) {
			q := pairedRatio(res, name, base, "ns/op")
			al := res.get(name, "allocs/op")
			if !q.ok || !al.ok {
				return false, false, false
			}
			return q.center <= maxRatio && al.max <= maxAllocs, q.lo <= maxRatio && maxRatio <= q.hi, true
		},
	}
}

func (r *report) coreV2Section() {
	if r.before == nil {
		return
	}
	const (
		fcPressure = "EvictionPressure/flightcache"
		sfPressure = "EvictionPressure/ristretto-singleflight"
		otPressure = "EvictionPressure/otter"
	)
	rows := []v2Target{
		ratioTarget("cold miss, one goroutine, instant load: `Coalesce/g=1` (nothing evicted)", "≤ 2× otter's loading Get, ≤ 10 allocs",
			"Coalesce/flightcache/g=1", "Coalesce/otter/g=1", "otter", 2, 10),
		ratioTarget("cold miss, one goroutine, instant load: `Miss` (10k entries, every fill evicts)", "≤ 2× otter's loading Get, ≤ 10 allocs",
			"Miss/flightcache", "Miss/otter", "otter", 2, 10),
		ratioTarget("hit, 100k string keys, Zipf(1.01), serial: `HitSerial`", "≤ 1.15× raw ristretto, 0 allocs",
			"HitSerial/flightcache", "HitSerial/ristretto", "ristretto", 1.15, 0),
		ratioTarget("hit, same, parallel: `HitParallel`", "≤ 1.15× raw ristretto, 0 allocs",
			"HitParallel/flightcache", "HitParallel/ristretto", "ristretto", 1.15, 0),
	}
	for _, n := range scaleSizes {
		rows = append(rows, ratioTarget("hit, uint64 keys, uniform, "+groupThousands(n)+" keys: `ScaleHit`", "≤ 1.15× raw ristretto",
			"ScaleHit/flightcache/keys="+n, "ScaleHit/ristretto/keys="+n, "ristretto", 1.15, math.Inf(1)))
	}
	rows = append(rows, v2Target{
		measure: "memory per entry, 1M entries: `Memory`",
		target:  "≤ +32 B over ristretto with a TTL",
		cell: func(res *results) string {
			fc, rs := res.get("Memory/flightcache", "B/entry"), res.get("Memory/ristretto", "B/entry")
			if !fc.ok || !rs.ok {
				return "not measured"
			}
			return fmt.Sprintf("%s B/entry %s; %+.0f B", fmtNum(fc.center), fc.spread, fc.center-rs.center)
		},
		met: func(res *results) (bool, bool, bool) {
			fc, rs := res.get("Memory/flightcache", "B/entry"), res.get("Memory/ristretto", "B/entry")
			return fc.center-rs.center <= 32, false, fc.ok && rs.ok
		},
	}, v2Target{
		measure: "eviction pressure (2M Gets, Zipf(1.01) over 1M keys, 10k entries, 8 goroutines): `EvictionPressure`",
		target:  "calls ≤ ristretto + x/sync and ≤ 1.10× otter",
		cell: func(res *results) string {
			c := res.get(fcPressure, "calls")
			if !c.ok {
				return "not measured"
			}
			return fmt.Sprintf("%s calls %s; %s ristretto + x/sync, %s otter; hit ratio %s, %s sets dropped, %s rejected",
				fmtNum(c.center), c.spread, pairedRatio(res, fcPressure, sfPressure, "calls").ratioCell(),
				pairedRatio(res, fcPressure, otPressure, "calls").ratioCell(), fmtRatio(res.get(fcPressure, "hit-ratio")),
				fmtNum(res.get(fcPressure, "sets-dropped").center), fmtNum(res.get(fcPressure, "sets-rejected").center))
		},
		met: func(res *results) (bool, bool, bool) {
			sf, ot := pairedRatio(res, fcPressure, sfPressure, "calls"), pairedRatio(res, fcPressure, otPressure, "calls")
			if !sf.ok || !ot.ok {
				return false, false, false
			}
			return sf.center <= 1 && ot.center <= 1.10, sf.lo <= 1 && 1 <= sf.hi || ot.lo <= 1.10 && 1.10 <= ot.hi, true
		},
	})

	runs := func(res *results, name string) int { return len(res.values[name]["ns/op"]) }
	nb, na := runs(r.before, "HitSerial/flightcache"), runs(r.res, "HitSerial/flightcache")
	wb, wa := runs(r.before, "ExpiryWall/flightcache-swr"), runs(r.res, "ExpiryWall/flightcache-swr")

	r.printf("## Core v2: before → after\n\n")
	r.printf("The core was redesigned (core v2: one write path with a writer goroutine, one context type per load, one LoadTimeout timer per Loader, a lock-free healthy breaker; see the findings at the end). ")
	short := func(res *results) string {
		c := res.config["commit"]
		if len(c) > 7 {
			c = c[:7]
		}
		if c == "" {
			return ""
		}
		return ", at " + c
	}
	r.printf("This section compares the same benchmarks on the last commit before the redesign (**before**%s) and on core v2 (**after**%s), measured in interleaved rounds on one machine while other work was running on it: ", short(r.before), short(r.res))
	r.printf("each round ran every benchmark once (`-count 1`) on one tree, then on the other, the order alternating between rounds, so that both trees saw the same load. ")
	r.printf("Runs per benchmark: %d before, %d after", nb, na)
	if wb+wa > 0 {
		r.printf(" (the expiry wall, which takes 3 s per implementation, %d and %d)", wb, wa)
	}
	r.printf(". ")
	r.printf("Each cell is flightcache's median with its 95%% confidence interval, and its ratio to the peer in brackets: the median of the ratios taken run by run against the peer measured in the same process, with the 95%% interval of that median. ")
	r.printf("The tables below this section are the after runs.\n\n")

	r.printf("| measure | target | before | after | met (after) |\n|---|---|---|---|---|\n")
	for _, row := range rows {
		met, straddles, known := row.met(r.res)
		verdict := "no"
		switch {
		case !known:
			verdict = "not measured"
		case met && straddles:
			verdict = "yes (the interval straddles the target)"
		case met:
			verdict = "yes"
		case straddles:
			verdict = "no (the interval straddles the target)"
		}
		r.printf("| %s | %s | %s | %s | %s |\n", row.measure, row.target, row.cell(r.before), row.cell(r.res), verdict)
	}
	r.printf("\n")

	// Eviction pressure, every implementation, before and after.
	r.printf("Eviction pressure, every implementation (medians; ristretto-singleflight and otter are the same code in both trees):\n\n")
	r.printf("| implementation | tree | calls | hit-ratio | sets dropped | sets rejected | ns/Get | allocs/Get |\n|---|---|---|---|---|---|---|---|\n")
	for _, impl := range pressureImpls {
		name := "EvictionPressure/" + impl
		for _, t := range []struct {
			tree string
			res  *results
		}{{"before", r.before}, {"after", r.res}} {
			c := t.res.get(name, "calls")
			if !c.ok {
				continue
			}
			r.printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", bold(impl), t.tree, c.cell(), fmtRatio(t.res.get(name, "hit-ratio")),
				orDash(numOrNone(t.res.get(name, "sets-dropped"))), orDash(numOrNone(t.res.get(name, "sets-rejected"))),
				t.res.get(name, "ns/op").cell(), fmtNum(t.res.get(name, "allocs/get").center))
		}
	}
	r.printf("\n")

	// The peers are the same code in both trees: how far apart their
	// medians are says how well the interleaving evened out the load.
	var drift []float64
	for _, name := range r.res.order {
		if strings.Contains(name, "flightcache") || strings.HasPrefix(name, "ExpiryWall/") || strings.HasPrefix(name, "Memory/") {
			continue
		}
		a, b := r.res.get(name, "ns/op"), r.before.get(name, "ns/op")
		if a.ok && b.ok && b.center > 0 {
			drift = append(drift, a.center/b.center)
		}
	}
	if len(drift) > 0 {
		slices.Sort(drift)
		r.printf("Control: the %d peer benchmarks (same code in both trees) have after/before medians between %.2f× and %.2f× (median %.2f×), the scale of the noise left after interleaving.\n\n",
			len(drift), drift[0], drift[len(drift)-1], drift[len(drift)/2])
	}
}

package main

import (
	"fmt"
	"math"
	"slices"

	"golang.org/x/perf/benchmath"
)

// The sections of the two benchmarks added with core v2, the cold miss in a
// full cache (BenchmarkMiss) and the eviction pressure scenario, and of the
// batch benchmark added with GetMany (BenchmarkGetMany).

var (
	missImpls     = []string{"ristretto", "otter", "flightcache"}
	pressureImpls = []string{"ristretto-singleflight", "otter", "flightcache"}
	getManyImpls  = []string{"sturdyc", "otter", "flightcache"}
)

// pressureGets is how many Gets one eviction-pressure run plays.
const pressureGets = 2_000_000

func (r *report) missSection() {
	r.printf("## Cold miss in a full cache\n\n")
	r.printf("One goroutine, one never-seen uint64 key per op, an instant loader; every implementation holds 10,000 entries and is full before the timer starts, so every fill evicts an entry or is refused by admission. ")
	r.printf("Raw ristretto is Get then SetWithTTL (no coalescing), otter is its loading Get, flightcache is Loader.Get with default options. ")
	r.printf("Ratios are taken run by run against the peer measured in the same process, then their median given.\n\n")
	r.printf("| implementation | ns/op | × ristretto | × otter | allocs/op | B/op |\n|---|---|---|---|---|---|\n")
	for _, impl := range missImpls {
		name := "Miss/" + impl
		ns := r.res.get(name, "ns/op")
		if !ns.ok {
			continue
		}
		r.printf("| %s | %s | %s | %s | %s | %s |\n", bold(impl), ns.cell(),
			pairedRatioCell(r.res, name, "Miss/ristretto", "ns/op"), pairedRatioCell(r.res, name, "Miss/otter", "ns/op"),
			fmtNum(r.res.get(name, "allocs/op").center), fmtNum(r.res.get(name, "B/op").center))
	}
	r.printf("\n")
}

func (r *report) pressureSection() {
	r.printf("## Eviction pressure\n\n")
	r.printf("Zipf(1.01) over 1,000,000 uint64 keys, a cache of 10,000 entries, 8 goroutines playing one precomputed trace of 2,000,000 Gets (an eighth each), an instant loader; each run plays the trace once. ")
	r.printf("About a third of the Gets miss, so the cache evicts or refuses a fill all the time; a fill that ristretto's set buffer drops or its admission policy refuses is a downstream call made again later. ")
	r.printf("ristretto-singleflight is the hand-rolled cache-aside (ristretto configured as flightcache configures it, golang.org/x/sync/singleflight around load and SetWithTTL); otter is Get with a Loader; flightcache has default options. ")
	r.printf("calls are downstream calls per run; hit-ratio is 1 − calls / Gets; ns and allocs are per Get (wall time of the run over 2M Gets, background goroutines' allocations included).\n\n")
	r.printf("| implementation | calls | × ristretto-singleflight | × otter | hit-ratio | sets dropped | sets rejected | ns/Get | allocs/Get |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, impl := range pressureImpls {
		name := "EvictionPressure/" + impl
		calls := r.res.get(name, "calls")
		if !calls.ok {
			continue
		}
		r.printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", bold(impl), calls.cell(),
			pairedRatioCell(r.res, name, "EvictionPressure/ristretto-singleflight", "calls"),
			pairedRatioCell(r.res, name, "EvictionPressure/otter", "calls"),
			fmtRatio(r.res.get(name, "hit-ratio")), orDash(numOrNone(r.res.get(name, "sets-dropped"))),
			orDash(numOrNone(r.res.get(name, "sets-rejected"))), r.res.get(name, "ns/op").cell(),
			fmtNum(r.res.get(name, "allocs/get").center))
	}
	r.printf("\n")
}

// getManySection is left out when the runs have no GetMany result.
func (r *report) getManySection() {
	if !slices.ContainsFunc(getManyImpls, func(impl string) bool { return r.res.get("GetMany/"+impl, "ns/op").ok }) {
		return
	}
	r.printf("## Batches\n\n")
	r.printf("One goroutine, one op asks for 100 distinct string keys at once: Zipf(1.01) over 1,000,000 keys (one precomputed trace cut into ops), a cache of 10,000 entries warmed before the timer, a TTL of one hour, an instant batch loader. ")
	r.printf("sturdyc is GetOrFetchBatch, otter is BulkGet with a BulkLoader, flightcache is GetMany with Options.LoadMany. ")
	r.printf("calls/op is downstream batch calls per op, keys-loaded/op the keys they asked for, hit-ratio 1 − keys-loaded / 100. ")
	r.printf("Ratios are taken run by run against the peer measured in the same process, then their median given.\n\n")
	r.printf("| implementation | ns/op | × sturdyc | × otter | allocs/op | B/op | calls/op | keys-loaded/op | hit-ratio |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, impl := range getManyImpls {
		name := "GetMany/" + impl
		ns := r.res.get(name, "ns/op")
		if !ns.ok {
			continue
		}
		r.printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", bold(impl), ns.cell(),
			pairedRatioCell(r.res, name, "GetMany/sturdyc", "ns/op"), pairedRatioCell(r.res, name, "GetMany/otter", "ns/op"),
			fmtNum(r.res.get(name, "allocs/op").center), fmtNum(r.res.get(name, "B/op").center),
			fmtNum(r.res.get(name, "calls/op").center), fmtNum(r.res.get(name, "keys-loaded/op").center),
			fmtRatio(r.res.get(name, "hit-ratio")))
	}
	r.printf("\n")
}

func numOrNone(s summary) string {
	if !s.ok {
		return ""
	}
	return fmtNum(s.center)
}

// pairedRatio is the summary of name/base over the runs, run by run: the
// i-th value of name divided by the i-th value of base. In a raw file made
// of rounds of -count 1 (or of one -count N invocation), the i-th values of
// two benchmarks come from the same process, so the machine's load at that
// moment largely cancels out.
func pairedRatio(res *results, name, base, unit string) summary {
	a, b := res.values[name][unit], res.values[base][unit]
	n := min(len(a), len(b))
	var q []float64
	for i := range n {
		if b[i] != 0 {
			q = append(q, a[i]/b[i])
		}
	}
	if len(q) == 0 {
		return summary{}
	}
	s := benchmath.AssumeNothing.Summary(benchmath.NewSample(q, &benchmath.DefaultThresholds), 0.95)
	return summary{ok: true, n: len(q), center: s.Center, lo: s.Lo, hi: s.Hi, min: slices.Min(q), max: slices.Max(q)}
}

// ratioCell prints a paired ratio as "1.23× [1.10, 1.30]" (the 95%
// interval), or without the interval when there are too few runs.
func (s summary) ratioCell() string {
	if !s.ok {
		return "—"
	}
	if s.n < 6 || math.IsInf(s.lo, 0) || math.IsInf(s.hi, 0) {
		return fmt.Sprintf("%.2f×", s.center)
	}
	return fmt.Sprintf("%.2f× [%.2f, %.2f]", s.center, s.lo, s.hi)
}

func pairedRatioCell(res *results, name, base, unit string) string {
	if name == base {
		return "1.00×"
	}
	return pairedRatio(res, name, base, unit).ratioCell()
}

package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// raw is a small benchmark output in the shape the bench package prints.
const raw = `goversion: go1.26.0
gomaxprocs: 2
benchflags: -bench . -benchmem -count 6 -run '^$'
goos: linux
goarch: amd64
pkg: github.com/flightcache/flightcache/bench
cpu: Some CPU
BenchmarkHitSerial/ristretto-2     	 1000	 100.0 ns/op	 1.000 hit-ratio	 0 B/op	 0 allocs/op
BenchmarkHitSerial/ristretto-2     	 1000	 102.0 ns/op	 1.000 hit-ratio	 0 B/op	 0 allocs/op
BenchmarkHitSerial/ristretto-2     	 1000	  98.0 ns/op	 1.000 hit-ratio	 0 B/op	 0 allocs/op
BenchmarkHitSerial/flightcache-2   	 1000	 110.0 ns/op	 1.000 hit-ratio	 0 B/op	 0 allocs/op
BenchmarkHitSerial/flightcache-2   	 1000	 112.0 ns/op	 1.000 hit-ratio	 0 B/op	 0 allocs/op
BenchmarkHitSerial/flightcache-2   	 1000	 130.0 ns/op	 1.000 hit-ratio	 0 B/op	 0 allocs/op
BenchmarkCoalesce/resenje-singleflight/g=64-2 	 10	 90000 ns/op	 0.9 loads/get	 57.6 loads/op	 20000 B/op	 400 allocs/op
BenchmarkCoalesce/flightcache/g=64-2 	 10	 45000 ns/op	 0.0156 loads/get	 1.000 loads/op	 2500 B/op	 33 allocs/op
BenchmarkExpiryWall/flightcache-swr-2 	 1	 600 ns/op	 12.00 calls	 0.300 max-ms	 5.000 p99-us	 0 slow-gets	 1 B/op	 1 allocs/op
BenchmarkMemory/ristretto-2 	 1	 2000 ns/op	 220.0 B/entry	 1.000 stored-ratio
BenchmarkMemory/flightcache-2 	 1	 7000 ns/op	 300.0 B/entry	 1.000 stored-ratio
PASS
`

func TestReadResults(t *testing.T) {
	res, err := readResults(strings.NewReader(raw), "raw.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := res.config["goversion"]; got != "go1.26.0" {
		t.Errorf(`config["goversion"] = %q; want "go1.26.0"`, got)
	}
	if got := res.order[0]; got != "HitSerial/ristretto" {
		t.Errorf("first name = %q; want HitSerial/ristretto", got)
	}
	s := res.get("HitSerial/ristretto", "ns/op") // in ns, not tidied to seconds
	if !s.ok || s.n != 3 || s.center != 100 || s.min != 98 || s.max != 102 {
		t.Errorf("get(HitSerial/ristretto, ns/op) = %+v; want median 100 of 3 runs in [98, 102]", s)
	}
	if s := res.get("Coalesce/flightcache/g=64", "loads/op"); s.center != 1 {
		t.Errorf("loads/op = %v; want 1", s.center)
	}
	if s := res.get("HitSerial/nobody", "ns/op"); s.ok {
		t.Errorf("get of a missing benchmark = %+v; want !ok", s)
	}
}

func TestReportGoals(t *testing.T) {
	res, err := readResults(strings.NewReader(raw), "raw.txt")
	if err != nil {
		t.Fatal(err)
	}
	r := &report{res: res, chartRel: "benchmarks", wallDir: t.TempDir()}
	charts := r.build()
	if _, ok := charts["hit.svg"]; !ok {
		t.Error("no hit.svg chart")
	}
	met := map[string]bool{}
	for _, g := range r.goals {
		met[g.what] = g.met && g.known
	}
	want := map[string]bool{
		"hit, serial":                      true,  // 112/100 = 1.12×
		"coalescing, 64 goroutines: speed": true,  // 45 µs against 90 µs
		"coalescing, 64 goroutines: loads": true,  // 1 load per burst
		"expiry wall, swr":                 true,  // 0 slow, 0.3 ms, 12 calls
		"memory per entry":                 false, // +80 B
	}
	for what, w := range want {
		if got, ok := met[what]; !ok || got != w {
			t.Errorf("goal %q met = %v (present %v); want %v", what, got, ok, w)
		}
	}
	md := r.w.String()
	for _, s := range []string{"# Benchmarks", "| Go | go1.26.0 |", "## Hit path", "## Coalescing", "## The expiry wall", "## Memory", "1.12×"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
}

func TestWallTraceBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.csv")
	if err := os.WriteFile(path, []byte("at_ms,latency_us\n1,5\n3,50000\n12,7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := readWallTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	b := tr.buckets(10, 30)
	if len(b) != 3 || b[0] != 50000 || b[1] != 7 || !math.IsNaN(b[2]) {
		t.Errorf("buckets = %v; want [50000 7 NaN]", b)
	}
}

func TestFmtNum(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0"}, {1, "1"}, {1.5, "1.5"}, {12, "12"}, {123.4, "123"}, {12345, "12,345"}, {0.0156, "0.0156"}} {
		if got := fmtNum(c.v); got != c.want {
			t.Errorf("fmtNum(%v) = %q; want %q", c.v, got, c.want)
		}
	}
}

// rawV2 is a small output of the benchmarks added with core v2, two runs.
const rawV2 = `commit: 0123456789abcdef
BenchmarkMiss/otter-2       	 1000	 1000 ns/op	 378 B/op	 5 allocs/op
BenchmarkMiss/otter-2       	 1000	 2000 ns/op	 378 B/op	 5 allocs/op
BenchmarkMiss/flightcache-2 	 1000	 1500 ns/op	 900 B/op	 9 allocs/op
BenchmarkMiss/flightcache-2 	 1000	 3000 ns/op	 900 B/op	 9 allocs/op
BenchmarkEvictionPressure/ristretto-singleflight-2 	 1	 600 ns/op	 750000 calls	 0.625 hit-ratio	 300000 sets-dropped	 300000 sets-rejected	 2.5 allocs/get
BenchmarkEvictionPressure/ristretto-singleflight-2 	 1	 600 ns/op	 760000 calls	 0.62 hit-ratio	 300000 sets-dropped	 300000 sets-rejected	 2.5 allocs/get
BenchmarkEvictionPressure/otter-2 	 1	 500 ns/op	 680000 calls	 0.66 hit-ratio	 1.7 allocs/get
BenchmarkEvictionPressure/otter-2 	 1	 500 ns/op	 690000 calls	 0.655 hit-ratio	 1.7 allocs/get
BenchmarkEvictionPressure/flightcache-2 	 1	 1500 ns/op	 740000 calls	 0.63 hit-ratio	 0 sets-dropped	 580000 sets-rejected	 4 allocs/get
BenchmarkEvictionPressure/flightcache-2 	 1	 1500 ns/op	 740000 calls	 0.63 hit-ratio	 0 sets-dropped	 580000 sets-rejected	 4 allocs/get
`

func TestPairedRatio(t *testing.T) {
	res, err := readResults(strings.NewReader(rawV2), "raw.txt")
	if err != nil {
		t.Fatal(err)
	}
	// Run by run: 1500/1000 and 3000/2000, both 1.5, where the ratio of
	// the medians (2250/1500) happens to be 1.5 too but the runs disagree.
	if q := pairedRatio(res, "Miss/flightcache", "Miss/otter", "ns/op"); !q.ok || q.n != 2 || q.center != 1.5 || q.min != 1.5 || q.max != 1.5 {
		t.Errorf("pairedRatio = %+v; want 1.5 in both runs", q)
	}
	if q := pairedRatio(res, "Miss/flightcache", "Miss/nobody", "ns/op"); q.ok {
		t.Errorf("pairedRatio against a missing benchmark = %+v; want !ok", q)
	}
}

func TestCoreV2Section(t *testing.T) {
	after, err := readResults(strings.NewReader(raw+rawV2), "raw.txt")
	if err != nil {
		t.Fatal(err)
	}
	before, err := readResults(strings.NewReader(rawV2), "before.txt")
	if err != nil {
		t.Fatal(err)
	}
	r := &report{res: after, before: before, chartRel: "benchmarks", wallDir: t.TempDir()}
	r.build()
	md := r.w.String()
	for _, s := range []string{
		"## Core v2: before → after",
		"./compare.sh 0123456",
		"## Cold miss in a full cache",
		"## Eviction pressure",
		"| **flightcache** | after | 740,000",
		"1.50× otter", // Miss: ≤ 2× otter...
		"| cold miss, one goroutine, instant load: `Miss` (10k entries, every fill evicts) | ≤ 2× otter's loading Get, ≤ 10 allocs |",
	} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	// The section comes before the results and after the goals.
	if i, j := strings.Index(md, "## Core v2"), strings.Index(md, "## Hit path"); i < 0 || j < i || strings.Index(md, "## Goals") > i {
		t.Errorf("Core v2 section at %d, goals at %d, hit path at %d", i, strings.Index(md, "## Goals"), j)
	}
}

// rawGetMany is a small output of BenchmarkGetMany, two runs.
const rawGetMany = `BenchmarkGetMany/sturdyc-2     	 1000	 40000 ns/op	 1.000 calls/op	 0.47 hit-ratio	 53 keys-loaded/op	 47000 B/op	 97 allocs/op
BenchmarkGetMany/sturdyc-2     	 1000	 40000 ns/op	 1.000 calls/op	 0.47 hit-ratio	 53 keys-loaded/op	 47000 B/op	 97 allocs/op
BenchmarkGetMany/otter-2       	 1000	 20000 ns/op	 1.000 calls/op	 0.60 hit-ratio	 40 keys-loaded/op	 28000 B/op	 180 allocs/op
BenchmarkGetMany/otter-2       	 1000	 20000 ns/op	 1.000 calls/op	 0.60 hit-ratio	 40 keys-loaded/op	 28000 B/op	 180 allocs/op
BenchmarkGetMany/flightcache-2 	 1000	 30000 ns/op	 1.000 calls/op	 0.55 hit-ratio	 45 keys-loaded/op	 57000 B/op	 470 allocs/op
BenchmarkGetMany/flightcache-2 	 1000	 30000 ns/op	 1.000 calls/op	 0.55 hit-ratio	 45 keys-loaded/op	 57000 B/op	 470 allocs/op
`

func TestGetManySection(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want bool
	}{{raw, false}, {raw + rawGetMany, true}} {
		res, err := readResults(strings.NewReader(c.raw), "raw.txt")
		if err != nil {
			t.Fatal(err)
		}
		r := &report{res: res, chartRel: "benchmarks", wallDir: t.TempDir()}
		r.build()
		md := r.w.String()
		if got := strings.Contains(md, "## Batches"); got != c.want {
			t.Errorf("report has a Batches section: %v; want %v", got, c.want)
		}
		if c.want && !strings.Contains(md, "| **flightcache** | 30,000 ∞ | 0.75× | 1.50× | 470 | 57,000 | 1 | 45 | 0.55 |") {
			t.Errorf("report lacks flightcache's GetMany row:\n%s", md)
		}
	}
}

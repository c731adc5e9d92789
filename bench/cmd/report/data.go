package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// results holds every measurement of one raw benchmark output, by benchmark
// name (without the Benchmark prefix and the -GOMAXPROCS suffix) and unit.
type results struct {
	config map[string]string               // file configuration: goos, cpu, goversion, benchflags...
	values map[string]map[string][]float64 // name → unit → one value per run
	order  []string                        // names in order of first appearance
}

// readResults parses the output of go test -bench with benchfmt. Values are
// kept in the units the benchmark printed (ns/op, not sec/op).
func readResults(r io.Reader, fileName string) (*results, error) {
	res := &results{config: map[string]string{}, values: map[string]map[string][]float64{}}
	br := benchfmt.NewReader(r, fileName)
	for br.Scan() {
		switch rec := br.Result(); rec := rec.(type) {
		case *benchfmt.SyntaxError:
			fmt.Fprintln(os.Stderr, "report: skipping:", rec)
		case *benchfmt.Result:
			for _, c := range rec.Config {
				if c.File {
					res.config[c.Key] = string(c.Value)
				}
			}
			name := benchName(rec.Name)
			m := res.values[name]
			if m == nil {
				m = map[string][]float64{}
				res.values[name] = m
				res.order = append(res.order, name)
			}
			for _, v := range rec.Values {
				unit, val := v.Unit, v.Value
				if v.OrigUnit != "" {
					unit, val = v.OrigUnit, v.OrigValue
				}
				m[unit] = append(m[unit], val)
			}
		}
	}
	return res, br.Err()
}

// benchName is the name without "Benchmark" and the GOMAXPROCS suffix.
func benchName(n benchfmt.Name) string {
	base, parts := n.Parts()
	var b strings.Builder
	b.Write(base)
	for _, p := range parts {
		if len(p) > 0 && p[0] == '-' { // -GOMAXPROCS
			continue
		}
		b.Write(p)
	}
	return strings.TrimPrefix(b.String(), "Benchmark")
}

// summary is the median of a benchmark's runs and its 95% confidence
// interval, as benchstat computes them.
type summary struct {
	ok             bool
	n              int
	center, lo, hi float64
	spread         string // "±3%", or "∞" when there are too few runs for a 95% interval
	min, max       float64
}

func (r *results) get(name, unit string) summary {
	vals := slices.Clone(r.values[name][unit])
	if len(vals) == 0 {
		return summary{}
	}
	s := benchmath.AssumeNothing.Summary(benchmath.NewSample(vals, &benchmath.DefaultThresholds), 0.95)
	spread := s.PctRangeString()
	if spread != "∞" && spread != "?" {
		spread = "±" + spread
	}
	return summary{ok: true, n: len(vals), center: s.Center, lo: s.Lo, hi: s.Hi, spread: spread,
		min: slices.Min(vals), max: slices.Max(vals)}
}

// fmtNum prints a value with 3 significant digits, and thousands without
// a fraction.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "—"
	case a == 0:
		return "0"
	case a >= 1000:
		return groupThousands(strconv.FormatFloat(v, 'f', 0, 64))
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return trimZeros(strconv.FormatFloat(v, 'f', 1, 64))
	case a >= 1:
		return trimZeros(strconv.FormatFloat(v, 'f', 2, 64))
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// trimZeros drops a fraction of zeros: "12.0" is "12", "1.50" is "1.5".
func trimZeros(s string) string {
	if !strings.Contains(s, ".") {
		return s
	}
	return strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
}

func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// cell prints a summary as "median ±spread".
func (s summary) cell() string {
	if !s.ok {
		return "—"
	}
	if s.n < 2 || s.spread == "" {
		return fmtNum(s.center)
	}
	return fmtNum(s.center) + " " + s.spread
}

// wallTrace is the per-Get latency of one expiry-wall run.
type wallTrace struct {
	atMs      []float64
	latencyUs []float64
}

func readWallTrace(path string) (wallTrace, error) {
	var t wallTrace
	f, err := os.Open(path)
	if err != nil {
		return t, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 0; sc.Scan(); line++ {
		if line == 0 {
			continue // header
		}
		at, lat, ok := strings.Cut(sc.Text(), ",")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseFloat(at, 64)
		l, err2 := strconv.ParseFloat(lat, 64)
		if err1 != nil || err2 != nil {
			return t, fmt.Errorf("%s:%d: bad row %q", path, line+1, sc.Text())
		}
		t.atMs = append(t.atMs, a)
		t.latencyUs = append(t.latencyUs, l)
	}
	return t, sc.Err()
}

// buckets returns, per bucket of width ms, the slowest Get in it (µs);
// empty buckets are NaN.
func (t wallTrace) buckets(width, total float64) []float64 {
	n := int(math.Ceil(total / width))
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
	}
	for i, at := range t.atMs {
		b := int(at / width)
		if b < 0 || b >= n {
			continue
		}
		if math.IsNaN(out[b]) || t.latencyUs[i] > out[b] {
			out[b] = t.latencyUs[i]
		}
	}
	return out
}

package flightcache

import (
	"math"
	"math/big"
	"testing"
	"time"
)

func TestJitter(t *testing.T) {
	tests := []struct {
		ttl    time.Duration
		spread float64
		u      float64
		want   time.Duration
	}{
		{time.Second, 0, 0.7, time.Second},
		{time.Second, 0.2, 0, time.Second},
		{time.Second, 0.2, 0.5, 900 * time.Millisecond},
		{time.Second, 1, 0.999999999, 1},              // never 0
		{time.Second, 1, 1, 1},                        // clamped u, still never 0
		{time.Second, 2, 0.5, 500 * time.Millisecond}, // spread clamped to 1
		{time.Second, math.NaN(), 0.5, time.Second},
		{time.Second, 0.5, math.NaN(), time.Second},
		{0, 0.5, 0.5, 1},
		{-time.Second, 0.5, 0.5, 1},
		{math.MaxInt64, 1e-18, 0.5, math.MaxInt64},   // rounds to 2^63: saturates, never wraps to 1ns
		{math.MaxInt64, 0.5, 1, math.MaxInt64/2 + 1}, // 2^62, to float64 precision
	}
	for _, tt := range tests {
		if got := jitter(tt.ttl, tt.spread, tt.u); got != tt.want {
			t.Errorf("jitter(%v, %v, %v) = %v; want %v", tt.ttl, tt.spread, tt.u, got, tt.want)
		}
	}
}

// FuzzJitter: for any input, the lifetime is in [max(1, ttl·(1−spread)), ttl]
// (or 1 for ttl < 1), and never 0.
func FuzzJitter(f *testing.F) {
	f.Add(int64(time.Second), 0.2, 0.5)
	f.Add(int64(1), 1.0, 0.99)
	f.Add(int64(math.MaxInt64), 0.5, 0.5)
	f.Add(int64(math.MaxInt64), 1e-18, 0.5)
	f.Add(int64(math.MaxInt64-1), 0.0, 1.0)
	f.Add(int64(math.MinInt64), 0.5, 0.5)
	f.Add(int64(-5), math.NaN(), math.Inf(1))
	f.Fuzz(func(t *testing.T, ttl int64, spread, u float64) {
		d := time.Duration(ttl)
		got := jitter(d, spread, u)
		if got < 1 {
			t.Fatalf("jitter(%v, %v, %v) = %v; want >= 1ns", d, spread, u, got)
		}
		if d < 1 {
			if got != 1 {
				t.Fatalf("jitter(%v, ...) = %v; want 1ns for a non-positive ttl", d, got)
			}
			return
		}
		if got > d {
			t.Fatalf("jitter(%v, %v, %v) = %v; want <= ttl", d, spread, u, got)
		}
		if s := min(spread, 1); s > 0 && !math.IsNaN(u) {
			floor := float64(d) * (1 - s)
			if float64(got) < floor-float64(d)*1e-9-1 {
				t.Fatalf("jitter(%v, %v, %v) = %v; want >= %v", d, spread, u, got, floor)
			}
		}
	})
}

func TestPhaseAt(t *testing.T) {
	w := windows{staleWhileRevalidate: 10, staleIfError: 5}
	for now, want := range map[time.Duration]phase{
		99: phaseFresh, 100: phaseStale, 109: phaseStale, 110: phaseStaleIfError,
		114: phaseStaleIfError, 115: phaseExpired, 1000: phaseExpired,
	} {
		if got := w.phaseAt(now, 100); got != want {
			t.Errorf("phaseAt(%d, 100) = %d; want %d", now, got, want)
		}
	}
	if got := (windows{}).phaseAt(100, 100); got != phaseExpired {
		t.Errorf("no windows: phaseAt(expiry) = %d; want expired", got)
	}
}

func TestEarlyRefreshAt(t *testing.T) {
	const loaded, life = 100 * time.Second, 10 * time.Second // expiry at 110s
	tests := []struct {
		delta time.Duration
		beta  float64
		u     float64
		want  time.Duration
	}{
		{time.Second, 1, 1, 109 * time.Second},                  // no random lead: delta only
		{time.Second, 1, math.Exp(-1), 108 * time.Second},       // lead 1s + 1s
		{time.Second, 2, math.Exp(-1), 107 * time.Second},       // β doubles the random part
		{time.Second, 1, math.Exp(-20), 105 * time.Second},      // capped at half the life
		{time.Second, 1, 0, 105 * time.Second},                  // -ln 0 is +Inf: the cap
		{0, 1, 0.5, 110 * time.Second},                          // unknown load time: off
		{time.Second, 0, 0.5, 110 * time.Second},                // β = 0: off
		{time.Second, math.NaN(), 0.5, 110 * time.Second},       // NaN: off
		{2 * time.Second, 0.5, math.Exp(-2), 106 * time.Second}, // 2s + 2·0.5·2s
	}
	for _, tt := range tests {
		got := earlyRefreshAt(loaded, life, tt.delta, tt.beta, tt.u)
		if d := got - tt.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("earlyRefreshAt(δ %v, β %v, u %v) = %v; want %v", tt.delta, tt.beta, tt.u, got, tt.want)
		}
	}
}

// FuzzEarlyRefreshAt: the early refresh is never after expiry, nor before
// half the life has passed.
func FuzzEarlyRefreshAt(f *testing.F) {
	f.Add(int64(time.Second), int64(time.Millisecond), 1.0, 0.5)
	f.Fuzz(func(t *testing.T, life, delta int64, beta, u float64) {
		if life <= 0 || life > int64(1000*time.Hour) {
			return
		}
		at := earlyRefreshAt(0, time.Duration(life), time.Duration(delta), beta, u)
		if at > time.Duration(life) || at < time.Duration(life)/2 {
			t.Fatalf("earlyRefreshAt(life %v, δ %v, β %v, u %v) = %v; want in [life/2, life]", time.Duration(life), time.Duration(delta), beta, u, at)
		}
	})
}

func TestRefreshDelay(t *testing.T) {
	base, limit := 100*time.Millisecond, time.Second
	for n, want := range map[int][2]time.Duration{
		1: {50 * time.Millisecond, 100 * time.Millisecond},
		2: {100 * time.Millisecond, 200 * time.Millisecond},
		4: {400 * time.Millisecond, 800 * time.Millisecond},
		9: {500 * time.Millisecond, time.Second},
	} {
		lo, hi := refreshDelay(n, base, limit, 0), refreshDelay(n, base, limit, 0.999999)
		if lo != want[0] || hi < want[0] || hi > want[1] {
			t.Errorf("refreshDelay(%d) spans [%v, %v]; want [%v, %v)", n, lo, hi, want[0], want[1])
		}
	}
	if d := refreshDelay(1, 0, 0, math.NaN()); d < 1 {
		t.Errorf("refreshDelay with zero inputs = %v; want >= 1ns", d)
	}
}

// A limit near math.MaxInt64 is reached by doubling, never overflowed: the
// delay doubled past it into a negative one (a refresh at once, 1ns later)
// and, at the saturated failure count, on to 0, then looped about 2^63
// times. The calls run with a deadline, so a hang fails instead of blocking.
func TestRefreshDelayNearMaxInt64(t *testing.T) {
	const never = time.Duration(math.MaxInt64)
	year := 365 * 24 * time.Hour
	tests := []struct {
		n           int
		base, limit time.Duration
		u           float64
		lo, hi      time.Duration
	}{
		{math.MaxInt, year, never, 1, never, never},
		{math.MaxInt, 50 * time.Millisecond, never, 0, never / 2, never/2 + 1},
		{math.MaxInt, never, never, 1, never, never},
		{9, year, never, 1, 256 * year, 256 * year},
		{10, year, never, 0, never / 2, never/2 + 1}, // 512 years is past the limit
		{64, 1, never, 1, never, never},
	}
	for _, tt := range tests {
		got := make(chan time.Duration, 1)
		go func() { got <- refreshDelay(tt.n, tt.base, tt.limit, tt.u) }()
		select {
		case d := <-got:
			if d < tt.lo || d > tt.hi {
				t.Errorf("refreshDelay(%d, %v, %v, %v) = %v; want in [%v, %v]", tt.n, tt.base, tt.limit, tt.u, d, tt.lo, tt.hi)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("refreshDelay(%d, %v, %v, %v) still running after 10s", tt.n, tt.base, tt.limit, tt.u)
		}
	}
}

// FuzzRefreshDelay: for any failure count, base, limit and draw, the delay
// is base doubled per failure (computed exactly here), capped at the limit,
// then spread over [d/2, d]; never below 1ns, and never a wrap-around.
func FuzzRefreshDelay(f *testing.F) {
	f.Add(1, int64(100*time.Millisecond), int64(time.Second), 0.5)
	f.Add(math.MaxInt, int64(365*24*time.Hour), int64(math.MaxInt64), 1.0)
	f.Add(math.MaxInt, int64(1), int64(math.MaxInt64), 0.0)
	f.Add(15, int64(math.MaxInt64), int64(math.MaxInt64), 0.999)
	f.Add(0, int64(-5), int64(math.MinInt64), math.NaN())
	f.Add(-3, int64(0), int64(1), math.Inf(-1))
	f.Fuzz(func(t *testing.T, n int, base, limit int64, u float64) {
		got := refreshDelay(n, time.Duration(base), time.Duration(limit), u)
		b := max(base, 1)
		want := new(big.Int).Lsh(big.NewInt(b), uint(min(max(n-1, 0), 64)))
		if cap := big.NewInt(max(limit, b)); want.Cmp(cap) > 0 {
			want = cap
		}
		d := float64(want.Int64())
		slack := d/(1<<51) + 1 // the spread is computed in float64
		switch {
		case got < 1:
			t.Fatalf("refreshDelay(%d, %d, %d, %v) = %v; want >= 1ns", n, base, limit, u, got)
		case float64(got) > d+slack:
			t.Fatalf("refreshDelay(%d, %d, %d, %v) = %v; want <= %v", n, base, limit, u, got, want)
		case float64(got) < d/2-slack:
			t.Fatalf("refreshDelay(%d, %d, %d, %v) = %v; want >= %v/2", n, base, limit, u, got, want)
		}
	})
}

// clampBig is x clamped to the Durations.
func clampBig(x *big.Int) time.Duration {
	switch {
	case x.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case x.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return time.Duration(x.Int64())
}

func TestSaturatingArithmetic(t *testing.T) {
	const hi, lo = time.Duration(math.MaxInt64), time.Duration(math.MinInt64)
	for _, tt := range []struct{ a, b, want time.Duration }{
		{1, 2, 3}, {hi, 1, hi}, {hi, hi, hi}, {hi - 1, 1, hi}, {lo, -1, lo}, {lo, lo, lo},
		{lo, hi, -1}, {5, -3, 2}, {-5, 3, -2}, {0, 0, 0},
	} {
		if got := addSat(tt.a, tt.b); got != tt.want {
			t.Errorf("addSat(%d, %d) = %d; want %d", tt.a, tt.b, got, tt.want)
		}
	}
	for _, tt := range []struct {
		d    time.Duration
		n    int64
		want time.Duration
	}{
		{3, 2, 6}, {hi/2 + 1, 2, hi}, {hi / 2, 2, hi - 1}, {lo, 2, lo}, {lo, -1, hi}, {-1, math.MinInt64, hi},
		{lo / 2, 2, lo}, {hi, -1, -hi}, {hi, 0, 0}, {0, math.MinInt64, 0}, {-3, 4, -12},
	} {
		if got := mulSat(tt.d, tt.n); got != tt.want {
			t.Errorf("mulSat(%d, %d) = %d; want %d", tt.d, tt.n, got, tt.want)
		}
	}
	for _, tt := range []struct {
		d    time.Duration
		f    float64
		want time.Duration
	}{
		{10, 0.5, 5}, {hi, 1, hi}, {hi, 2, hi}, {hi, -2, lo}, {lo, 1, lo}, {lo, -1, hi}, {hi, math.Inf(1), hi},
		{-1, math.Inf(1), lo}, {hi, math.NaN(), 0}, {0, math.Inf(1), 0}, {1, 1e-300, 0}, {-7, 0.5, -3},
	} {
		if got := scaleSat(tt.d, tt.f); got != tt.want {
			t.Errorf("scaleSat(%d, %v) = %d; want %d", tt.d, tt.f, got, tt.want)
		}
	}
}

// FuzzSaturatingArithmetic: addSat and mulSat are the exact sum and
// product, clamped to the Durations; scaleSat is the product by a float to
// float64 precision, clamped likewise, and 0 for a NaN product.
func FuzzSaturatingArithmetic(f *testing.F) {
	f.Add(int64(math.MaxInt64), int64(1), 2.0)
	f.Add(int64(math.MinInt64), int64(-1), -1.0)
	f.Add(int64(math.MaxInt64/2+1), int64(2), 0.5)
	f.Add(int64(-1), int64(math.MinInt64), math.Inf(1))
	f.Add(int64(0), int64(0), math.NaN())
	f.Add(int64(1), int64(math.MaxInt64), 1e-300)
	f.Fuzz(func(t *testing.T, a, b int64, x float64) {
		da, db := time.Duration(a), time.Duration(b)
		if got, want := addSat(da, db), clampBig(new(big.Int).Add(big.NewInt(a), big.NewInt(b))); got != want {
			t.Fatalf("addSat(%d, %d) = %d; want %d", a, b, got, want)
		}
		if got, want := mulSat(da, b), clampBig(new(big.Int).Mul(big.NewInt(a), big.NewInt(b))); got != want {
			t.Fatalf("mulSat(%d, %d) = %d; want %d", a, b, got, want)
		}
		got := scaleSat(da, x)
		p := float64(a) * x
		if math.IsNaN(p) {
			if got != 0 {
				t.Fatalf("scaleSat(%d, %v) = %d; want 0 for a NaN product", a, x, got)
			}
			return
		}
		var want time.Duration
		switch {
		case math.IsInf(p, 1) && math.IsInf(x, 0):
			want = math.MaxInt64
		case math.IsInf(p, -1) && math.IsInf(x, 0):
			want = math.MinInt64
		default:
			exact, _ := new(big.Float).SetPrec(200).Mul(new(big.Float).SetInt64(a), big.NewFloat(x)).Int(nil)
			want = clampBig(exact)
		}
		slack := math.Abs(p)/(1<<51) + 1
		if diff := math.Abs(float64(got) - float64(want)); diff > slack {
			t.Fatalf("scaleSat(%d, %v) = %d; want %d (±%v)", a, x, got, want, slack)
		}
		if (got < 0 && p > 0) || (got > 0 && p < 0) {
			t.Fatalf("scaleSat(%d, %v) = %d: the sign of %v flipped", a, x, got, p)
		}
	})
}

// FuzzPhaseAt: an entry's phase at any moment follows the exact sums of its
// freshness and windows (non-negative, as validated), saturated at the end
// of time: a window that runs past math.MaxInt64 lasts to the last moment.
func FuzzPhaseAt(f *testing.F) {
	f.Add(int64(61*time.Second), int64(60*time.Second), int64(math.MaxInt64), int64(0))
	f.Add(int64(math.MaxInt64-1), int64(math.MaxInt64-2), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(int64(math.MinInt64), int64(math.MinInt64), int64(1), int64(1))
	f.Add(int64(0), int64(-1), int64(0), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, now, freshUntil, swr, sie int64) {
		if swr < 0 || sie < 0 || now == math.MaxInt64 {
			return // windows are >= 0; now never reaches the end of time
		}
		w := windows{staleWhileRevalidate: time.Duration(swr), staleIfError: time.Duration(sie)}
		n, fu := big.NewInt(now), big.NewInt(freshUntil)
		staleUntil := new(big.Int).Add(fu, big.NewInt(swr))
		errUntil := new(big.Int).Add(staleUntil, big.NewInt(sie))
		want := phaseExpired
		switch {
		case n.Cmp(fu) < 0:
			want = phaseFresh
		case n.Cmp(staleUntil) < 0:
			want = phaseStale
		case n.Cmp(errUntil) < 0:
			want = phaseStaleIfError
		}
		if got := w.phaseAt(time.Duration(now), time.Duration(freshUntil)); got != want {
			t.Fatalf("phaseAt(%d, %d) with windows %d, %d = %d; want %d", now, freshUntil, swr, sie, got, want)
		}
	})
}

// FuzzEarlyRefreshAtExtremes: at any load time, for any life, load time and
// β, the early refresh is at the expiry (saturated) or before it by at most
// half the life, with no wrap-around; with β or δ off, it is the expiry.
func FuzzEarlyRefreshAtExtremes(f *testing.F) {
	f.Add(int64(0), int64(math.MaxInt64), int64(math.MaxInt64), 1e300, 1e-300)
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), int64(1), 1.0, 0.5)
	f.Add(int64(math.MinInt64), int64(1), int64(math.MaxInt64), 1.0, 0.0)
	f.Add(int64(-5), int64(3), int64(-1), 1.0, 0.5)
	f.Add(int64(time.Hour), int64(time.Minute), int64(time.Millisecond), 0.0, 0.5)
	f.Fuzz(func(t *testing.T, loadedAt, life, delta int64, beta, u float64) {
		if life <= 0 {
			return // an entry's life is at least 1ns (jitter)
		}
		expiry := clampBig(new(big.Int).Add(big.NewInt(loadedAt), big.NewInt(life)))
		at := earlyRefreshAt(time.Duration(loadedAt), time.Duration(life), time.Duration(delta), beta, u)
		if !(beta > 0) || delta <= 0 {
			if at != expiry {
				t.Fatalf("earlyRefreshAt(%d, %d, δ %d, β %v, u %v) = %d; want the expiry %d", loadedAt, life, delta, beta, u, at, expiry)
			}
			return
		}
		if at > expiry || at < expiry-time.Duration(life)/2 {
			t.Fatalf("earlyRefreshAt(%d, %d, δ %d, β %v, u %v) = %d; want in [%d, %d]", loadedAt, life, delta, beta, u, at, expiry-time.Duration(life)/2, expiry)
		}
	})
}

// An entry keeps its early refresh to the microsecond, rounded up: the lead
// of a load faster than a millisecond does not vanish, and is never
// shorter than the load took (what earlyRefreshAt promises).
func TestEntryKeepsItsEarlyRefreshLead(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{EarlyRefresh: 1})
	took := 300 * time.Microsecond
	for range 1000 {
		e := l.newEntry("k", "v", lifetime{ttl: time.Minute}, born{at: time.Hour, took: took})
		if lead := e.freshUntil - e.refreshAt(); lead < took || e.refreshAt() < e.loadedAt {
			t.Fatalf("early refresh %v before expiry (at %v, loaded at %v); want at least the load's %v, after the load",
				lead, e.refreshAt(), e.loadedAt, took)
		}
	}
}

// The failed-refresh count saturates in its 4 bits without touching the
// gone bit or the fleet generation, and a saturated count means the
// backoff's limit, whatever the ratio of MaxInterval to InitialInterval.
func TestFailedRefreshCountSaturates(t *testing.T) {
	e := &entry[string, string]{}
	e.mark.Store(3 * genUnit)
	e.setGone()
	n := 0
	for range 40 {
		n = e.failedRefresh()
	}
	if n != maxRefreshFails || !e.isGone() || e.mark.Load()&^(goneBit|failsMask) != 3*genUnit {
		t.Fatalf("after 40 failures: count %d, gone %v, mark %#x", n, e.isGone(), e.mark.Load())
	}
	if d := refreshDelay(math.MaxInt, time.Millisecond, time.Minute, 1); d != time.Minute {
		t.Fatalf("refreshDelay at the saturated count = %v, want the limit (1m)", d)
	}
}

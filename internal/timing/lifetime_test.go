package timing

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
		if got := Jitter(tt.ttl, tt.spread, tt.u); got != tt.want {
			t.Errorf("Jitter(%v, %v, %v) = %v; want %v", tt.ttl, tt.spread, tt.u, got, tt.want)
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
		got := Jitter(d, spread, u)
		if got < 1 {
			t.Fatalf("Jitter(%v, %v, %v) = %v; want >= 1ns", d, spread, u, got)
		}
		if d < 1 {
			if got != 1 {
				t.Fatalf("Jitter(%v, ...) = %v; want 1ns for a non-positive ttl", d, got)
			}
			return
		}
		if got > d {
			t.Fatalf("Jitter(%v, %v, %v) = %v; want <= ttl", d, spread, u, got)
		}
		if s := min(spread, 1); s > 0 && !math.IsNaN(u) {
			floor := float64(d) * (1 - s)
			if float64(got) < floor-float64(d)*1e-9-1 {
				t.Fatalf("Jitter(%v, %v, %v) = %v; want >= %v", d, spread, u, got, floor)
			}
		}
	})
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
		got := EarlyRefreshAt(loaded, life, tt.delta, tt.beta, tt.u)
		if d := got - tt.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("EarlyRefreshAt(δ %v, β %v, u %v) = %v; want %v", tt.delta, tt.beta, tt.u, got, tt.want)
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
		at := EarlyRefreshAt(0, time.Duration(life), time.Duration(delta), beta, u)
		if at > time.Duration(life) || at < time.Duration(life)/2 {
			t.Fatalf("EarlyRefreshAt(life %v, δ %v, β %v, u %v) = %v; want in [life/2, life]", time.Duration(life), time.Duration(delta), beta, u, at)
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
		at := EarlyRefreshAt(time.Duration(loadedAt), time.Duration(life), time.Duration(delta), beta, u)
		if !(beta > 0) || delta <= 0 {
			if at != expiry {
				t.Fatalf("EarlyRefreshAt(%d, %d, δ %d, β %v, u %v) = %d; want the expiry %d", loadedAt, life, delta, beta, u, at, expiry)
			}
			return
		}
		if at > expiry || at < expiry-time.Duration(life)/2 {
			t.Fatalf("EarlyRefreshAt(%d, %d, δ %d, β %v, u %v) = %d; want in [%d, %d]", loadedAt, life, delta, beta, u, at, expiry-time.Duration(life)/2, expiry)
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
		lo, hi := RefreshDelay(n, base, limit, 0), RefreshDelay(n, base, limit, 0.999999)
		if lo != want[0] || hi < want[0] || hi > want[1] {
			t.Errorf("RefreshDelay(%d) spans [%v, %v]; want [%v, %v)", n, lo, hi, want[0], want[1])
		}
	}
	if d := RefreshDelay(1, 0, 0, math.NaN()); d < 1 {
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
		go func() { got <- RefreshDelay(tt.n, tt.base, tt.limit, tt.u) }()
		select {
		case d := <-got:
			if d < tt.lo || d > tt.hi {
				t.Errorf("RefreshDelay(%d, %v, %v, %v) = %v; want in [%v, %v]", tt.n, tt.base, tt.limit, tt.u, d, tt.lo, tt.hi)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("RefreshDelay(%d, %v, %v, %v) still running after 10s", tt.n, tt.base, tt.limit, tt.u)
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
		got := RefreshDelay(n, time.Duration(base), time.Duration(limit), u)
		b := max(base, 1)
		want := new(big.Int).Lsh(big.NewInt(b), uint(min(max(n-1, 0), 64)))
		if cap := big.NewInt(max(limit, b)); want.Cmp(cap) > 0 {
			want = cap
		}
		d := float64(want.Int64())
		slack := d/(1<<51) + 1 // the spread is computed in float64
		switch {
		case got < 1:
			t.Fatalf("RefreshDelay(%d, %d, %d, %v) = %v; want >= 1ns", n, base, limit, u, got)
		case float64(got) > d+slack:
			t.Fatalf("RefreshDelay(%d, %d, %d, %v) = %v; want <= %v", n, base, limit, u, got, want)
		case float64(got) < d/2-slack:
			t.Fatalf("RefreshDelay(%d, %d, %d, %v) = %v; want >= %v/2", n, base, limit, u, got, want)
		}
	})
}

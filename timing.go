package flightcache

import (
	"math"
	"time"
)

// This file holds the pure time arithmetic of the Loader: no clock reads and
// no random draws happen here. Callers pass the current time (as an offset
// from the Loader's epoch) and uniform random numbers in, so every function
// can be tested and fuzzed exhaustively.
//
// Every sum and product of durations in the package goes through addSat,
// mulSat or scaleSat, which saturate at the largest (or smallest) Duration
// instead of overflowing: a TTL, a window or a Retry.MaxInterval of
// math.MaxInt64 is a natural "never", and must not wrap into the past, nor
// into a loop that never ends.

// jitter returns the freshness lifetime of one entry: ttl scaled by a factor
// drawn uniformly from [1-spread, 1] with u in [0, 1). The result is never
// below 1ns (a lifetime of 0 would read as "never expires" in many caches)
// and never above ttl. Out-of-range inputs are clamped.
func jitter(ttl time.Duration, spread, u float64) time.Duration {
	if ttl < 1 {
		return 1
	}
	if !(spread > 0) || !(u > 0) { // also catches NaN
		return ttl
	}
	spread = min(spread, 1)
	u = min(u, 1)
	d := scaleSat(ttl, 1-spread*u)
	return min(max(d, 1), ttl)
}

// earlyRefreshAt places the early refresh of an entry loaded at loadedAt and
// fresh for life, whose load took delta. It is XFetch (Vattani,
// Chierichetti and Lowenstein, "Optimal Probabilistic Cache Stampede
// Prevention", VLDB 2015) with two changes:
//
//   - the random lead, delta·beta·(−ln u) with u uniform in (0, 1], is drawn
//     once per entry rather than at every read. Per read, the chance of an
//     early refresh compounds with the request rate: a key read thousands of
//     times a second would reload right after every load. Drawn once, the
//     refresh time keeps XFetch's exponential spread (keys loaded together
//     refresh apart; slower loads refresh earlier) at any request rate;
//   - the lead also includes delta itself, so a load as slow as the last one
//     finishes before the entry expires and no reader waits.
//
// The lead is capped at half the entry's life, so an entry is never
// refreshed right after it was loaded. beta <= 0 or delta <= 0 (unknown load
// time) means no early refresh: the result is the expiry itself.
func earlyRefreshAt(loadedAt, life, delta time.Duration, beta, u float64) time.Duration {
	expiry := addSat(loadedAt, life)
	if !(beta > 0) || delta <= 0 {
		return expiry
	}
	lead := life / 2
	if u > 0 {
		lead = min(lead, scaleSat(delta, 1+beta*-math.Log(min(u, 1))))
	}
	return expiry - lead
}

// refreshDelay is how long to wait before another background refresh of a
// key whose last n (>= 1) refreshes failed: base doubled per failure, capped
// at limit, then spread uniformly over [d/2, d) with u in [0, 1).
func refreshDelay(n int, base, limit time.Duration, u float64) time.Duration {
	if base <= 0 {
		base = 1
	}
	limit = max(limit, base)
	d := base
	for i := 1; i < n && d < limit; i++ { // at most 63 doublings: d saturates
		d = mulSat(d, 2)
	}
	d = min(d, limit)
	if !(u > 0) {
		u = 0
	}
	u = min(u, 1)
	return max(scaleSat(d, 0.5+0.5*u), 1)
}

// addSat returns a + b, saturating instead of overflowing.
func addSat(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// mulSat returns d·n, saturating instead of overflowing.
func mulSat(d time.Duration, n int64) time.Duration {
	if d == 0 || n == 0 {
		return 0
	}
	if p := d * time.Duration(n); p/time.Duration(n) == d && (n != -1 || d != math.MinInt64) {
		return p
	}
	if (d < 0) == (n < 0) {
		return math.MaxInt64
	}
	return math.MinInt64
}

// scaleSat returns d·f rounded toward zero, saturating instead of
// overflowing (Go leaves a float conversion out of range undefined); a NaN
// product gives 0.
func scaleSat(d time.Duration, f float64) time.Duration {
	switch p := float64(d) * f; {
	case p >= 1<<63:
		return math.MaxInt64
	case p <= -(1 << 63):
		return math.MinInt64
	case p == p:
		return time.Duration(p)
	}
	return 0
}

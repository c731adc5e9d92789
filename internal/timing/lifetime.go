package timing

import (
	"math"
	"time"
)

// Jitter returns the freshness lifetime of one cached value: ttl scaled by
// a factor drawn uniformly from [1-spread, 1] with u in [0, 1). The result
// is never below 1ns (a lifetime of 0 would read as "never expires" in
// many caches) and never above ttl. Out-of-range inputs are clamped: a ttl
// below 1ns gives 1ns, a spread or u that is not positive (or NaN) gives
// ttl, and a spread or u above 1 counts as 1.
func Jitter(ttl time.Duration, spread, u float64) time.Duration {
	if ttl < 1 {
		return 1
	}
	if !(spread > 0) || !(u > 0) { // also catches NaN
		return ttl
	}
	spread = min(spread, 1)
	u = min(u, 1)
	d := Scale(ttl, 1-spread*u)
	return min(max(d, 1), ttl)
}

// EarlyRefreshAt places the early refresh of a value loaded at loadedAt
// and fresh for life, whose load took delta. It is XFetch (Vattani,
// Chierichetti and Lowenstein, "Optimal Probabilistic Cache Stampede
// Prevention", VLDB 2015) with two changes:
//
//   - the random lead, delta·beta·(−ln u) with u uniform in (0, 1], is drawn
//     once per value rather than at every read. Per read, the chance of an
//     early refresh compounds with the request rate: a key read thousands of
//     times a second would reload right after every load. Drawn once, the
//     refresh time keeps XFetch's exponential spread (keys loaded together
//     refresh apart; slower loads refresh earlier) at any request rate;
//   - the lead also includes delta itself, so a load as slow as the last one
//     finishes before the value expires and no reader waits.
//
// The lead is capped at half the value's life, so a value is never
// refreshed right after it was loaded. beta <= 0 or delta <= 0 (unknown load
// time) means no early refresh: the result is the expiry itself,
// loadedAt+life saturated.
func EarlyRefreshAt(loadedAt, life, delta time.Duration, beta, u float64) time.Duration {
	expiry := Add(loadedAt, life)
	if !(beta > 0) || delta <= 0 {
		return expiry
	}
	lead := life / 2
	if u > 0 {
		lead = min(lead, Scale(delta, 1+beta*-math.Log(min(u, 1))))
	}
	return expiry - lead
}

// RefreshDelay is how long to wait before another background refresh of a
// key whose last n (>= 1) refreshes failed: base doubled per failure,
// capped at limit, then spread uniformly over [d/2, d) with u in [0, 1).
// It is never below 1ns; a base below 1ns counts as 1ns, a limit below
// base as base.
func RefreshDelay(n int, base, limit time.Duration, u float64) time.Duration {
	if base <= 0 {
		base = 1
	}
	limit = max(limit, base)
	d := base
	for i := 1; i < n && d < limit; i++ { // at most 63 doublings: d saturates
		d = Mul(d, 2)
	}
	d = min(d, limit)
	if !(u > 0) {
		u = 0
	}
	u = min(u, 1)
	return max(Scale(d, 0.5+0.5*u), 1)
}

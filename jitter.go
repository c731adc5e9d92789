package flightcache

import (
	"math"
	"time"
)

// This file holds the pure time arithmetic of the Loader: no clock reads and
// no random draws happen here. Callers pass the current time (as an offset
// from the Loader's epoch) and uniform random numbers in, so every function
// can be tested and fuzzed exhaustively.

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
	d := time.Duration(float64(ttl) * (1 - spread*u))
	return min(max(d, 1), ttl)
}

// phase is where an entry is in its life at a given moment.
type phase uint8

const (
	phaseFresh        phase = iota // served as a hit
	phaseStale                     // served at once, refreshed in the background
	phaseStaleIfError              // a caller loads; the value covers a failure
	phaseExpired                   // no use left: a miss
)

// windows are the stale windows that follow an entry's freshness.
type windows struct {
	staleWhileRevalidate time.Duration
	staleIfError         time.Duration
}

// phaseAt places now (an offset from the epoch) against an entry that is
// fresh until freshUntil. Negative entries (cached not-found errors) have no
// stale windows: pass the zero windows for them.
func (w windows) phaseAt(now, freshUntil time.Duration) phase {
	switch {
	case now < freshUntil:
		return phaseFresh
	case now < freshUntil+w.staleWhileRevalidate:
		return phaseStale
	case now < freshUntil+w.staleWhileRevalidate+w.staleIfError:
		return phaseStaleIfError
	default:
		return phaseExpired
	}
}

// xfetch is the probabilistic early-expiration test of Vattani, Chierichetti
// and Lowenstein ("Optimal Probabilistic Cache Stampede Prevention", VLDB
// 2015): refresh now if now - delta*beta*ln(u) >= expiry, where delta is how
// long the value took to load and u is uniform in (0, 1]. The chance grows as
// expiry nears and with slower loads; beta scales it (1 is the paper's
// optimum, >1 favours earlier refreshes). beta <= 0 or delta <= 0 disables it.
func xfetch(now, expiry, delta time.Duration, beta, u float64) bool {
	if !(beta > 0) || delta <= 0 || now >= expiry {
		return false
	}
	if !(u > 0) {
		return true // -ln(0) is +Inf: the earliest possible refresh
	}
	gap := float64(delta) * beta * -math.Log(min(u, 1))
	return float64(now)+gap >= float64(expiry)
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
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	if !(u > 0) {
		u = 0
	}
	u = min(u, 1)
	return max(time.Duration(float64(d)*(0.5+0.5*u)), 1)
}

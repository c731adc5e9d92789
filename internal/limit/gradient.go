package limit

import (
	"math"
	"time"
)

// gradient finds the adaptive bound of a [Limiter] from the downstream's
// latency, in the family of Envoy's adaptive concurrency filter and
// Netflix's Gradient2: the bound grows while the calls' mean latency stays
// near the lowest mean seen, and shrinks as it rises above it. It is pure
// arithmetic: the limiter passes it the time, each attempt's latency and
// outcome, and how many slots were in use, under the limiter's lock.
//
// # Means, not single calls
//
// The gradient compares means: the latency of about the last round trip
// (mean, a moving average over max(L, gradientRound) successful calls)
// against the anchor, the lowest mean of a block of gradientRounds round
// trips. One call says little: a downstream with a fast path (a not-found
// it knows at once, a hit in its own cache) answers some calls in
// microseconds and the others in milliseconds, at any load. Measured
// against its fastest call, every other call looks overloaded, and a fifth
// of instant answers held the bound at a few slots with nothing
// overloaded; measured as means, a steady mix is a steady latency, and
// only a rise of the mix is a rise. An anchor's block is long so that its
// mean is steady too: a short one may catch a run of fast answers by
// chance, an anchor lower than the mix ever is again.
//
// # The anchor
//
// The anchor is the lowest block mean seen so far, with the most slots in
// use while a block was that fast, within gradientFlat (anchorAt: a
// downstream whose latency is flat up to some load has the anchor's
// latency up to there). It is not a long-term average: an average follows
// a downstream that slows from its first call up past its capacity, so the
// gradient would read every step up as normal. Failures give no latency:
// an overload error that comes back at once is not a fast answer.
//
// A clearly lower block moves the anchor down at once. To follow a
// downstream that has become slower for good (a bigger table, a move to
// another region), the anchor may also move up, but only on evidence taken
// at no more load than the anchor's: over each window of gradientWindow,
// the lowest mean of the blocks run with at most max(anchorAt, MinLoads)
// slots in use (if they held at least gradientEvidence calls) replaces the
// anchor if it is higher, and no block of the window was as fast as the
// anchor. A block that is slower at a higher load says that load is too
// high, which is the gradient's signal, not a new normal. So a storm's own
// queueing cannot walk the anchor up; once the storm is over, or the bound
// is down to MinLoads, a downstream that really is slower is re-anchored
// within two windows. A one-off fast block holds the anchor low in the
// same way, until such a window.
//
// The window is long (seconds, not round trips) on purpose. From here, a
// downstream made slower for good looks the same as one made slower by
// someone else's load, other processes or other clients of it; a short
// window would take that load in as the new normal and let the bound grow
// back into it, a long one only takes in what lasts. Envoy re-measures its
// minimum once a minute, at a forced low concurrency, for the same reason.
//
// # The bound
//
// The first block is the Limiter's start, not the downstream's steady mix
// (the first keys asked for may all be of one kind, all not-founds, say),
// and sets no anchor. Until the second block has set it, the bound holds:
// there is nothing to measure the mean against. Then each successful
// sample gives
// the gradient g = tolerance·anchor/mean, clamped to [gradientMinGrad, 1]:
// 1 while the mean is within the tolerance of the anchor. The bound L then
// moves by (g·L + √L − L)/L: a round trip of L samples moves it by about
// g·L + √L − L, Envoy's update, with √L of headroom so that a bound that is
// right keeps probing a little above itself. At rest, the mean latency is
// tolerance·anchor/(1 − 1/√L). The bound only grows while at least half
// of it is in use: a trickle of misses says nothing about a larger bound
// and leaves it where it is.
//
// A timeout cuts the bound by gradientTimeoutCut, and a failure (one that
// says the downstream is failing) by gradientFailureCut, at once, while at least half of it is in
// use (a failing key in a trickle is not overload). One cut per
// generation, as TCP halves its window once per round trip: a failure of a
// call that started before the last cut has been answered by that cut.
type gradient struct {
	lo, hi float64 // MinLoads and MaxLoads
	limit  float64 // the bound, in [lo, hi]; bound() is the slots

	mean    float64 // mean latency of about the last round trip of successful calls, in ns; 0 before the first
	sum     float64 // latencies of the current block's calls, in ns
	count   int     // calls in the current block
	busiest int     // most slots in use at the end of a call of the current block
	started bool    // the first block, the Limiter's start, is over

	anchor   time.Duration // lowest block mean; 0 before the first block
	anchorAt int           // most slots in use while a block was that fast
	window   time.Duration // when the current re-anchoring window started
	low      time.Duration // lowest mean of the window's blocks run at no more load than the anchor's
	lows     int           // how many calls such blocks have held
	lastCut  time.Duration // when the bound was last cut; calls that started before it cut no more
	cut      bool          // lastCut is set
}

// AdaptiveStart is the bound an adaptive Limiter starts at, within
// [Config.MinLoads, Config.MaxLoads].
const AdaptiveStart = 20

// Tuning of the adaptive bound (see gradient).
const (
	gradientTolerance  = 2.0              // a mean within this × the anchor is "near the minimum"
	gradientFlat       = 1.1              // a block mean within this × the anchor is as fast as it
	gradientMinGrad    = 0.5              // one sample never pulls harder than halving the bound per round trip
	gradientRound      = 20               // fewest calls a round trip's mean spans (under a bound that low)
	gradientRounds     = 10               // round trips an anchor's block spans
	gradientFailureCut = 0.9              // × the bound on a failure (SampleFailure)
	gradientTimeoutCut = 0.5              // × the bound on a timeout
	gradientWindow     = 10 * time.Second // the re-anchoring window
	gradientEvidence   = 10               // calls a window needs to re-anchor
)

// Sample is what one attempt says to the adaptive bound (Limiter.Sample).
type Sample uint8

const (
	// SampleOK: the downstream answered (a value, a not-found, or an
	// error that says nothing of its load): its latency counts.
	SampleOK Sample = iota
	// SampleFailure: a failure that says the downstream is failing, not
	// a timeout.
	SampleFailure
	// SampleTimeout: the attempt ran past its time.
	SampleTimeout
	// SampleIgnored: the attempt was cut short by its callers or a
	// shutdown; it says nothing and gives no sample.
	SampleIgnored
)

// newGradient returns the adaptive bound between minLoads and maxLoads
// (1 <= minLoads <= maxLoads), starting at AdaptiveStart.
func newGradient(minLoads, maxLoads int) gradient {
	lo, hi := float64(minLoads), float64(maxLoads)
	return gradient{lo: lo, hi: hi, limit: min(max(AdaptiveStart, lo), hi)}
}

// bound is the slots the bound allows now. It saturates: a ceiling of
// math.MaxInt is 2⁶³ as a float64, one past every int.
func (g *gradient) bound() int {
	if g.limit >= float64(math.MaxInt) {
		return math.MaxInt
	}
	return int(g.limit)
}

// observe takes one attempt's sample: at now, an attempt of the given
// latency ended as k, with inUse slots in use (its own included). It
// returns the bound.
func (g *gradient) observe(now, latency time.Duration, k Sample, inUse int) int {
	b := g.bound()
	busy := inUse >= b-b/2 // at least half the bound is in use (2·inUse may overflow)
	switch k {
	case SampleIgnored:
	case SampleFailure, SampleTimeout:
		if start := now - latency; busy && (!g.cut || start >= g.lastCut) {
			f := gradientFailureCut
			if k == SampleTimeout {
				f = gradientTimeoutCut
			}
			g.limit = max(g.limit*f, g.lo)
			g.lastCut, g.cut = now, true
		}
	case SampleOK:
		g.average(now, max(latency, 1), inUse)
		if g.anchor == 0 {
			break // no anchor yet: nothing to measure the mean against
		}
		grad := min(max(gradientTolerance*float64(g.anchor)/g.mean, gradientMinGrad), 1)
		step := grad - 1 + 1/math.Sqrt(g.limit) // (grad·L + √L − L) / L
		if step < 0 || busy {
			g.limit = min(max(g.limit+step, g.lo), g.hi)
		}
	}
	return g.bound()
}

// average adds a successful latency x, seen at now with inUse slots in
// use, to the mean and to the current block; a block of gradientRounds
// round trips, once complete, moves the anchor.
func (g *gradient) average(now, x time.Duration, inUse int) {
	round := max(g.limit, gradientRound)
	if g.mean == 0 {
		g.mean = float64(x)
	}
	g.mean += (float64(x) - g.mean) / round
	g.sum += float64(x)
	g.count++
	g.busiest = max(g.busiest, inUse)
	if float64(g.count) >= gradientRounds*round {
		if g.started {
			g.reanchor(now, time.Duration(g.sum/float64(g.count)), g.busiest, g.count)
		}
		g.sum, g.count, g.busiest, g.started = 0, 0, 0, true
	}
}

// reanchor moves the anchor for a block of n successful calls whose mean
// latency was x, ending at now, with at most inUse slots in use (see
// gradient).
func (g *gradient) reanchor(now, x time.Duration, inUse, n int) {
	if now-g.window >= gradientWindow {
		if g.lows >= gradientEvidence && g.low > g.anchor {
			g.anchor = g.low // slower at no more load: the downstream itself is slower
		}
		g.window, g.low, g.lows = now, 0, 0
	}
	switch {
	case g.anchor == 0 || float64(x)*gradientFlat < float64(g.anchor): // clearly faster: a new minimum
		g.anchor, g.anchorAt = x, inUse
		g.low, g.lows = 0, 0
	case float64(x) <= float64(g.anchor)*gradientFlat: // as fast: the anchor holds, up to this load
		g.anchor, g.anchorAt = min(g.anchor, x), max(g.anchorAt, inUse)
		g.low, g.lows = 0, 0
	case float64(inUse) <= max(float64(g.anchorAt), g.lo):
		if g.lows == 0 || x < g.low {
			g.low = x
		}
		g.lows = min(g.lows, math.MaxInt-n) + n
	}
}

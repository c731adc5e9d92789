package limit

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// knee is the storm's downstream of the Limit issue: a call takes
// 2 ms × (1 + n/50)² with n calls in flight, n counting the other load on
// it (extra) as well as ours.
func knee(extra int) func(n int) time.Duration {
	return func(n int) time.Duration {
		f := 1 + float64(n+extra)/50
		return time.Duration(2 * float64(time.Millisecond) * f * f)
	}
}

// flat is a downstream that takes d whatever the load.
func flat(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }

// saturate feeds g n samples of a storm: every slot of the bound is in use
// and each call takes lat(bound); the clock advances by one call's share
// of a round trip per sample. It returns the lowest and highest bound seen.
func saturate(g *gradient, now *time.Duration, n int, lat func(int) time.Duration) (lo, hi int) {
	lo, hi = g.bound(), g.bound()
	for range n {
		b := g.bound()
		d := lat(b)
		*now += d / time.Duration(b)
		g.observe(*now, d, SampleOK, b)
		lo, hi = min(lo, g.bound()), max(hi, g.bound())
	}
	return lo, hi
}

func TestGradientStart(t *testing.T) {
	for _, tt := range []struct{ lo, hi, want int }{
		{1, 200, AdaptiveStart}, {1, 8, 8}, {30, 40, 30}, {1, 1, 1},
	} {
		g := newGradient(tt.lo, tt.hi)
		if got := g.bound(); got != tt.want {
			t.Errorf("newGradient(%d, %d).bound() = %d; want %d", tt.lo, tt.hi, got, tt.want)
		}
	}
}

// Against the downstream, the bound settles below the downstream's
// capacity (100 calls at once), falls when someone else's load raises the
// latency, and returns once it is gone.
func TestGradientFallsAndReturns(t *testing.T) {
	g := newGradient(1, 200)
	var now time.Duration
	_, hi := saturate(&g, &now, 3000, knee(0))
	settled := g.bound()
	if hi >= 100 || settled < 35 || settled > 80 {
		t.Fatalf("alone: bound settled at %d (highest %d); want 35 to 80, never 100", settled, hi)
	}
	saturate(&g, &now, 1000, knee(60)) // 60 more calls from elsewhere
	loaded := g.bound()
	if loaded > settled/2 {
		t.Errorf("with 60 calls from elsewhere: bound %d; want it to fall below half of %d", loaded, settled)
	}
	// Back at a low bound, the calls are faster than the storm's first ones
	// were: the anchor moves down to them, so the bound settles a little
	// lower than it first did.
	saturate(&g, &now, 3000, knee(0))
	if back := g.bound(); back < 35 || back < 3*loaded || back >= 100 {
		t.Errorf("once the other load is gone: bound %d; want it back from %d to 35 or more, under 100", back, loaded)
	}
	if now >= gradientWindow {
		t.Fatalf("the test ran %v of virtual time, past a re-anchoring window: it tests the gradient alone", now)
	}
}

// A latency that does not depend on the load lets the bound grow to the
// ceiling, at √bound per round trip of samples; latency four times the
// minimum brings it down to where the headroom balances the gradient.
func TestGradientGrowsAndShrinks(t *testing.T) {
	g := newGradient(1, 100)
	var now time.Duration
	if _, hi := saturate(&g, &now, 2000, flat(time.Millisecond)); hi != 100 || g.bound() != 100 {
		t.Fatalf("flat latency: bound %d (highest %d); want the ceiling, 100", g.bound(), hi)
	}
	lo, _ := saturate(&g, &now, 500, flat(4*time.Millisecond))
	if lo > 5 {
		t.Errorf("latency 4× the minimum: bound fell to %d; want at most 5 (1/√bound = 1 − gradientMinGrad)", lo)
	}
}

// A trickle of misses, far below half the bound, neither grows the bound
// nor cuts it on failures: it says nothing about a larger bound, and a
// failing key in a trickle is not overload.
func TestGradientTrickleLeavesIt(t *testing.T) {
	g := newGradient(1, 200)
	var now time.Duration
	for range 10_000 {
		now += time.Millisecond
		g.observe(now, time.Millisecond, SampleOK, 1)
	}
	for range 100 {
		now += time.Millisecond
		g.observe(now, time.Millisecond, SampleFailure, 1)
		now += time.Millisecond
		g.observe(now, time.Millisecond, SampleTimeout, 2)
	}
	if got := g.bound(); got != AdaptiveStart {
		t.Errorf("after a trickle of 10,000 loads and 200 failures: bound %d; want it left at %d", got, AdaptiveStart)
	}
}

// An overload error that comes back at once is not a fast answer: it does
// not move the anchor, it cuts the bound, once per generation of calls.
func TestGradientFastFailuresCut(t *testing.T) {
	g := newGradient(1, 200)
	now := time.Second
	saturate(&g, &now, 3, flat(4*time.Millisecond))
	anchor, b := g.anchor, g.limit
	for range 50 { // calls that started before the first cut: one cut
		now += time.Microsecond
		g.observe(now, time.Millisecond, SampleFailure, g.bound())
	}
	if g.anchor != anchor {
		t.Errorf("fast failures moved the anchor from %v to %v", anchor, g.anchor)
	}
	if want := b * gradientFailureCut; g.limit != want {
		t.Errorf("50 failures of one generation: bound %v; want one cut, %v × %v = %v", g.limit, b, gradientFailureCut, want)
	}
	b = g.limit
	now += time.Second // a call that started after the cut cuts again
	g.observe(now, time.Millisecond, SampleFailure, g.bound())
	if want := b * gradientFailureCut; g.limit != want {
		t.Errorf("a failure of the next generation: bound %v; want %v", g.limit, want)
	}
	b = g.limit
	now += time.Second
	g.observe(now, time.Millisecond, SampleTimeout, g.bound())
	if want := b * gradientTimeoutCut; g.limit != want {
		t.Errorf("a timeout: bound %v; want %v × %v", g.limit, b, gradientTimeoutCut)
	}
	b = g.limit
	g.observe(now+time.Second, 0, SampleIgnored, g.bound())
	if g.limit != b {
		t.Errorf("an ignored sample changed the bound from %v to %v", b, g.limit)
	}
	for range 100 {
		now += time.Second
		g.observe(now, time.Millisecond, SampleTimeout, g.bound())
	}
	if got := g.bound(); got != 1 {
		t.Errorf("after 100 timeouts: bound %d; want the floor, 1", got)
	}
}

// A storm's own queueing never walks the anchor up, however long it
// lasts; a downstream slower for good, seen at no more load than the
// anchor was, is re-anchored within two windows, and the bound grows back.
func TestGradientReanchors(t *testing.T) {
	g := newGradient(1, 100)
	var now time.Duration
	_, hi := saturate(&g, &now, 200_000, knee(0)) // about 30 s of storm
	if now < 3*gradientWindow {
		t.Fatalf("the storm lasted %v; want at least three windows", now)
	}
	if g.anchor > knee(0)(AdaptiveStart+2) || hi >= 100 {
		t.Errorf("after a storm of %v: anchor %v, highest bound %d; want the anchor at the storm's first latency and under 100", now, g.anchor, hi)
	}

	g = newGradient(1, 100)
	now = 0
	for range 1000 { // a trickle: the anchor is 2 ms, at one call
		now += 10 * time.Millisecond
		g.observe(now, 2*time.Millisecond, SampleOK, 1)
	}
	slow := 6 * time.Millisecond
	for now < 3*gradientWindow { // the downstream is now 3× slower
		now += 10 * time.Millisecond
		g.observe(now, slow, SampleOK, 1)
	}
	if g.anchor != slow {
		t.Errorf("after %v of a downstream slower for good: anchor %v; want %v", now, g.anchor, slow)
	}
	if saturate(&g, &now, 2000, flat(slow)); g.bound() != 100 {
		t.Errorf("re-anchored, a flat downstream: bound %d; want the ceiling, 100", g.bound())
	}
}

// mixed is a downstream with a fast path: a share of its calls (a
// not-found it knows at once, a hit in its own cache) take fast, the
// others slow(n); which ones is drawn from a fixed seed.
func mixed(share float64, fast time.Duration, slow func(int) time.Duration) func(int) time.Duration {
	rng := rand.New(rand.NewPCG(1, 2))
	return func(n int) time.Duration {
		if rng.Float64() < share {
			return fast
		}
		return slow(n)
	}
}

// A steady share of fast answers is not a lower latency the others fall
// short of: against a downstream whose slow calls take 5ms whatever the
// load, the bound grows to the ceiling and stays there, window after
// window, whatever the share, even when the first 150 calls all took the
// fast path.
func TestGradientFastPathKeepsTheBound(t *testing.T) {
	for _, share := range []float64{0.2, 0.5, 0.8} {
		g := newGradient(1, 100)
		var now time.Duration
		saturate(&g, &now, 150, flat(20*time.Microsecond))
		lat := mixed(share, 20*time.Microsecond, flat(5*time.Millisecond))
		saturate(&g, &now, 20_000, lat)
		lo, start := g.bound(), now
		for now-start < 3*gradientWindow {
			l, _ := saturate(&g, &now, 10_000, lat)
			lo = min(lo, l)
		}
		if lo < 90 || g.bound() != 100 {
			t.Errorf("%v%% fast: bound fell to %d over %v, %d at the end; want it held at 90 or more, 100 at the end", share*100, lo, now-start, g.bound())
		}
	}
}

// A fast path does not hide overload either: with a fifth of the calls
// answered at once and the others on the downstream, the bound
// settles below its capacity, falls when someone else's load raises the
// latency, and returns once it is gone.
func TestGradientFastPathStillFalls(t *testing.T) {
	g := newGradient(1, 200)
	var now time.Duration
	fast := 20 * time.Microsecond
	_, hi := saturate(&g, &now, 3000, mixed(0.2, fast, knee(0)))
	settled := g.bound()
	if hi >= 100 || settled < 35 || settled > 80 {
		t.Fatalf("alone: bound settled at %d (highest %d); want 35 to 80, never 100", settled, hi)
	}
	saturate(&g, &now, 1000, mixed(0.2, fast, knee(60)))
	loaded := g.bound()
	if loaded > settled/2 {
		t.Errorf("with 60 calls from elsewhere: bound %d; want it to fall below half of %d", loaded, settled)
	}
	saturate(&g, &now, 3000, mixed(0.2, fast, knee(0)))
	if back := g.bound(); back < 35 || back < 3*loaded || back >= 100 {
		t.Errorf("once the other load is gone: bound %d; want it back from %d to 35 or more, under 100", back, loaded)
	}
}

// Whatever the samples, the bound stays within [MinLoads, MaxLoads].
func FuzzGradient(f *testing.F) {
	f.Add(uint8(1), uint8(200), []byte{0, 10, 20, 1, 200, 3, 2, 255, 0, 9})
	f.Add(uint8(5), uint8(5), []byte{1, 1, 1, 2, 2, 2})
	f.Fuzz(func(t *testing.T, lo, hi uint8, samples []byte) {
		if lo == 0 || hi < lo {
			t.Skip()
		}
		g := newGradient(int(lo), int(hi))
		var now time.Duration
		for i := 0; i+2 < len(samples); i += 3 {
			now += time.Duration(samples[i]) * time.Millisecond
			latency := time.Duration(samples[i+1]) * 100 * time.Microsecond // 0 included
			kind := Sample(samples[i+2] % 4)
			inUse := int(samples[i+2] / 4)
			b := g.observe(now, latency, kind, inUse)
			if b < int(lo) || b > int(hi) || math.IsNaN(g.limit) {
				t.Fatalf("bound %d (limit %v) outside [%d, %d]", b, g.limit, lo, hi)
			}
		}
	})
}

// The adaptive bound saturates at the largest int: its float arithmetic
// never turns it negative, whatever it is fed.
func TestGradientHugeBounds(t *testing.T) {
	for _, lo := range []int{1, AdaptiveStart, math.MaxInt} {
		g := newGradient(lo, math.MaxInt)
		now := time.Second
		for i := range 1000 {
			now += time.Millisecond
			k := SampleOK
			if i%7 == 6 {
				k = SampleTimeout
			}
			if b := g.observe(now, time.Millisecond, k, max(g.bound(), 1)); b < min(lo, AdaptiveStart) || b < 1 {
				t.Fatalf("newGradient(%d, MaxInt): bound %d after %d samples; want at least %d", lo, b, i+1, min(lo, AdaptiveStart))
			}
		}
	}
}

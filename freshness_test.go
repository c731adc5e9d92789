package flightcache

import (
	"math"
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

// An entry keeps its early refresh to the microsecond, rounded up: the lead
// of a load faster than a millisecond does not vanish, and is never
// shorter than the load took (what earlyRefreshAt promises).
func TestEntryKeepsItsEarlyRefreshLead(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{EarlyRefresh: 1})
	took := 300 * time.Microsecond
	for range 1000 {
		e := l.newEntry("k", "v", time.Hour, lifetime{ttl: time.Minute}, took, 0)
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

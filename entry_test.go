package flightcache

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

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

// An entry keeps its early refresh to the microsecond, rounded up: the lead
// of a load faster than a millisecond does not vanish, and is never
// shorter than the load took (what timing.EarlyRefreshAt promises).
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
	if d := timing.RefreshDelay(math.MaxInt, time.Millisecond, time.Minute, 1); d != time.Minute {
		t.Fatalf("RefreshDelay at the saturated count = %v, want the limit (1m)", d)
	}
}

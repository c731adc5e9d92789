package remote

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// The phase rule, the one the Loader serves its entries by.
func TestPhaseAt(t *testing.T) {
	w := Windows{StaleWhileRevalidate: 10, StaleIfError: 5}
	for now, want := range map[time.Duration]Phase{
		99: PhaseFresh, 100: PhaseStale, 109: PhaseStale, 110: PhaseStaleIfError,
		114: PhaseStaleIfError, 115: PhaseExpired, 1000: PhaseExpired,
	} {
		if got := w.PhaseAt(now, 100); got != want {
			t.Errorf("PhaseAt(%d, 100) = %d; want %d", now, got, want)
		}
	}
	if got := (Windows{}).PhaseAt(100, 100); got != PhaseExpired {
		t.Errorf("no windows: PhaseAt(expiry) = %d; want expired", got)
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
		w := Windows{StaleWhileRevalidate: time.Duration(swr), StaleIfError: time.Duration(sie)}
		n, fu := big.NewInt(now), big.NewInt(freshUntil)
		staleUntil := new(big.Int).Add(fu, big.NewInt(swr))
		errUntil := new(big.Int).Add(staleUntil, big.NewInt(sie))
		want := PhaseExpired
		switch {
		case n.Cmp(fu) < 0:
			want = PhaseFresh
		case n.Cmp(staleUntil) < 0:
			want = PhaseStale
		case n.Cmp(errUntil) < 0:
			want = PhaseStaleIfError
		}
		if got := w.PhaseAt(time.Duration(now), time.Duration(freshUntil)); got != want {
			t.Fatalf("PhaseAt(%d, %d) with windows %d, %d = %d; want %d", now, freshUntil, swr, sie, got, want)
		}
	})
}

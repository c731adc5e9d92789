package flightcache

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
	"github.com/flightcache/flightcache/remote"
)

// forever is the largest duration: "never", for the Loader's options.
const forever = time.Duration(math.MaxInt64)

// The root's Phase names are the phases the Loader serves its entries by
// (remote's), value for value.
func TestPhaseMirrorsTheLoadersPhase(t *testing.T) {
	for _, tc := range []struct {
		p    remote.Phase
		want Phase
		name string
	}{
		{remote.PhaseFresh, PhaseFresh, "fresh"},
		{remote.PhaseStale, PhaseStale, "stale"},
		{remote.PhaseStaleIfError, PhaseStaleIfError, "stale-if-error"},
		{remote.PhaseExpired, PhaseExpired, "expired"},
	} {
		if got := Phase(tc.p); got != tc.want || got.String() != tc.name {
			t.Errorf("Phase(%d) = %v (%q); want %v (%q)", tc.p, got, got.String(), tc.want, tc.name)
		}
	}
}

// Bounds.PhaseAt is the Loader's rule (Windows.PhaseAt) placed on times: a
// value loaded at t0 is, age later, in the phase phaseAt gives it at that
// age, at every boundary, for windows of every size up to "never".
func TestBoundsPhaseAtIsTheLoadersRule(t *testing.T) {
	t0 := time.Now()
	ws := []Windows{
		{Fresh: time.Second},
		{Fresh: time.Second, StaleWhileRevalidate: time.Minute},
		{Fresh: time.Second, StaleIfError: time.Hour},
		{Fresh: time.Second, StaleWhileRevalidate: time.Minute, StaleIfError: time.Hour},
		{Fresh: 1, StaleWhileRevalidate: 1, StaleIfError: 1},
		{Fresh: forever},
		{Fresh: forever, StaleWhileRevalidate: forever, StaleIfError: forever},
		{Fresh: time.Hour, StaleWhileRevalidate: forever},
		{Fresh: time.Hour, StaleIfError: forever},
		{Fresh: forever / 2, StaleWhileRevalidate: forever / 2, StaleIfError: forever / 2},
	}
	for _, w := range ws {
		b := w.Bounds(t0)
		ends := []time.Duration{w.Fresh, timing.Add(w.Fresh, w.StaleWhileRevalidate),
			timing.Add(timing.Add(w.Fresh, w.StaleWhileRevalidate), w.StaleIfError)}
		ages := []time.Duration{math.MinInt64, -time.Hour, -1, 0, 1, time.Second / 2, time.Hour, 1 << 62}
		for _, e := range ends {
			ages = append(ages, e-1, e, timing.Add(e, 1))
		}
		for range 50 {
			ages = append(ages, time.Duration(rand.Int64N(math.MaxInt64)))
		}
		for _, age := range ages {
			if age == math.MaxInt64 {
				continue // where the Loader's sums saturate (see PhaseAt)
			}
			want := Windows{StaleWhileRevalidate: w.StaleWhileRevalidate, StaleIfError: w.StaleIfError}.PhaseAt(age, w.Fresh)
			if got := b.PhaseAt(t0.Add(age)); got != want {
				t.Errorf("%+v: Bounds(t0).PhaseAt(t0+%v) = %v; want %v (phaseAt)", w, age, got, want)
			}
		}
	}
}

// The bounds of a value are its windows added up from when it was loaded,
// and a Remote that stores them and reads them back (on another process's
// clock, without a monotonic reading) places the value alike.
func TestWindowsBounds(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	w := Windows{Fresh: 10 * time.Second, StaleWhileRevalidate: time.Minute, StaleIfError: time.Hour}
	want := Bounds{RefreshFrom: t0.Add(10 * time.Second), FreshUntil: t0.Add(10 * time.Second),
		StaleUntil: t0.Add(70 * time.Second), UsableUntil: t0.Add(time.Hour + 70*time.Second)}
	if got := w.Bounds(t0); got != want {
		t.Errorf("Bounds(t0) = %+v; want %+v", got, want)
	}
	b := w.Bounds(time.Now())
	stored := Bounds{
		FreshUntil:  time.UnixMicro(b.FreshUntil.UnixMicro()),
		StaleUntil:  time.UnixMicro(b.StaleUntil.UnixMicro()),
		UsableUntil: time.UnixMicro(b.UsableUntil.UnixMicro()),
	}
	for _, at := range []time.Duration{0, 5 * time.Second, 30 * time.Second, 30 * time.Minute, 2 * time.Hour} {
		now := time.Now().Add(at)
		if got, want := stored.PhaseAt(now), b.PhaseAt(now); got != want {
			t.Errorf("stored bounds at +%v: %v; want %v, as the bounds as made", at, got, want)
		}
	}
	if got := (Bounds{}).PhaseAt(time.Now()); got != PhaseExpired {
		t.Errorf("Bounds{}.PhaseAt(now) = %v; want expired", got)
	}
}

// With EarlyRefresh, no process refreshes a value before RefreshFrom: the
// Loader's early refresh (timing.EarlyRefreshAt) of a value fresh for Fresh, for
// any load time and draw, is never earlier.
func TestBoundsRefreshFrom(t *testing.T) {
	t0 := time.Now()
	for _, fresh := range []time.Duration{1, 3, time.Second, 7*time.Second + 1, forever} {
		w := Windows{Fresh: fresh, EarlyRefresh: true}
		b := w.Bounds(t0)
		if got, want := b.RefreshFrom, t0.Add(fresh-fresh/2); !got.Equal(want) {
			t.Errorf("Fresh %v: RefreshFrom = t0+%v; want t0+%v, halfway", fresh, got.Sub(t0), want.Sub(t0))
		}
		for range 200 {
			delta := time.Duration(rand.Int64N(int64(min(fresh, time.Hour)))) + 1
			at := timing.EarlyRefreshAt(0, fresh, delta, 10*rand.Float64(), rand.Float64())
			if t0.Add(at).Before(b.RefreshFrom) {
				t.Fatalf("Fresh %v: the Loader refreshes at %v (delta %v); RefreshFrom is %v", fresh, at, delta, b.RefreshFrom.Sub(t0))
			}
		}
		w.EarlyRefresh = false
		if b := w.Bounds(t0); !b.RefreshFrom.Equal(b.FreshUntil) {
			t.Errorf("Fresh %v without EarlyRefresh: RefreshFrom = %v; want FreshUntil %v", fresh, b.RefreshFrom, b.FreshUntil)
		}
	}
}

// At the extremes the bounds saturate instead of wrapping: windows of
// "never" from the timing.Latest time a time.Time holds stay there, in order, and
// bounds centuries apart are placed exactly.
func TestBoundsSaturate(t *testing.T) {
	w := Windows{Fresh: forever, StaleWhileRevalidate: forever, StaleIfError: forever, EarlyRefresh: true}
	for _, at := range []time.Time{time.Now(), timing.Latest.Add(-time.Hour), timing.Latest} {
		b := w.Bounds(at)
		if b.FreshUntil.Before(at) || b.StaleUntil.Before(b.FreshUntil) || b.UsableUntil.Before(b.StaleUntil) || b.RefreshFrom.Before(at) {
			t.Errorf("Bounds(%v) = %+v; want every bound at or after the load, in order", at, b)
		}
		if got := b.PhaseAt(at); got != PhaseFresh && !at.Equal(timing.Latest) { // loaded at the last instant: nothing left
			t.Errorf("Bounds(%v).PhaseAt(loaded) = %v; want fresh", at, got)
		}
	}
	b := w.Bounds(time.Now())
	if got := b.PhaseAt(time.Now().Add(forever)); got != PhaseStale {
		t.Errorf("292 years on, with every window \"never\": %v; want stale", got)
	}
	// Bounds hundreds of thousands of years apart, as a Remote may read
	// them back: no offset from now fits a Duration, and the order holds.
	far := Bounds{FreshUntil: time.UnixMicro(math.MinInt64), StaleUntil: time.UnixMicro(math.MaxInt64), UsableUntil: time.UnixMicro(math.MaxInt64)}
	if got := far.PhaseAt(time.Now()); got != PhaseStale {
		t.Errorf("between bounds at the ends of time: %v; want stale", got)
	}
	far.StaleUntil = far.FreshUntil
	if got := far.PhaseAt(time.Now()); got != PhaseStaleIfError {
		t.Errorf("between a past stale bound and a usable bound at the end of time: %v; want stale-if-error", got)
	}
	if got := far.PhaseAt(time.UnixMicro(math.MaxInt64)); got != PhaseExpired {
		t.Errorf("at the usable bound itself: %v; want expired", got)
	}
}

// StaleMayCover is the Loader's rule: any failure but a not-found (by the
// Loader's rule, judged by the caller) and the Loader's shutdown.
func TestStaleMayCover(t *testing.T) {
	for _, tc := range []struct {
		err      error
		notFound bool
		want     bool
	}{
		{nil, false, false},
		{errBoom, false, true},
		{fmt.Errorf("wrapped: %w", errBoom), false, true},
		{errBoom, true, false}, // the Loader's IsNotFound said so
		{ErrNotFound, true, false},
		{ErrClosed, false, false},
		{fmt.Errorf("load: %w", ErrClosed), false, false},
		{fmt.Errorf("%w: open", ErrBreakerOpen), false, true},
		{ErrLoadTimeout, false, true},
		{context.DeadlineExceeded, false, true},
		{&PanicError{Value: "boom"}, false, true},
		{ErrGoexit, false, true},
	} {
		if got := StaleMayCover(tc.err, tc.notFound); got != tc.want {
			t.Errorf("StaleMayCover(%v, %v) = %v; want %v", tc.err, tc.notFound, got, tc.want)
		}
	}
}

// Breaker.WithDefaults gives the settings the Loader's own breaker runs
// with: New's defaults for zero thresholds, the rest as set.
func TestBreakerWithDefaults(t *testing.T) {
	want := Breaker{ConsecutiveFailures: DefaultConsecutiveFailures, OpenTimeout: DefaultOpenTimeout, HalfOpenRequests: DefaultHalfOpenRequests}
	if got := (Breaker{}).WithDefaults(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Breaker{}.WithDefaults() = %+v; want %+v", got, want)
	}
	set := Breaker{Disabled: true, ConsecutiveFailures: 2, OpenTimeout: time.Minute, HalfOpenRequests: 3}
	if got := set.WithDefaults(); fmt.Sprint(got) != fmt.Sprint(set) {
		t.Errorf("WithDefaults() of %+v = %+v; want it unchanged", set, got)
	}
	for _, b := range []Breaker{{}, set, {OpenTimeout: time.Second}} {
		o := Options[string, string]{TTL: time.Second, Breaker: b}.withDefaults()
		if got := b.WithDefaults(); fmt.Sprint(got) != fmt.Sprint(o.Breaker) {
			t.Errorf("WithDefaults() of %+v = %+v; want the Loader's %+v", b, got, o.Breaker)
		}
	}
}

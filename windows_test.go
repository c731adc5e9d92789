package flightcache

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// The windows New hands a Remote (Rules.Windows) are the Loader's own
// rules: the shortest freshness any entry draws (what the Loader judges
// never-cached values by), the windows, and LoadTimeout with its default;
// and New rejects bad ones, naming the field, before any Remote sees them.
func TestRulesWindows(t *testing.T) {
	r := &attachingRemote{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}}
	newLoader(t, &downstream{}, Options[string, string]{TTL: 10 * time.Second, Jitter: 0.2, StaleWhileRevalidate: time.Second,
		StaleIfError: time.Minute, EarlyRefresh: 1, Remote: r})
	want := Windows{Fresh: 8 * time.Second, TTL: 10 * time.Second, Jitter: 0.2, StaleWhileRevalidate: time.Second,
		StaleIfError: time.Minute, EarlyRefresh: true, LoadTimeout: DefaultLoadTimeout}
	if len(r.rules) != 1 || r.rules[0].Windows != want {
		t.Errorf("Attach: rules %+v; want Windows %+v", r.rules, want)
	}
	if w := (Options[string, int]{TTL: time.Second, Jitter: 1}).windows(); w.Fresh <= 0 {
		t.Errorf("windows().Fresh with Jitter 1 = %v; want > 0", w.Fresh)
	}
	bad := &attachingRemote{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}}
	_, err := New((&downstream{}).load, Options[string, string]{TTL: time.Second, Jitter: 3, Remote: bad})
	if err == nil || !strings.Contains(err.Error(), "Options.Jitter ") || len(bad.rules) != 0 {
		t.Errorf("New with Jitter 3 = %v (rules attached: %d); want an error naming Options.Jitter, nothing attached", err, len(bad.rules))
	}
}

// Windows.Draw is the Loader's draw of one entry's freshness (jitter):
// within [Fresh, TTL], never 0, TTL at u = 0, whatever the Jitter (1
// included, where Fresh is next to nothing); and Fresh for Windows made by
// hand, which have no TTL.
func TestWindowsDraw(t *testing.T) {
	for _, o := range []Options[string, int]{
		{TTL: time.Hour},
		{TTL: time.Hour, Jitter: 0.3},
		{TTL: time.Hour, Jitter: 1},
		{TTL: time.Hour, Freshness: func(string, int) Freshness { return Freshness{TTL: time.Minute} }},
		{TTL: forever, Jitter: 1},
		{TTL: 1, Jitter: 1},
	} {
		w, _ := o.windowsOf("k", 1)
		ttl := o.TTL
		if o.Freshness != nil {
			ttl = o.Freshness("k", 1).TTL
		}
		if w.TTL != ttl || w.Jitter != o.Jitter || w.Fresh != timing.Jitter(ttl, o.Jitter, 1) {
			t.Errorf("windowsOf with TTL %v, Jitter %v = %+v; want TTL %v, the Options' Jitter, the shortest draw as Fresh", o.TTL, o.Jitter, w, ttl)
		}
		for _, u := range []float64{0, 1e-9, 0.25, 0.5, 0.999999, math.Nextafter(1, 0)} {
			d := w.Draw(u)
			if d != timing.Jitter(ttl, o.Jitter, u) || d < w.Fresh || d > ttl || d <= 0 {
				t.Errorf("%+v: Draw(%v) = %v; want the Loader's draw %v, in [%v, %v]", w, u, d, timing.Jitter(ttl, o.Jitter, u), w.Fresh, ttl)
			}
		}
		if d := w.Draw(0); d != ttl {
			t.Errorf("%+v: Draw(0) = %v; want the TTL %v", w, d, ttl)
		}
	}
	if w := (Options[string, int]{TTL: time.Hour, Jitter: 1}).windows(); w.Draw(0.5) != 30*time.Minute {
		t.Errorf("with TTL 1h and Jitter 1, Draw(0.5) = %v; want 30m", w.Draw(0.5))
	}
	if d := (Windows{Fresh: time.Second}).Draw(0.5); d != time.Second {
		t.Errorf("Windows{Fresh: 1s}.Draw(0.5) = %v; want its Fresh, 1s", d)
	}
}

func TestAcceptsStale(t *testing.T) {
	bg := context.Background()
	tests := []struct {
		ctx   context.Context
		stale time.Duration
		want  bool
	}{
		{bg, time.Hour, true}, // no bound: the windows decide
		{WithMaxStale(bg, 0), 0, false},
		{WithMaxStale(bg, 0), time.Nanosecond, false},
		{WithMaxStale(bg, time.Second), time.Second, true},
		{WithMaxStale(bg, time.Second), time.Second + 1, false},
	}
	for _, tt := range tests {
		if got := AcceptsStale(tt.ctx, tt.stale); got != tt.want {
			d, ok := MaxStale(tt.ctx)
			t.Errorf("AcceptsStale(max-stale %v %v, %v) = %v; want %v", d, ok, tt.stale, got, tt.want)
		}
	}
}

// The windows of one value (Rules.WindowsOf) apply per-value Freshness as
// the Loader does: zero fields take the Options' values, negative ones
// none, a negative TTL is not to be cached.
func TestWindowsOf(t *testing.T) {
	o := Options[string, int]{TTL: 10 * time.Second, Jitter: 0.5, StaleWhileRevalidate: time.Second, StaleIfError: time.Minute,
		Freshness: func(k string, v int) Freshness {
			return Freshness{TTL: time.Duration(v) * time.Second, StaleWhileRevalidate: -1}
		}}
	w, ok := o.windowsOf("k", 4)
	want := Windows{Fresh: 2 * time.Second, TTL: 4 * time.Second, Jitter: 0.5, StaleIfError: time.Minute, LoadTimeout: DefaultLoadTimeout}
	if !ok || w != want {
		t.Errorf("windowsOf(4) = %+v, %v; want %+v, true", w, ok, want)
	}
	if w, ok := o.windowsOf("k", 0); !ok || w.Fresh != 5*time.Second {
		t.Errorf("windowsOf(0) = %+v, %v; want the Options' TTL (5s at least, with Jitter 0.5)", w, ok)
	}
	if _, ok := o.windowsOf("k", -1); ok {
		t.Errorf("windowsOf with a negative TTL: cache = true; want false")
	}
}

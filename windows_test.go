package flightcache

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Options.Windows gives a Remote the Loader's own rules: the shortest
// freshness any entry draws (what the Loader judges never-cached values
// by), the windows, and LoadTimeout with its default; and it rejects what
// New rejects, naming the field.
func TestOptionsWindows(t *testing.T) {
	w, err := Options[string, int]{TTL: 10 * time.Second, Jitter: 0.2, StaleWhileRevalidate: time.Second,
		StaleIfError: time.Minute, EarlyRefresh: 1}.Windows()
	want := Windows{Fresh: 8 * time.Second, StaleWhileRevalidate: time.Second, StaleIfError: time.Minute,
		EarlyRefresh: true, LoadTimeout: DefaultLoadTimeout}
	if err != nil || w != want {
		t.Errorf("Windows() = %+v, %v; want %+v", w, err, want)
	}
	if w, _ := (Options[string, int]{TTL: time.Second, Jitter: 1}).Windows(); w.Fresh <= 0 {
		t.Errorf("Windows().Fresh with Jitter 1 = %v; want > 0", w.Fresh)
	}
	_, err = Options[string, int]{TTL: time.Second, Jitter: 3}.Windows()
	if err == nil || !strings.Contains(err.Error(), "Options.Jitter ") {
		t.Errorf("Windows() with Jitter 3 = %v; want an error naming Options.Jitter", err)
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

package flightcache

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

func TestNewRejectsInvalidOptions(t *testing.T) {
	load := func(context.Context, string) (int, error) { return 0, nil }
	valid := Options[string, int]{TTL: time.Second}
	tests := []struct {
		field string
		edit  func(*Options[string, int])
	}{
		{"TTL", func(o *Options[string, int]) { o.TTL = 0 }},
		{"TTL", func(o *Options[string, int]) { o.TTL = -time.Second }},
		{"Jitter", func(o *Options[string, int]) { o.Jitter = -0.1 }},
		{"Jitter", func(o *Options[string, int]) { o.Jitter = 1.5 }},
		{"Jitter", func(o *Options[string, int]) { o.Jitter = math.NaN() }},
		{"StaleWhileRevalidate", func(o *Options[string, int]) { o.StaleWhileRevalidate = -1 }},
		{"StaleIfError", func(o *Options[string, int]) { o.StaleIfError = -1 }},
		{"EarlyRefresh", func(o *Options[string, int]) { o.EarlyRefresh = -1 }},
		{"EarlyRefresh", func(o *Options[string, int]) { o.EarlyRefresh = math.Inf(1) }},
		{"EarlyRefresh", func(o *Options[string, int]) { o.EarlyRefresh = math.NaN() }},
		{"MaxCost", func(o *Options[string, int]) { o.MaxCost = -1 }},
		{"MaxCost", func(o *Options[string, int]) { o.Cost = func(int) int64 { return 1 } }},
		{"NumCounters", func(o *Options[string, int]) { o.NumCounters = -1 }},
		{"Policy", func(o *Options[string, int]) { o.Policy = Policy(7) }},
		{"LoadTimeout", func(o *Options[string, int]) { o.LoadTimeout = -1 }},
		{"Retry.MaxAttempts", func(o *Options[string, int]) { o.Retry.MaxAttempts = -1 }},
		{"Retry.InitialInterval", func(o *Options[string, int]) { o.Retry.InitialInterval = -1 }},
		{"Retry.MaxInterval", func(o *Options[string, int]) { o.Retry.MaxInterval = -1 }},
		{"Breaker.OpenTimeout", func(o *Options[string, int]) { o.Breaker.OpenTimeout = -1 }},
		{"MaxRefreshes", func(o *Options[string, int]) { o.MaxRefreshes = -1 }},
		{"NotFoundTTL", func(o *Options[string, int]) { o.NotFoundTTL = -1 }},
	}
	for _, tt := range tests {
		opts := valid
		tt.edit(&opts)
		l, err := New(load, opts)
		if err == nil {
			l.Close()
			t.Errorf("New with bad %s = nil error; want one naming the field", tt.field)
			continue
		}
		if !strings.Contains(err.Error(), "Options."+tt.field+" ") || !strings.HasPrefix(err.Error(), "flightcache: ") {
			t.Errorf("New with bad %s: error %q does not name the field", tt.field, err)
		}
	}
	if _, err := New[string, int](nil, valid); err == nil || !strings.Contains(err.Error(), "LoadFunc") {
		t.Errorf("New(nil load) error = %v; want one naming the LoadFunc", err)
	}
}

func TestZeroOptionsPlusTTLWork(t *testing.T) {
	l, err := New(func(_ context.Context, k string) (string, error) { return k, nil }, Options[string, string]{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if v, err := l.Get(context.Background(), "x"); v != "x" || err != nil {
		t.Errorf("Get = %q, %v", v, err)
	}
	o := l.opts
	if o.MaxCost != DefaultMaxCost || o.LoadTimeout != DefaultLoadTimeout || o.MaxRefreshes != DefaultMaxRefreshes ||
		o.Breaker.ConsecutiveFailures != DefaultConsecutiveFailures || o.Policy != FinishAndFill {
		t.Errorf("defaults not applied: %+v", o)
	}
}

func TestNilContextIsAnError(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{})
	//lint:ignore SA1012 a nil context is the point of this test
	if _, err := l.Get(nil, "k"); err != errNilContext { //nolint:staticcheck
		t.Errorf("Get(nil ctx) = %v; want errNilContext", err)
	}
}

func TestStrings(t *testing.T) {
	for v, want := range map[interface{ String() string }]string{
		SourceNone: "none", SourceHit: "hit", SourceStale: "stale", SourceStaleOnError: "stale-on-error",
		SourceLoaded: "loaded", SourceShared: "shared", FinishAndFill: "finish-and-fill",
		CancelAtZero: "cancel-at-zero", Policy(9): "Policy(9)", BreakerClosed: "closed",
		BreakerHalfOpen: "half-open", BreakerOpen: "open",
	} {
		if got := v.String(); got != want {
			t.Errorf("%#v.String() = %q; want %q", v, got, want)
		}
	}
}

package flightcache

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// lifetimeOf reads a test value's lifetime from the value itself, as a
// repository would read max-age from a response: "v;ttl=50ms;swr=1s;sie=-1ns".
func lifetimeOf(_ string, v string) Freshness {
	var f Freshness
	for _, part := range strings.Split(v, ";")[1:] {
		name, val, _ := strings.Cut(part, "=")
		d, err := time.ParseDuration(val)
		if err != nil {
			panic("bad test value " + v)
		}
		switch name {
		case "ttl":
			f.TTL = d
		case "swr":
			f.StaleWhileRevalidate = d
		case "sie":
			f.StaleIfError = d
		}
	}
	return f
}

// seq is a LoadFunc that returns its values in turn (the last one again
// once they run out) and counts its calls.
type seq struct {
	vals  []string
	calls atomic.Int32
}

func (s *seq) load(context.Context, string) (string, error) {
	n := int(s.calls.Add(1)) - 1
	v := s.vals[min(n, len(s.vals)-1)]
	if v == "fail" {
		return "", errBoom
	}
	return v, nil
}

// docs/design.md rule 11: a value's own TTL decides when it expires, not
// the Options' TTL.
func TestFreshnessPerValueTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &seq{vals: []string{"a;ttl=50ms", "b"}}
		l, _ := New(d.load, Options[string, string]{TTL: time.Hour, Freshness: lifetimeOf})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		time.Sleep(49 * time.Millisecond)
		if v, info, _ := l.GetInfo(ctx, "k"); v != "a;ttl=50ms" || info.Source != SourceHit {
			t.Fatalf("Get at 49ms = %q, %v; want the value, a hit", v, info.Source)
		}
		time.Sleep(2 * time.Millisecond)
		if v, info, _ := l.GetInfo(ctx, "k"); v != "b" || info.Source != SourceLoaded {
			t.Fatalf("Get at 51ms = %q, %v; want a new load (its own TTL was 50ms)", v, info.Source)
		}
		time.Sleep(30 * time.Minute)
		if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceHit {
			t.Fatalf("Get of a value with no TTL of its own, 30 minutes on = %v; want a hit (the Options' hour)", info.Source)
		}
	})
}

// docs/design.md rule 11: a value's own windows replace the Options'; a
// negative one means none.
func TestFreshnessPerValueWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &seq{vals: []string{"own;ttl=10ms;swr=1s", "fail"}}
		l, _ := New(d.load, Options[string, string]{TTL: time.Hour, StaleIfError: time.Hour, Freshness: lifetimeOf,
			Breaker: Breaker{Disabled: true}})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		time.Sleep(500 * time.Millisecond)
		if v, info, _ := l.GetInfo(ctx, "k"); v != "own;ttl=10ms;swr=1s" || info.Source != SourceStale {
			t.Fatalf("Get inside the value's own stale window = %q, %v; want it stale", v, info.Source)
		}

		d2 := &seq{vals: []string{"none;ttl=10ms;sie=-1ns", "fail"}}
		l2, _ := New(d2.load, Options[string, string]{TTL: time.Hour, StaleIfError: time.Hour, Freshness: lifetimeOf,
			Breaker: Breaker{Disabled: true}})
		defer l2.Close()
		l2.Get(ctx, "k")
		time.Sleep(20 * time.Millisecond)
		if _, info, err := l2.GetInfo(ctx, "k"); err == nil {
			t.Fatalf("failed load of a value whose own StaleIfError is none = %v, nil; want the error", info.Source)
		}
	})
}

// docs/design.md rule 11: a negative TTL returns the value but does not
// cache it; a reload to such a value takes the older one out too. A Set
// passes through Freshness like a load.
func TestFreshnessNegativeTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &seq{vals: []string{"keep;ttl=10ms", "nocache;ttl=-1ns", "again"}}
		l, _ := New(d.load, Options[string, string]{TTL: time.Hour, StaleWhileRevalidate: time.Hour, Freshness: lifetimeOf})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		time.Sleep(20 * time.Millisecond)
		if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceStale {
			t.Fatalf("Get past the value's TTL = %v; want stale, with a refresh", info.Source)
		}
		synctest.Wait() // the refresh returned a value not to be cached
		if v, info, _ := l.GetInfo(ctx, "k"); v != "again" || info.Source != SourceLoaded {
			t.Fatalf("Get after a refresh to an uncacheable value = %q, %v; want a new load (no older value kept)", v, info.Source)
		}
		l.Set("k", "set;ttl=-1ns")
		if v, info, _ := l.GetInfo(ctx, "k"); v == "set;ttl=-1ns" || info.Source == SourceHit {
			t.Fatalf("Get after Set of an uncacheable value = %q, %v; want it not cached", v, info.Source)
		}
		l.Set("k", "set;ttl=5ms")
		time.Sleep(6 * time.Millisecond)
		if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceStale {
			t.Fatalf("Get 6ms after Set of a value that lives 5ms = %v; want stale", info.Source)
		}
	})
}

// A Freshness that panics is user code like any other: the value reaches
// its callers, is not cached, and Stats.Panics counts it. A not-found is
// never passed to Freshness.
func TestFreshnessPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var asked atomic.Int32
		l, _ := New(func(_ context.Context, k string) (string, error) {
			if k == "missing" {
				return "", ErrNotFound
			}
			return "v", nil
		}, Options[string, string]{TTL: time.Hour, NotFoundTTL: time.Hour, Freshness: func(k, v string) Freshness {
			asked.Add(1)
			panic("no idea")
		}})
		defer l.Close()
		ctx := context.Background()
		for range 2 {
			if v, info, err := l.GetInfo(ctx, "k"); v != "v" || err != nil || info.Source != SourceLoaded {
				t.Fatalf("Get = %q, %v, %v; want the value, loaded each time", v, info.Source, err)
			}
		}
		l.Get(ctx, "missing")
		if _, info, _ := l.GetInfo(ctx, "missing"); info.Source != SourceHit {
			t.Errorf("second Get of a missing key = %v; want the cached not-found", info.Source)
		}
		if s := l.Stats(); s.Panics != 2 || asked.Load() != 2 {
			t.Errorf("Panics %d, Freshness called %d times; want 2 and 2 (never for a not-found)", s.Panics, asked.Load())
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// origin is a downstream with versions: Load returns the current version;
// Reload returns ErrNotModified when the caller holds it already.
type origin struct {
	mu       sync.Mutex
	version  string
	loads    int
	reloads  []string // the old values Reload was given
	gate     chan struct{}
	fail     bool
	children func(ctx context.Context)
}

func (o *origin) load(ctx context.Context, k string) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.loads++
	return o.version, nil
}

func (o *origin) reload(ctx context.Context, k string, old string) (string, error) {
	o.mu.Lock()
	gate, children := o.gate, o.children
	o.reloads = append(o.reloads, old)
	o.mu.Unlock()
	if children != nil {
		children(ctx)
	}
	if gate != nil {
		<-gate
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fail {
		return "", errBoom
	}
	if old == o.version {
		return "", ErrNotModified
	}
	return o.version, nil
}

func (o *origin) set(f func(o *origin)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f(o)
}

// docs/design.md rule 13: a refresh of a held value goes through Reload
// with that value; what it returns replaces it.
func TestReloadGetsTheValueHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{version: "v1"}
		var events []LoadEvent[string]
		var mu sync.Mutex
		l, _ := New(o.load, Options[string, string]{TTL: 10 * time.Millisecond, StaleWhileRevalidate: time.Hour,
			Reload: o.reload, OnLoad: func(ev LoadEvent[string]) { mu.Lock(); events = append(events, ev); mu.Unlock() }})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		o.set(func(o *origin) { o.version = "v2" })
		time.Sleep(20 * time.Millisecond)
		if v, info, _ := l.GetInfo(ctx, "k"); v != "v1" || info.Source != SourceStale {
			t.Fatalf("Get in the stale window = %q, %v; want v1, stale", v, info.Source)
		}
		synctest.Wait()
		if v, info, _ := l.GetInfo(ctx, "k"); v != "v2" || info.Source != SourceHit {
			t.Fatalf("Get after the refresh = %q, %v; want v2, hit", v, info.Source)
		}
		if len(o.reloads) != 1 || o.reloads[0] != "v1" || o.loads != 1 {
			t.Errorf("Reload given %q, LoadFunc called %d times; want [v1], 1", o.reloads, o.loads)
		}
		if s := l.Stats(); s.Reloads != 1 || s.NotModified != 0 {
			t.Errorf("Stats Reloads %d, NotModified %d; want 1, 0", s.Reloads, s.NotModified)
		}
		if len(events) != 2 || events[0].Reload || !events[1].Reload || !events[1].Background {
			t.Errorf("events = %+v; want a load, then a background reload", events)
		}
	})
}

// docs/design.md rule 13: ErrNotModified keeps the value held, renews its
// freshness from now (asking Freshness again), never reaches a caller, is
// not retried and is no breaker failure.
func TestReloadNotModified(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{version: "v1"}
		var asked atomic.Int32
		var evMu sync.Mutex
		var ev LoadEvent[string]
		l, _ := New(o.load, Options[string, string]{TTL: time.Hour, Reload: o.reload, StaleIfError: time.Hour,
			Retry:     Retry{MaxAttempts: 3},
			Breaker:   Breaker{ConsecutiveFailures: 1},
			Freshness: func(k, v string) Freshness { asked.Add(1); return Freshness{TTL: 100 * time.Millisecond} },
			OnLoad:    func(e LoadEvent[string]) { evMu.Lock(); ev = e; evMu.Unlock() }})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		time.Sleep(150 * time.Millisecond) // expired, within StaleIfError: a Get reloads
		v, info, err := l.GetInfo(ctx, "k")
		if v != "v1" || err != nil || info.Source != SourceLoaded || info.Age != 0 {
			t.Fatalf("Get through a 304 = %q, %v (age %v), %v; want v1, loaded, age 0", v, info.Source, info.Age, err)
		}
		synctest.Wait() // OnLoad has run
		evMu.Lock()
		defer evMu.Unlock()
		if !ev.Reload || !ev.NotModified || ev.Err != nil || ev.Attempts != 1 {
			t.Errorf("LoadEvent = %+v; want a reload, not modified, no error, 1 attempt", ev)
		}
		time.Sleep(99 * time.Millisecond)
		if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceHit || info.Age != 99*time.Millisecond {
			t.Errorf("Get 99ms after the 304 = %v (age %v); want a hit, age 99ms (renewed)", info.Source, info.Age)
		}
		if s := l.Stats(); s.NotModified != 1 || s.Reloads != 1 || s.Breaker != BreakerClosed || asked.Load() != 2 {
			t.Errorf("NotModified %d, Reloads %d, breaker %v, Freshness asked %d; want 1, 1, closed, 2", s.NotModified, s.Reloads, s.Breaker, asked.Load())
		}
	})
}

// ErrNotModified from a plain LoadFunc is an error like any other; after a
// Set during a reload, a 304 gives the reload's callers the old value and
// leaves the Set's value in the cache (rule 6).
func TestNotModifiedCornerCases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, _ := New(func(context.Context, string) (string, error) { return "", ErrNotModified },
			Options[string, string]{TTL: time.Hour})
		defer l.Close()
		if _, err := l.Get(context.Background(), "k"); !errors.Is(err, ErrNotModified) {
			t.Errorf("Get with a LoadFunc returning ErrNotModified = %v; want that error", err)
		}

		o := &origin{version: "v1"}
		l2, _ := New(o.load, Options[string, string]{TTL: 10 * time.Millisecond, StaleIfError: time.Hour, Reload: o.reload})
		defer l2.Close()
		ctx := context.Background()
		l2.Get(ctx, "k")
		time.Sleep(20 * time.Millisecond)
		gate := make(chan struct{})
		o.set(func(o *origin) { o.gate = gate })
		got := make(chan string)
		go func() { v, _ := l2.Get(ctx, "k"); got <- v }()
		synctest.Wait() // the reload is running
		l2.Set("k", "set")
		close(gate)
		if v := <-got; v != "v1" {
			t.Errorf("the reload's caller got %q; want the old value v1", v)
		}
		if v, info, _ := l2.GetInfo(ctx, "k"); v != "set" || info.Source != SourceHit {
			t.Errorf("Get after = %q, %v; want the Set value, a hit", v, info.Source)
		}
	})
}

// docs/design.md rule 12: Refresh never makes a caller wait (the current
// value serves until the new one is stored), joins a load in flight, loads
// a key with no value, is bounded by MaxRefreshes, and does nothing after
// Close. A Refresh right after a Get reloads: a finished load does not
// count as in flight.
func TestRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{version: "v1"}
		l, _ := New(o.load, Options[string, string]{TTL: time.Hour, Reload: o.reload, MaxRefreshes: 1})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		o.set(func(o *origin) { o.version = "v2" })
		gate := make(chan struct{})
		o.set(func(o *origin) { o.gate = gate })
		l.Refresh(ctx, "k")
		synctest.Wait() // the reload waits at the gate
		if v, info, _ := l.GetInfo(ctx, "k"); v != "v1" || info.Source != SourceHit {
			t.Errorf("Get during the refresh = %q, %v; want the current value v1, a hit", v, info.Source)
		}
		l.Refresh(ctx, "k")       // joins the reload in flight
		l.Refresh(ctx, "missing") // beyond MaxRefreshes (1): dropped
		close(gate)
		synctest.Wait()
		if v, _, _ := l.GetInfo(ctx, "k"); v != "v2" {
			t.Errorf("Get after the refresh = %q; want v2", v)
		}
		if s := l.Stats(); len(o.reloads) != 1 || s.Refreshes != 1 || s.RefreshesDropped != 1 {
			t.Errorf("reloads %d, Refreshes %d, RefreshesDropped %d; want 1, 1, 1", len(o.reloads), s.Refreshes, s.RefreshesDropped)
		}
		o.set(func(o *origin) { o.gate = nil })
		l.Refresh(ctx, "new") // no value: loaded as by a Get nobody waits for
		synctest.Wait()
		if _, info, _ := l.GetInfo(ctx, "new"); info.Source != SourceHit || o.loads != 2 {
			t.Errorf("Get after Refresh of a new key = %v, %d LoadFunc calls; want a hit, 2", info.Source, o.loads)
		}
		l.Get(ctx, "k")
		l.Refresh(ctx, "k") // right after a Get: reloads
		synctest.Wait()
		if len(o.reloads) != 2 {
			t.Errorf("Refresh right after a Get made %d reloads in all; want 2", len(o.reloads))
		}
		l.Close()
		l.Refresh(ctx, "k")
		if s := l.Stats(); s.Refreshes != 3 {
			t.Errorf("Refresh after Close counted: Refreshes %d; want 3", s.Refreshes)
		}
	})
}

// docs/design.md rule 14: a Get under WithRevalidate is never answered
// from the cache; a burst of them makes one call (a Reload of the value
// held); the result replaces the cached value; a failure is covered under
// StaleIfError; the load's context does not pass WithRevalidate on.
func TestWithRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{version: "v1"}
		l, _ := New(o.load, Options[string, string]{TTL: time.Hour, StaleIfError: time.Hour, Reload: o.reload,
			Breaker: Breaker{Disabled: true}})
		defer l.Close()
		ctx := context.Background()
		l.Get(ctx, "k")
		l.Get(ctx, "other")
		o.set(func(o *origin) { o.version = "v2"; o.gate = make(chan struct{}) })
		var inner Source
		o.set(func(o *origin) {
			o.children = func(lctx context.Context) { _, info, _ := l.GetInfo(lctx, "other"); inner = info.Source }
		})
		rctx := WithRevalidate(ctx)
		var wg sync.WaitGroup
		results := make([]string, 100)
		for i := range results {
			wg.Go(func() { results[i], _ = l.Get(rctx, "k") })
		}
		synctest.Wait()
		o.set(func(o *origin) { close(o.gate); o.gate = nil; o.children = nil })
		wg.Wait()
		for _, v := range results {
			if v != "v2" {
				t.Fatalf("a revalidating Get = %q; want v2", v)
			}
		}
		if len(o.reloads) != 1 || o.reloads[0] != "v1" {
			t.Errorf("Reload calls %q; want one, given v1", o.reloads)
		}
		if inner != SourceHit {
			t.Errorf("a Get made inside the reload under its context = %v; want a hit (WithRevalidate is not passed on)", inner)
		}
		if v, info, _ := l.GetInfo(ctx, "k"); v != "v2" || info.Source != SourceHit {
			t.Errorf("plain Get after = %q, %v; want v2, hit", v, info.Source)
		}
		s := l.Stats()
		if s.Revalidations != 100 || s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed {
			t.Errorf("Stats = %+v; want 100 Revalidations, Gets adding up", s)
		}
		o.set(func(o *origin) { o.fail = true })
		if v, info, err := l.GetInfo(rctx, "k"); v != "v2" || err != nil || info.Source != SourceStaleOnError {
			t.Errorf("a failed revalidation = %q, %v, %v; want v2 covered (stale-on-error)", v, info.Source, err)
		}
	})
}

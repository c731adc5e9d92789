package flightredis

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
)

var errBoom = errors.New("boom")

// plant stores value as key's shared entry, loaded age ago by some other
// process, through a tier of its own (so no proc of the test has handed it
// out).
func plant(t *testing.T, addr, prefix string, lo flightcache.Options[string, string], key, value string, age time.Duration) *Tier[string, string] {
	t.Helper()
	// A Timeout generous enough for a loaded machine: the entry must land.
	to := Options[string, string]{Prefix: prefix, Timeout: 5 * time.Second, HolderTimeout: 15 * time.Second}
	tier, err := attachedTier(t, newClient(t, addr), lo, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	tier.Set(ctx, key, remote.Value[string]{Value: value, LoadedAt: time.Now().Add(-age)})
	if s := tier.Stats(); s.InvalidationsSent != 1 {
		t.Fatalf("planting %s: the Set did not reach Redis (tier %+v)", key, s)
	}
	return tier
}

// A process with no local copy whose load fails is covered by the older
// entry the fleet holds, inside StaleIfError; the tier offers nothing past
// the window, for a not-found, or once an Invalidate dropped the entry.
func TestFailedLoadCoveredByTheFleet(t *testing.T) {
	lo := flightcache.Options[string, string]{TTL: time.Minute, StaleIfError: 5 * time.Minute,
		Breaker: flightcache.Breaker{Disabled: true}}
	tests := []struct {
		name       string
		age        time.Duration // of the shared entry; fresh for 1m, covers until 6m
		err        error
		invalidate bool // another process invalidates the key during the load
		want       string
		wantOffers uint64
	}{
		{name: "inside StaleIfError", age: 2 * time.Minute, err: errBoom, want: "old", wantOffers: 1},
		{name: "past StaleIfError", age: 7 * time.Minute, err: errBoom},
		{name: "not found", age: 2 * time.Minute, err: fmt.Errorf("gone: %w", flightcache.ErrNotFound)},
		{name: "invalidated during the load", age: 2 * time.Minute, err: errBoom, invalidate: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := redisAddr(t)
			p := testPrefix(t, newClient(t, addr))
			other := plant(t, addr, p, lo, "k", "old", tt.age)
			d := newDownstream()
			d.fail(tt.err)
			if tt.invalidate {
				d.gate = make(chan struct{})
			}
			b := newProc(t, addr, p, lo, Options[string, string]{}, d)

			type result struct {
				v    string
				info flightcache.Info
				err  error
			}
			got := make(chan result, 1)
			go func() {
				v, info, err := b.l.GetInfo(ctx, "k")
				got <- result{v, info, err}
			}()
			if tt.invalidate {
				within(t, d.started, 10*time.Second, "downstream call by b")
				other.Invalidate(ctx, "k")
				close(d.gate)
			}
			r := within(t, got, 30*time.Second, "answer to b.GetInfo")
			switch {
			case tt.want != "":
				if r.v != tt.want || r.err != nil || r.info.Source != flightcache.SourceStaleOnError || r.info.Age < tt.age {
					t.Errorf("Get(k) = %q, %+v, %v; want %q as stale-on-error, at least %v old", r.v, r.info, r.err, tt.want, tt.age)
				}
			case !errors.Is(r.err, tt.err):
				t.Errorf("Get(k) = %q, %+v, %v; want the error %v", r.v, r.info, r.err, tt.err)
			}
			if n := d.calls.Load(); n != 1 {
				t.Errorf("downstream calls = %d; want 1", n)
			}
			if s := b.t.Stats(); s.Leases != 1 || s.StaleOffers != tt.wantOffers {
				t.Errorf("stats %+v; want 1 lease, %d stale offers", s, tt.wantOffers)
			}
			if tt.want == "" {
				return
			}
			// The Loader never caches the cover, and applies the caller's
			// max-stale to it: the entry went stale 1m ago.
			if _, err := b.l.Get(flightcache.WithMaxStale(ctx, 30*time.Second), "k"); !errors.Is(err, errBoom) {
				t.Errorf("Get(k) with max-stale 30s = %v; want %v", err, errBoom)
			}
			if n := d.calls.Load(); n != 2 {
				t.Errorf("downstream calls = %d; want 2 (the cover must not be cached)", n)
			}
		})
	}
}

// A process that waited for another's failed load learns of the failure
// (ErrPeerFailed) and is covered too: one downstream call for the fleet,
// and both processes serve the older entry.
func TestPeerFailureCoveredByTheFleet(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: time.Minute, StaleIfError: 5 * time.Minute,
		Breaker: flightcache.Breaker{Disabled: true}}
	plant(t, addr, p, lo, "k", "old", 2*time.Minute)
	d := newDownstream()
	d.gate = make(chan struct{})
	d.fail(errBoom)
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	type result struct {
		v    string
		info flightcache.Info
		err  error
	}
	got := make(chan result, 2)
	get := func(pr proc) {
		v, info, err := pr.l.GetInfo(ctx, "k")
		got <- result{v, info, err}
	}
	go get(a)
	within(t, d.started, 10*time.Second, "downstream call")
	go get(b)
	eventually(t, 10*time.Second, "b to wait on a's lease", func() bool { return b.t.Stats().Waits == 1 })
	close(d.gate)
	for range 2 {
		if r := within(t, got, 30*time.Second, "answer to the Get"); r.v != "old" || r.err != nil || r.info.Source != flightcache.SourceStaleOnError {
			t.Errorf("Get(k) = %q, %+v, %v; want old as stale-on-error", r.v, r.info, r.err)
		}
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls = %d; want 1", n)
	}
	sa, sb := a.t.Stats(), b.t.Stats()
	if sa.Leases != 1 || sa.StaleOffers != 1 || sb.PeerErrors != 1 || sb.StaleOffers != 1 {
		t.Errorf("stats: a %+v, b %+v; want a's lease and b's peer error, each covered", sa, sb)
	}
}

// A caller's WithMaxStale reaches the tier: a shared entry stale for longer
// than the bound is not handed out as a load's value (the Loader would pass
// it on as loaded); the tier loads instead.
func TestMaxStaleRefusesAStaleSharedEntry(t *testing.T) {
	lo := flightcache.Options[string, string]{TTL: time.Minute, StaleWhileRevalidate: 10 * time.Minute}
	tests := []struct {
		name      string
		maxStale  time.Duration // < 0: no bound
		want      string
		wantCalls int64
	}{
		{name: "no bound", maxStale: -1, want: "old"},
		{name: "stale within the bound", maxStale: 5 * time.Minute, want: "old"},
		{name: "stale past the bound", maxStale: 30 * time.Second, want: "k-v1", wantCalls: 1},
		{name: "fresh only", maxStale: 0, want: "k-v1", wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := redisAddr(t)
			p := testPrefix(t, newClient(t, addr))
			plant(t, addr, p, lo, "k", "old", 2*time.Minute) // stale for 1m
			d := newDownstream()
			b := newProc(t, addr, p, lo, Options[string, string]{}, d)
			c := ctx
			if tt.maxStale >= 0 {
				c = flightcache.WithMaxStale(ctx, tt.maxStale)
			}
			v, info, err := b.l.GetInfo(c, "k")
			if v != tt.want || err != nil {
				t.Errorf("Get(k) = %q, %+v, %v; want %q", v, info, err, tt.want)
			}
			if n := d.calls.Load(); n != tt.wantCalls {
				t.Errorf("downstream calls = %d; want %d", n, tt.wantCalls)
			}
			s := b.t.Stats()
			if tt.wantCalls == 0 {
				if s.StaleHits != 1 || s.Leases != 0 {
					t.Errorf("stats %+v; want 1 stale hit, no lease", s)
				}
				return
			}
			if s.StaleHits != 0 || s.Leases != 1 || info.Age >= time.Minute {
				t.Errorf("stats %+v, age %v; want a lease and a new value, no stale hit", s, info.Age)
			}
			// The new entry is fresh: another fresh-only process takes it.
			e := newProc(t, addr, p, lo, Options[string, string]{}, d)
			if v, err := e.l.Get(flightcache.WithMaxStale(ctx, 0), "k"); v != "k-v1" || err != nil {
				t.Errorf("e.Get(k) fresh only = %q, %v; want k-v1", v, err)
			}
			if n := d.calls.Load(); n != 1 {
				t.Errorf("downstream calls = %d; want 1 (the reloaded entry is shared)", n)
			}
		})
	}
}

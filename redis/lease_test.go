package flightredis

import (
	"errors"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

func TestSetAndInvalidateReachTheFleet(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	a.l.Set("k", "set-by-a")
	if v, err := b.l.Get(ctx, "k"); err != nil || v != "set-by-a" {
		t.Fatalf("b.Get(k) after a.Set = %q, %v; want set-by-a", v, err)
	}
	a.l.Invalidate("k")
	if n := c.Exists(ctx, keysFor(p, "k").entry).Val(); n != 0 {
		t.Fatalf("the shared entry survived Invalidate")
	}
	// A third process has nothing locally: it loads afresh.
	e := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if v, err := e.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Errorf("e.Get(k) after Invalidate = %q, %v; want k-v1", v, err)
	}
}

// TestSetWinsOverALoadInFlight: a load in flight when another process
// stores a value does not overwrite it (docs/design.md rule 6, across
// processes).
func TestSetWinsOverALoadInFlight(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	got := make(chan string)
	go func() { v, _ := a.l.Get(ctx, "k"); got <- v }()
	within(t, d.started, 10*time.Second, "downstream call")
	b.l.Set("k", "set-by-b")
	close(d.gate)
	if v := within(t, got, 30*time.Second, "answer to b's Get"); v != "k-v1" {
		t.Errorf("a.Get(k) = %q; want its own load's k-v1", v)
	}
	e := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if v, err := e.l.Get(ctx, "k"); err != nil || v != "set-by-b" {
		t.Errorf("e.Get(k) = %q, %v; want set-by-b (the load in flight must not overwrite it)", v, err)
	}
	if s := a.t.Stats(); s.WritesLost != 1 {
		t.Errorf("a stats %+v; want 1 write lost", s)
	}
}

func TestUndecodableEntryIsReloaded(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	a := newProc(t, addr, p, flightcache.Options[string, string]{TTL: time.Minute}, Options[string, string]{}, d)
	ks := keysFor(p, "k")
	now := micros(time.Now())
	c.HSet(ctx, ks.entry, "id", "x", "v", "{not json", "at", now, "took", 0, "fresh", now+60e6, "stale", now+60e6)
	if v, err := a.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Fatalf("Get(k) over an undecodable entry = %q, %v; want k-v1", v, err)
	}
	if s := a.t.Stats(); s.DecodeErrors != 1 || s.Leases != 1 {
		t.Errorf("stats %+v; want 1 decode error and 1 lease", s)
	}
	if v := c.HGet(ctx, ks.entry, "v").Val(); v != `"k-v1"` {
		t.Errorf("entry value = %s; want the reloaded one", v)
	}
}

// TestHolderClosedHandsOver: a holder whose Loader closes mid-load releases
// its lease at once, and a waiter loads without waiting for HolderTimeout.
func TestHolderClosedHandsOver(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	to := Options[string, string]{HolderTimeout: time.Minute}
	a := newProc(t, addr, p, lo, to, d)
	b := newProc(t, addr, p, lo, to, d)

	errA := make(chan error)
	go func() { _, err := a.l.Get(ctx, "k"); errA <- err }()
	within(t, d.started, 10*time.Second, "downstream call")
	got := make(chan string)
	go func() { v, _ := b.l.Get(ctx, "k"); got <- v }()
	eventually(t, 10*time.Second, "b to wait on a's lease", func() bool { return b.t.Stats().Waits == 1 })
	_ = a.l.Close() // cancels a's load: not a downstream failure, so not shared
	if err := within(t, errA, 30*time.Second, "answer to a's Get"); !errors.Is(err, flightcache.ErrClosed) {
		t.Errorf("a.Get(k) = %v; want ErrClosed", err)
	}
	within(t, d.started, 10*time.Second, "b's own downstream call") // b's own load, after a released the lease
	close(d.gate)
	if v := within(t, got, 30*time.Second, "answer to b's Get"); v != "k-v2" {
		t.Errorf("b.Get(k) = %q; want k-v2", v)
	}
	if s := b.t.Stats(); s.Takeovers != 0 || s.Leases != 1 || s.PeerErrors != 0 {
		t.Errorf("b stats %+v; want its own lease, no takeover, no peer error", s)
	}
}

// TestEarlyRefreshOncePerFleet: the entry carries how long its load took,
// so each process places its early refresh (XFetch) from it; whichever
// refreshes first reloads for the fleet, and the other picks the new value
// up from Redis. Every downstream call yields one new value.
func TestEarlyRefreshOncePerFleet(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.delay = 50 * time.Millisecond
	lo := flightcache.Options[string, string]{TTL: 600 * time.Millisecond, EarlyRefresh: 2}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	seen := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < 5 && time.Now().Before(deadline) {
		for _, pr := range []proc{a, b} {
			v, err := pr.l.Get(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			seen[v] = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(seen) < 5 {
		t.Fatalf("saw %d values in 30s; want 5", len(seen))
	}
	// The last value may be loaded but not yet seen by both.
	if n := int(d.calls.Load()); n != len(seen) && n != len(seen)+1 {
		t.Errorf("downstream calls = %d for %d values; want one call per value", n, len(seen))
	}
	sa, sb := a.t.Stats(), b.t.Stats()
	la, lb := a.l.Stats(), b.l.Stats()
	t.Logf("a: %d leases, %d hits, %d shared, %d refreshes, %d misses; b: %d leases, %d hits, %d shared, %d refreshes, %d misses",
		sa.Leases, sa.Hits, sa.Shared, la.Refreshes, la.Misses, sb.Leases, sb.Hits, sb.Shared, lb.Refreshes, lb.Misses)
}

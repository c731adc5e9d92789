package flightredis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// newTierProc is newProc: the tier is made by NewTier, and the Loader's
// Options are given once, to flightcache.New, which attaches the tier.
func newTierProc(t *testing.T, addr, prefix string, lo flightcache.Options[string, string], to Options[string, string], d *downstream) proc {
	t.Helper()
	to.Prefix = prefix
	tier, err := NewTier(newClient(t, addr), to)
	if err != nil {
		t.Fatal(err)
	}
	return startProc(t, tier, lo, d)
}

// attachedTier makes a tier on client by NewTier and attaches it as every
// tier is attached: flightcache.New makes a Loader of lo with the tier as
// its Remote. The Loader loads nothing; it and the tier are closed when
// the test ends. The error is NewTier's or flightcache.New's (the Loader's
// options, or Attach's), naming the bad option.
func attachedTier[V any](t testing.TB, client redis.UniversalClient, lo flightcache.Options[string, V], to Options[string, V]) (*Tier[string, V], error) {
	t.Helper()
	tier, err := NewTier(client, to)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = tier.Close() })
	lo.Remote = tier
	l, err := flightcache.New(func(context.Context, string) (V, error) { return *new(V), errBoom }, lo)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = l.Close() })
	return tier, nil
}

// startProc makes the Loader of a simulated process on tier.
func startProc(t *testing.T, tier *Tier[string, string], lo flightcache.Options[string, string], d *downstream) proc {
	t.Helper()
	t.Cleanup(func() { _ = tier.Close() })
	lo.Remote = tier
	l, err := flightcache.New(d.load, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return proc{l: l, t: tier}
}

// Processes whose tiers are made by NewTier share one Redis as one
// fleet: one downstream call between them, and each hands the other its
// value.
func TestNewTierServesTheFleet(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newTierProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newTierProc(t, addr, p, lo, Options[string, string]{}, d)
	for _, pr := range []proc{a, b} {
		if v, err := pr.l.Get(ctx, "k"); err != nil || v != "k-v1" {
			t.Fatalf("Get(k) = %q, %v; want k-v1", v, err)
		}
	}
	if v, err := b.l.Get(ctx, "j"); err != nil || v != "j-v2" {
		t.Fatalf("b.Get(j) = %q, %v; want j-v2", v, err)
	}
	if v, err := a.l.Get(ctx, "j"); err != nil || v != "j-v2" {
		t.Fatalf("a.Get(j) = %q, %v; want b's j-v2", v, err)
	}
	if n := d.calls.Load(); n != 2 {
		t.Errorf("downstream calls = %d; want 2, one per key", n)
	}
	if s := a.t.Stats(); s.Hits != 1 || s.Leases != 1 {
		t.Errorf("the NewTier tier's stats %+v; want 1 hit, 1 lease", s)
	}
}

// A tier not attached yet does not load: Load and every key of LoadMany
// return ErrNotAttached without calling load, and a Set drops the key's
// shared entry (and the fleet's copies) instead of writing a value it has
// no windows for.
func TestTierBeforeAttach(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	w := newProc(t, addr, p, flightcache.Options[string, string]{TTL: time.Hour}, Options[string, string]{}, d)
	if _, err := w.l.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	tier, err := NewTier(newClient(t, addr), Options[string, string]{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	called := false
	load := func(context.Context) (string, error) { called = true; return "x", nil }
	if rv, err := tier.Load(ctx, "k", load); !errors.Is(err, ErrNotAttached) || called || rv.Value != "" {
		t.Errorf("Load before Attach = %+v, %v (load called: %v); want ErrNotAttached, no load", rv, err, called)
	}
	res := tier.LoadMany(ctx, []string{"k", "j"}, func(context.Context, []string) (map[string]string, error) {
		called = true
		return nil, nil
	})
	if len(res) != 2 || !errors.Is(res["k"].Err, ErrNotAttached) || !errors.Is(res["j"].Err, ErrNotAttached) || called {
		t.Errorf("LoadMany before Attach = %+v (load called: %v); want ErrNotAttached for each key, no load", res, called)
	}
	tier.Set(ctx, "k", remote.Value[string]{Value: "set", LoadedAt: time.Now()})
	if n, err := c.Exists(ctx, keysFor(p, "k").entry).Result(); err != nil || n != 0 {
		t.Errorf("after a Set before Attach: the shared entry exists (%d, %v); want it dropped", n, err)
	}
	if s := tier.Stats(); s.EncodeErrors != 0 {
		t.Errorf("EncodeErrors = %d; want 0: nothing failed to encode", s.EncodeErrors)
	}
}

// A Tier serves one Loader: a second flightcache.New with the same tier
// fails with ErrAttached.
func TestTierAttachedToTwoLoaders(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	d := newDownstream()
	byNewTier, err := NewTier(client, Options[string, string]{})
	if err != nil {
		t.Fatal(err)
	}
	defer byNewTier.Close()
	for name, tier := range map[string]*Tier[string, string]{"NewTier": byNewTier} {
		lo.Remote = tier
		first, err := flightcache.New(d.load, lo)
		if err != nil {
			t.Fatalf("%s: the first Loader: %v", name, err)
		}
		defer first.Close()
		if l, err := flightcache.New(d.load, lo); !errors.Is(err, ErrAttached) || l != nil {
			t.Errorf("%s: a second Loader on the tier = %v, %v; want ErrAttached", name, l, err)
		}
		if err := tier.Attach(remote.Rules[string, string]{}); !errors.Is(err, ErrAttached) {
			t.Errorf("%s: Attach after the Loader's = %v; want ErrAttached", name, err)
		}
	}
}

// The options that depend on the Loader are checked when it attaches the
// tier: a LeaseTTL not longer than its LoadTimeout fails flightcache.New
// with an error naming it, and leaves the tier free for a Loader it can
// serve. Rules that are not a Loader's are refused.
func TestAttachChecksTheLease(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	tier, err := NewTier(client, Options[string, string]{LeaseTTL: 2 * time.Second})
	if err != nil {
		t.Fatalf("NewTier with a LeaseTTL of 2s = %v; want a tier (no Loader to check it against yet)", err)
	}
	defer tier.Close()
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 2 * time.Second, Remote: tier}
	if l, err := flightcache.New(d.load, lo); err == nil || !strings.Contains(err.Error(), "Options.LeaseTTL") || l != nil {
		t.Errorf("flightcache.New with LoadTimeout 2s, LeaseTTL 2s = %v, %v; want an error naming Options.LeaseTTL", l, err)
	}
	if err := tier.Attach(remote.Rules[string, string]{}); err == nil || errors.Is(err, ErrAttached) {
		t.Errorf("Attach of zero Rules = %v; want them refused", err)
	}
	lo.LoadTimeout = time.Second
	l, err := flightcache.New(d.load, lo)
	if err != nil {
		t.Fatalf("flightcache.New with LoadTimeout 1s, LeaseTTL 2s = %v; want a Loader", err)
	}
	defer l.Close()
	if a := tier.attached(); a == nil || a.leaseTTL != 2*time.Second || a.rules.Windows.LoadTimeout != time.Second {
		t.Errorf("attached %+v; want the lease of 2s, the Loader's LoadTimeout of 1s", a)
	}
}

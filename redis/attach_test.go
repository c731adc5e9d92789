package flightredis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
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

// newProcByNew is newProc with a tier made by New, from the Loader's
// Options.
func newProcByNew(t *testing.T, addr, prefix string, lo flightcache.Options[string, string], to Options[string, string], d *downstream) proc {
	t.Helper()
	to.Prefix = prefix
	tier, err := New(newClient(t, addr), lo, to)
	if err != nil {
		t.Fatal(err)
	}
	return startProc(t, tier, lo, d)
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

// A tier made by NewTier and attached by its Loader knows what a tier
// made by New from the same Options knows, and writes and judges every
// entry alike: the same windows (per-value Freshness included), lease,
// not-found rule; the same bounds for each value.
func TestNewTierAndNewAgree(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	errGone := errors.New("gone")
	lo := flightcache.Options[string, int]{TTL: 10 * time.Second, Jitter: 0.3, StaleWhileRevalidate: time.Second + 1,
		StaleIfError: time.Minute + 999, EarlyRefresh: 1, LoadTimeout: 3 * time.Second, NotFoundTTL: 5 * time.Second,
		IsNotFound: func(err error) bool { return errors.Is(err, errGone) },
		Freshness: func(k string, v int) flightcache.Freshness {
			switch {
			case v < 0:
				return flightcache.Freshness{TTL: -1}
			case v > 0:
				return flightcache.Freshness{TTL: time.Duration(v) * time.Millisecond, StaleIfError: -1}
			}
			return flightcache.Freshness{}
		}}
	old, err := New(client, lo, Options[string, int]{})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	tier, err := NewTier(client, Options[string, int]{})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	lo.Remote = tier
	l, err := flightcache.New(func(_ context.Context, k string) (int, error) { return 0, nil }, lo)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	a, b := old.attached(), tier.attached()
	if b == nil {
		t.Fatal("flightcache.New did not attach the tier")
	}
	if a.rules.Windows != b.rules.Windows || a.win != b.win || a.leaseTTL != b.leaseTTL || a.leaseMS != b.leaseMS ||
		a.rules.NotFoundTTL != b.rules.NotFoundTTL || a.perValue() != b.perValue() {
		t.Errorf("attached by the Loader: %+v; made by New: %+v; want the same", *b, *a)
	}
	for _, err := range []error{errGone, flightcache.ErrNotFound, errBoom, flightcache.ErrClosed} {
		if old.notFound(err) != tier.notFound(err) || old.coverable(err) != tier.coverable(err) || old.mayCover(err) != tier.mayCover(err) {
			t.Errorf("%v: the two tiers judge it differently", err)
		}
	}
	loadedAt := time.Now()
	for _, v := range []int{0, 1, 250, 7001, -1} {
		rv := flightcache.RemoteValue[int]{Value: v, LoadedAt: loadedAt, Took: time.Millisecond}
		e1, ok1 := old.encode("k", rv, 0.5)
		e2, ok2 := tier.encode("k", rv, 0.5)
		if ok1 != ok2 || e1.at != e2.at || e1.fresh != e2.fresh || e1.stale != e2.stale || e1.until != e2.until || e1.life != e2.life {
			t.Errorf("value %d: encoded %+v, %v by the attached tier; %+v, %v by New's", v, e2, ok2, e1, ok1)
		}
		if !ok1 {
			continue
		}
		e := entry{ok: true, id: "x", at: e1.at, fresh: e1.fresh, stale: e1.stale, until: e1.until}
		for _, at := range []time.Time{loadedAt, fromMicros(e1.fresh), fromMicros(e1.stale), fromMicros(e1.until)} {
			if p1, p2 := a.phase(e, at), b.phase(e, at); p1 != p2 {
				t.Errorf("value %d at %v: phase %v by the attached tier, %v by New's", v, at, p2, p1)
			}
		}
	}
	ks := keysFor("p:", "k")
	n1, n2 := old.notFoundCall(ks, "tok"), tier.notFoundCall(ks, "tok")
	if d1, d2 := n1.args[3].(int64)-n1.args[2].(int64), n2.args[3].(int64)-n2.args[2].(int64); d1 != d2 || n1.args[4] != n2.args[4] {
		t.Errorf("not-found marker: %v µs, PX %v by the attached tier; %v µs, PX %v by New's", d2, n2.args[4], d1, n1.args[4])
	}
}

// Processes whose tiers are made by NewTier and by New share one Redis as
// one fleet: one downstream call between them, and each hands the other
// its value.
func TestNewTierServesTheFleet(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newTierProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProcByNew(t, addr, p, lo, Options[string, string]{}, d)
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
	tier.Set(ctx, "k", flightcache.RemoteValue[string]{Value: "set", LoadedAt: time.Now()})
	if n, err := c.Exists(ctx, keysFor(p, "k").entry).Result(); err != nil || n != 0 {
		t.Errorf("after a Set before Attach: the shared entry exists (%d, %v); want it dropped", n, err)
	}
	if s := tier.Stats(); s.EncodeErrors != 0 {
		t.Errorf("EncodeErrors = %d; want 0: nothing failed to encode", s.EncodeErrors)
	}
}

// A Tier serves one Loader: a second flightcache.New with the same tier
// fails with ErrAttached, whichever constructor made it.
func TestTierAttachedToTwoLoaders(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	d := newDownstream()
	byNew, err := New(client, lo, Options[string, string]{})
	if err != nil {
		t.Fatal(err)
	}
	defer byNew.Close()
	byNewTier, err := NewTier(client, Options[string, string]{})
	if err != nil {
		t.Fatal(err)
	}
	defer byNewTier.Close()
	for name, tier := range map[string]*Tier[string, string]{"New": byNew, "NewTier": byNewTier} {
		lo.Remote = tier
		first, err := flightcache.New(d.load, lo)
		if err != nil {
			t.Fatalf("%s: the first Loader: %v", name, err)
		}
		defer first.Close()
		if l, err := flightcache.New(d.load, lo); !errors.Is(err, ErrAttached) || l != nil {
			t.Errorf("%s: a second Loader on the tier = %v, %v; want ErrAttached", name, l, err)
		}
		if err := tier.Attach(flightcache.Rules[string, string]{}); !errors.Is(err, ErrAttached) {
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
	if err := tier.Attach(flightcache.Rules[string, string]{}); err == nil || errors.Is(err, ErrAttached) {
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

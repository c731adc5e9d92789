package flightredis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// A LoadMany that fails some keys alone (a *flightcache.ManyError) fails
// only those keys through the tier: the others are answered and shared
// with the fleet, a key whose own error is a not-found is shared as one
// (NotFoundTTL), and a key's own failure is not shared: another process
// loads it again.
func TestGetManyKeyErrorsThroughTheTier(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.keyErrs = map[string]error{"bad": errBoom, "gone": flightcache.ErrNotFound}
	lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute, Breaker: flightcache.Breaker{ConsecutiveFailures: 1}}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)

	r := within(t, getMany(a, []string{"ok", "bad", "gone"}), 30*time.Second, "a's GetMany")
	var me *flightcache.ManyError[string]
	if r.m["ok"] != "ok-v1" || len(r.m) != 1 || !errors.As(r.err, &me) || len(me.Errs) != 1 || !errors.Is(me.Errs["bad"], errBoom) {
		t.Fatalf("a.GetMany(ok, bad, gone) = %v, %v; want ok's value, bad alone failed with its own error, gone absent", r.m, r.err)
	}
	if s := a.l.Stats(); s.Breaker != flightcache.BreakerClosed {
		t.Errorf("a's breaker %v; want closed: the downstream answered", s.Breaker)
	}
	r = within(t, getMany(b, []string{"ok", "gone"}), 30*time.Second, "b's GetMany")
	if r.m["ok"] != "ok-v1" || len(r.m) != 1 || r.err != nil {
		t.Errorf("b.GetMany(ok, gone) = %v, %v; want ok's shared value, gone not found", r.m, r.err)
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want a's one: b's keys came from the tier", calls)
	}
	r = within(t, getMany(b, []string{"bad"}), 30*time.Second, "b's GetMany of bad")
	if !errors.As(r.err, &me) || !errors.Is(me.Errs["bad"], errBoom) {
		t.Errorf("b.GetMany(bad) = %v; want its own error, loaded again", r.err)
	}
	if n := d.loadsOf("bad"); n != 2 {
		t.Errorf("bad loaded %d times; want 2: a failure is not shared", n)
	}
}

// A window whose call fails as a whole for one poison key is split
// (flightcache's rule 31) inside the tier's one load of its keys: the
// split answers the tier a map and a *flightcache.ManyError, so the good
// keys are answered and shared with the fleet, the poison key alone fails.
func TestWindowPoisonKeyThroughTheTier(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.poison = "k03"
	lo := flightcache.Options[string, string]{TTL: time.Minute, BatchWindow: time.Minute, MaxBatch: 8}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, flightcache.Options[string, string]{TTL: time.Minute}, Options[string, string]{}, d)

	keys := keyRange("k", 0, 8)
	type got struct {
		key, v string
		err    error
	}
	out := make(chan got, len(keys))
	for _, k := range keys {
		go func() {
			c, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			v, err := a.l.Get(c, k)
			out <- got{k, v, err}
		}()
	}
	for range keys {
		r := within(t, out, 30*time.Second, "a Get")
		switch {
		case r.key == d.poison && !errors.Is(r.err, errBoom):
			t.Errorf("Get(%s) = %v; want the downstream's error", r.key, r.err)
		case r.key != d.poison && (r.err != nil || r.v == ""):
			t.Errorf("Get(%s) = %q, %v; want its value", r.key, r.v, r.err)
		}
	}
	calls := d.allCalls()
	if len(calls) > 7 || len(calls[0]) != 8 {
		t.Errorf("downstream calls %v; want at most 7 (2·log2 8 + 1), the first of the 8 keys", calls)
	}
	if v, err := b.l.Get(ctx, "k00"); err != nil || v == "" || len(d.allCalls()) != len(calls) {
		t.Errorf("b.Get(k00) = %q, %v after %d calls; want the shared value, no call", v, err, len(d.allCalls())-len(calls))
	}
}

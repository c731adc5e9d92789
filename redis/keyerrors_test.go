package flightredis

import (
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

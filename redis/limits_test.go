package flightredis

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// The tier's arithmetic at the far end of time.Duration: lifetimes that
// mean "never" must stay long in Redis, not wrap around to a short or
// negative one.

// TestNeverExpiringEntryStaysShared: a TTL of math.MaxInt64 ("never
// expires") with a stale window must not wrap the entry's Redis lifetime
// around to 1ms: a second process finds the entry later and does not load.
func TestNeverExpiringEntryStaysShared(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: forever, StaleWhileRevalidate: time.Minute}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	if v, err := a.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Fatalf("a.Get(k) = %q, %v; want k-v1", v, err)
	}
	ttl, err := c.PTTL(ctx, keysFor(p, "k").entry).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl != -1 && ttl < 100*365*24*time.Hour {
		t.Errorf("the entry's Redis TTL = %v; want no expiry or over 100 years", ttl)
	}
	// Redis expiry needs real time: the broken lifetime was 1ms.
	time.Sleep(100 * time.Millisecond)
	if v, err := b.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Errorf("b.Get(k) 100ms later = %q, %v; want a's k-v1", v, err)
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls = %d; want 1", n)
	}
	if s := b.t.Stats(); s.Hits != 1 || s.Leases != 0 || s.RedisErrors != 0 {
		t.Errorf("b stats %+v; want 1 hit, no lease, no Redis error", s)
	}
}

// TestHugeLoadTimeoutLeases: a LoadTimeout near the top of time.Duration
// must not wrap the default LeaseTTL around to a negative PX (which Redis
// refuses, stepping the tier aside at every load): the first process
// takes the lease, the second waits for it and shares its value.
func TestHugeLoadTimeoutLeases(t *testing.T) {
	addr := redisAddr(t)
	for _, lt := range []time.Duration{forever, 200 * 365 * 24 * time.Hour} {
		t.Run(lt.String(), func(t *testing.T) {
			c := newClient(t, addr)
			p := testPrefix(t, c)
			d := newDownstream()
			d.gate = make(chan struct{})
			lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: lt}
			a := newProc(t, addr, p, lo, Options[string, string]{}, d)
			b := newProc(t, addr, p, lo, Options[string, string]{}, d)
			if got := a.t.attached().leaseTTL; got < lt {
				t.Errorf("default LeaseTTL = %v; want at least LoadTimeout (%v)", got, lt)
			}

			got := make(chan string, 2)
			for _, pr := range []proc{a, b} {
				go func() {
					v, err := pr.l.Get(ctx, "k")
					if err != nil {
						t.Errorf("Get(k) = %v", err)
					}
					got <- v
				}()
			}
			select {
			case <-d.started:
			case <-time.After(10 * time.Second):
				t.Fatal("no downstream call in 10s")
			}
			eventually(t, 10*time.Second, "the other process to wait on the lease", func() bool {
				return a.t.Stats().Waits+b.t.Stats().Waits == 1
			})
			close(d.gate)
			for range 2 {
				select {
				case v := <-got:
					if v != "k-v1" {
						t.Errorf("Get(k) = %q; want k-v1", v)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("a Get did not return in 10s")
				}
			}
			if n := d.calls.Load(); n != 1 {
				t.Errorf("downstream calls = %d; want 1", n)
			}
			sa, sb := a.t.Stats(), b.t.Stats()
			if sa.Leases+sb.Leases != 1 || sa.Shared+sb.Shared != 1 || sa.RedisErrors+sb.RedisErrors != 0 {
				t.Errorf("stats: a %+v, b %+v; want one lease, one shared, no Redis error", sa, sb)
			}
			lease, err := c.PTTL(ctx, keysFor(p, "k").lease).Result()
			if err != nil || lease != -2 {
				t.Errorf("the lease after the write: PTTL %v, %v; want gone", lease, err)
			}
		})
	}
}

// TestTierSaturatesAtTheExtremes: with every window at the largest
// duration, what the tier gives Redis stays at the largest: the entry's
// times and its PEXPIRE, the not-found marker's, the lease's PX, the
// failure marker's, the poll waits and the step-aside deadline.
func TestTierSaturatesAtTheExtremes(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	lo := flightcache.Options[string, int]{TTL: forever, StaleWhileRevalidate: forever, StaleIfError: forever, LoadTimeout: forever, NotFoundTTL: forever}
	tier, err := attachedTier(t, client, lo, Options[string, int]{RetryAfter: forever, HolderTimeout: forever, PollInterval: forever})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	maxMS := math.MaxInt64 / int64(time.Millisecond)
	if tier.attached().leaseTTL != forever || tier.attached().leaseMS != maxMS || tier.link.aliveMS != maxMS || tier.link.failMS != maxMS {
		t.Errorf("LeaseTTL %v, PX lease %d, alive %d, fail %d; want the largest", tier.attached().leaseTTL, tier.attached().leaseMS, tier.link.aliveMS, tier.link.failMS)
	}
	ks := keysFor("p:", "k")
	now := time.Now()
	enc, ok := tier.encode("k", remote.Value[int]{Value: 1, LoadedAt: now}, 0.5)
	if !ok {
		t.Fatal("encode refused the value")
	}
	_, args := tier.link.writeArgs(ks, enc)
	// writeScript's ARGV after the token: id, v, at, took, fresh, stale,
	// PEXPIRE, channel, base, until. The times, in microseconds, do not
	// overflow (about 2·10¹⁶ at most); the PEXPIRE is the largest.
	at, life := now.UnixMicro(), forever.Microseconds()
	if args[2] != at || args[4] != at+life || args[5] != at+2*life || args[6] != maxMS || args[9] != at+3*life {
		t.Errorf("entry at %v, fresh %v, stale %v, PEXPIRE %v, until %v; want at %d, then the largest", args[2], args[4], args[5], args[6], args[9], at)
	}
	nf := tier.link.notFoundCall(ks, "tok", tier.attached().rules.NotFoundTTL)
	// notFoundScript's ARGV: token, id, at, fresh, PEXPIRE, ...
	if fresh, exp := nf.args[3].(int64), nf.args[4].(int64); fresh <= nf.args[2].(int64) || exp != maxMS {
		t.Errorf("not-found marker fresh %d (at %v), PEXPIRE %d; want after at, and the largest", fresh, nf.args[2], exp)
	}
	tier.link.failed()
	if u := tier.link.downUntil.Load(); u != math.MaxInt64 || !tier.link.down() {
		t.Errorf("after a failure with RetryAfter forever: downUntil %d, down %v; want stepping aside for good", u, tier.link.down())
	}
	e := entry{ok: true, id: "x", at: math.MinInt64, fresh: math.MinInt64, stale: math.MaxInt64, until: -1, took: math.MaxInt64}
	if !tier.usable(ctx, ks, e) { // stale, not handed yet, no max-stale: usable
		t.Error("an entry inside its stale window is not usable")
	}
	if tier.usable(flightcache.WithMaxStale(ctx, time.Hour), ks, e) { // its staleness saturates: past any bound
		t.Error("an entry stale for longer than any duration is usable under a max-stale of 1h")
	}
	if rv, _ := tier.cover(entry{ok: true, id: "x", val: []byte("1"), stale: math.MaxInt64 - 1, until: -1, took: math.MaxInt64}, errors.New("boom")); rv.Took != forever || rv.Value != 1 {
		t.Errorf("cover = %+v; want the value, with Took saturated", rv)
	}
}

// TestBreakerSaturatesAtTheExtremes: the shared breaker's mutex lifetimes
// and its step-aside deadline saturate too.
func TestBreakerSaturatesAtTheExtremes(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	b, err := NewBreaker(client, BreakerOptions{Name: "x", ProbeTimeout: forever, Timeout: forever / 2, RetryAfter: forever})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.store.LockTTL != forever || b.store.ProbeTTL != forever {
		t.Errorf("lock TTL %v, probe TTL %v; want the largest", b.store.LockTTL, b.store.ProbeTTL)
	}
	b.failed()
	if u := b.downUntil.Load(); u != math.MaxInt64 || !b.down() {
		t.Errorf("after a failure with RetryAfter forever: downUntil %d, down %v; want deciding locally for good", u, b.down())
	}
}

package flightredis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// downstream is a fake downstream shared by the Loaders of one test: it
// counts calls, and each call waits on gate (when set) until the test
// closes it. A call returns "<key>-v<n>" (n: the call's number), or the
// key's row once the test has committed one (commit): a test whose writer
// Sets values commits each to the downstream first, as an application
// writes its database before it calls Set, so a load after the Set reads
// what was set, as it would from a database.
type downstream struct {
	calls   atomic.Int64
	rows    sync.Map // key → its committed row (a string)
	gate    chan struct{}
	started chan struct{} // receives (without blocking) when a call starts
	delay   time.Duration // how long each call takes
	mu      sync.Mutex
	err     error
}

func newDownstream() *downstream {
	return &downstream{started: make(chan struct{}, 64)}
}

func (d *downstream) load(ctx context.Context, key string) (string, error) {
	n := d.calls.Add(1)
	select {
	case d.started <- struct{}{}:
	default:
	}
	if d.gate != nil {
		select {
		case <-d.gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if d.delay > 0 {
		time.Sleep(d.delay)
	}
	d.mu.Lock()
	err := d.err
	d.mu.Unlock()
	if err != nil {
		return "", err
	}
	if row, ok := d.rows.Load(key); ok {
		return row.(string), nil
	}
	return fmt.Sprintf("%s-v%d", key, n), nil
}

// commit makes v key's row: every call that reads the row after commit
// returns v.
func (d *downstream) commit(key, v string) { d.rows.Store(key, v) }

func (d *downstream) fail(err error) {
	d.mu.Lock()
	d.err = err
	d.mu.Unlock()
}

// proc is one simulated process: a Loader with its own tier and client.
type proc struct {
	l *flightcache.Loader[string, string]
	t *Tier[string, string]
}

// newProc starts a simulated process on prefix: a Loader whose Remote is a
// tier on a client of its own, both closed when the test ends. The tier
// is made by NewTier and attached by flightcache.New; the other
// helpers that build a tier (batch_test.go, invalidate_test.go,
// outage_test.go, cluster_test.go, fleet_test.go) make it with New, so the
// suite runs on both.
func newProc(t *testing.T, addr, prefix string, lo flightcache.Options[string, string], to Options[string, string], d *downstream) proc {
	t.Helper()
	return newTierProc(t, addr, prefix, lo, to, d)
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var ctx = context.Background()

// Two processes' 20 Gets of one key make one downstream call: one process
// takes the lease, the other waits for its value. The tiers' Timeout is
// generous; a tier that still found Redis too slow steps aside and its
// process loads alone (LocalLoads), one call more per such load and
// nothing else. Its idle twin asserts the figures of a run without a
// Redis error: one call, one lease, one wait answered, every Get k-v1.
func TestTwoLoadersMakeOneCall(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	to := Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: 6 * time.Second}
	a := newProc(t, addr, p, lo, to, d)
	b := newProc(t, addr, p, lo, to, d)

	var wg sync.WaitGroup
	results := make(chan string, 20)
	for _, pr := range []proc{a, b} {
		for range 10 {
			wg.Go(func() {
				v, err := pr.l.Get(ctx, "k")
				if err != nil {
					t.Errorf("Get(k) = %v", err)
				}
				results <- v
			})
		}
	}
	within(t, d.started, 10*time.Second, "downstream call")
	local := func() uint64 { return a.t.Stats().LocalLoads + b.t.Stats().LocalLoads }
	eventually(t, 10*time.Second, "the second loader to wait on the lease (or load alone)", func() bool {
		return a.t.Stats().Waits+b.t.Stats().Waits == 1 || local() > 0
	})
	close(d.gate)
	waitAll(t, &wg, 30*time.Second, "end of the Gets")
	close(results)
	sa, sb := a.t.Stats(), b.t.Stats()
	n := local()
	if n > 0 {
		t.Logf("a tier stepped aside: %d local loads (a %+v, b %+v)", n, sa, sb)
	}
	var vals []string
	for v := range results {
		vals = append(vals, v)
		if version(v) < 1 || version(v) > int64(1+n) {
			t.Errorf("Get(k) = %q; want k-v1 (or a local load's)", v)
		}
	}
	calls := d.calls.Load()
	if calls != int64(1+n) {
		t.Errorf("downstream calls = %d; want 1, plus %d local loads", calls, n)
	}
	if n == 0 && (sa.Leases+sb.Leases != 1 || sa.Shared+sb.Shared != 1) {
		t.Errorf("stats: a %+v, b %+v; want one lease and one shared", sa, sb)
	}
	idleTwin(t, []loadSign{{"RedisErrors", sa.RedisErrors + sb.RedisErrors}}, func(t *testing.T) {
		if calls != 1 || n != 0 {
			t.Errorf("downstream calls = %d, local loads %d; want 1, 0", calls, n)
		}
		if sa.Leases+sb.Leases != 1 || sa.Takeovers+sb.Takeovers != 0 || sa.Waits+sb.Waits != 1 || sa.Shared+sb.Shared != 1 {
			t.Errorf("stats: a %+v, b %+v; want one lease, no takeover, one wait, answered", sa, sb)
		}
		for _, v := range vals {
			if v != "k-v1" {
				t.Errorf("Get(k) = %q; want k-v1", v)
			}
		}
	})
}

// generous are tier options for a test about something else than Redis's
// speed: a loaded machine's round trip past the default Timeout (250ms)
// would step a tier aside, and its Loads would go to the downstream.
var generous = Options[string, string]{Timeout: 5 * time.Second, HolderTimeout: 10 * time.Second}

func TestSharedEntryKeepsItsAge(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newProc(t, addr, p, lo, generous, d)
	b := newProc(t, addr, p, lo, generous, d)

	if _, err := a.l.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	v, info, err := b.l.GetInfo(ctx, "k")
	if err != nil || v != "k-v1" {
		t.Fatalf("b.Get(k) = %q, %v; want k-v1; a's tier %+v, b's %+v", v, err, a.t.Stats(), b.t.Stats())
	}
	if info.Age < 100*time.Millisecond {
		t.Errorf("b.Get(k) age = %v; want >= 100ms (the value was loaded by a)", info.Age)
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls = %d; want 1", n)
	}
	if s := b.t.Stats(); s.Hits != 1 || s.Leases != 0 {
		t.Errorf("b stats %+v; want 1 hit, no lease", s)
	}
}

func TestStaleEntryServedThenRefreshedOnce(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: 200 * time.Millisecond, StaleWhileRevalidate: time.Minute}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	if _, err := a.l.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // stale everywhere
	// b has nothing locally: the stale shared entry is served at once.
	if v, err := b.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Fatalf("b.Get(k) = %q, %v; want k-v1 (stale)", v, err)
	}
	if n := d.calls.Load(); n != 1 {
		t.Fatalf("downstream calls = %d; want 1 (stale served without a load)", n)
	}
	// b's next Gets see its local copy stale and refresh it: the tier does
	// not hand the same stale entry back, it takes the lease and reloads.
	// Both processes then see v2.
	eventually(t, 10*time.Second, "b's refresh", func() bool {
		v, _ := b.l.Get(ctx, "k")
		return v == "k-v2"
	})
	// a refreshes too, when its copy is stale: it finds v2 in Redis.
	eventually(t, 10*time.Second, "a's refresh", func() bool {
		v, _ := a.l.Get(ctx, "k")
		return v == "k-v2"
	})
	if n := d.calls.Load(); n != 2 {
		t.Errorf("downstream calls = %d; want 2", n)
	}
}

func TestFailureIsSharedWithWaiters(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.gate = make(chan struct{})
	d.fail(fmt.Errorf("wrapped: %w", flightcache.ErrNotFound))
	lo := flightcache.Options[string, string]{TTL: time.Minute, Breaker: flightcache.Breaker{Disabled: true}}
	a := newProc(t, addr, p, lo, generous, d)
	b := newProc(t, addr, p, lo, generous, d)

	errs := make(chan error, 2)
	go func() { _, err := a.l.Get(ctx, "k"); errs <- err }()
	within(t, d.started, 10*time.Second, "downstream call")
	go func() { _, err := b.l.Get(ctx, "k"); errs <- err }()
	eventually(t, 10*time.Second, "b to wait on a's lease", func() bool { return b.t.Stats().Waits == 1 })
	close(d.gate)
	for range 2 {
		if err := within(t, errs, 30*time.Second, "answer to a Get"); !errors.Is(err, flightcache.ErrNotFound) {
			t.Errorf("Get(k) error = %v; want one matching ErrNotFound", err)
		}
	}
	if s := b.t.Stats(); s.PeerErrors != 1 {
		t.Errorf("b stats %+v (a's %+v); want 1 peer error", s, a.t.Stats())
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls = %d; want 1 (the failure is shared)", n)
	}
	// Forgotten: the next Get loads again.
	d.fail(nil)
	if v, err := b.l.Get(ctx, "k"); err != nil || v != "k-v2" {
		t.Errorf("b.Get(k) = %q, %v; want k-v2", v, err)
	}
}

func TestDeadHolderIsTakenOver(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 10 * time.Second}
	b := newProc(t, addr, p, lo, Options[string, string]{HolderTimeout: 500 * time.Millisecond}, d)

	// A holder that took the lease and died: its lease lives on (LeaseTTL),
	// its alive key lapses after HolderTimeout.
	ks := keysFor(p, "k")
	c.Set(ctx, ks.lease, "dead", time.Minute)
	c.Set(ctx, ks.alive, "dead", 300*time.Millisecond)

	start := time.Now()
	v, err := b.l.Get(ctx, "k")
	if err != nil || v != "k-v1" {
		t.Fatalf("Get(k) = %q, %v; want k-v1", v, err)
	}
	if s := b.t.Stats(); s.Takeovers != 1 || s.Waits != 1 {
		t.Errorf("stats %+v; want 1 takeover after 1 wait", s)
	}
	t.Logf("took over a dead holder's lease in %v", time.Since(start))
}

// A tier is attached only to a Loader whose options flightcache.New
// validated: a bad Loader option is refused by name.
func TestNewRejectsTheLoadersBadOptions(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	_, err := attachedTier(t, client, flightcache.Options[string, string]{TTL: time.Second, StaleIfError: -1}, Options[string, string]{})
	if err == nil || !strings.Contains(err.Error(), "Options.StaleIfError ") {
		t.Errorf("attaching to a Loader with StaleIfError -1 = %v; want an error naming it", err)
	}
}

// The tier stores each value with its own lifetime (Options.Freshness), so
// every process applies the same one: a value that states a short life is
// not handed to another process past it, and a value not to be cached is
// not shared.
func TestSharedEntryKeepsItsOwnFreshness(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, Freshness: func(k, v string) flightcache.Freshness {
		switch k {
		case "short":
			return flightcache.Freshness{TTL: 300 * time.Millisecond}
		case "never":
			return flightcache.Freshness{TTL: -1}
		}
		return flightcache.Freshness{}
	}}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	if v, err := a.l.Get(ctx, "short"); err != nil || v != "short-v1" {
		t.Fatalf("a.Get(short) = %q, %v", v, err)
	}
	if v, err := b.l.Get(ctx, "short"); err != nil || v != "short-v1" {
		t.Fatalf("b.Get(short) within its 300ms = %q, %v; want the shared short-v1", v, err)
	}
	time.Sleep(400 * time.Millisecond)
	if v, err := b.l.Get(ctx, "short"); err != nil || v != "short-v2" {
		t.Errorf("b.Get(short) 400ms on = %q, %v; want a new load (the value lived 300ms, the TTL is a minute)", v, err)
	}
	if n := d.calls.Load(); n != 2 {
		t.Errorf("downstream calls = %d; want 2", n)
	}
	a.l.Get(ctx, "never")
	b.l.Get(ctx, "never")
	if n := d.calls.Load(); n != 4 {
		t.Errorf("downstream calls after two Gets of a value not to be cached = %d; want 4", n)
	}
}

// With Jitter 1 each value's freshness is drawn from (0, TTL]. The shared
// entry draws its own, as every entry of a Loader does, rather than take
// the shortest draw, which Jitter 1 drives to nothing: a second process
// gets the first's value without loading it, and Redis keeps the entry
// for the life it drew. (A draw under the 50ms this waits, one chance in
// 70000 per key, would fail it.)
func TestSharedEntryWithFullJitter(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour, Jitter: 1}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)
	gctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()

	for i := range 3 { // each key draws its own
		key := fmt.Sprint("k", i)
		want := fmt.Sprintf("%s-v%d", key, d.calls.Load()+1)
		if v, err := a.l.Get(gctx, key); err != nil || v != want {
			t.Fatalf("a.Get(%q) = %q, %v; want %s", key, v, err, want)
		}
		time.Sleep(50 * time.Millisecond) // Redis expiry needs real time: the broken lifetime was 1ms
		name := keysFor(p, key).entry
		ttl, err := c.PTTL(gctx, name).Result()
		if err != nil || ttl <= 0 || ttl > lo.TTL {
			t.Errorf("PTTL of %s's shared entry = %v, %v; want in (0, %v]", key, ttl, err, lo.TTL)
		}
		vals, err := c.HMGet(gctx, name, entryFields...).Result()
		if e, perr := parseEntry(vals); err == nil && perr == nil && e.ok {
			// No stale windows: the entry lives until the end of its
			// freshness, and Redis frees it then.
			life, left := fromUS(e.fresh-e.at), fromMicros(e.until).Sub(time.Now())
			t.Logf("%s: drew a freshness of %v; PTTL %v", key, life.Round(time.Second), ttl.Round(time.Second))
			if e.until != e.fresh || life <= 0 || life > lo.TTL || (ttl > 0 && (ttl-left).Abs() > time.Second) {
				t.Errorf("%s's shared entry: fresh for %v, until %v from now, PTTL %v; want one drawn life in (0, %v], which Redis keeps",
					key, life, left.Round(time.Millisecond), ttl, lo.TTL)
			}
		}
		calls := d.calls.Load()
		if v, err := b.l.Get(gctx, key); err != nil || v != want {
			t.Errorf("b.Get(%q) = %q, %v; want a's %s", key, v, err, want)
		}
		if n := d.calls.Load() - calls; n != 0 {
			t.Errorf("b.Get(%q) made %d downstream calls; want none (a's value is shared)", key, n)
		}
	}
	if s := b.t.Stats(); s.Hits != 3 || s.Leases != 0 {
		t.Errorf("b stats %+v; want 3 hits, no lease", s)
	}
}

// A reload through the tier revalidates the fleet's value: a process that
// holds nothing reloads the value another process stored (Options.Reload
// gets it as old), and a 304 renews it for every process. Redis and the
// entries' times need the real clock: the TTL is 3s, so the margins hold on
// a loaded machine (a value not renewed is over 3s old when b reads it; a
// reads the renewed one well inside its 3s of freshness), and the tiers'
// Timeout is generous (a process that stepped aside would reload alone).
func TestReloadRevalidatesTheFleetsValue(t *testing.T) {
	const ttl = 3 * time.Second
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	var mu sync.Mutex
	var olds []string
	lo := flightcache.Options[string, string]{TTL: ttl, StaleIfError: time.Minute,
		Reload: func(ctx context.Context, k, old string) (string, error) {
			mu.Lock()
			olds = append(olds, old)
			mu.Unlock()
			return "", flightcache.ErrNotModified
		}}
	a := newProc(t, addr, p, lo, generous, d)
	b := newProc(t, addr, p, lo, generous, d)
	gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if v, err := a.l.Get(gctx, "k"); err != nil || v != "k-v1" {
		t.Fatalf("a.Get = %q, %v", v, err)
	}
	time.Sleep(ttl + 200*time.Millisecond) // past freshness (a's copy and the shared entry), within StaleIfError
	renewing := time.Now()
	v, info, err := b.l.GetInfo(gctx, "k")
	if err != nil || v != "k-v1" || info.Age > ttl/2 {
		t.Fatalf("b.Get = %q (age %v), %v; want the fleet's k-v1, renewed (not renewed, it is over %v old)", v, info.Age, err, ttl)
	}
	mu.Lock()
	got := append([]string(nil), olds...)
	mu.Unlock()
	if len(got) != 1 || got[0] != "k-v1" || d.calls.Load() != 1 {
		t.Errorf("Reload given %q, LoadFunc calls %d; want [k-v1] (b held nothing), 1", got, d.calls.Load())
	}
	if s := b.l.Stats(); s.NotModified != 1 {
		t.Errorf("b's Stats.NotModified = %d; want 1", s.NotModified)
	}
	// The renewed entry is fresh for the fleet: a's next Get, past its own
	// copy's freshness, takes it from the tier without a reload.
	if v, err := a.l.Get(gctx, "k"); err != nil || v != "k-v1" {
		t.Errorf("a.Get after the renewal = %q, %v", v, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(olds) != 1 {
		t.Errorf("Reload calls after a's Get = %d, %v after b's renewal began; want still 1 (the renewed shared entry, fresh for %v, served a)",
			len(olds), time.Since(renewing).Round(time.Millisecond), ttl)
	}
}

package flightredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/wake"
)

// ownRedis is a redis-server process owned by one test, so the test can
// stop, freeze and restart it without disturbing the shared one.
type ownRedis struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
}

func startOwnRedis(t *testing.T) *ownRedis {
	t.Helper()
	redisAddr(t) // same gate as every Redis test
	singleNodeOnly(t, "it stops, freezes and restarts a redis-server of its own")
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not on PATH: CI must install it (redis/testdata/start-redis.sh)")
		}
		t.Skip("redis-server is not on PATH: this test stops and restarts a server of its own")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &ownRedis{t: t, addr: ln.Addr().String()}
	ln.Close()
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *ownRedis) start() {
	r.t.Helper()
	_, port, _ := net.SplitHostPort(r.addr)
	r.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port,
		"--save", "", "--appendonly", "no", "--dir", r.t.TempDir())
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	c := newClient(r.t, r.addr)
	eventually(r.t, 10*time.Second, "redis-server to answer", func() bool { return c.Ping(ctx).Err() == nil })
}

func (r *ownRedis) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // in case it is frozen
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

func (r *ownRedis) signal(s syscall.Signal) {
	if err := r.cmd.Process.Signal(s); err != nil {
		r.t.Fatal(err)
	}
}

func TestRedisStoppedThenBack(t *testing.T) {
	srv := startOwnRedis(t)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	to := Options[string, string]{Timeout: 200 * time.Millisecond, RetryAfter: 300 * time.Millisecond}
	a := newProc(t, srv.addr, "fctest:", lo, to, d)
	b := newProc(t, srv.addr, "fctest:", lo, to, d)

	if _, err := a.l.Get(ctx, "before"); err != nil {
		t.Fatal(err)
	}
	srv.stop()

	// Redis is gone: Gets keep working, locally, one call per key per
	// process, and none waits long.
	local := a.t.Stats().LocalLoads // "before" loaded through Redis, or alone on a loaded machine
	var slowest time.Duration
	for i := range 5 {
		start := time.Now()
		key := fmt.Sprint("down-", i)
		if v, err := a.l.Get(ctx, key); err != nil || v != key+"-v"+fmt.Sprint(d.calls.Load()) {
			t.Fatalf("a.Get(%q) with Redis down = %q, %v; want the downstream's value", key, v, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	var wg sync.WaitGroup
	before := d.calls.Load()
	for range 20 {
		wg.Go(func() {
			if _, err := b.l.Get(ctx, "burst"); err != nil {
				t.Errorf("b.Get(burst) with Redis down = %v", err)
			}
		})
	}
	waitAll(t, &wg, 30*time.Second, "end of the burst")
	if n := d.calls.Load() - before; n != 1 {
		t.Errorf("20 Gets of one key with Redis down made %d calls; want 1 (local single-flight)", n)
	}
	sa := a.t.Stats()
	if sa.RedisErrors == 0 || sa.LocalLoads-local != 5 {
		t.Errorf("a stats with Redis down %+v (%d local loads before); want Redis errors and 5 local loads", sa, local)
	}
	t.Logf("with Redis down, the slowest Get took %v (Timeout %v)", slowest.Round(time.Millisecond), to.Timeout)

	// Redis is back (empty): after RetryAfter the tier resumes, for both
	// processes, pub/sub included.
	srv.start()
	leases := a.t.Stats().Leases
	eventually(t, 20*time.Second, "a's tier to resume", func() bool {
		_, err := a.l.Get(ctx, "after-"+token(4))
		return err == nil && a.t.Stats().Leases > leases
	})
	eventually(t, 20*time.Second, "b to use a's values again", func() bool {
		key := "again-" + token(4)
		if _, err := a.l.Get(ctx, key); err != nil {
			return false
		}
		calls := d.calls.Load()
		v, err := b.l.Get(ctx, key)
		return err == nil && v == key+"-v"+fmt.Sprint(calls) && d.calls.Load() == calls
	})
	if s := b.t.Stats(); s.Hits == 0 {
		t.Errorf("b stats after Redis came back %+v; want a hit", s)
	}
	// The wake-up subscriptions work again: a publish wakes a waiter.
	w := make(chan struct{}, 1)
	b.t.wake.Watch(w, "probe")
	defer b.t.wake.Unwatch(w, "probe")
	pub := newClient(t, srv.addr)
	eventually(t, 20*time.Second, "pub/sub to resume", func() bool {
		pub.Publish(ctx, wake.Channel("probe"), "")
		select {
		case <-w:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
}

func TestRedisFrozenDoesNotHang(t *testing.T) {
	srv := startOwnRedis(t)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 10 * time.Second}
	to := Options[string, string]{Timeout: 200 * time.Millisecond}
	a := newProc(t, srv.addr, "fctest:", lo, to, d)
	if _, err := a.l.Get(ctx, "warm"); err != nil { // connections open before the freeze
		t.Fatal(err)
	}

	srv.signal(syscall.SIGSTOP) // accepts nothing, answers nothing: a hung Redis
	t.Cleanup(func() { srv.signal(syscall.SIGCONT) })
	start := time.Now()
	v, err := a.l.Get(ctx, "cold")
	took := time.Since(start)
	if err != nil || v != "cold-v2" {
		t.Fatalf("Get(cold) with Redis frozen = %q, %v; want cold-v2", v, err)
	}
	if s := a.t.Stats(); s.RedisErrors == 0 || s.LocalLoads != 1 {
		t.Errorf("stats %+v; want a Redis error and 1 local load", s)
	}
	t.Logf("with Redis frozen, a cold Get took %v (Timeout %v)", took.Round(time.Millisecond), to.Timeout)
	if took > lo.LoadTimeout {
		t.Errorf("Get(cold) took %v; want far under LoadTimeout (%v)", took, lo.LoadTimeout)
	}
}

func TestNewDoesNotWaitForAHungRedis(t *testing.T) {
	srv := startOwnRedis(t)
	srv.signal(syscall.SIGSTOP)
	t.Cleanup(func() { srv.signal(syscall.SIGCONT) })
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	to := Options[string, string]{Prefix: "fctest:", Timeout: 200 * time.Millisecond}
	c := newClient(t, srv.addr)
	start := time.Now()
	tier, err := NewTier(c, to)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("NewTier took %v with Redis hung; want it not to wait for Redis", took)
	}
	lo.Remote = tier
	l, err := flightcache.New(d.load, lo)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Errorf("Get(k) with Redis hung = %q, %v; want k-v1", v, err)
	}
	_ = l.Close()
	// Close waits for go-redis to give up the subscription's connection
	// attempt: bounded by the client's timeouts, not by Redis.
	start = time.Now()
	_ = tier.Close()
	t.Logf("with Redis hung, Tier.Close took %v", time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("Tier.Close took %v with Redis hung", took)
	}
}

// While an InvalidateAll is kept because Redis does not answer, the Loads
// that find it kept wait for one move at most, not for one move each: a
// Load that waited while another's move failed loads locally, as the tier
// steps aside, instead of trying again for a Timeout of its own. So every
// Get returns within about Timeout, and the loads drain at once, whether
// Redis is stopped or frozen.
func TestLoadsDoNotQueueBehindAKeptInvalidateAll(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outage func(t *testing.T, srv *ownRedis)
	}{
		{"stopped", func(t *testing.T, srv *ownRedis) { srv.stop() }},
		{"frozen", func(t *testing.T, srv *ownRedis) {
			srv.signal(syscall.SIGSTOP) // answers nothing: every round trip takes Timeout
			t.Cleanup(func() { srv.signal(syscall.SIGCONT) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { loadsBehindAKeptInvalidateAll(t, tc.outage) })
	}
}

func loadsBehindAKeptInvalidateAll(t *testing.T, outage func(*testing.T, *ownRedis)) {
	srv := startOwnRedis(t)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	to := Options[string, string]{Timeout: 250 * time.Millisecond, RetryAfter: 300 * time.Millisecond}
	a := newProc(t, srv.addr, "fctest:", lo, to, d)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.l.Get(wctx, "warm"); err != nil { // connections open before the outage
		t.Fatal(err)
	}

	outage(t, srv)
	a.l.InvalidateAll() // its move fails: the call is kept
	if s := a.t.Stats(); s.InvalidateAllsSent != 0 || s.RedisErrors == 0 {
		t.Fatalf("a's tier: sent %d, Redis errors %d; want 0 and > 0 (the move failed)", s.InvalidateAllsSent, s.RedisErrors)
	}
	// Once RetryAfter is over, the next Loads make the move first; Redis
	// still does not answer.
	eventually(t, 10*time.Second, "the tier to stop stepping aside", func() bool { return !a.t.link.down() })

	const n = 24
	deadline := 6 * to.Timeout // wide: one move's Timeout is the promise
	calls, local := d.calls.Load(), a.t.Stats().LocalLoads
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	for i := range n {
		wg.Go(func() {
			gctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			key := fmt.Sprint("cold-", i)
			begin := time.Now()
			v, err := a.l.Get(gctx, key)
			took := time.Since(begin)
			mu.Lock()
			slowest = max(slowest, took)
			mu.Unlock()
			if err != nil || !strings.HasPrefix(v, key+"-v") {
				t.Errorf("Get(%q) after %v = %q, %v; want the downstream's value within %v", key, took.Round(time.Millisecond), v, err, deadline)
			}
		})
	}
	waitAll(t, &wg, time.Minute, "end of the cold Gets")
	t.Logf("%d cold Gets with an InvalidateAll kept and Redis out: the slowest took %v (Timeout %v)",
		n, slowest.Round(time.Millisecond), to.Timeout)
	// Every load got past the kept call to the downstream, soon after the
	// Gets: none is still queued for a move of its own.
	eventually(t, 2*time.Second, "every load to reach the downstream", func() bool { return d.calls.Load()-calls == n })
	t.Logf("the %d loads drained %v after the Gets began", n, time.Since(start).Round(time.Millisecond))
	// Each of them is a local load, and nothing else is: the count is
	// taken from before the Gets (the warm Get may have loaded alone).
	if s := a.t.Stats(); s.InvalidateAllsSent != 0 || s.LocalLoads-local != n {
		t.Errorf("a's tier: sent %d, local loads %d; want 0 and %d", s.InvalidateAllsSent, s.LocalLoads-local, n)
	}
}

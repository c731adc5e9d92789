package flightredis

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// listening waits until every tier of ps hears the fleet's invalidations.
func listening(t *testing.T, ps ...proc) {
	t.Helper()
	eventually(t, 5*time.Second, "the tiers' subscriptions", func() bool {
		for _, p := range ps {
			if !p.t.Stats().Listening {
				return false
			}
		}
		return true
	})
}

// listeningPair builds two simulated processes of any key and value types
// (a Loader on load, TTL an hour, each with its own client and tier built
// with to) and waits until both tiers listen.
func listeningPair[K comparable, V any](t *testing.T, addr string, load flightcache.LoadFunc[K, V], to Options[K, V]) ([]*flightcache.Loader[K, V], []*Tier[K, V]) {
	t.Helper()
	var ls []*flightcache.Loader[K, V]
	var ts []*Tier[K, V]
	for range 2 {
		lo := flightcache.Options[K, V]{TTL: time.Hour}
		tier, err := NewTier(newClient(t, addr), to)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tier.Close() })
		lo.Remote = tier
		l, err := flightcache.New(load, lo)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls, ts = append(ls, l), append(ts, tier)
	}
	eventually(t, 5*time.Second, "the subscriptions", func() bool { return ts[0].Stats().Listening && ts[1].Stats().Listening })
	return ls, ts
}

// An Invalidate in one process drops the key in the others, and a Set
// replaces it there, through the shared entry: no process serves the old
// value, fresh, until its TTL runs out.
func TestInvalidateAndSetReachEveryProcess(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	a := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	c := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	listening(t, a, b, c)

	v1, _ := a.l.Get(ctx, "k")
	for _, p := range []proc{b, c} {
		if v, _ := p.l.Get(ctx, "k"); v != v1 {
			t.Fatalf("Get = %q, want the fleet's %q", v, v1)
		}
	}
	a.l.Invalidate("k")
	eventually(t, 5*time.Second, "b and c to drop k", func() bool {
		return b.l.Stats().RemoteDrops == 1 && c.l.Stats().RemoteDrops == 1
	})
	v2, _ := b.l.Get(ctx, "k")
	if v, _ := c.l.Get(ctx, "k"); v2 == v1 || v != v2 {
		t.Fatalf("after Invalidate: b %q, c %q; want one new value (was %q)", v2, v, v1)
	}
	if n := d.calls.Load(); n != 2 {
		t.Fatalf("downstream calls = %d, want 2 (one per value)", n)
	}

	a.l.Set("k", "set-by-a")
	eventually(t, 5*time.Second, "b and c to drop k again", func() bool {
		return b.l.Stats().RemoteDrops == 2 && c.l.Stats().RemoteDrops == 2
	})
	for _, p := range []proc{b, c} {
		if v, _ := p.l.Get(ctx, "k"); v != "set-by-a" {
			t.Fatalf("after Set: Get = %q, want set-by-a", v)
		}
	}
	if n := d.calls.Load(); n != 2 {
		t.Fatalf("downstream calls = %d after the Set, want still 2", n)
	}
	// The writer hears its own messages too, and drops its copy: a Get
	// that raced its write may have read the old shared entry back.
	eventually(t, 5*time.Second, "the writer's own echoes", func() bool { return a.l.Stats().RemoteDrops == 2 })
	if s := a.t.Stats(); s.InvalidationsSent != 2 || s.InvalidationsHeard != 0 {
		t.Fatalf("the writer: sent %d, heard %d; want 2, 0 (its own messages are not counted as heard)",
			s.InvalidationsSent, s.InvalidationsHeard)
	}
	if v, _ := a.l.Get(ctx, "k"); v != "set-by-a" {
		t.Fatalf("the writer after its echo: %q, want set-by-a", v)
	}
	// b hears the Invalidate and, as a rule, the Set. With tracking, the
	// echo of b's own fill has b read the entry's id again (tracked), and
	// when that read comes after a's Set, b tracked nothing when the Set
	// landed: the read itself finds b's copy outdated and drops it (the
	// second RemoteDrop above), and no message comes.
	if s := b.t.Stats(); s.InvalidationsHeard < 1 || s.InvalidationsHeard > 2 || s.UndecodedInvalidations != 0 || s.Distrusts != 0 {
		t.Fatalf("b: heard %d, undecoded %d, distrusts %d; want 2 (or 1, see above), 0, 0", s.InvalidationsHeard, s.UndecodedInvalidations, s.Distrusts)
	}
}

// A key that is not a string travels as JSON, and drops the same key.
func TestInvalidationOfAStructKey(t *testing.T) {
	type sku struct {
		Region string
		ID     int
	}
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	var calls atomic.Int64
	load := func(_ context.Context, k sku) (int, error) { return int(calls.Add(1)), nil }
	key := func(k sku) string { return fmt.Sprintf("%s/%d", k.Region, k.ID) }
	procs, tiers := listeningPair(t, addr, load, Options[sku, int]{Prefix: prefix, Key: key})
	k := sku{"eu\nwest", 7} // a newline in the name too
	procs[1].Get(ctx, k)
	procs[1].Get(ctx, sku{"eu\nwest", 8})
	procs[0].Invalidate(k)
	eventually(t, 5*time.Second, "the drop", func() bool { return procs[1].Stats().RemoteDrops == 1 })
	if _, info, _ := procs[1].GetInfo(ctx, k); info.Source != flightcache.SourceLoaded {
		t.Fatalf("the invalidated key: %v, want loaded", info.Source)
	}
	if _, info, _ := procs[1].GetInfo(ctx, sku{"eu\nwest", 8}); info.Source != flightcache.SourceHit {
		t.Fatalf("another key was dropped too: %v", info.Source)
	}
	if s := tiers[1].Stats(); s.UndecodedInvalidations != 0 {
		t.Fatalf("UndecodedInvalidations = %d", s.UndecodedInvalidations)
	}
}

// A message the tier cannot read names a key it cannot find: it distrusts
// every local copy instead, and each is read again (from the shared entry,
// without a downstream call) before it is served.
func TestUndecodedInvalidationDistrustsEverything(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	prefix := testPrefix(t, c)
	d := newDownstream()
	p := newProc(t, addr, prefix, flightcache.Options[string, string]{TTL: time.Hour}, Options[string, string]{}, d)
	listening(t, p)
	for _, k := range []string{"a", "b"} {
		p.l.Get(ctx, k)
	}
	if err := c.Publish(ctx, prefix+"invalidated", "someone\nname\n{not json").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the distrust", func() bool { return p.l.Stats().Distrusts == 1 })
	for _, k := range []string{"a", "b"} {
		if _, info, err := p.l.GetInfo(ctx, k); err != nil || info.Source != flightcache.SourceLoaded {
			t.Fatalf("Get(%s) after the distrust: %v, %v; want a reread", k, info.Source, err)
		}
	}
	if n := d.calls.Load(); n != 2 {
		t.Fatalf("downstream calls = %d, want 2: the rereads come from the shared entries", n)
	}
	s := p.t.Stats()
	if s.UndecodedInvalidations != 1 || s.Distrusts != 1 || s.Hits != 2 {
		t.Fatalf("tier: undecoded %d, distrusts %d, hits %d; want 1, 1, 2", s.UndecodedInvalidations, s.Distrusts, s.Hits)
	}
}

// When the subscription is lost, every local copy is distrusted: an
// Invalidate the process could not hear is not served past, whatever the
// timing. The tier says so in Stats, and listens again.
func TestSubscriptionLossDistrustsEveryCopy(t *testing.T) {
	singleNodeOnly(t, "kills the pub/sub connections of one server")
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	a := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	listening(t, a, b)
	old, _ := b.l.Get(ctx, "k")

	// Kill every pub/sub connection: both tiers lose their subscription.
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b to see its subscription lost", func() bool { return b.t.Stats().SubscriptionLosses >= 1 })
	a.l.Invalidate("k") // b may or may not hear this one
	if v, _ := b.l.Get(ctx, "k"); v == old {
		t.Fatalf("b served %q after an Invalidate it could not hear", v)
	}
	listening(t, a, b)
	if s := b.l.Stats(); s.Distrusts < 1 || s.Rereads < 1 {
		t.Fatalf("b's Loader: Distrusts %d, Rereads %d; want >= 1 each", s.Distrusts, s.Rereads)
	}
}

// A Set or Invalidate that cannot reach Redis is kept and sent, as an
// invalidation, once the tier can reach Redis again.
func TestWriteThatMissedRedisIsReplayed(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	// A Timeout generous for a loaded machine: the replay is made after
	// RetryAfter whatever it is, and a replay that timed out waits for the
	// next.
	to := Options[string, string]{RetryAfter: 300 * time.Millisecond, Timeout: time.Second}
	a := newProc(t, addr, prefix, lo, to, d)
	b := newProc(t, addr, prefix, lo, to, d)
	listening(t, a, b)
	v1, _ := b.l.Get(ctx, "k")

	a.t.link.failed() // as after a failed round trip: a steps aside for RetryAfter
	a.l.Set("k", "new")
	if s := a.t.Stats(); s.Skipped != 1 {
		t.Fatalf("Skipped = %d, want 1", s.Skipped)
	}
	if v, _ := b.l.Get(ctx, "k"); v != v1 {
		t.Fatalf("b = %q before the replay; want %q still", v, v1)
	}
	eventually(t, 10*time.Second, "the replay", func() bool { return a.t.Stats().InvalidationsReplayed == 1 })
	eventually(t, 10*time.Second, "b to drop k", func() bool { return b.l.Stats().RemoteDrops == 1 })
	if v, _ := b.l.Get(ctx, "k"); v == v1 {
		t.Fatalf("b still serves %q after the replayed Set", v)
	}
	if s := a.t.Stats(); s.InvalidationsLost != 0 {
		t.Fatalf("InvalidationsLost = %d", s.InvalidationsLost)
	}
}

// The first Loads of a tier wait (at most Timeout) for its subscription,
// so a fleet that starts together hands out nothing it could not hear the
// invalidation of: no distrust, no reread.
func TestFirstLoadsWaitForTheSubscription(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	p := newProc(t, addr, prefix, flightcache.Options[string, string]{TTL: time.Hour}, Options[string, string]{}, d)
	p.l.Get(ctx, "k") // at once: the subscription may not be up yet
	if !p.t.Stats().Listening {
		t.Fatal("a Load returned before the subscription was confirmed")
	}
	if s := p.t.Stats(); s.Distrusts != 0 {
		t.Fatalf("Distrusts = %d, want 0", s.Distrusts)
	}
}

// TestInvalidationLatencyAcrossProcesses measures fleet-wide invalidation
// with 4 processes: this one writes (a version in Redis, the "database",
// then Invalidate), 3 children (the test binary re-executed with
// FLIGHTREDIS_CHILD=reader) read the key in a loop, each through its own
// Loader and tier, with a TTL of an hour. For each invalidation it records
// how long after Invalidate returned each child first served the new
// version; a child that serves an older version after a newer one counts
// a stale read. The rule: every child serves every version, and none
// goes back, even where the machine is loaded enough that Invalidates
// reach Redis late (the writer's round trip passes Timeout: kept, and
// replayed) and readers step aside (their own round trips pass it: loaded
// without Redis, then read again). Those are counted and logged, with the
// latencies (docs/distributed-invalidation.md quotes them); every
// Invalidate must still reach Redis, at once or replayed. The idle twin
// asserts the figures of a run in which no tier met a Redis error: every
// Invalidate sent at once, no reader loaded without Redis.
func TestInvalidationLatencyAcrossProcesses(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	db := prefix + "{db}"
	if err := admin.Set(ctx, db, 0, 0).Err(); err != nil {
		t.Fatal(err)
	}
	load := func(ctx context.Context, key string) (string, error) {
		return admin.Get(ctx, db).Result()
	}
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	tier, err := NewTier(newClient(t, addr), Options[string, string]{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	lo.Remote = tier
	writer, err := flightcache.New(load, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = writer.Close() })

	const readers = 3
	type seen struct {
		version int
		at      time.Time
	}
	seenCh := make([]chan seen, readers)
	doneCh := make(chan childDone, readers)
	var stdins []io.WriteCloser
	var cmds []*exec.Cmd
	for i := range readers {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=reader", "FR_ADDR="+addr, "FR_PREFIX="+prefix, "FR_DB="+db)
		cmd.Stderr = os.Stderr
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stdins, cmds = append(stdins, stdin), append(cmds, cmd)
		seenCh[i] = make(chan seen, rounds+2)
		go func(ch chan seen) {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				switch {
				case len(f) == 3 && f[0] == "seen":
					v, _ := strconv.Atoi(f[1])
					ns, _ := strconv.ParseInt(f[2], 10, 64)
					ch <- seen{v, time.Unix(0, ns)}
				case len(f) == 7 && f[0] == "done":
					var d childDone
					for i, p := range []*int{&d.stale, &d.reads, &d.localLoads, &d.aheadLoads, &d.distrusts, &d.redisErrors} {
						*p, _ = strconv.Atoi(f[i+1])
					}
					doneCh <- d
				}
			}
			close(ch)
		}(seenCh[i])
	}
	t.Cleanup(func() {
		for i, c := range cmds {
			_ = stdins[i].Close()
			_ = c.Wait()
		}
	})
	next := func(i, want int) seen {
		// A late Invalidate is replayed at the writer's next health check
		// once its tier stops stepping aside (about 2s); the bound is for
		// a reader that never serves the version.
		timer := time.NewTimer(30 * time.Second)
		defer timer.Stop()
		for {
			select {
			case s, ok := <-seenCh[i]:
				if !ok {
					t.Fatalf("reader %d exited before serving version %d", i, want)
				}
				if s.version >= want {
					return s
				}
			case <-timer.C:
				t.Fatalf("reader %d did not serve version %d within 30s", i, want)
			}
		}
	}
	for i := range readers { // each reader serves version 0, the first load
		next(i, 0)
	}

	var lat []time.Duration // per round, until the last reader served the new version
	for v := 1; v <= rounds; v++ {
		if err := admin.Incr(ctx, db).Err(); err != nil {
			t.Fatal(err)
		}
		writer.Invalidate("k")
		t0 := time.Now()
		var worst time.Duration
		for i := range readers {
			if s := next(i, v); s.at.Sub(t0) > worst {
				worst = s.at.Sub(t0)
			}
		}
		lat = append(lat, worst)
	}
	var sum childDone
	for i := range readers {
		_ = stdins[i].Close()
		select {
		case r := <-doneCh:
			sum.stale += r.stale
			sum.reads += r.reads
			sum.localLoads += r.localLoads
			sum.aheadLoads += r.aheadLoads
			sum.distrusts += r.distrusts
			sum.redisErrors += r.redisErrors
		case <-time.After(30 * time.Second):
			t.Fatal("a reader did not report")
		}
	}
	// Every Invalidate reaches Redis: at once, or kept and then replayed
	// or covered by a later one that reached it (those kept of the key
	// while one waits are replayed as one).
	eventually(t, 30*time.Second, "the writer's kept Invalidates to be replayed", func() bool {
		tier.fleet.mu.Lock()
		defer tier.fleet.mu.Unlock()
		return len(tier.fleet.pending) == 0
	})
	s := tier.Stats()
	atOnce := s.InvalidationsSent - s.InvalidationsReplayed
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	t.Logf("%d invalidations, %d readers: until no reader serves the old value p50 %v, p99 %v, max %v; %d reads, %d stale after a newer one",
		rounds, readers, pct(0.50), pct(0.99), lat[len(lat)-1], sum.reads, sum.stale)
	t.Logf("writer: %d Invalidates reached Redis at once, %d late (kept, then %d replays); readers: %d loads without Redis, %d loads of a key they were ahead of Redis on, %d distrusts",
		atOnce, uint64(rounds)-min(atOnce, uint64(rounds)), s.InvalidationsReplayed, sum.localLoads, sum.aheadLoads, sum.distrusts)
	if sum.stale != 0 {
		t.Errorf("%d reads served a version older than one already served", sum.stale)
	}
	if atOnce > uint64(rounds) || s.InvalidationsLost != 0 {
		t.Errorf("InvalidationsSent %d, Replayed %d, Lost %d: want at most %d sent at once, none lost",
			s.InvalidationsSent, s.InvalidationsReplayed, s.InvalidationsLost, rounds)
	}
	// The idle twin: where no tier met a Redis error, every Invalidate
	// reached Redis at once and every reader read through the tier.
	idleTwin(t, []loadSign{{"the writer's RedisErrors", s.RedisErrors}, {"the readers' RedisErrors", uint64(sum.redisErrors)}}, func(t *testing.T) {
		if s.InvalidationsSent != uint64(rounds) || s.InvalidationsReplayed != 0 || s.Skipped != 0 {
			t.Errorf("writer: InvalidationsSent %d, Replayed %d, Skipped %d; want %d, 0, 0", s.InvalidationsSent, s.InvalidationsReplayed, s.Skipped, rounds)
		}
		if sum.localLoads != 0 || sum.aheadLoads != 0 {
			t.Errorf("readers: %d loads without Redis, %d ahead loads; want 0, 0", sum.localLoads, sum.aheadLoads)
		}
	})
}

// childDone is what a reader of TestInvalidationLatencyAcrossProcesses
// reports when it ends: its reads, those of a version older than one it
// had served, and its tier's LocalLoads, AheadLoads, Distrusts and
// RedisErrors.
type childDone struct{ stale, reads, localLoads, aheadLoads, distrusts, redisErrors int }

// readerChild is a reader of TestInvalidationLatencyAcrossProcesses: it
// reads "k" in a loop and prints "seen <version> <unix ns>" each time it
// serves a newer version, until its stdin closes; then "done <stale>
// <reads> <local loads> <ahead loads> <distrusts> <Redis errors>".
func readerChild() int {
	addr, prefix, db := os.Getenv("FR_ADDR"), os.Getenv("FR_PREFIX"), os.Getenv("FR_DB")
	rdb := dial(addr)
	defer rdb.Close()
	load := func(ctx context.Context, key string) (string, error) { return rdb.Get(ctx, db).Result() }
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	tier, err := NewTier(rdb, Options[string, string]{Prefix: prefix})
	if err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	defer tier.Close()
	lo.Remote = tier
	l, err := flightcache.New(load, lo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	defer l.Close()
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	for deadline := time.Now().Add(30 * time.Second); !tier.Stats().Listening; {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "reader: the tier was not listening after 30s")
			return 1
		}
		time.Sleep(time.Millisecond)
	}
	out := bufio.NewWriter(os.Stdout)
	last, stale, reads := -1, 0, 0
	for {
		select {
		case <-stop:
			s := tier.Stats()
			fmt.Fprintf(out, "done %d %d %d %d %d %d\n", stale, reads, s.LocalLoads, s.AheadLoads, s.Distrusts, s.RedisErrors)
			out.Flush()
			return 0
		default:
		}
		v, err := l.Get(context.Background(), "k")
		reads++
		n, perr := strconv.Atoi(v)
		switch {
		case err != nil || perr != nil:
			fmt.Fprintln(os.Stderr, "reader: Get:", v, err)
		case n > last:
			last = n
			fmt.Fprintf(out, "seen %d %d\n", n, time.Now().UnixNano())
			out.Flush()
		case n < last:
			stale++
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// A key type JSON does not carry back (an interface: 5 would come back as
// 5.0) is dropped by the key the tier handed over under that name.
func TestInvalidationOfAnInterfaceKey(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	var calls atomic.Int64
	load := func(context.Context, any) (int64, error) { return calls.Add(1), nil }
	ls, ts := listeningPair(t, addr, load, Options[any, int64]{Prefix: prefix})
	v1, _ := ls[1].Get(ctx, 5)
	ls[0].Invalidate(5)
	eventually(t, 5*time.Second, "the drop", func() bool { return ls[1].Stats().RemoteDrops == 1 })
	if v, _ := ls[1].Get(ctx, 5); v == v1 {
		t.Fatalf("Get(5) after Invalidate(5) elsewhere = %d, the old value", v)
	}
	if s := ts[1].Stats(); s.UndecodedInvalidations != 0 || s.Distrusts != 0 {
		t.Fatalf("undecoded %d, distrusts %d; want 0, 0", s.UndecodedInvalidations, s.Distrusts)
	}
}

// A process whose subscription never comes up (here Redis refuses it the
// invalidation channel) still stops serving an invalidated value: it
// distrusts what it handed over after each failed attempt, about once a
// second. A refused write does not step the tier aside.
func TestSubscriptionThatNeverComesUp(t *testing.T) {
	singleNodeOnly(t, "sets an ACL user on one server")
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	user := "fctest-" + token(4)
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">fctest-pw", "~*", "resetchannels", "&"+prefix+"{*", "+@all").Err(); err != nil {
		if os.Getenv("CI") == "true" { // CI's Redis (6 or later) has ACLs: a refusal is a failure there
			t.Fatalf("ACL SETUSER: %v", err)
		}
		t.Skipf("this Redis has no ACLs: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	opts := clientOptions(addr)
	opts.Username, opts.Password = user, "fctest-pw"
	rc := redis.NewClient(opts)
	t.Cleanup(func() { _ = rc.Close() })
	tier, err := NewTier(rc, Options[string, string]{Prefix: prefix, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	alo := lo
	alo.Remote = tier
	al, err := flightcache.New(d.load, alo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = al.Close() })
	listening(t, b)

	v1, err := al.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	b.l.Invalidate("k")
	start := time.Now()
	eventually(t, 10*time.Second, "a to stop serving the invalidated value", func() bool {
		v, _ := al.Get(ctx, "k")
		return v != v1
	})
	t.Logf("a served the new value %v after the Invalidate", time.Since(start).Round(time.Millisecond))
	if s := tier.Stats(); s.Listening || s.Distrusts == 0 {
		t.Fatalf("a's tier: Listening %v, Distrusts %d; want false, > 0", s.Listening, s.Distrusts)
	}
	al.Set("k2", "x") // its publish is refused: kept, and the tier stays in use
	if s := tier.Stats(); s.RedisErrors == 0 || tier.link.down() {
		t.Fatalf("after a refused Set: RedisErrors %d, stepping aside %v; want > 0, false", s.RedisErrors, tier.link.down())
	}
}

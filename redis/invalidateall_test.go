package flightredis

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// Tests of Loader.InvalidateAll through the tier (generation.go). Each
// simulated process is a Loader with its own tier and client; they share
// one Redis (a node, or the Cluster of REDIS_CLUSTER).

// version returns the number of the downstream call that loaded v (a value
// of downstream.load, "key-vN"), or -1.
func version(v string) int64 {
	i := strings.LastIndex(v, "-v")
	if i < 0 {
		return -1
	}
	n, err := strconv.ParseInt(v[i+2:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// loadedAfter fails the test unless v was loaded by a downstream call
// numbered above mark: after the InvalidateAll (or InvalidateTag) that
// mark was taken at.
func loadedAfter(t *testing.T, who string, v string, err error, mark int64) {
	t.Helper()
	if err != nil || version(v) <= mark {
		t.Fatalf("%s = %q, %v; want a value loaded after the invalidation (a call after #%d)", who, v, err, mark)
	}
}

// heardAll waits until every process of ps knows generation gen and its
// Loader counts at least want InvalidateAlls (moves a tier learns of
// together, say one it reads when its subscription is confirmed, drop the
// copies once). It returns how long that took. It fails once 10s pass
// without any process moving on: the deadline grows with progress, so a
// slow machine is not a failure, a stuck process is.
func heardAll(t *testing.T, gen int64, want uint64, ps ...proc) time.Duration {
	t.Helper()
	const stuck = 10 * time.Second
	start := time.Now()
	deadline, last := start.Add(stuck), ""
	for {
		var state []string
		ok := true
		for _, p := range ps {
			g, n := p.t.Stats().Generation, p.l.Stats().InvalidateAlls
			state = append(state, fmt.Sprintf("%d/%d", g, n))
			ok = ok && g == gen && n >= want
		}
		if ok {
			return time.Since(start)
		}
		if now := fmt.Sprint(state); now != last {
			deadline, last = time.Now().Add(stuck), now
		}
		if time.Now().After(deadline) {
			for i, p := range ps {
				t.Logf("process %d: tier %+v", i, p.t.Stats())
			}
			t.Fatalf("no process moved on for %v (%v in all) while waiting for every process to reach generation %d with %d InvalidateAlls or more; generation/InvalidateAlls: %v",
				stuck, time.Since(start).Round(time.Millisecond), gen, want, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// movedTo waits until the InvalidateAll calls of p have reached Redis
// (one whose round trip timed out is replayed), and returns the
// generation they moved the shared tier to: with replays, possibly past
// one move per call (a call that timed out after Redis ran it moves it
// again when replayed).
func movedTo(t *testing.T, p proc) int64 {
	t.Helper()
	eventually(t, 30*time.Second, "the InvalidateAll calls to reach Redis", func() bool { return p.t.allKept.Load() == 0 })
	return p.t.Stats().Generation
}

// genKey returns the name of the shared generation of prefix.
func genKey(prefix string) string { return prefix + "generation" }

// An InvalidateAll in one process: at once, in every process, a Get that
// reaches the tier gets nothing from before the call; once each process
// has heard, its local copies are gone too; and the fleet reloads each key
// once, through the lease.
func TestInvalidateAllReachesEveryProcess(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	a := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	c := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	ps := []proc{a, b, c}
	listening(t, ps...)
	keys := []string{"r0", "r1", "r2", "p0", "p1", "p2"} // r: read again at once; p: plain Gets once heard
	// On a Cluster, the counter and the keys' state live in different
	// slots: no script could touch both.
	if onCluster() {
		slots := map[int]bool{}
		for _, k := range keys {
			slots[keySlot(keysFor(prefix, k).base)] = true
		}
		if delete(slots, keySlot(genKey(prefix))); len(slots) == 0 {
			t.Fatalf("every key shares the counter's slot %d; want keys of other slots", keySlot(genKey(prefix)))
		}
	}
	for _, k := range keys {
		want, _ := a.l.Get(ctx, k)
		for _, p := range ps[1:] {
			if v, _ := p.l.Get(ctx, k); v != want {
				t.Fatalf("Get(%s) = %q; want the fleet's %q", k, v, want)
			}
		}
	}
	mark := d.calls.Load()

	a.l.InvalidateAll()
	// (1) At once, whether or not they have heard: a Get that reaches the
	// tier (a revalidating one) gets nothing of before, in any process.
	for _, k := range keys[:3] {
		for i, p := range ps {
			v, err := p.l.Get(flightcache.WithRevalidate(ctx), k)
			loadedAfter(t, fmt.Sprintf("process %d: revalidating Get(%s) right after", i, k), v, err, mark)
		}
	}
	// (2) Once each has heard, its local copies are gone.
	heardAll(t, 1, 1, ps...)
	for _, k := range keys[3:] {
		for i, p := range ps {
			v, err := p.l.Get(ctx, k)
			loadedAfter(t, fmt.Sprintf("process %d: Get(%s) once heard", i, k), v, err, mark)
		}
	}
	if n := d.calls.Load() - mark; n != int64(len(keys)) {
		t.Errorf("%d downstream calls after the InvalidateAll; want %d: one per key for the fleet", n, len(keys))
	}
	for i, p := range ps {
		if n := p.l.Stats().InvalidateAlls; n != 1 {
			t.Errorf("process %d's Loader: InvalidateAlls %d; want 1", i, n)
		}
	}
	if s := a.t.Stats(); s.InvalidateAllsSent != 1 || s.InvalidateAllsHeard != 0 || s.Generation != 1 {
		t.Errorf("the caller's tier: sent %d, heard %d, generation %d; want 1, 0, 1", s.InvalidateAllsSent, s.InvalidateAllsHeard, s.Generation)
	}
	for i, p := range ps[1:] {
		if s := p.t.Stats(); s.InvalidateAllsHeard != 1 || s.InvalidateAllsSent != 0 || s.Distrusts != 0 || s.UndecodedInvalidations != 0 {
			t.Errorf("process %d's tier: heard %d, sent %d, distrusts %d, undecoded %d; want 1, 0, 0, 0",
				i+1, s.InvalidateAllsHeard, s.InvalidateAllsSent, s.Distrusts, s.UndecodedInvalidations)
		}
	}
	if g, err := newClient(t, addr).Get(ctx, genKey(prefix)).Result(); err != nil || g != "1" {
		t.Errorf("the shared generation = %q, %v; want 1", g, err)
	}
}

// A process that has not heard of a generation move yet (here the counter
// moves without a message, as for an InvalidateAll whose message is still
// on its way) may still serve its local copies; but its tier hands out
// nothing from before the move, and a Set it makes lands in the new
// generation, where every process reads it. The first reply that shows the
// move has its Loader drop every copy.
func TestUnheardGenerationMoveIsExact(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	a := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	listening(t, a, b)
	old, _ := a.l.Get(ctx, "k")
	if v, _ := b.l.Get(ctx, "k"); v != old {
		t.Fatalf("b: Get(k) = %q; want the fleet's %q", v, old)
	}
	mark := d.calls.Load()
	if err := admin.Incr(ctx, genKey(prefix)).Err(); err != nil {
		t.Fatal(err)
	}

	// b has not heard: its local copy still serves (the documented window).
	if v, info, _ := b.l.GetInfo(ctx, "k"); v != old || info.Source != flightcache.SourceHit {
		t.Fatalf("b before it learns of the move: %q, %v; want its local copy %q", v, info.Source, old)
	}
	// a's tier reads the generation with the entry: nothing of before.
	v, err := a.l.Get(flightcache.WithRevalidate(ctx), "k")
	loadedAfter(t, "a: revalidating Get(k)", v, err, mark)
	if s, ls := a.t.Stats(), a.l.Stats(); s.Generation != 1 || s.InvalidateAllsHeard != 1 || ls.InvalidateAlls != 1 {
		t.Fatalf("a after the reply: generation %d, heard %d, its Loader's InvalidateAlls %d; want 1, 1, 1", s.Generation, s.InvalidateAllsHeard, ls.InvalidateAlls)
	}
	// b, which still does not know, Sets a key: the write lands in the
	// generation Redis has, and teaches b's tier the move.
	b.l.Set("s", "set-by-b")
	if s, ls := b.t.Stats(), b.l.Stats(); s.Generation != 1 || ls.InvalidateAlls != 1 {
		t.Fatalf("b after its Set: generation %d, its Loader's InvalidateAlls %d; want 1, 1", s.Generation, ls.InvalidateAlls)
	}
	for i, p := range []proc{a, b} {
		if v, err := p.l.Get(ctx, "s"); v != "set-by-b" || err != nil {
			t.Fatalf("process %d: Get(s) = %q, %v; want set-by-b, from the new generation", i, v, err)
		}
		v, err := p.l.Get(ctx, "k")
		loadedAfter(t, fmt.Sprintf("process %d: Get(k)", i), v, err, mark)
	}
	vals, err := admin.HMGet(ctx, keysAt(prefix, "s", 1).entry, "v").Result()
	if err != nil || len(vals) != 1 || vals[0] != `"set-by-b"` {
		t.Fatalf("the Set's entry in generation 1: %v, %v; want set-by-b", vals, err)
	}
}

// Loads in flight across an InvalidateAll (a holds k's lease, its
// downstream call gated; b waits for it) deliver to their own callers, but
// leave nothing of before in the tier: every later Get, anywhere, gets a
// value loaded after the call.
func TestInvalidateAllDuringLoads(t *testing.T) {
	for _, tc := range []struct {
		name  string
		heard bool // the processes hear the move before the loads end
	}{{"heard", true}, {"unheard", false}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redisAddr(t)
			admin := newClient(t, addr)
			prefix := testPrefix(t, admin)
			d := newDownstream()
			d.gate = make(chan struct{})
			lo := flightcache.Options[string, string]{TTL: time.Hour}
			a := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
			b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
			c := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
			listening(t, a, b, c)

			type result struct {
				v   string
				err error
			}
			resA, resB := make(chan result, 1), make(chan result, 1)
			go func() { v, err := a.l.Get(ctx, "k"); resA <- result{v, err} }()
			select {
			case <-d.started:
			case <-time.After(10 * time.Second):
				t.Fatal("a's load did not start")
			}
			go func() { v, err := b.l.Get(ctx, "k"); resB <- result{v, err} }()
			eventually(t, 10*time.Second, "b to wait for a's load", func() bool { return b.t.Stats().Waits == 1 })
			mark := d.calls.Load() // a's call

			if tc.heard {
				c.l.InvalidateAll()
				eventually(t, 10*time.Second, "every tier to know generation 1", func() bool {
					return a.t.Stats().Generation == 1 && b.t.Stats().Generation == 1
				})
			} else if err := admin.Incr(ctx, genKey(prefix)).Err(); err != nil { // no message: nobody hears
				t.Fatal(err)
			}
			close(d.gate)
			wait := func(ch chan result, who string) result {
				select {
				case r := <-ch:
					if r.err != nil {
						t.Fatalf("%s's Get in flight: %v", who, r.err)
					}
					return r
				case <-time.After(10 * time.Second):
					t.Fatalf("%s's Get in flight did not return", who)
				}
				return result{}
			}
			if r := wait(resA, "a"); r.v != "k-v1" {
				t.Fatalf("a's Get in flight = %q; want its own load's k-v1", r.v)
			}
			wait(resB, "b") // its own load's value: a's, or (having heard) one it loaded after the move
			if tc.heard {
				if s := a.t.Stats(); s.WritesLost != 1 {
					t.Errorf("a's tier: WritesLost %d; want 1 (its load's generation had ended)", s.WritesLost)
				}
			}
			for i, p := range []proc{c, a, b} {
				v, err := p.l.Get(flightcache.WithRevalidate(ctx), "k")
				loadedAfter(t, fmt.Sprintf("process %d: revalidating Get(k) after the loads", i), v, err, mark)
			}
			vals, err := admin.HMGet(ctx, keysAt(prefix, "k", 1).entry, "v").Result()
			if err != nil || len(vals) != 1 || vals[0] == `"k-v1"` {
				t.Fatalf("k's entry in generation 1: %v, %v; want a value loaded after the move", vals, err)
			}
		})
	}
}

// A Set made after an InvalidateAll, in the caller or in a process that may
// not have heard yet, is what every process serves: no downstream call, no
// value of before.
func TestSetAfterInvalidateAllReachesEveryProcess(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	a := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	b := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	c := newProc(t, addr, prefix, lo, Options[string, string]{}, d)
	ps := []proc{a, b, c}
	listening(t, ps...)
	for _, k := range []string{"k", "j"} {
		for _, p := range ps {
			p.l.Get(ctx, k)
		}
	}
	calls := d.calls.Load()

	a.l.InvalidateAll()
	a.l.Set("j", "set-by-a") // the caller
	b.l.Set("k", "set-by-b") // another process, right away
	heardAll(t, 1, 1, ps...)
	for i, p := range ps {
		for k, want := range map[string]string{"k": "set-by-b", "j": "set-by-a"} {
			eventually(t, 10*time.Second, fmt.Sprintf("process %d to serve %s = %s", i, k, want), func() bool {
				v, _ := p.l.Get(ctx, k)
				return v == want
			})
		}
	}
	if n := d.calls.Load(); n != calls {
		t.Errorf("%d downstream calls after the Sets; want none", n-calls)
	}
}

// An InvalidateAll that cannot reach Redis is kept: meanwhile the caller's
// tier hands its Loader nothing from Redis (every Get of the caller gets a
// value loaded after the call), and once Redis is back the move is made,
// and the other processes drop their copies.
func TestInvalidateAllThatMissedRedisIsReplayed(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	to := Options[string, string]{RetryAfter: 300 * time.Millisecond, Timeout: 200 * time.Millisecond}
	a := newProc(t, addr, prefix, lo, to, d)
	b := newProc(t, addr, prefix, lo, to, d)
	listening(t, a, b)
	old, _ := b.l.Get(ctx, "k")
	a.l.Get(ctx, "k")
	mark := d.calls.Load()

	a.t.link.failed() // as after a failed round trip: a steps aside for RetryAfter
	a.l.InvalidateAll()
	if s := a.t.Stats(); s.Skipped != 1 || s.InvalidateAllsSent != 0 || s.Generation != 0 {
		t.Fatalf("a's tier: skipped %d, sent %d, generation %d; want 1, 0, 0", s.Skipped, s.InvalidateAllsSent, s.Generation)
	}
	if v, _ := b.l.Get(ctx, "k"); v != old {
		t.Fatalf("b before the replay = %q; want its copy %q still (it cannot have heard)", v, old)
	}
	// Until the move is made (by a Load once RetryAfter is over, or by the
	// replay), a's Gets never see the shared entry of before.
	eventually(t, 10*time.Second, "the replay", func() bool {
		v, err := a.l.Get(flightcache.WithRevalidate(ctx), "k")
		loadedAfter(t, "a: revalidating Get(k) while the move waits", v, err, mark)
		return a.t.Stats().InvalidateAllsReplayed == 1
	})
	heardAll(t, 1, 1, a, b)
	v, err := b.l.Get(ctx, "k")
	loadedAfter(t, "b: Get(k) after the replay", v, err, mark)
	if s := a.t.Stats(); s.InvalidateAllsSent != 1 || s.InvalidateAllsLost != 0 || s.LocalLoads == 0 {
		t.Errorf("a's tier: sent %d, lost %d, local loads %d; want 1, 0, > 0", s.InvalidateAllsSent, s.InvalidateAllsLost, s.LocalLoads)
	}
	if s := b.t.Stats(); s.InvalidateAllsHeard != 1 {
		t.Errorf("b's tier: heard %d; want 1", s.InvalidateAllsHeard)
	}
}

// An InvalidateAll still kept when the tier closes, or made after it
// closed, is counted lost.
func TestInvalidateAllLostAtClose(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	tier, err := attachedTier(t, newClient(t, addr), flightcache.Options[string, string]{TTL: time.Hour},
		Options[string, string]{Prefix: prefix, RetryAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tier.link.failed() // stepping aside for an hour: the call cannot be sent
	tier.InvalidateAll(ctx)
	_ = tier.Close()
	tier.InvalidateAll(ctx)
	if s := tier.Stats(); s.InvalidateAllsLost != 2 || s.InvalidateAllsSent != 0 || s.InvalidateAllsReplayed != 0 {
		t.Fatalf("lost %d, sent %d, replayed %d; want 2, 0, 0", s.InvalidateAllsLost, s.InvalidateAllsSent, s.InvalidateAllsReplayed)
	}
}

// A shared generation found below the one a tier knows was lost: the tier
// sets it back (no process goes back to an older generation's entries),
// and an InvalidateAll made then moves it past what its caller knows.
func TestLostGenerationIsSetBack(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	to := Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: 6 * time.Second} // for a loaded machine
	a := newProc(t, addr, prefix, lo, to, d)
	b := newProc(t, addr, prefix, lo, to, d)
	listening(t, a, b)
	b.l.Get(ctx, "k") // a copy to drop
	a.l.InvalidateAll()
	a.l.InvalidateAll()
	g := movedTo(t, a) // 2, or more if a call was replayed after Redis ran it
	if s := a.t.Stats(); s.InvalidateAllsReplayed == 0 && g != 2 {
		t.Fatalf("two InvalidateAlls that reached Redis at once moved the generation to %d; want 2", g)
	}
	heardAll(t, g, 1, a, b)
	vg, _ := a.l.Get(ctx, "k") // generation g's entry
	calls := d.calls.Load()
	drops := b.l.Stats().InvalidateAlls
	restores := b.t.Stats().GenerationRestores

	if err := admin.Del(ctx, genKey(prefix)).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := b.l.Get(flightcache.WithRevalidate(ctx), "k"); v != vg || err != nil {
		t.Fatalf("b after the counter was lost: %q, %v; want generation %d's %q", v, err, g, vg)
	}
	if got, err := admin.Get(ctx, genKey(prefix)).Result(); err != nil || got != fmt.Sprint(g) {
		t.Fatalf("the shared generation = %q, %v; want %d, set back", got, err, g)
	}
	if s := b.t.Stats(); s.GenerationRestores != restores+1 || s.Generation != g || b.l.Stats().InvalidateAlls != drops {
		t.Fatalf("b: restores %d, generation %d, InvalidateAlls %d; want %d, %d, %d (setting the counter back drops nothing)",
			s.GenerationRestores, s.Generation, b.l.Stats().InvalidateAlls, restores+1, g, drops)
	}
	// A process that starts now reads generation g when its subscription
	// is confirmed, before any Load (which drops nothing: it holds
	// nothing), and finds its entry.
	c := newProc(t, addr, prefix, lo, to, d)
	eventually(t, 10*time.Second, "the new process to read the generation", func() bool { return c.t.Stats().Generation == g })
	if s := c.t.Stats(); s.InvalidateAllsHeard != 0 || c.l.Stats().InvalidateAlls != 0 {
		t.Fatalf("a new process: heard %d, InvalidateAlls %d; want 0, 0", s.InvalidateAllsHeard, c.l.Stats().InvalidateAlls)
	}
	if v, err := c.l.Get(ctx, "k"); v != vg || err != nil || d.calls.Load() != calls {
		t.Fatalf("a new process: Get(k) = %q, %v after %d downstream calls; want %q, none", v, err, d.calls.Load()-calls, vg)
	}

	// Lost again, and a's next move is its first contact: it still moves
	// past the generation a knows.
	if err := admin.Del(ctx, genKey(prefix)).Err(); err != nil {
		t.Fatal(err)
	}
	replayed := a.t.Stats().InvalidateAllsReplayed
	a.l.InvalidateAll()
	next := movedTo(t, a)
	if got, err := admin.Get(ctx, genKey(prefix)).Result(); err != nil || got != fmt.Sprint(next) || next <= g {
		t.Fatalf("after an InvalidateAll on a lost counter, the shared generation = %q, %v, a's %d; want past %d", got, err, next, g)
	}
	if s := a.t.Stats(); s.InvalidateAllsReplayed == replayed && next != g+1 {
		t.Fatalf("after an InvalidateAll on a lost counter that reached Redis at once, the generation is %d; want %d", next, g+1)
	}
	heardAll(t, next, drops+1, a, b)
}

// GetMany's batches work in the current generation too, whether their
// process has heard of the move or learns of it from the batch's read; and
// a batch's loads in flight across the move store nothing.
func TestGetManyAcrossInvalidateAll(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	d := newBatchDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	newP := func() proc { return newBatchProc(t, addr, nil, prefix, lo, Options[string, string]{}, d) }
	a, b, c := newP(), newP(), newP()
	listening(t, a, b, c)
	keys := []string{"x", "y", "z"}
	first, err := a.l.GetMany(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	fresh := func(who string, m map[string]string, err error) {
		t.Helper()
		for _, k := range keys {
			if err != nil || m[k] == "" || m[k] == first[k] {
				t.Fatalf("%s: GetMany = %v, %v; want values loaded after the move (before: %v)", who, m, err, first)
			}
		}
	}

	// Unheard: b has no copies and has not heard; its batch's read shows
	// the move, and it reads again in the new generation.
	if err := admin.Incr(ctx, genKey(prefix)).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := b.l.GetMany(ctx, keys)
	fresh("b, unheard", m, err)
	if s := b.t.Stats(); s.Generation != 1 {
		t.Fatalf("b's tier: generation %d; want 1", s.Generation)
	}
	second := m
	if m, err := c.l.GetMany(ctx, keys); err != nil || fmt.Sprint(m) != fmt.Sprint(second) {
		t.Fatalf("c: GetMany = %v, %v; want b's %v, from generation 1", m, err, second)
	}

	// In flight: a batch of c holds the leases of new keys when a
	// InvalidateAll is heard everywhere; it answers its callers, stores
	// nothing, and the next batch anywhere loads again.
	more := []string{"u", "w"}
	gate := make(chan struct{})
	d.set(func(d *batchDownstream) { d.gate = gate })
	for len(d.started) > 0 { // the earlier batches' starts
		<-d.started
	}
	done := getMany(c, more)
	waitStarted(t, d, 1)
	a.l.InvalidateAll()
	eventually(t, 10*time.Second, "every tier to know generation 2", func() bool {
		return a.t.Stats().Generation == 2 && b.t.Stats().Generation == 2 && c.t.Stats().Generation == 2
	})
	d.set(func(d *batchDownstream) { d.gate = nil })
	close(gate)
	select {
	case r := <-done:
		if r.err != nil || len(r.m) != len(more) {
			t.Fatalf("c's batch in flight: %v, %v; want its own load's values", r.m, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("c's batch in flight did not return")
	}
	if s := c.t.Stats(); s.WritesLost != uint64(len(more)) {
		t.Errorf("c's tier: WritesLost %d; want %d (the batch's generation had ended)", s.WritesLost, len(more))
	}
	for _, k := range more {
		if n, err := admin.Exists(ctx, keysAt(prefix, k, 1).entry, keysAt(prefix, k, 2).entry).Result(); err != nil || n != 0 {
			t.Fatalf("the batch in flight stored %s (%d entries, %v)", k, n, err)
		}
	}
	before := len(d.allCalls())
	if _, err := b.l.GetMany(ctx, more); err != nil {
		t.Fatal(err)
	}
	if n := len(d.allCalls()) - before; n != 1 {
		t.Fatalf("b's batch after the move made %d LoadMany calls; want 1", n)
	}
}

// The message of an InvalidateAll that does not parse (a foreign or broken
// publisher) cannot be acted on as a move: the tier distrusts every copy.
func TestUndecodedInvalidateAllMessage(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	prefix := testPrefix(t, c)
	p := newProc(t, addr, prefix, flightcache.Options[string, string]{TTL: time.Hour}, Options[string, string]{}, newDownstream())
	listening(t, p)
	p.l.Get(ctx, "k")
	if err := c.Publish(ctx, prefix+"invalidated", "someone\n*not-a-number").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the distrust", func() bool { return p.l.Stats().Distrusts == 1 })
	if s := p.t.Stats(); s.UndecodedInvalidations != 1 || s.Generation != 0 || p.l.Stats().InvalidateAlls != 0 {
		t.Fatalf("undecoded %d, generation %d, InvalidateAlls %d; want 1, 0, 0", s.UndecodedInvalidations, s.Generation, p.l.Stats().InvalidateAlls)
	}
}

// TestInvalidateAllLatency measures, over 200 InvalidateAll calls of one of
// 4 processes, how long after the call returned the last of the other
// processes had dropped its copies (docs/distributed-invalidation.md
// quotes it); every drop must come within the heardAll deadline.
func TestInvalidateAllLatency(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	to := Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: 6 * time.Second} // for a loaded machine: the test measures hearing
	var ps []proc
	for range 4 {
		ps = append(ps, newProc(t, addr, prefix, lo, to, d))
	}
	listening(t, ps...)
	for _, p := range ps { // a copy in every process: a Loader that never used its tier holds nothing to drop
		p.l.Get(ctx, "k")
	}
	rounds := 200
	if testing.Short() || raceEnabled {
		rounds = 50
	}
	lat := make([]time.Duration, 0, rounds)
	for i := 1; i <= rounds; i++ {
		ps[0].l.InvalidateAll()
		start := time.Now()
		heardAll(t, movedTo(t, ps[0]), uint64(i), ps...)
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("%d InvalidateAlls (%d replayed): the last of 3 other processes had dropped its copies after p50 %v, p99 %v, max %v",
		rounds, ps[0].t.Stats().InvalidateAllsReplayed, lat[rounds/2].Round(time.Microsecond), lat[rounds*99/100].Round(time.Microsecond), lat[rounds-1].Round(time.Microsecond))
}

package flightredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/redis/go-redis/v9"
)

// trackingProcs starts n simulated processes on one prefix and waits
// until every one tracks and listens.
func trackingProcs(t *testing.T, n int, to Options[string, string]) ([]proc, *downstream) {
	t.Helper()
	addr := redisAddr(t)
	to.Prefix = testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	ps := make([]proc, n)
	for i := range ps {
		ps[i] = newProc(t, addr, to.Prefix, lo, to, d)
	}
	listening(t, ps...)
	for _, p := range ps {
		if s := p.t.Stats(); s.Invalidations != "tracking" {
			t.Fatalf("Stats.Invalidations = %q, want tracking", s.Invalidations)
		}
	}
	return ps, d
}

// An invalidation reaches only the processes that read the key: one that
// never did hears nothing of it.
func TestTrackingReachesHoldersOnly(t *testing.T) {
	ps, _ := trackingProcs(t, 3, Options[string, string]{})
	writer, holder, other := ps[0], ps[1], ps[2]
	old, _ := holder.l.Get(ctx, "k")
	other.l.Get(ctx, "j") // another key only
	writer.l.Set("k", "new")
	eventually(t, 5*time.Second, "the holder's drop", func() bool { return holder.l.Stats().RemoteDrops == 1 })
	if v, _ := holder.l.Get(ctx, "k"); v != "new" || v == old {
		t.Fatalf("the holder after the drop: %q, want new", v)
	}
	writer.l.Invalidate("j") // the other process holds j: it hears that one
	eventually(t, 5*time.Second, "the other's drop of j", func() bool { return other.l.Stats().RemoteDrops == 1 })
	if s := other.t.Stats(); s.InvalidationsHeard != 1 {
		t.Fatalf("the process that never read k heard %d invalidations, want 1 (j's only)", s.InvalidationsHeard)
	}
	if s := holder.t.Stats(); s.InvalidationsHeard != 1 || s.TrackedReads == 0 || s.Distrusts != 0 {
		t.Fatalf("the holder: heard %d, tracked reads %d, distrusts %d; want 1, > 0, 0", s.InvalidationsHeard, s.TrackedReads, s.Distrusts)
	}
}

// Set and Invalidate in one process drop another's copy; once the drop is
// heard, no Get returns the old value. The tiers' Timeout is generous for
// a loaded machine; a Set that still missed Redis is replayed as an
// invalidation (Stats.InvalidationsReplayed), and b then loads the key
// instead of finding the value set. The idle twin asserts the figures of
// a run in which neither tier met a Redis error: b reads every value set,
// and the downstream is called once per key (4) and once per Invalidate
// (10), no more.
func TestTrackingSetAndInvalidateDropCopies(t *testing.T) {
	ps, d := trackingProcs(t, 2, Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: 6 * time.Second})
	a, b := ps[0], ps[1]
	var excused []string // rounds in which b did not read the value set, its Set replayed
	for round := range 20 {
		k := fmt.Sprint("k", round%4)
		old, _ := b.l.Get(ctx, k)
		drops := b.l.Stats().RemoteDrops
		replayed := a.t.Stats().InvalidationsReplayed
		var want string
		if round%2 == 0 {
			want = fmt.Sprint("set-", round)
			a.l.Set(k, want)
		} else {
			a.l.Invalidate(k)
		}
		eventually(t, 10*time.Second, "b's drop", func() bool { return b.l.Stats().RemoteDrops > drops })
		v, err := b.l.Get(ctx, k)
		switch {
		case err != nil:
			t.Fatal(err)
		case v == old:
			t.Fatalf("round %d: b served the old %q after the drop", round, old)
		case want != "" && v != want && a.t.Stats().InvalidationsReplayed == replayed:
			t.Fatalf("round %d: b got %q, want %q", round, v, want)
		case want != "" && v != want:
			excused = append(excused, fmt.Sprintf("round %d: b got %q, want %q (replayed)", round, v, want))
		}
	}
	if n := d.calls.Load(); n < 10 {
		t.Fatalf("downstream calls %d: every Invalidate should make a load", n)
	}
	sa, sb := a.t.Stats(), b.t.Stats()
	idleTwin(t, []loadSign{{"RedisErrors", sa.RedisErrors + sb.RedisErrors}}, func(t *testing.T) {
		if len(excused) > 0 || sa.InvalidationsReplayed != 0 {
			t.Errorf("%d Sets replayed: %s; want none", sa.InvalidationsReplayed, strings.Join(excused, "; "))
		}
		if n := d.calls.Load(); n != 4+10 {
			t.Errorf("downstream calls %d; want 14: one per key (4), one per Invalidate (10)", n)
		}
		if sa.LocalLoads+sb.LocalLoads != 0 {
			t.Errorf("local loads: a %d, b %d; want 0", sa.LocalLoads, sb.LocalLoads)
		}
	})
}

// Several checks of one copy queued at once (the echo of a fill the
// holder waited for, then another process's write, both heard before the
// first check ran) drop it once: the later ones find it dropped already.
// Each check is of a copy that is outdated, the write having come first.
func TestTrackingQueuedChecksDropOnce(t *testing.T) {
	ps, _ := trackingProcs(t, 2, Options[string, string]{})
	a, b := ps[0], ps[1]
	for round := range 20 {
		k, last := fmt.Sprint("k", round), fmt.Sprint("last", round)
		b.l.Get(ctx, k)
		b.l.Get(ctx, last)
		drops := b.l.Stats().RemoteDrops
		a.l.Set(k, "new") // b hears it, and its check drops b's copy
		ks := keysAt(b.t.opts.Prefix, b.t.key(k), b.t.gen.Load())
		for range 4 {
			b.t.copies.verify(k, ks)
		}
		// A check queued last, of a copy b is told is of another version:
		// the checks run in order, so once it has dropped that copy, every
		// check of k has run.
		lks := keysAt(b.t.opts.Prefix, b.t.key(last), b.t.gen.Load())
		b.t.copies.served.Note(lks.base, "0")
		b.t.copies.verify(last, lks)
		eventually(t, 5*time.Second, "the last check", func() bool { return b.t.copies.served.Get(lks.base) == b.t.copies.droppedMark() })
		eventually(t, 5*time.Second, "b's drops", func() bool { return b.l.Stats().RemoteDrops-drops >= 2 })
		if n := b.l.Stats().RemoteDrops - drops; n != 2 {
			t.Fatalf("round %d: %d drops of one outdated copy and the last one, want 2", round, n)
		}
		if v, _ := b.l.Get(ctx, k); v != "new" {
			t.Fatalf("round %d: b got %q after the drop, want new", round, v)
		}
	}
}

// invNode is the only invalidation connection of a single-node tier, or
// the one of the master of name on a Cluster.
func invNode(t *testing.T, tier *Tier[string, string], name string) (*track.Node, string) {
	t.Helper()
	ks := keysFor(tier.opts.Prefix, name)
	n, addr, err := tier.track.NodeOf(ctx, ks.entry)
	if err != nil {
		t.Fatal(err)
	}
	if n == nil {
		t.Fatalf("no node for %s", addr)
	}
	return n, addr
}

// nodeClient is a plain client of the Redis node at addr, closed when the
// test ends.
func nodeClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(clientOptions(addr))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// checkRearmed waits for the tier to have re-armed after a loss, then
// checks that invalidations reach it again: the holder reads k, tracked,
// the writer Sets it, and the holder drops its copy and reads the Set's
// value.
//
// A round trip past the Timeout on a loaded machine steps a tier aside:
// the holder's read is then a local load, untracked, or the writer's Set
// is skipped, and no invalidation is due. Such a round, and only a round
// in which either tier counted a Redis failure, is tried again, once both
// tiers are back and the untracked copy distrusted.
func checkRearmed(t *testing.T, writer, holder proc, losses uint64) {
	t.Helper()
	eventually(t, 10*time.Second, "the loss and the re-arm", func() bool {
		s := holder.t.Stats()
		return s.SubscriptionLosses > losses && s.Rearms >= 1 && s.Listening
	})
	if s := holder.t.Stats(); s.Distrusts == 0 {
		t.Fatal("the loss distrusted nothing")
	}
	failures := func() uint64 { return writer.t.Stats().RedisErrors + holder.t.Stats().RedisErrors }
	for round := 1; ; round++ {
		before := failures()
		holder.l.Get(ctx, "k")
		drops := holder.l.Stats().RemoteDrops
		writer.l.Set("k", "after")
		heard := holds(5*time.Second, func() bool { return holder.l.Stats().RemoteDrops > drops })
		v, _ := holder.l.Get(ctx, "k")
		if heard && v == "after" {
			return
		}
		if failures() == before || round == 5 {
			t.Fatalf("after the re-arm (round %d): drop heard %v, then %q, want after; holder %+v, writer %+v",
				round, heard, v, holder.t.Stats(), writer.t.Stats())
		}
		t.Logf("round %d: a tier stepped aside (%d Redis failures); again", round, failures()-before)
		eventually(t, 10*time.Second, "both tiers back, the untracked copy distrusted", func() bool {
			return !writer.t.link.down() && !holder.t.link.down() && !holder.t.fleet.missed.Load()
		})
	}
}

// holds reports whether cond holds within d, checking every 5ms.
func holds(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// A killed invalidation connection is a loss: every copy is distrusted,
// tracking is armed again on a new connection, and works.
func TestTrackingInvalidationConnectionKilled(t *testing.T) {
	ps, _ := trackingProcs(t, 2, Options[string, string]{})
	writer, holder := ps[0], ps[1]
	holder.l.Get(ctx, "k")
	n, addr := invNode(t, holder.t, "k")
	losses := holder.t.Stats().SubscriptionLosses
	if err := nodeClient(t, addr).ClientKillByFilter(ctx, "ID", fmt.Sprint(n.ID())).Err(); err != nil {
		t.Fatal(err)
	}
	checkRearmed(t, writer, holder, losses)
}

// A tracked connection whose redirect is broken is found by the health
// check (CLIENT TRACKINGINFO), which counts as a loss and re-arms.
func TestTrackingBrokenRedirect(t *testing.T) {
	ps, _ := trackingProcs(t, 2, Options[string, string]{})
	writer, holder := ps[0], ps[1]
	holder.l.Get(ctx, "k")
	n, addr := invNode(t, holder.t, "k")
	// Redirect the node's tracked connection (its pool holds one) to a
	// client that then goes away.
	other := nodeClient(t, addr)
	conn := other.Conn()
	id, err := conn.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	reads := n.Reads()
	if err := reads.Do(ctx, "CLIENT", "TRACKING", "off").Err(); err != nil {
		t.Fatal(err)
	}
	if err := reads.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", id, "OPTIN").Err(); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	losses := holder.t.Stats().SubscriptionLosses
	checkRearmed(t, writer, holder, losses)
}

// A FLUSHDB (of any database) invalidates every tracked key: Redis sends a
// null, and every copy is distrusted.
func TestTrackingFlush(t *testing.T) {
	singleNodeOnly(t, "a Cluster has one database, which the other tests use")
	ps, _ := trackingProcs(t, 1, Options[string, string]{})
	p := ps[0]
	p.l.Get(ctx, "k")
	before := p.t.Stats().Distrusts
	o := clientOptions(redisAddr(t))
	o.DB = 15 // empty: the flush drops nothing of anyone
	c := redis.NewClient(o)
	defer func() { _ = c.Close() }()
	if err := c.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the distrust", func() bool { return p.t.Stats().Distrusts > before })
	if _, info, _ := p.l.GetInfo(ctx, "k"); info.Source == flightcache.SourceHit {
		t.Fatal("a distrusted copy was served without being read again")
	}
}

// Where Redis refuses CLIENT TRACKING (an ACL user without
// client|tracking), the tier falls back to invalidation channels, and
// every process still hears every Set and Invalidate.
func TestTrackingRefusedFallsBackToChannels(t *testing.T) {
	ps := channelProcs(t, 3, Options[string, string]{})
	ps[1].l.Get(ctx, "k")
	ps[0].l.Set("k", "v2")
	eventually(t, 5*time.Second, "every process's drop", func() bool {
		return ps[1].l.Stats().RemoteDrops == 1 && ps[2].l.Stats().RemoteDrops == 1
	})
	if v, _ := ps[1].l.Get(ctx, "k"); v != "v2" {
		t.Fatalf("after the Set: %q, want v2", v)
	}
	ps[2].l.Invalidate("k")
	eventually(t, 5*time.Second, "the drop of the Invalidate", func() bool { return ps[1].l.Stats().RemoteDrops == 2 })
	if s := ps[1].t.Stats(); s.InvalidationsHeard != 2 || s.Distrusts != 0 {
		t.Fatalf("heard %d, distrusts %d; want 2, 0", s.InvalidationsHeard, s.Distrusts)
	}
}

// channelProcs starts n simulated processes on one prefix, each logged in
// as a user that Redis refuses CLIENT TRACKING, and waits until every one
// listens on the invalidation channels.
func channelProcs(t *testing.T, n int, to Options[string, string]) []proc {
	t.Helper()
	addr := redisAddr(t)
	admin := newClient(t, addr)
	user, pass := "fctest-notrack-"+token(4), token(8)
	acl := func(args ...any) {
		err := forEachMaster(ctx, admin, func(ctx context.Context, n redis.UniversalClient) error {
			return n.Do(ctx, append([]any{"ACL"}, args...)...).Err()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	acl("SETUSER", user, "on", ">"+pass, "~*", "&*", "+@all", "-client|tracking")
	t.Cleanup(func() { acl("DELUSER", user) })
	to.Prefix = testPrefix(t, admin)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	ps := make([]proc, n)
	for i := range ps {
		tier, err := NewTier(userClient(t, addr, user, pass), to)
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = startProc(t, tier, lo, d)
	}
	listening(t, ps...)
	for _, p := range ps {
		if s := p.t.Stats(); s.Invalidations != "channels" {
			t.Fatalf("Stats.Invalidations = %q, want channels", s.Invalidations)
		}
	}
	return ps
}

// Close interrupts the listeners at once. Their reads wait for a health
// check (four Timeouts) and go-redis ends a read at its deadline, not when
// its context ends: with a Timeout of a minute, a Close that only
// cancelled would take minutes.
func TestCloseInterruptsTrackingRead(t *testing.T) {
	to := Options[string, string]{Timeout: time.Minute, HolderTimeout: 2 * time.Minute}
	ps, _ := trackingProcs(t, 1, to)
	closesWithin(t, ps[0], to.Timeout/4)
}

// The same with the invalidation channels, where tracking is refused.
func TestCloseInterruptsChannelRead(t *testing.T) {
	to := Options[string, string]{Timeout: time.Minute, HolderTimeout: 2 * time.Minute}
	ps := channelProcs(t, 1, to)
	closesWithin(t, ps[0], to.Timeout/4)
}

// closesWithin closes p's Loader, then its tier, and fails if the tier's
// Close has not returned within d.
func closesWithin(t *testing.T, p proc, d time.Duration) {
	t.Helper()
	_ = p.l.Close()
	start := time.Now()
	done := make(chan time.Duration, 1)
	go func() {
		_ = p.t.Close()
		done <- time.Since(start)
	}()
	select {
	case took := <-done:
		t.Logf("Close took %v", took)
	case <-time.After(d):
		t.Fatalf("Close has not returned after %v", d)
	}
}

// userClient is a client for addr that logs in as user, closed when the
// test ends.
func userClient(t *testing.T, addr, user, pass string) redis.UniversalClient {
	var c redis.UniversalClient
	if isCluster(addr) {
		o := clusterOptions(addr)
		o.Username, o.Password = user, pass
		c = redis.NewClusterClient(o)
	} else {
		o := clientOptions(addr)
		o.Username, o.Password = user, pass
		c = redis.NewClient(o)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// InvalidateAll still reaches every process with tracking.
func TestTrackingInvalidateAll(t *testing.T) {
	ps, _ := trackingProcs(t, 2, Options[string, string]{})
	old, _ := ps[1].l.Get(ctx, "k")
	ps[0].l.InvalidateAll()
	eventually(t, 5*time.Second, "the other's DropAll", func() bool { return ps[1].t.Stats().InvalidateAllsHeard == 1 })
	if v, _ := ps[1].l.Get(ctx, "k"); v == old {
		t.Fatalf("after InvalidateAll: %q, the old value", v)
	}
}

// A storm of Sets and Invalidates in one process while others Get: every
// Get answers within its deadline, and once the writes stop, every
// process converges on the last value written.
//
// On a loaded machine the writer may step aside during the storm (a round
// trip past its Timeout): its Sets then are kept and replayed as
// invalidations, as documented, and the fleet reloads those keys from the
// downstream. So the last values are written until Redis holds every one
// of them, each after the writer has replayed what it kept (a replay that
// came after a last Set would delete it); the readers must then converge
// on them. The idle twin asserts the figures of a run in which no tier
// met a Redis error: one round of last Sets, nothing skipped or replayed,
// no load without Redis.
//
// The writer commits every value to the downstream before it Sets it, and
// a fresh row before it Invalidates, as an application writes its
// database first: a process that loads the key after the last Set reads
// the last value, as it would from a database. Without the rows the
// downstream answers "<key>-v<n>" whatever was set, and a reader that
// legitimately loads after the last Set (one that loaded the key without
// Redis during the storm loads it from the downstream, under the lease,
// ahead.go) stored that answer over the last value: the model's error,
// not the tier's.
func TestTrackingStorm(t *testing.T) {
	ps, d := trackingProcs(t, 3, Options[string, string]{})
	writer, readers := ps[0], ps[1:]
	const nkeys = 40
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failures atomic.Int64
	var firstErr atomic.Value
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprint("k", (i*7+w)%nkeys)
				if i%3 == 0 {
					d.commit(k, fmt.Sprint("row-", w, "-", i))
					writer.l.Invalidate(k)
				} else {
					v := fmt.Sprint(w, "-", i)
					d.commit(k, v)
					writer.l.Set(k, v)
				}
			}
		})
	}
	for _, r := range readers {
		for g := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					c, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := r.l.Get(c, fmt.Sprint("k", (i+g)%nkeys))
					cancel()
					if err != nil {
						failures.Add(1)
						firstErr.CompareAndSwap(nil, err)
					}
				}
			})
		}
	}
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d Gets failed, the first: %v", n, firstErr.Load())
	}

	rc := newClient(t, redisAddr(t))
	entryOf := func(i int) keys {
		return keysAt(writer.t.opts.Prefix, writer.t.key(fmt.Sprint("k", i)), writer.t.gen.Load())
	}
	final := func(i int) string { return fmt.Sprint("final-", i) }
	stored := func(i int) bool {
		v, err := rc.HGet(ctx, entryOf(i).entry, "v").Result()
		return err == nil && v == fmt.Sprintf("%q", final(i))
	}
	missing := make([]int, nkeys)
	for i := range missing {
		missing[i] = i
	}
	rounds := 0
	for round := 0; len(missing) > 0; round++ {
		rounds = round + 1
		if round == 5 {
			t.Fatalf("after %d rounds of Sets, Redis lacks the last value of %d keys; writer %+v", round, len(missing), writer.t.Stats())
		}
		for _, i := range missing {
			d.commit(fmt.Sprint("k", i), final(i))
			writer.l.Set(fmt.Sprint("k", i), final(i))
		}
		eventually(t, 10*time.Second, "the writer to replay what it kept", func() bool {
			writer.t.fleet.mu.Lock()
			kept := len(writer.t.fleet.pending)
			writer.t.fleet.mu.Unlock()
			return kept == 0 && !writer.t.fleet.replaying.Load() && !writer.t.link.down()
		})
		missing = slices.DeleteFunc(missing, stored)
		if len(missing) > 0 {
			t.Logf("round %d of the last Sets: Redis lacks %d of them (the writer stepped aside); writer %+v", round, len(missing), writer.t.Stats())
		}
	}

	settle := time.Now()
	logged := false
	eventually(t, 10*time.Second, "every reader to see the last Set", func() bool {
		for _, r := range readers {
			for i := range nkeys {
				c, cancel := context.WithTimeout(ctx, 5*time.Second)
				v, err := r.l.Get(c, fmt.Sprint("k", i))
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatal(err)
				}
				if v != final(i) {
					if !logged && time.Since(settle) > 9*time.Second {
						logged = true
						ks := entryOf(i)
						cur, _ := rc.HGetAll(ctx, ks.entry).Result()
						t.Logf("k%d: a reader serves %q; its tier's record %q; the entry %v; reader %+v %+v; writer %+v",
							i, v, r.t.copies.served.Get(ks.base), cur, r.t.Stats(), r.l.Stats(), writer.t.Stats())
					}
					return false
				}
			}
		}
		return true
	})
	for i := range nkeys {
		if !stored(i) {
			cur, _ := rc.HGetAll(ctx, entryOf(i).entry).Result()
			t.Errorf("k%d: Redis holds %v, not the last value set", i, cur)
		}
	}
	var errs uint64
	for _, p := range ps {
		errs += p.t.Stats().RedisErrors
	}
	idleTwin(t, []loadSign{{"RedisErrors", errs}}, func(t *testing.T) {
		if rounds != 1 {
			t.Errorf("%d rounds of the last Sets; want 1", rounds)
		}
		if s := writer.t.Stats(); s.Skipped != 0 || s.InvalidationsReplayed != 0 || s.LocalLoads != 0 {
			t.Errorf("writer: skipped %d, replayed %d, local loads %d; want 0, 0, 0", s.Skipped, s.InvalidationsReplayed, s.LocalLoads)
		}
		for i, r := range readers {
			if s := r.t.Stats(); s.LocalLoads != 0 || s.AheadLoads != 0 {
				t.Errorf("reader %d: local loads %d, ahead loads %d; want 0, 0", i, s.LocalLoads, s.AheadLoads)
			}
		}
	})
}

// An invalidation names an entry by its Redis name: every name keysAt makes
// reads back as its key and generation, and no other name of the tier does.
func TestParseEntryName(t *testing.T) {
	for _, name := range []string{"", "%", "%25", "}", "a}b{c", "%7D", "k:v", "{x}", "é\n"} {
		for _, gen := range []int64{0, 1, 42} {
			ks := keysAt("p:", name, gen)
			got, g, ok := parseEntryName("p:", ks.entry)
			if !ok || got != name || g != gen {
				t.Errorf("parseEntryName(%q) = %q, %d, %v; want %q, %d", ks.entry, got, g, ok, name, gen)
			}
			for _, other := range []string{ks.lease, ks.alive, ks.fail, ks.base, "q:" + ks.entry[2:]} {
				if _, _, ok := parseEntryName("p:", other); ok {
					t.Errorf("parseEntryName(%q) took a name that is not an entry's", other)
				}
			}
		}
	}
	if _, _, ok := parseEntryName("p:", "p:{a}:gx:v"); ok {
		t.Error("a generation that is not a number was taken")
	}
}

// pipelineHold holds, once armed, the first pipeline that reads entry
// (HMGET) before it is sent, until release is closed: a Load held before
// its read of the entry, as a goroutine the scheduler left waiting there
// is. The read then runs without the deadline of its round trip, which
// the hold has used up: a Load that is late to start its read does not
// start its round trip's Timeout any sooner.
type pipelineHold struct {
	entry   string
	armed   atomic.Bool
	held    chan struct{} // closed when the pipeline is held
	release chan struct{}
	free    func() // closes release; once
}

func newPipelineHold(entry string) *pipelineHold {
	h := &pipelineHold{entry: entry, held: make(chan struct{}), release: make(chan struct{})}
	h.free = sync.OnceFunc(func() { close(h.release) })
	return h
}

func (h *pipelineHold) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *pipelineHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if a := c.Args(); c.Name() == "hmget" && len(a) > 1 && a[1] == h.entry && h.armed.CompareAndSwap(true, false) {
				close(h.held)
				<-h.release
				return next(context.WithoutCancel(ctx), cmds)
			}
		}
		return next(ctx, cmds)
	}
}

// A Load the Loader detached (its key was dropped while it ran) still
// hands its entry over, to its own waiters; the tier must not take that
// entry for the Loader's copy. b's first Load of k is held before it reads
// the entry; the tier drops k meanwhile (as a check that found b's copy
// outdated does), which detaches that Load; a second Load hands b x1,
// which b keeps; a writes x2, whose invalidation b hears while the first
// Load still runs; then the first Load reads x2 and hands it over. b holds
// x1, so the invalidation must drop it: were x2 recorded as handed over,
// the check of b's copy would find it current and b would serve x1 until
// its TTL (an hour).
func TestTrackingDetachedLoadClaimsNoCopy(t *testing.T) {
	addr := redisAddr(t)
	// Generous timeouts: the test is about the detached Load, not Redis's
	// speed (with the default 250ms a loaded machine's tier stepped aside
	// and the second Load read the downstream).
	to := Options[string, string]{Prefix: testPrefix(t, newClient(t, addr)), Timeout: 5 * time.Second, HolderTimeout: 10 * time.Second}
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Hour}
	a := newProc(t, addr, to.Prefix, lo, to, d)
	bc := newClient(t, addr)
	hold := newPipelineHold(keysFor(to.Prefix, "k").entry)
	bc.AddHook(hold)
	tier, err := NewTier(bc, to)
	if err != nil {
		t.Fatal(err)
	}
	b := startProc(t, tier, lo, d)
	t.Cleanup(hold.free) // before the Loader closes: it waits for the held Load
	listening(t, a, b)
	for _, p := range []proc{a, b} {
		if s := p.t.Stats(); s.Invalidations != "tracking" {
			t.Fatalf("Stats.Invalidations = %q, want tracking", s.Invalidations)
		}
	}
	a.l.Set("k", "x1")
	ks := keysAt(b.t.opts.Prefix, b.t.key("k"), b.t.gen.Load())

	hold.armed.Store(true)
	first := make(chan string, 1)
	go func() {
		v, _ := b.l.Get(ctx, "k")
		first <- v
	}()
	within(t, hold.held, 5*time.Second, "hold of the first Load's read")
	b.t.copies.dropKey("k", ks) // the first Load is detached: the Loader keeps nothing of it
	if v, err := b.l.Get(ctx, "k"); err != nil || v != "x1" {
		t.Fatalf("the second Load: %q, %v; want x1", v, err)
	}
	heard := b.t.Stats().InvalidationsHeard
	a.l.Set("k", "x2")
	eventually(t, 5*time.Second, "b to hear the Set", func() bool { return b.t.Stats().InvalidationsHeard > heard })
	hold.free()
	if v := within(t, first, 5*time.Second, "answer of the first Load"); v != "x2" {
		t.Fatalf("the first Load's waiter got %q, want x2", v)
	}
	eventually(t, 5*time.Second, "b to drop its copy of x1", func() bool {
		v, err := b.l.Get(ctx, "k")
		return err == nil && v == "x2"
	})
}

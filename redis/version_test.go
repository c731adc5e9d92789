package flightredis

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
)

// The rows of these tests are "name@N": N is the row's version.
func rowVersion(v string) uint64 {
	_, n, _ := strings.Cut(v, "@")
	if n == "boom" {
		panic("rowVersion: boom")
	}
	u, _ := strconv.ParseUint(n, 10, 64)
	return u
}

// versionedProc starts a simulated process on prefix, as newProc does,
// whose Loader loads with load and has lo's Options.Version.
func versionedProc(t *testing.T, addr, prefix string, lo flightcache.Options[string, string], to Options[string, string], load flightcache.LoadFunc[string, string]) proc {
	t.Helper()
	to.Prefix = prefix
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
	return proc{l: l, t: tier}
}

// sharedRow returns the value and the version field of key's shared entry
// (generation 0): the value as the Codec wrote it ("" when there is no
// entry), the version as the script compares it ("" when it has none).
func sharedRow(t *testing.T, pr proc, key string) (v, ver string) {
	t.Helper()
	ks := keysFor(pr.t.opts.Prefix, key)
	vals, err := pr.t.rdb.HMGet(ctx, ks.entry, "v", "ver").Result()
	if err != nil {
		t.Fatal(err)
	}
	v, _ = vals[0].(string)
	ver, _ = vals[1].(string)
	return v, ver
}

// noLoad is the LoadFunc of a process that must get every value from the
// tier: it counts its calls and fails.
func noLoad(calls *atomic.Int64) flightcache.LoadFunc[string, string] {
	return func(context.Context, string) (string, error) {
		calls.Add(1)
		return "", errBoom
	}
}

// A Set of an older version does not replace the fleet's newer value
// (docs/design.md rule 30): process A Sets v5, then B Sets v3. The shared
// entry keeps v5, and nothing is published, so A keeps its copy. B's own
// Loader stored v3 (it held nothing newer: A's invalidation had dropped
// B's copy before), but the refused Set has B's Loader drop it, so B's next
// Get reads v5 from the tier. A new process gets v5.
func TestVersionedSetKeepsTheHigherVersionAcrossProcesses(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: time.Minute, Version: rowVersion}
	var calls atomic.Int64
	a := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	b := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	eventually(t, 10*time.Second, "both subscriptions", func() bool {
		return a.t.Stats().Listening && b.t.Stats().Listening
	})

	a.l.Set("k", "a@5")
	// b holds no copy of k: Redis tells it nothing of a's Set (tracking).
	const drops = 0
	b.l.Set("k", "b@3")
	if v, ver := sharedRow(t, a, "k"); v != `"a@5"` || ver != "00000000000000000005" {
		t.Errorf("shared entry after b's Set(b@3) = %s, ver %q; want \"a@5\", ver 00000000000000000005", v, ver)
	}
	if s := b.t.Stats(); s.WritesOutdated != 1 || s.InvalidationsSent != 0 {
		t.Errorf("b tier stats: WritesOutdated %d, InvalidationsSent %d; want 1, 0", s.WritesOutdated, s.InvalidationsSent)
	}
	if n := b.l.Stats().RemoteDrops; n != drops+1 {
		t.Errorf("b's RemoteDrops = %d; want %d (the refused Set drops b's own copy)", n, drops+1)
	}
	if v, err := b.l.Get(ctx, "k"); v != "a@5" || err != nil {
		t.Errorf("b.Get(k) = %q, %v; want a@5 (read from the tier)", v, err)
	}
	if s := b.t.Stats(); s.Hits != 1 {
		t.Errorf("b tier Hits = %d; want 1", s.Hits)
	}

	// The refused Set published nothing: a hears b's next write, and only it.
	b.l.Set("other", "b@1")
	if v, err := a.l.Get(ctx, "other"); v != "b@1" || err != nil { // a holds it now
		t.Fatalf("a.Get(other) = %q, %v; want b@1", v, err)
	}
	b.l.Invalidate("other")
	eventually(t, 10*time.Second, "a to hear b's Invalidate", func() bool { return a.t.Stats().InvalidationsHeard >= 1 })
	if n := a.t.Stats().InvalidationsHeard; n != 1 {
		t.Errorf("a heard %d invalidations; want 1 (b's Invalidate, not its refused Set)", n)
	}
	if v, err := a.l.Get(ctx, "k"); v != "a@5" || err != nil {
		t.Errorf("a.Get(k) = %q, %v; want a@5", v, err)
	}
	c := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	if v, err := c.l.Get(ctx, "k"); v != "a@5" || err != nil {
		t.Errorf("new process: Get(k) = %q, %v; want a@5", v, err)
	}
	if s := c.t.Stats(); s.Hits != 1 {
		t.Errorf("new process tier Hits = %d; want 1", s.Hits)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("downstream calls = %d; want 0", n)
	}
}

// A lease holder's load that reads an older row than the shared entry
// holds (docs/design.md rule 30): A Sets v5; it goes stale. B and C each
// Get it refusing stale values, so B takes the lease and C waits on it.
// B's load reads v3 (a lagging replica): the shared entry keeps v5, B's
// caller gets v3, and B's lease is dropped with a publish, so C is woken
// at once (its poll is a minute away). C finds v5 still stale by its own
// rule, takes the lease and loads v5 (the primary), which an equal
// version lets it write. B's Loader, which was never handed v5, is made
// to drop the key: its next Get reads the fleet's v5, not its v3.
func TestVersionedFillOlderThanTheEntryWakesTheWaiters(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: 200 * time.Millisecond, StaleWhileRevalidate: time.Minute, Version: rowVersion}
	to := Options[string, string]{PollInterval: time.Minute, HolderTimeout: 10 * time.Second}
	var calls atomic.Int64
	a := versionedProc(t, addr, p, lo, to, noLoad(&calls))
	a.l.Set("k", "a@5")
	time.Sleep(300 * time.Millisecond) // a@5 is stale, and still in Redis
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	b := versionedProc(t, addr, p, lo, to, func(ctx context.Context, _ string) (string, error) {
		started <- struct{}{}
		<-gate
		return "b@3", nil
	})
	c := versionedProc(t, addr, p, lo, to, func(context.Context, string) (string, error) { return "c@5", nil })

	fresh := flightcache.WithMaxStale(ctx, 0)
	type result struct {
		v   string
		err error
	}
	bres, cres := make(chan result, 1), make(chan result, 1)
	go func() { v, err := b.l.Get(fresh, "k"); bres <- result{v, err} }()
	within(t, started, 10*time.Second, "b's load")
	go func() { v, err := c.l.Get(fresh, "k"); cres <- result{v, err} }()
	eventually(t, 10*time.Second, "c to wait on b's lease", func() bool { return c.t.Stats().Waits == 1 })
	close(gate)
	if r := within(t, bres, 30*time.Second, "answer to b's Get"); r.v != "b@3" || r.err != nil {
		t.Errorf("b.Get(k) = %q, %v; want b@3 (what its load read)", r.v, r.err)
	}
	if r := within(t, cres, 30*time.Second, "answer to c's Get"); r.v != "c@5" || r.err != nil {
		t.Errorf("c.Get(k) = %q, %v; want c@5 (its own load)", r.v, r.err)
	}
	if s := b.t.Stats(); s.Leases != 1 || s.WritesOutdated != 1 || s.WritesLost != 0 {
		t.Errorf("b tier stats: Leases %d, WritesOutdated %d, WritesLost %d; want 1, 1, 0", s.Leases, s.WritesOutdated, s.WritesLost)
	}
	// c waits on b's lease and subscribes to k's wake-ups; the refused
	// fill drops b's lease and wakes it. c looks once more when its
	// subscription is confirmed: if b's fill was done by then, that look
	// finds the lease free and c takes it without a wake-up. Either way
	// c never waits for a poll (PollInterval is a minute).
	if s := c.t.Stats(); s.Wakeups > 1 || s.Polls != 0 || s.Leases != 1 || s.WritesOutdated != 0 {
		t.Errorf("c tier stats: Wakeups %d, Polls %d, Leases %d, WritesOutdated %d; want at most 1, 0, 1, 0", s.Wakeups, s.Polls, s.Leases, s.WritesOutdated)
	}
	if v, ver := sharedRow(t, a, "k"); v != `"c@5"` || ver != "00000000000000000005" {
		t.Errorf("shared entry = %s, ver %q; want \"c@5\", ver 00000000000000000005", v, ver)
	}
	if n := b.l.Stats().RemoteDrops; n != 1 {
		t.Errorf("b's RemoteDrops = %d; want 1 (the refused fill drops b's key)", n)
	}
	if v, err := b.l.Get(ctx, "k"); v != "c@5" || err != nil {
		t.Errorf("b.Get(k) afterwards = %q, %v; want c@5 (from the tier)", v, err)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("a's downstream calls = %d; want 0", n)
	}
}

// An equal version wins, an entry without a version never refuses, and a
// Loader without Version writes as it always did (docs/design.md rule 30).
func TestVersionedEqualAndUnversionedWritesWin(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: time.Minute, Version: rowVersion}
	var calls atomic.Int64
	a := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	b := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	u := versionedProc(t, addr, p, flightcache.Options[string, string]{TTL: time.Minute}, Options[string, string]{}, noLoad(&calls))

	a.l.Set("k", "a@5")
	b.l.Set("k", "b@5")
	if v, ver := sharedRow(t, a, "k"); v != `"b@5"` || ver != "00000000000000000005" {
		t.Errorf("after an equal version: shared entry = %s, ver %q; want \"b@5\", ver 00000000000000000005", v, ver)
	}
	u.l.Set("k2", "u@9")
	if v, ver := sharedRow(t, a, "k2"); v != `"u@9"` || ver != "" {
		t.Errorf("after an unversioned Set: shared entry = %s, ver %q; want \"u@9\", no version", v, ver)
	}
	b.l.Set("k2", "b@3")
	if v, ver := sharedRow(t, a, "k2"); v != `"b@3"` || ver != "00000000000000000003" {
		t.Errorf("after a versioned Set over an unversioned entry: shared entry = %s, ver %q; want \"b@3\", ver 00000000000000000003", v, ver)
	}
	u.l.Set("k2", "u@1")
	if v, ver := sharedRow(t, a, "k2"); v != `"u@1"` || ver != "" {
		t.Errorf("after an unversioned Set over a versioned entry: shared entry = %s, ver %q; want \"u@1\", no version", v, ver)
	}
	for _, pr := range []proc{a, b, u} {
		if n := pr.t.Stats().WritesOutdated; n != 0 {
			t.Errorf("WritesOutdated = %d; want 0", n)
		}
	}
}

// Versions compare exactly, above 2^53 too, where a double would round
// 2^60+1 to 2^60 (docs/design.md rule 30).
func TestVersionedCompareExactlyAbove2To53(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: time.Minute, Version: rowVersion}
	var calls atomic.Int64
	pr := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	for i, tc := range []struct {
		held, write uint64
		refused     bool
	}{
		{1<<60 + 1, 1 << 60, true},
		{1 << 60, 1<<60 + 1, false},
		{1 << 60, 1 << 60, false},
		{math.MaxUint64, math.MaxUint64 - 1, true},
		{math.MaxUint64 - 1, math.MaxUint64, false},
		{10_000_000_000, 9_999_999_999, true}, // the halves: 1|0 against 0|9999999999
		{9_999_999_999, 10_000_000_000, false},
		{1, 0, true},
		{0, 0, false},
	} {
		key := fmt.Sprintf("k%d", i)
		before := pr.t.Stats().WritesOutdated
		now := time.Now()
		pr.t.Set(ctx, key, remote.Value[string]{Value: fmt.Sprintf("h@%d", tc.held), LoadedAt: now})
		pr.t.Set(ctx, key, remote.Value[string]{Value: fmt.Sprintf("w@%d", tc.write), LoadedAt: now})
		want, wantVer := fmt.Sprintf(`"w@%d"`, tc.write), fmt.Sprintf("%020d", tc.write)
		if tc.refused {
			want, wantVer = fmt.Sprintf(`"h@%d"`, tc.held), fmt.Sprintf("%020d", tc.held)
		}
		if v, ver := sharedRow(t, pr, key); v != want || ver != wantVer {
			t.Errorf("held %d, write %d: shared entry = %s, ver %q; want %s, ver %s", tc.held, tc.write, v, ver, want, wantVer)
		}
		if got := pr.t.Stats().WritesOutdated - before; got != map[bool]uint64{true: 1}[tc.refused] {
			t.Errorf("held %d, write %d: WritesOutdated +%d; want refused %v", tc.held, tc.write, got, tc.refused)
		}
	}
}

// A Version that panics makes the value one the tier does not share, as a
// Freshness that panics does: the Set deletes the key's shared entry,
// whatever its version, and counts in EncodeErrors; nothing escapes into
// the caller (docs/design.md rule 30).
func TestVersionPanicIsNotShared(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: time.Minute, Version: rowVersion}
	var calls atomic.Int64
	pr := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	pr.l.Set("k", "a@5")
	if v, _ := sharedRow(t, pr, "k"); v != `"a@5"` {
		t.Fatalf("shared entry = %s; want \"a@5\"", v)
	}
	pr.t.Set(ctx, "k", remote.Value[string]{Value: "a@boom", LoadedAt: time.Now()})
	if v, ver := sharedRow(t, pr, "k"); v != "" || ver != "" {
		t.Errorf("shared entry after a Set whose Version panicked = %s, ver %q; want none", v, ver)
	}
	if s := pr.t.Stats(); s.EncodeErrors != 1 || s.WritesOutdated != 0 {
		t.Errorf("tier stats: EncodeErrors %d, WritesOutdated %d; want 1, 0", s.EncodeErrors, s.WritesOutdated)
	}
}

// A batch's fills follow the rule too (docs/design.md rule 30): B's
// GetMany, refusing stale values, leases two keys whose shared entries
// hold v5 (stale) and loads v3 for both. The entries keep v5, B's caller
// gets v3, and B's Loader, never handed v5, drops both keys, so its next
// Gets read v5 from the tier.
func TestVersionedBatchFillOlderThanTheEntry(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: 200 * time.Millisecond, StaleWhileRevalidate: time.Minute, Version: rowVersion}
	var calls atomic.Int64
	a := versionedProc(t, addr, p, lo, Options[string, string]{}, noLoad(&calls))
	a.l.Set("x", "a@5")
	a.l.Set("y", "a@5")
	time.Sleep(300 * time.Millisecond) // stale, and still in Redis
	blo := lo
	blo.LoadMany = func(_ context.Context, keys []string) (map[string]string, error) {
		m := make(map[string]string, len(keys))
		for _, k := range keys {
			m[k] = "b@3"
		}
		return m, nil
	}
	b := versionedProc(t, addr, p, blo, Options[string, string]{}, noLoad(&calls))
	got, err := b.l.GetMany(flightcache.WithMaxStale(ctx, 0), []string{"x", "y"})
	if err != nil || got["x"] != "b@3" || got["y"] != "b@3" {
		t.Fatalf("b.GetMany(x, y) = %v, %v; want b@3 for both (what its load read)", got, err)
	}
	if s := b.t.Stats(); s.Leases != 2 || s.WritesOutdated != 2 {
		t.Errorf("b tier stats: Leases %d, WritesOutdated %d; want 2, 2", s.Leases, s.WritesOutdated)
	}
	for _, k := range []string{"x", "y"} {
		if v, ver := sharedRow(t, a, k); v != `"a@5"` || ver != "00000000000000000005" {
			t.Errorf("shared entry of %s = %s, ver %q; want \"a@5\", ver 00000000000000000005", k, v, ver)
		}
		if v, err := b.l.Get(ctx, k); v != "a@5" || err != nil {
			t.Errorf("b.Get(%s) afterwards = %q, %v; want a@5 (the stale shared entry)", k, v, err)
		}
	}
	// (b then refreshes the stale copies in the background: not asserted.)
}

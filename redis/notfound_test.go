package flightredis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// entryState reports whether key's shared entry is in Redis, and its
// "nf" field.
func entryState(t *testing.T, pr proc, key string) (exists bool, nf string) {
	t.Helper()
	ks := keysFor(pr.t.opts.Prefix, key)
	n, err := pr.t.rdb.Exists(ctx, ks.entry).Result()
	if err != nil {
		t.Fatal(err)
	}
	nf, _ = pr.t.rdb.HGet(ctx, ks.entry, "nf").Result()
	return n == 1, nf
}

// A not-found is stored in the tier for NotFoundTTL and served to every
// process; Set replaces it, Invalidate deletes it, and it expires.
func TestNotFoundIsSharedByTheTier(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.fail(fmt.Errorf("wrapped: %w", flightcache.ErrNotFound))
	const nfTTL = 2 * time.Second
	lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: nfTTL, Breaker: flightcache.Breaker{Disabled: true}}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)

	if _, err := a.l.Get(ctx, "k"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("a.Get(k) = %v; want ErrNotFound", err)
	}
	if exists, nf := entryState(t, a, "k"); !exists || nf != "1" {
		t.Fatalf("entry of k: exists %v, nf %q; want a not-found marker", exists, nf)
	}
	ttl, err := a.t.rdb.PTTL(ctx, keysFor(p, "k").entry).Result()
	if err != nil || ttl <= 0 || ttl > nfTTL {
		t.Errorf("marker PTTL = %v, %v; want in (0, %v]", ttl, err, nfTTL)
	}
	if _, err := b.l.Get(ctx, "k"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("b.Get(k) = %v; want ErrNotFound from the tier", err)
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls = %d; want 1", n)
	}
	if s := b.t.Stats(); s.NotFoundHits != 1 || s.Leases != 0 {
		t.Errorf("b stats %+v; want 1 not-found hit, no lease", s)
	}

	// Set replaces the marker: a process with nothing locally gets the
	// value, and b does once its local not-found expires.
	d.fail(nil)
	a.l.Set("k", "set")
	eventually(t, 10*time.Second, "Set to replace the marker", func() bool {
		_, nf := entryState(t, a, "k")
		return nf == ""
	})
	c := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if v, err := c.l.Get(ctx, "k"); err != nil || v != "set" {
		t.Errorf("c.Get(k) after Set = %q, %v; want set", v, err)
	}
	eventually(t, 10*time.Second, "b to see the value Set stored", func() bool {
		v, _ := b.l.Get(ctx, "k")
		return v == "set"
	})
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls after Set = %d; want still 1", n)
	}

	// Invalidate deletes a marker.
	d.fail(flightcache.ErrNotFound)
	if _, err := a.l.Get(ctx, "gone"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("a.Get(gone) = %v; want ErrNotFound", err)
	}
	a.l.Invalidate("gone")
	eventually(t, 10*time.Second, "Invalidate to delete the marker", func() bool {
		exists, _ := entryState(t, a, "gone")
		return !exists
	})

	// A marker expires after NotFoundTTL: then a miss loads again.
	if _, err := a.l.Get(ctx, "gone2"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("a.Get(gone2) = %v; want ErrNotFound", err)
	}
	before := d.calls.Load()
	eventually(t, nfTTL+10*time.Second, "the marker to expire", func() bool {
		exists, _ := entryState(t, a, "gone2")
		return !exists
	})
	if _, err := b.l.Get(ctx, "gone2"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("b.Get(gone2) = %v; want ErrNotFound", err)
	}
	if n := d.calls.Load(); n != before+1 {
		t.Errorf("downstream calls after the marker expired = %d; want %d", n, before+1)
	}
}

// Without NotFoundTTL nothing is stored: each process asks the downstream.
func TestNotFoundNotStoredWithoutNotFoundTTL(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.fail(flightcache.ErrNotFound)
	lo := flightcache.Options[string, string]{TTL: time.Minute, Breaker: flightcache.Breaker{Disabled: true}}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)
	for _, pr := range []proc{a, b} {
		if _, err := pr.l.Get(ctx, "k"); !errors.Is(err, flightcache.ErrNotFound) {
			t.Fatalf("Get(k) = %v; want ErrNotFound", err)
		}
	}
	if exists, _ := entryState(t, a, "k"); exists {
		t.Error("an entry was stored for a not-found without NotFoundTTL")
	}
	if n := d.calls.Load(); n != 2 {
		t.Errorf("downstream calls = %d; want 2", n)
	}
	if s := b.t.Stats(); s.NotFoundHits != 0 {
		t.Errorf("b stats %+v; want no not-found hit", s)
	}
}

// The batch path stores a not-found marker for a key LoadMany omits, and
// serves one; a single Get reads the batch's marker too.
func TestGetManyNotFoundIsStoredInTheTier(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.absent = map[string]bool{"gone": true, "gone2": true}
	lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute, Breaker: flightcache.Breaker{Disabled: true}}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)

	if m, err := a.l.GetMany(ctx, []string{"a1", "gone", "gone2"}); err != nil || len(m) != 1 {
		t.Fatalf("a.GetMany = %v, %v; want a1 only", m, err)
	}
	if exists, nf := entryState(t, a, "gone"); !exists || nf != "1" {
		t.Fatalf("entry of gone: exists %v, nf %q; want a not-found marker", exists, nf)
	}
	if m, err := b.l.GetMany(ctx, []string{"gone", "a1"}); err != nil || len(m) != 1 || m["a1"] == "" {
		t.Errorf("b.GetMany = %v, %v; want a1 only", m, err)
	}
	if _, err := b.l.Get(ctx, "gone2"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Errorf("b.Get(gone2) = %v; want ErrNotFound from the tier", err)
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want only a's", calls)
	}
	if s := b.t.Stats(); s.NotFoundHits != 2 || s.Hits != 1 || s.Leases != 0 {
		t.Errorf("b stats %+v; want 2 not-found hits, 1 hit, no lease", s)
	}

	// Set replaces the marker for the batch path too.
	a.l.Set("gone", "set")
	eventually(t, 10*time.Second, "Set to replace the marker", func() bool {
		_, nf := entryState(t, a, "gone")
		return nf == ""
	})
	c := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	if m, err := c.l.GetMany(ctx, []string{"gone"}); err != nil || m["gone"] != "set" {
		t.Errorf("c.GetMany(gone) after Set = %v, %v; want set", m, err)
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want only a's", calls)
	}
}

// A LoadMany that fails as a whole with ErrNotFound makes each of its keys a
// not-found marker in the tier, as a single load's ErrNotFound does: another
// process reads the markers and loads nothing.
func TestGetManyWholeNotFoundIsStoredInTheTier(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.err = fmt.Errorf("catalogue: no such products: %w", flightcache.ErrNotFound)
	lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute, Breaker: flightcache.Breaker{Disabled: true}}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)

	if m, err := a.l.GetMany(ctx, []string{"x1", "x2"}); err != nil || len(m) != 0 {
		t.Fatalf("a.GetMany = %v, %v; want nothing and no error (both not found)", m, err)
	}
	for _, k := range []string{"x1", "x2"} {
		if exists, nf := entryState(t, a, k); !exists || nf != "1" {
			t.Fatalf("entry of %s: exists %v, nf %q; want a not-found marker", k, exists, nf)
		}
	}
	if m, err := b.l.GetMany(ctx, []string{"x1", "x2"}); err != nil || len(m) != 0 {
		t.Errorf("b.GetMany = %v, %v; want nothing and no error", m, err)
	}
	if _, err := b.l.Get(ctx, "x1"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Errorf("b.Get(x1) = %v; want ErrNotFound", err)
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want only a's", calls)
	}
	if s := b.t.Stats(); s.NotFoundHits != 2 || s.Leases != 0 {
		t.Errorf("b stats %+v; want 2 not-found hits, no lease", s)
	}
}

// A not-found marker is never a value to a version that does not know it:
// read with the fields it reads (no "nf"), it does not parse.
func TestNotFoundMarkerDoesNotParseAsAValue(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.fail(flightcache.ErrNotFound)
	lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if _, err := a.l.Get(ctx, "k"); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("a.Get(k) = %v; want ErrNotFound", err)
	}
	vals, err := a.t.rdb.HMGet(ctx, keysFor(p, "k").entry, entryFields[:untilField+1]...).Result()
	if err != nil {
		t.Fatal(err)
	}
	if e, err := parseEntry(vals); err == nil || e.ok {
		t.Errorf("the marker read without nf = %+v, %v; want an entry that does not parse", e, err)
	}
	vals, err = a.t.rdb.HMGet(ctx, keysFor(p, "k").entry, entryFields...).Result()
	if e, perr := parseEntry(vals); err != nil || perr != nil || !e.nf || !a.t.attached().sharedNotFound(e) {
		t.Errorf("the marker = %+v, %v, %v; want a live not-found marker", e, err, perr)
	}
}

// docs/design.md rule 26 through the tier: with NotFoundTTL 0, a load that
// finds the key gone deletes the shared entry as it drops the local copy,
// so no process is handed the deleted value from the tier, not even to
// cover a later failure. Before the fix the lease was released and the
// entry kept: c's failing load was covered with "v", the deleted row.
func TestNotFoundDropsTheSharedEntry(t *testing.T) {
	for _, many := range []bool{false, true} {
		t.Run(fmt.Sprint("many=", many), func(t *testing.T) { notFoundDropsTheSharedEntry(t, many) })
	}
}

func notFoundDropsTheSharedEntry(t *testing.T, many bool) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: 500 * time.Millisecond, StaleIfError: time.Hour, Breaker: flightcache.Breaker{Disabled: true}}
	get := func(l *flightcache.Loader[string, string]) (string, error) { return l.Get(ctx, "k") }
	if many { // through LoadMany and the tier's batches: a key LoadMany leaves out is not found
		lo.LoadMany = func(ctx context.Context, keys []string) (map[string]string, error) {
			m := map[string]string{}
			for _, k := range keys {
				v, err := d.load(ctx, k)
				if errors.Is(err, flightcache.ErrNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				m[k] = v
			}
			return m, nil
		}
		get = func(l *flightcache.Loader[string, string]) (string, error) {
			m, err := l.GetMany(ctx, []string{"k"})
			if v, ok := m["k"]; ok || err != nil {
				return v, err
			}
			return "", flightcache.ErrNotFound
		}
	}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	v, err := get(a.l)
	if err != nil || v == "" {
		t.Fatalf("a.Get(k) = %q, %v; want a value", v, err)
	}
	if exists, _ := entryState(t, a, "k"); !exists {
		t.Fatal("no shared entry for k after a's load")
	}
	time.Sleep(time.Second)         // past its freshness, within StaleIfError: a Get loads
	d.fail(flightcache.ErrNotFound) // the row is deleted
	if _, err := get(a.l); !errors.Is(err, flightcache.ErrNotFound) {
		t.Fatalf("a.Get(k) = %v; want ErrNotFound", err)
	}
	if exists, _ := entryState(t, a, "k"); exists {
		t.Error("the shared entry of k outlived the not-found")
	}
	d.fail(errors.New("connection refused"))
	c := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if got, err := get(c.l); err == nil || got == v {
		t.Errorf("c.Get(k) of a failing downstream = %q, %v; want the failure, not covered by the deleted value", got, err)
	}
}

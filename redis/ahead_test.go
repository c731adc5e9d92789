package flightredis

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// versionProc starts a simulated process on addr (a Loader of TTL an hour
// on load, its tier made with to), both closed when the test ends.
func versionProc(t *testing.T, addr string, to Options[string, string], load flightcache.LoadFunc[string, string]) proc {
	t.Helper()
	return versionedProc(t, addr, to.Prefix, flightcache.Options[string, string]{TTL: time.Hour}, to, load)
}

// get is p's Get of k, which must succeed.
func get(t *testing.T, p proc, k string) string {
	t.Helper()
	v, err := p.l.Get(ctx, k)
	if err != nil {
		t.Fatalf("Get(%s) = %v", k, err)
	}
	return v
}

// A reader whose tier steps aside loads the key's new version from the
// downstream and serves it, while the writer's Invalidate has not reached
// Redis yet (it is kept for replay, or late): the shared entry is still the
// version before. When the reader's tier is back, its health check
// distrusts the copy loaded without Redis, and the reread must not hand
// back that older shared entry: the reader loads under the lease instead,
// and the shared entry catches up.
func TestReaderNeverGoesBackAfterALocalLoad(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	var db atomic.Int64 // the database: a version
	load := func(context.Context, string) (string, error) { return strconv.FormatInt(db.Load(), 10), nil }
	to := Options[string, string]{Prefix: prefix, RetryAfter: time.Hour}
	writer := versionProc(t, addr, to, load)
	reader := versionProc(t, addr, to, load)
	listening(t, writer, reader)
	if v := get(t, reader, "k"); v != "0" {
		t.Fatalf("reader = %q, want 0", v)
	}

	db.Store(1)
	writer.t.link.failed() // the writer's Invalidate does not reach Redis: kept for replay
	writer.l.Invalidate("k")
	if s := writer.t.Stats(); s.Skipped != 1 {
		t.Fatalf("writer: Skipped = %d, want 1", s.Skipped)
	}
	reader.t.link.failed() // a round trip of the reader timed out: it steps aside
	reader.t.distrust()
	if v := get(t, reader, "k"); v != "1" {
		t.Fatalf("reader without Redis = %q, want 1", v)
	}
	if s := reader.t.Stats(); s.LocalLoads != 1 {
		t.Fatalf("reader: LocalLoads = %d, want 1", s.LocalLoads)
	}

	reader.t.link.downUntil.Store(0) // Redis answers the reader again
	reader.t.distrust()              // as its health check does after a copy loaded untracked
	if v := get(t, reader, "k"); v != "1" {
		t.Fatalf("reader went back to %q after serving 1", v)
	}
	if s := reader.t.Stats(); s.Leases != 2 || s.AheadLoads != 1 {
		t.Fatalf("reader: Leases %d, AheadLoads %d; want 2, 1", s.Leases, s.AheadLoads)
	}
	other := versionProc(t, addr, to, load)
	if v := get(t, other, "k"); v != "1" {
		t.Fatalf("another process reads %q from the shared entry, want 1", v)
	}
	if s := other.t.Stats(); s.Hits != 1 {
		t.Fatalf("another process: Hits = %d, want 1", s.Hits)
	}
}

// A writer's own Set that did not reach Redis: once Redis answers again
// and before the replay has run, a reread of its copy (distrusted) must not
// hand it back the shared entry from before the Set.
func TestWriterNeverGoesBackBeforeItsReplay(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	var db atomic.Int64
	load := func(context.Context, string) (string, error) { return strconv.FormatInt(db.Load(), 10), nil }
	to := Options[string, string]{Prefix: prefix, RetryAfter: time.Hour}
	p := versionProc(t, addr, to, load)
	listening(t, p)
	if v := get(t, p, "k"); v != "0" {
		t.Fatalf("Get = %q, want 0", v)
	}

	db.Store(2)
	p.t.link.failed()
	p.l.Set("k", "2")
	if v := get(t, p, "k"); v != "2" {
		t.Fatalf("Get after Set = %q, want 2", v)
	}
	// Redis answers again; the replay has not run yet (it runs on a
	// goroutine, at the next health check: held here).
	if !p.t.fleet.replaying.CompareAndSwap(false, true) {
		t.Fatal("a replay runs already")
	}
	p.t.link.downUntil.Store(0)
	p.t.distrust()
	if v := get(t, p, "k"); v != "2" {
		t.Fatalf("Get went back to %q after serving 2", v)
	}
	p.t.fleet.replaying.Store(false)
}

// A reader that served a version loaded without Redis finds, when it reads
// the key again, the lease held by a process whose load read the version
// before (its value is older: the write's Invalidate is late). It must not
// wait for that value: it loads from the downstream itself, without the
// lease. Once that holder has written its older value, the reader's next
// reread does not take it either.
func TestReaderNeverTakesAnOlderLeaseHoldersValue(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	var db atomic.Int64
	load := func(context.Context, string) (string, error) { return strconv.FormatInt(db.Load(), 10), nil }
	read, gate := make(chan struct{}), make(chan struct{})
	slow := func(context.Context, string) (string, error) { // reads, then takes its time
		v := strconv.FormatInt(db.Load(), 10)
		close(read)
		<-gate
		return v, nil
	}
	to := Options[string, string]{Prefix: prefix, RetryAfter: time.Hour}
	holder := versionProc(t, addr, to, slow)
	reader := versionProc(t, addr, to, load)
	listening(t, holder, reader)

	held := make(chan string, 1)
	go func() { v, _ := holder.l.Get(ctx, "k"); held <- v }()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not load")
	}
	db.Store(1)
	reader.t.link.failed()
	if v := get(t, reader, "k"); v != "1" {
		t.Fatalf("reader without Redis = %q, want 1", v)
	}
	reader.t.link.downUntil.Store(0)
	reader.t.distrust()

	got := make(chan string, 1)
	go func() { v, _ := reader.l.Get(ctx, "k"); got <- v }()
	open := sync.OnceFunc(func() { close(gate) })
	var v string
	for deadline := time.Now().Add(10 * time.Second); v == ""; {
		select {
		case v = <-got:
		case <-time.After(5 * time.Millisecond):
			if reader.t.Stats().Waits > 0 {
				open() // the reader waits for the holder: let it go, to see what it serves
			}
			if time.Now().After(deadline) {
				t.Fatal("the reader's Get did not return")
			}
		}
	}
	if v != "1" {
		t.Fatalf("reader went back to %q after serving 1", v)
	}
	if s := reader.t.Stats(); s.Waits != 0 || s.AheadLoads != 1 {
		t.Fatalf("reader: Waits %d, AheadLoads %d; want 0, 1", s.Waits, s.AheadLoads)
	}
	open()
	select {
	case v := <-held:
		if v != "0" {
			t.Fatalf("holder = %q, want 0", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's Get did not return")
	}
	// The holder's older value is the shared entry now. Whether or not the
	// reader has heard of that write yet, its copy read again is not it.
	reader.t.distrust()
	if v := get(t, reader, "k"); v != "1" {
		t.Fatalf("reader went back to %q after serving 1", v)
	}
}

// The batch path keeps the rule too: a GetMany whose keys this process
// loaded without Redis reads none of their shared entries back; it loads
// a key whose lease is free under it (k1), and one whose lease another
// process holds without it (k2), in one call.
func TestBatchNeverGoesBackAfterALocalLoad(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	var db atomic.Int64
	load := func(context.Context, string) (string, error) { return strconv.FormatInt(db.Load(), 10), nil }
	var calls atomic.Int64
	loadMany := func(_ context.Context, keys []string) (map[string]string, error) {
		calls.Add(1)
		m := make(map[string]string, len(keys))
		for _, k := range keys {
			m[k] = strconv.FormatInt(db.Load(), 10)
		}
		return m, nil
	}
	read, gate := make(chan struct{}), make(chan struct{})
	slow := func(context.Context, string) (string, error) {
		v := strconv.FormatInt(db.Load(), 10)
		close(read)
		<-gate
		return v, nil
	}
	to := Options[string, string]{Prefix: prefix, RetryAfter: time.Hour}
	holder := versionProc(t, addr, to, slow)
	reader := versionedProc(t, addr, to.Prefix, flightcache.Options[string, string]{TTL: time.Hour, LoadMany: loadMany}, to, load)
	listening(t, holder, reader)
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open)

	getMany := func(keys ...string) map[string]string {
		t.Helper()
		type result struct {
			m   map[string]string
			err error
		}
		got := make(chan result, 1)
		go func() { m, err := reader.l.GetMany(ctx, keys); got <- result{m, err} }()
		for deadline := time.Now().Add(10 * time.Second); ; {
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatalf("GetMany(%v) = %v", keys, r.err)
				}
				return r.m
			case <-time.After(5 * time.Millisecond):
				if reader.t.Stats().Waits > 0 {
					open() // the reader waits for the holder: let it go, to see what it serves
				}
				if time.Now().After(deadline) {
					t.Fatalf("GetMany(%v) did not return", keys)
				}
			}
		}
	}
	if m := getMany("k1"); m["k1"] != "0" {
		t.Fatalf("GetMany = %v, want k1 0", m)
	}
	go func() { _, _ = holder.l.Get(ctx, "k2") }()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not load")
	}

	db.Store(1)
	reader.t.link.failed()
	reader.t.distrust()
	if m := getMany("k1", "k2"); m["k1"] != "1" || m["k2"] != "1" {
		t.Fatalf("GetMany without Redis = %v, want 1 each", m)
	}
	reader.t.link.downUntil.Store(0)
	reader.t.distrust()
	before := reader.t.Stats()
	if m := getMany("k1", "k2"); m["k1"] != "1" || m["k2"] != "1" {
		t.Fatalf("GetMany went back: %v after serving 1 each", m)
	}
	s := reader.t.Stats()
	if s.AheadLoads != 2 || s.Waits != 0 || s.Leases != before.Leases+1 {
		t.Fatalf("reader: AheadLoads %d, Waits %d, Leases +%d; want 2, 0, +1", s.AheadLoads, s.Waits, s.Leases-before.Leases)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("LoadMany calls = %d, want 3 (one per GetMany)", n)
	}
}

// A reader that served a value loaded without Redis reloads the key from
// the downstream after another process's Set (ahead.go): the entry it
// stores is the downstream's answer, which is the value set when the
// writer committed it before its Set, as an application writes its
// database first. This is the path of TestTrackingStorm's readers after
// its last Sets; a downstream that ignores the writes (answering
// "<key>-v<n>") has that reload store its own answer over the value set.
func TestAheadReloadAfterASetReadsTheRow(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	to := Options[string, string]{Prefix: prefix, RetryAfter: time.Hour}
	writer := versionedProc(t, addr, prefix, flightcache.Options[string, string]{TTL: time.Hour}, to, d.load)
	reader := versionedProc(t, addr, prefix, flightcache.Options[string, string]{TTL: time.Hour}, to, d.load)
	listening(t, writer, reader)
	reader.t.link.failed() // a round trip of the reader timed out: it steps aside
	if v := get(t, reader, "k"); v != "k-v1" {
		t.Fatalf("reader without Redis = %q, want k-v1", v)
	}
	reader.t.link.downUntil.Store(0) // Redis answers the reader again

	d.commit("k", "final")
	writer.l.Set("k", "final")
	reader.t.distrust() // as its health check does after a copy loaded untracked
	if v := get(t, reader, "k"); v != "final" {
		t.Fatalf("reader after the Set = %q, want final", v)
	}
	if s := reader.t.Stats(); s.AheadLoads != 1 {
		t.Fatalf("reader: AheadLoads %d, want 1 (the reload came from the downstream)", s.AheadLoads)
	}
	if v := get(t, versionedProc(t, addr, prefix, flightcache.Options[string, string]{TTL: time.Hour}, to, d.load), "k"); v != "final" {
		t.Fatalf("another process reads %q from the shared entry, want final", v)
	}
}

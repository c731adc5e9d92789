package flightcache

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// holdWriter stops every Loader's writer at the start of its next batch
// until the returned release is called. Tests that use it must not run in
// parallel with others.
func holdWriter(t *testing.T) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	hook := func() { <-gate }
	testHookWriter.Store(&hook)
	var once sync.Once
	release = func() {
		once.Do(func() {
			testHookWriter.Store(nil)
			close(gate)
		})
	}
	t.Cleanup(release)
	return release
}

// docs/design.md rule 17, and rule 2 for writes still on their way: with
// the writer held (nothing reaches ristretto), Set, Invalidate and fills of
// one key return, a Get after each sees its effect, and misses of other
// keys of the same shard load and return. Nothing waits for ristretto.
func TestNoWriteWaitsForRistretto(t *testing.T) {
	release := holdWriter(t)
	// Hash puts every key in shard 0: keys 0, 64, 128, ...
	l, err := New(func(_ context.Context, k int) (string, error) { return "loaded", nil },
		Options[int, string]{TTL: time.Hour, Hash: func(k int) uint64 { return uint64(k) }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	check := func(what string, k int, want string, src Source) {
		t.Helper()
		if v, info, err := l.GetInfo(ctx, k); v != want || info.Source != src || err != nil {
			t.Fatalf("%s: Get(%d) = %q, %v, %v; want %q, %v", what, k, v, info.Source, err, want, src)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check("first Get", 0, "loaded", SourceLoaded)
		check("Get after the fill", 0, "loaded", SourceHit)
		l.Set(0, "set")
		check("Get after Set", 0, "set", SourceHit)
		l.Set(0, "set again")
		check("Get after a second Set", 0, "set again", SourceHit)
		l.Invalidate(0)
		check("Get after Invalidate", 0, "loaded", SourceLoaded)
		for k := 64; k <= 64*20; k += 64 {
			check("miss of another key of the shard", k, "loaded", SourceLoaded)
			l.Set(0, "set")
		}
		check("Get after the last Set", 0, "set", SourceHit)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an operation waited for the writer (held)")
	}
	if n := l.writer.backlog.Load(); n == 0 {
		t.Fatal("the writer was not held: no write is pending")
	}
	release()
	// Once the writer runs, the values reach ristretto and the pending
	// writes close.
	deadline := time.Now().Add(10 * time.Second)
	for l.flights.pending(0) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if l.flights.pending(0) {
		t.Fatal("the write of key 0 is still pending 10s after the writer was released")
	}
	if e := l.cached(l.mustHash(0), 0); e == nil || e.val != "set" {
		t.Fatalf("ristretto holds %v for key 0; want the last Set's value", e)
	}
	check("Get once the write settled", 0, "set", SourceHit)
}

// docs/design.md rules 2 and 6 across the writer's batches, with the
// writer held between them, step by step as docs/design.md's write path tells
// it: a Set racing the fill of its key wins, and the later value reaches
// ristretto in place of the earlier one (never as a second new item, which
// ristretto would refuse).
func TestSetOverPendingFill(t *testing.T) {
	release := holdWriter(t)
	l, err := New(func(_ context.Context, k string) (string, error) { return "v1", nil },
		Options[string, string]{TTL: time.Hour, MaxCost: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if v, _ := l.Get(ctx, "k"); v != "v1" {
		t.Fatalf("Get = %q; want v1", v)
	}
	l.Set("k", "v2")
	if v, info, _ := l.GetInfo(ctx, "k"); v != "v2" || info.Source != SourceHit {
		t.Fatalf("Get after Set = %q, %v; want v2, hit", v, info.Source)
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for l.flights.pending("k") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if e := l.cached(l.mustHash("k"), "k"); e == nil || e.val != "v2" {
		t.Fatalf("ristretto holds %+v; want v2", e)
	}
	if s := l.Stats(); s.SetsRejected != 0 || s.SetsDropped != 0 || s.Loads != 1 {
		t.Errorf("Stats = %+v; want 1 load, nothing rejected or dropped", s)
	}
}

// waitWriterIdle waits until every write handed to l's writer has closed.
func waitWriterIdle(t *testing.T, l interface{ backlog() int64 }) {
	t.Helper()
	waitProgress(t, "writes pending", 20*time.Second, l.backlog)
}

func (l *Loader[K, V]) backlog() int64 { return l.writer.backlog.Load() }

// docs/design.md rule 17: nothing is lost. Sets of six times more new keys
// than ristretto's set buffer holds (32k), made while the writer is held so
// that they all wait for it at once, every one reaches the cache: a Get of
// each afterwards is a hit, and nothing loads. (Handed to ristretto in one
// go, without -race, some of them used to be refused and lost.)
// MaxPendingWrites lets them all wait at once.
func TestWriterLosesNoSet(t *testing.T) {
	n := 200_000
	if raceEnabled {
		n = 100_000 // still three times the set buffer, at a fifth of the time
	}
	release := holdWriter(t)
	l, err := New(func(_ context.Context, k int) (int, error) { return -1, nil },
		Options[int, int]{TTL: time.Hour, MaxCost: 4 * int64(n), MaxPendingWrites: n})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for k := range n {
		l.Set(k, k)
	}
	if p := l.Stats().PendingWrites; p != int64(n) {
		t.Fatalf("Stats.PendingWrites = %d with the writer held; want %d", p, n)
	}
	release()
	waitWriterIdle(t, l)
	if p := l.Stats().PendingWrites; p != 0 {
		t.Fatalf("Stats.PendingWrites = %d once the writer caught up; want 0", p)
	}
	for k := range n {
		if v, info, err := l.GetInfo(context.Background(), k); v != k || info.Source != SourceHit || err != nil {
			t.Fatalf("Get(%d) = %d, %v, %v; want %d, a hit", k, v, info.Source, err, k)
		}
	}
	if s := l.Stats(); s.Loads != 0 || s.Hits != uint64(n) {
		t.Fatalf("Stats = %+v; want %d hits and no load", s, n)
	}
}

// A burst of loads or writes in one shard must not keep its maps' buckets
// once it is over (Go maps never shrink): they are rebuilt small.
func TestShardMapsShrink(t *testing.T) {
	const n = 4 * shrinkFrom
	gate := make(chan struct{})
	l, err := New(func(_ context.Context, k int) (int, error) { <-gate; return k, nil },
		Options[int, int]{TTL: time.Hour, MaxCost: 4 * n,
			Hash: func(k int) uint64 { return uint64(k) * flightShards }}) // all in shard 0
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sh := &l.flights.shards[0]
	peaks := func() (loads, writes int32, nl, nw int) {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.peakLoads, sh.peakWrites, len(sh.loads), len(sh.writes)
	}

	// Loads (the writer runs: a finishing load waits for a held one).
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() { l.Get(context.Background(), k) })
	}
	waitFor(t, fmt.Sprintf("%d loads in flight", n), 10*time.Second, func() bool { return l.Stats().InFlight == n })
	if pl, _, nl, _ := peaks(); pl != n || nl != n {
		t.Fatalf("with %d loads in flight: %d in the map, peak %d", n, nl, pl)
	}
	close(gate)
	waitGroup(t, "the loads' Gets", &wg)
	if pl, _, nl, _ := peaks(); pl > shrinkFrom || nl != 0 {
		t.Fatalf("after the loads: loads map %d keys, peak %d; want it rebuilt", nl, pl)
	}
	waitWriterIdle(t, l)

	// Writes (Sets of new keys, the writer held).
	release := holdWriter(t)
	for k := n; k < 2*n; k++ {
		l.Set(k, k)
	}
	if _, pw, _, nw := peaks(); pw != n || nw != n {
		t.Fatalf("with %d writes pending: %d in the map, peak %d", n, nw, pw)
	}
	release()
	waitWriterIdle(t, l)
	if _, pw, _, nw := peaks(); pw > shrinkFrom || nw != 0 {
		t.Fatalf("after the writes settled: writes map %d keys, peak %d; want it rebuilt", nw, pw)
	}
}

// docs/design.md rules 2 and 5 for a write still on its way: a Get that
// finds a key's value only in its pending write answers as the cache would
// have, a fresh value as a hit and a value within StaleWhileRevalidate at
// once as stale, with a background refresh (not by waiting for a load).
func TestPendingWriteAnswersAsTheCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := holdWriter(t)
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Minute})
		ctx := context.Background()
		v, _ := l.Get(ctx, "k")
		if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceHit {
			t.Fatalf("Get of a fresh value in a pending write: %v; want a hit", info.Source)
		}
		time.Sleep(2 * time.Second)
		sv, info, err := l.GetInfo(ctx, "k")
		if sv != v || info.Source != SourceStale || err != nil || info.Age != 2*time.Second {
			t.Fatalf("Get of a stale value in a pending write = %q, %v, age %v, %v; want %q, stale, 2s", sv, info.Source, info.Age, err, v)
		}
		synctest.Wait()
		if s := l.Stats(); s.Refreshes != 1 || s.StaleHits != 1 || s.Hits != 1 || s.Misses != 1 || d.calls.Load() != 2 {
			t.Fatalf("Stats = %+v, %d loads; want 1 miss, 1 hit, 1 stale hit and its refresh", s, d.calls.Load())
		}
		many, err := l.GetMany(ctx, []string{"k"})
		if err != nil || many["k"] != "k#2" {
			t.Fatalf("GetMany after the refresh = %v, %v; want the refreshed value", many, err)
		}
		release()
	})
}

// placesFree reports whether every place of l's pending writes is back:
// nothing is pending and nothing leaked.
func placesFree[K comparable, V any](l *Loader[K, V]) bool {
	wr := &l.writer
	st := wr.turns.State()
	free, room := st.Places-st.Held, st.Room-st.Spent
	return wr.fills.Load() == 0 && wr.fillCost.Load() == 0 &&
		free == l.opts.MaxPendingWrites && room == l.opts.MaxCost
}

// Rule 19, readers first: with the fills' share full (one place, the
// writer held), a load still answers its caller, its value is not cached
// (Stats.FillsDropped), and the key keeps no older value: a Get after it
// loads again instead of serving the stale one. Every place is given back
// once the writer has caught up.
func TestFillWithoutAPlaceIsNotCached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Minute, MaxPendingWrites: 1})
		ctx := context.Background()
		l.Get(ctx, "stale")
		synctest.Wait()
		waitWriterIdle(t, l)
		time.Sleep(2 * time.Second) // "stale" is stale now
		release := holdWriter(t)
		l.Get(ctx, "a") // takes the fills' only place
		v, info, err := l.GetInfo(ctx, "b")
		if err != nil || info.Source != SourceLoaded || v != "b#3" {
			t.Fatalf("Get(b) with the fills' share full = %q, %v, %v; want its load's value", v, info.Source, err)
		}
		if s := l.Stats(); s.FillsDropped != 1 {
			t.Fatalf("Stats.FillsDropped = %d; want 1", s.FillsDropped)
		}
		if _, info, _ := l.GetInfo(ctx, "b"); info.Source != SourceLoaded {
			t.Fatalf("Get(b) again = %v; want a new load: its value was not cached", info.Source)
		}
		// The stale value's refresh cannot be stored either: the key keeps
		// no older value, so the next Get waits for a load.
		if v, info, _ := l.GetInfo(ctx, "stale"); info.Source != SourceStale {
			t.Fatalf("Get(stale) = %q, %v; want the stale value while it refreshes", v, info.Source)
		}
		synctest.Wait()
		if v, info, _ := l.GetInfo(ctx, "stale"); info.Source != SourceLoaded {
			t.Fatalf("Get(stale) after its refresh found no place = %q, %v; want a new load, not the older value", v, info.Source)
		}
		release()
		synctest.Wait()
		waitWriterIdle(t, l)
		if !placesFree(l) {
			t.Fatalf("places not all given back once the writer caught up: fills %d, cost %d", l.writer.fills.Load(), l.writer.fillCost.Load())
		}
	})
}

// Rule 19, fair turns: with the writes' share full, Set and Invalidate wait
// their turn, first come first served, while Gets of other keys (cold ones
// included) are answered; Close releases a waiting Set, which then does
// nothing.
func TestSetWaitsItsTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute, MaxPendingWrites: 1})
		ctx := context.Background()
		release := holdWriter(t)
		l.Set("a", "1") // takes the writes' only place
		var order []string
		var mu sync.Mutex
		done := func(k string) { mu.Lock(); order = append(order, k); mu.Unlock() }
		go func() { l.Set("b", "2"); done("b") }()
		synctest.Wait()
		go func() { l.Invalidate("c"); done("c") }()
		synctest.Wait()
		if v, info, err := l.GetInfo(ctx, "cold"); err != nil || info.Source != SourceLoaded {
			t.Fatalf("cold Get while Sets wait = %q, %v, %v; want its load", v, info.Source, err)
		}
		if v, _ := l.Get(ctx, "a"); v != "1" {
			t.Fatalf("Get(a) = %q; want 1", v)
		}
		if len(order) != 0 || l.Stats().WriteWaits != 2 {
			t.Fatalf("with the share full: %v returned, %d waited; want none returned, 2 waiting", order, l.Stats().WriteWaits)
		}
		release()
		synctest.Wait()
		if len(order) != 2 || order[0] != "b" || order[1] != "c" {
			t.Fatalf("returned in order %v; want [b c]", order)
		}
		if v, _ := l.Get(ctx, "b"); v != "2" {
			t.Fatalf("Get(b) = %q; want 2", v)
		}
		waitWriterIdle(t, l)
		if !placesFree(l) {
			t.Fatal("places not all given back once the writer caught up")
		}
		hold := holdWriter(t)
		l.Set("x", "1")
		closed := make(chan struct{})
		go func() { l.Set("y", "2"); close(closed) }()
		synctest.Wait()
		go l.Close()
		<-closed // Close refuses the waiting Set
		hold()
	})
}

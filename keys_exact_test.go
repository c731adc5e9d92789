package flightcache

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 9, as Options.Hash's doc tells it: keys are compared
// exactly, so "P1", "p1 " and "p1", one row to a database whose collation
// ignores case and trailing spaces, are three keys: three loads, three
// cached copies, and an Invalidate of one leaves the others serving the
// row as it was. Normalised before Get, they are one key.
func TestKeysAreNotNormalised(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		row := "v1"
		var calls int
		l, err := New(func(ctx context.Context, id string) (string, error) {
			calls++
			return row, nil
		}, Options[string, string]{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		for _, id := range []string{"P1", "p1 ", "p1"} {
			if _, err := l.Get(ctx, id); err != nil {
				t.Fatalf("Get(%q) = %v", id, err)
			}
		}
		if calls != 3 {
			t.Errorf("%d loads for \"P1\", \"p1 \" and \"p1\"; want 3: keys are compared exactly", calls)
		}
		row = "v2" // the row is written, and its writer invalidates its own spelling
		l.Invalidate("p1")
		if v, _ := l.Get(ctx, "P1"); v != "v1" {
			t.Errorf("Get(%q) = %q; want the old row, %q: the Invalidate was of another key", "P1", v, "v1")
		}
		if v, _ := l.Get(ctx, "p1"); v != "v2" {
			t.Errorf("Get(%q) = %q; want %q", "p1", v, "v2")
		}
	})
}

// nanPoint is a key type that can hold a NaN.
type nanPoint struct{ X, Y float64 }

// A key not equal to itself (a NaN in it) is never kept (docs/design.md
// rule 24): every Get of it loads it, each time, and gets that load's
// value; Set of it does nothing; nothing of it stays in the in-flight map
// or the cache. The shard maps kept an entry per load and per Set of such
// a key, which no lookup ever found to delete: with MaxCost 1000, 300,000
// Gets took the heap from 1 MB to 257 MB, 300,000 Sets to 317 MB, for
// good.
func TestNaNKeyDoesNotLeak(t *testing.T) {
	const n = 20_000
	var loads atomic.Int64
	l, err := New(func(_ context.Context, p nanPoint) (int64, error) { return loads.Add(1), nil },
		Options[nanPoint, int64]{TTL: time.Hour, MaxCost: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	key := nanPoint{math.NaN(), 1}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		v, info, err := l.GetInfo(ctx, key)
		if err != nil || v != int64(i+1) || info.Source != SourceLoaded {
			t.Fatalf("Get %d of a NaN key = %d, %v, %v; want %d, loaded: a key not equal to itself is loaded every time", i+1, v, info.Source, err, i+1)
		}
		l.Set(key, -1)
	}
	got, err := l.GetMany(ctx, []nanPoint{key, key})
	if err != nil || len(got) != 2 || loads.Load() != n+2 {
		t.Fatalf("GetMany of two NaN keys = %v, %v after %d loads; want both loaded, %d loads", got, err, loads.Load(), n+2)
	}
	l.Refresh(ctx, key)
	if v, _, ok := l.Peek(key); ok {
		t.Errorf("Peek of a NaN key = %v; want nothing held", v)
	}
	for i := range l.flights.shards {
		sh := &l.flights.shards[i]
		sh.mu.Lock()
		nl, nw, nd := len(sh.loads), len(sh.writes), len(sh.detached)
		sh.mu.Unlock()
		if nl+nw+nd != 0 {
			t.Errorf("shard %d keeps %d loads, %d writes, %d detached loads after %d Gets and Sets of a NaN key; want none", i, nl, nw, nd, n)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap %d KB before, %d KB after: %+d KB", before.HeapAlloc>>10, after.HeapAlloc>>10, grown>>10)
	if grown > 4<<20 {
		t.Errorf("the live heap grew by %d KB over %d Gets and Sets of a NaN key; want a bound (4 MB), nothing kept", grown>>10, n)
	}
	if s := l.Stats(); s.Loads != n+2 || s.Misses != n+2 || s.PendingWrites != 0 {
		t.Errorf("Stats = %+v; want %d loads and misses, no pending write", s, n+2)
	}
}

// A load of a key not equal to itself, kept in no map by key, still ends
// as any load does (docs/design.md rules 4, 8 and 19): under CancelAtZero
// its caller leaving cancels it, and Close cancels it and waits for it.
func TestNaNKeyLoadEndsWithItsCallerAndAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan error, 2)
		l, err := New(func(ctx context.Context, p nanPoint) (int, error) {
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return 0, ctx.Err()
		}, Options[nanPoint, int]{TTL: time.Hour, Policy: CancelAtZero})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		key := nanPoint{1, math.NaN()}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := l.Get(ctx, key); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get = %v; want its own deadline", err)
		}
		if cause := <-ended; !errors.Is(cause, context.Canceled) {
			t.Errorf("the abandoned load ended with %v; want its cancellation", cause)
		}
		got := make(chan error, 1)
		go func() { _, err := l.Get(t.Context(), key); got <- err }()
		synctest.Wait() // the load waits for its context
		l.Close()
		if err := <-got; !errors.Is(err, ErrClosed) {
			t.Errorf("Get during Close = %v; want ErrClosed", err)
		}
		if cause := <-ended; !errors.Is(cause, ErrClosed) {
			t.Errorf("the load ended with %v; want ErrClosed", cause)
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// getRow is a Get of key with a deadline, failing the test on an error.
func getRow(t *testing.T, l *Loader[string, row], key string) (row, Info) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, info, err := l.GetInfo(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return v, info
}

// A change committed as version 2 is applied while a replica still has
// version 1: a load that starts after the invalidation and reads the
// replica gets v1. Its caller gets what it read, but the key keeps no v1:
// once the replica has caught up, the next Get loads v2 (docs/design.md
// rule 41).
func TestInvalidateVersionRefusesALaggingReplicasFill(t *testing.T) {
	src := &rowSource{next: row{ver: 1, by: "before"}}
	l := newRowLoader(t, src, Options[string, row]{})
	if v, _ := getRow(t, l, "k"); v.ver != 1 {
		t.Fatalf("first Get: %+v, want version 1", v)
	}

	l.InvalidateVersion("k", 2) // the primary committed version 2; the replica has not replayed it

	if v, info := getRow(t, l, "k"); v.ver != 1 || info.Source != SourceLoaded {
		t.Fatalf("Get from the lagging replica: %+v %v, want version 1 loaded (its caller gets what it read)", v, info.Source)
	}
	if got := l.Stats().WritesOutdated; got != 1 {
		t.Fatalf("WritesOutdated = %d, want 1: the replica's older row must be refused", got)
	}

	src.set(row{ver: 2, by: "after"}, nil) // the replica caught up
	v, info := getRow(t, l, "k")
	if v.ver != 2 {
		t.Fatalf("Get after the replica caught up: %+v (%v), want version 2: a row older than the change was stored after it", v, info.Source)
	}
	if v, info := getRow(t, l, "k"); v.ver != 2 || info.Source != SourceHit {
		t.Fatalf("next Get: %+v %v, want version 2 as a hit", v, info.Source)
	}
	if got := src.count(); got != 3 {
		t.Fatalf("loads = %d, want 3", got)
	}
}

// The tombstone is not a value: nothing serves it, counts it or saves it.
func TestInvalidateVersionLeavesNoValue(t *testing.T) {
	src := &rowSource{next: row{ver: 1}}
	l := newRowLoader(t, src, Options[string, row]{NotFoundTTL: time.Hour})
	getRow(t, l, "k")
	l.InvalidateVersion("k", 5)
	l.InvalidateVersion("new", 5) // a key that held nothing
	for _, key := range []string{"k", "new"} {
		if _, _, ok := l.Peek(key); ok {
			t.Fatalf("Peek(%q) found a value after InvalidateVersion", key)
		}
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("Len = %d, want 0", n)
	}
	for e := range l.Entries() {
		t.Fatalf("Entries yielded %+v", e)
	}
	src.set(row{ver: 5}, nil)
	if v, info := getRow(t, l, "new"); v.ver != 5 || info.Source != SourceLoaded {
		t.Fatalf("Get: %+v %v, want version 5 loaded", v, info.Source)
	}
}

// The tombstone never goes back: a later InvalidateVersion of a lower
// version, or a value held of a higher one, leaves the higher tombstone. An
// equal version fills; Set below the tombstone is refused as a fill is.
func TestInvalidateVersionTombstoneNeverGoesBack(t *testing.T) {
	src := &rowSource{next: row{ver: 7}}
	l := newRowLoader(t, src, Options[string, row]{})
	getRow(t, l, "k")           // holds version 7
	l.InvalidateVersion("k", 3) // dropped, but the tombstone is 7: the value held proves it
	src.set(row{ver: 6}, nil)
	getRow(t, l, "k")
	l.InvalidateVersion("k", 2)
	l.Set("k", row{ver: 5})
	if got := l.Stats().WritesOutdated; got != 2 {
		t.Fatalf("WritesOutdated = %d, want 2 (the fill of 6 and the Set of 5, under the tombstone 7)", got)
	}
	src.set(row{ver: 7, by: "equal"}, nil)
	if v, _ := getRow(t, l, "k"); v != (row{ver: 7, by: "equal"}) {
		t.Fatalf("Get: %+v, want the equal version loaded", v)
	}
	if v, info := getRow(t, l, "k"); v.ver != 7 || info.Source != SourceHit {
		t.Fatalf("Get: %+v %v, want version 7 as a hit", v, info.Source)
	}
}

// What drops a value drops the tombstone: Invalidate, InvalidateAll, a
// not-found. Without Options.Version, InvalidateVersion is Invalidate.
func TestInvalidateVersionTombstoneGoesWithTheKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop func(l *Loader[string, row], src *rowSource)
	}{
		{"Invalidate", func(l *Loader[string, row], _ *rowSource) { l.Invalidate("k") }},
		{"InvalidateAll", func(l *Loader[string, row], _ *rowSource) { l.InvalidateAll() }},
		{"not-found", func(l *Loader[string, row], src *rowSource) {
			src.set(row{}, ErrNotFound)
			if _, err := l.Get(context.Background(), "k"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get: %v, want ErrNotFound", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &rowSource{next: row{ver: 1}}
			l := newRowLoader(t, src, Options[string, row]{})
			l.InvalidateVersion("k", 9)
			tc.drop(l, src)
			src.set(row{ver: 1}, nil)
			getRow(t, l, "k")
			if v, info := getRow(t, l, "k"); v.ver != 1 || info.Source != SourceHit {
				t.Fatalf("Get: %+v %v, want version 1 as a hit: the tombstone went with the key", v, info.Source)
			}
		})
	}
	t.Run("without Version", func(t *testing.T) {
		src := &rowSource{next: row{ver: 1}}
		l, err := New(src.load, Options[string, row]{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		getRow(t, l, "k")
		l.InvalidateVersion("k", 9)
		if v, info := getRow(t, l, "k"); v.ver != 1 || info.Source != SourceLoaded {
			t.Fatalf("Get: %+v %v, want version 1 loaded: the value was dropped", v, info.Source)
		}
		if v, info := getRow(t, l, "k"); v.ver != 1 || info.Source != SourceHit {
			t.Fatalf("Get: %+v %v, want version 1 as a hit: no tombstone without Version", v, info.Source)
		}
	})
}

// Many readers against a replica that lags by up to three versions, while
// a writer commits version after version, leaves each as a tombstone and
// waits for a hit: no Get is answered from the cache with a version below
// the last tombstone left before it started. With Invalidate instead, most
// of them are.
func TestInvalidateVersionUnderConcurrentLoads(t *testing.T) {
	var primary, tombstone atomic.Uint64 // the version committed; the last tombstone left
	load := func(ctx context.Context, _ string) (row, error) {
		p := primary.Load()
		lag := rand.Uint64N(4)
		return row{ver: p - min(p, lag)}, nil
	}
	l, err := New(load, Options[string, row]{TTL: time.Hour, Version: rowVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var bad atomic.Int64
	var hits atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				f := tombstone.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				v, info, err := l.GetInfo(ctx, "k")
				cancel()
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				if info.Source == SourceHit {
					hits.Add(1)
					if v.ver < f {
						bad.Add(1)
					}
				}
			}
		}()
	}
	for v := uint64(1); v <= 100; v++ {
		primary.Store(v)
		l.InvalidateVersion("k", v)
		tombstone.Store(v)
		// Each tombstone is met: wait for a hit after it (a load of the primary's
		// version fills; one from the lagging replica does not).
		for seen, until := hits.Load(), time.Now().Add(10*time.Second); hits.Load() == seen; runtime.Gosched() {
			if time.Now().After(until) {
				t.Fatalf("no hit within 10s of the tombstone %d", v)
			}
		}
	}
	close(stop)
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d hits of a version below the tombstone left before their Get (of %d hits)", n, hits.Load())
	}
	if hits.Load() == 0 {
		t.Fatal("no hit at all: the test checked nothing")
	}
}

package flightcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Values whose Cost exceeds MaxCost reach their callers but are never
// cached, and what the cache holds never costs more than MaxCost (rule 10),
// however a value arrives: a first load, a reload of a key whose old entry
// is still in ristretto, or Set over an existing entry.
func TestCostAboveMaxCost(t *testing.T) {
	const maxCost = 1000
	small, big := "s", strings.Repeat("b", 5*maxCost)
	build := func(t *testing.T, load LoadFunc[string, string]) *Loader[string, string] {
		l, err := New(load, Options[string, string]{
			TTL: time.Second, MaxCost: maxCost,
			Cost: func(v string) int64 { return int64(len(v)) },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}

	t.Run("first load", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			l := build(t, func(context.Context, string) (string, error) { calls++; return big, nil })
			for i := range 2 {
				synctest.Wait() // the first load's write is settled (refused)
				v, info, err := l.GetInfo(t.Context(), "k")
				if v != big || info.Source != SourceLoaded || err != nil {
					t.Fatalf("Get %d = %d bytes, %v, %v; want the big value, loaded (never cached)", i, len(v), info.Source, err)
				}
			}
			synctest.Wait()
			if s := l.Stats(); calls != 2 || s.SetsRejected != 2 {
				t.Errorf("calls %d, SetsRejected %d; want 2 and 2", calls, s.SetsRejected)
			}
		})
	})

	t.Run("reload of an expired key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			l := build(t, func(context.Context, string) (string, error) {
				calls++
				if calls == 1 {
					return small, nil
				}
				return big, nil
			})
			if v, _ := l.Get(t.Context(), "k"); v != small {
				t.Fatalf("first Get = %q; want %q", v, small)
			}
			time.Sleep(2 * time.Second) // expired: the old entry is still in ristretto
			if v, info, _ := l.GetInfo(t.Context(), "k"); v != big || info.Source != SourceLoaded {
				t.Fatalf("Get after expiry = %d bytes, %v; want the big value, loaded", len(v), info.Source)
			}
			synctest.Wait() // the reload's write is settled
			if v, info, _ := l.GetInfo(t.Context(), "k"); info.Source == SourceHit {
				t.Errorf("Get after the big reload = %d bytes, %v; a value of cost %d > MaxCost %d was cached",
					len(v), info.Source, len(big), maxCost)
			}
		})
	})

	t.Run("Set over an entry", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := build(t, func(context.Context, string) (string, error) { return "", ErrNotFound })
			l.Set("k", small)
			l.Set("k", big)
			if v, info, _ := l.GetInfo(t.Context(), "k"); info.Source == SourceHit {
				t.Errorf("Get after Set of the big value = %d bytes, %v; a value of cost %d > MaxCost %d was cached",
					len(v), info.Source, len(big), maxCost)
			}
		})
	})

	t.Run("total cost", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Loads fail without caching anything, so the Gets below only look.
			l := build(t, func(context.Context, string) (string, error) { return "", ErrNotFound })
			const keys = 500
			for i := range keys {
				l.Set(fmt.Sprint("k", i), small)
			}
			grown := strings.Repeat("g", maxCost/10) // each fits; all of them do not
			for i := range keys {
				l.Set(fmt.Sprint("k", i), grown)
			}
			var total int
			for i := range keys {
				if v, info, err := l.GetInfo(t.Context(), fmt.Sprint("k", i)); info.Source == SourceHit && err == nil {
					total += len(v)
				}
			}
			if total > maxCost {
				t.Errorf("cached values cost %d in all; want at most MaxCost %d (Stats %+v)", total, maxCost, l.Stats())
			}
		})
	})
}

// Ten million distinct keys through a Loader with MaxCost 10,000: every Get
// misses and loads, ristretto evicts or refuses all but 10,000 entries, and
// the live heap, measured after a GC every second while the Gets run, stays
// flat (rule 10). Under -race or -short the test runs 50,000 keys; run it
// without either for the full ten million (about two minutes on 2 cores).
func TestManyDistinctKeysKeepTheHeapBounded(t *testing.T) {
	keys := 10_000_000
	if testing.Short() || raceEnabled {
		keys = 50_000
	}
	const (
		maxCost   = 10_000
		valueSize = 256
		heapBound = 200 << 20 // generous: 10,000 entries of 256 bytes are ~3 MB
	)
	l, err := New(func(_ context.Context, k int) ([]byte, error) {
		v := make([]byte, valueSize)
		binary.LittleEndian.PutUint64(v, uint64(k))
		return v, nil
	}, Options[int, []byte]{TTL: time.Hour, MaxCost: maxCost})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	var heaps []uint64 // live heap, once a second
	var peakG atomic.Int64
	var peakStack uint64
	sample := func() {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		heaps = append(heaps, m.HeapAlloc)
		peakStack = max(peakStack, m.StackInuse)
	}
	sample()
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			storeMax(&peakG, int64(runtime.NumGoroutine()))
			if i%100 == 0 {
				sample()
			}
		}
	})

	workers := 4 * runtime.GOMAXPROCS(0)
	var bad atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := w; k < keys; k += workers {
				v, err := l.Get(context.Background(), k)
				if err != nil || len(v) != valueSize || binary.LittleEndian.Uint64(v) != uint64(k) {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(stop)
	sampler.Wait()
	sample()

	s := l.Stats()
	mb := func(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	first := heaps[0]
	heaps = heaps[1:]
	slices.Sort(heaps)
	peak := heaps[len(heaps)-1]
	t.Logf("%d distinct keys in %v (%.0f Gets/s, %d goroutines calling); live heap before %s MB, then once a second "+
		"(%d samples) min %s, median %s, max %s MB; peak goroutines %d, peak stacks %s MB; "+
		"Stats: Loads %d, Evicted %d, SetsRejected %d, SetsDropped %d",
		keys, took.Round(time.Millisecond), float64(keys)/took.Seconds(), workers, mb(first),
		len(heaps), mb(heaps[0]), mb(heaps[len(heaps)/2]), mb(peak), peakG.Load(), mb(peakStack),
		s.Loads, s.Evicted, s.SetsRejected, s.SetsDropped)
	if n := bad.Load(); n > 0 {
		t.Errorf("%d Gets returned an error or another key's value", n)
	}
	if peak > heapBound {
		t.Errorf("live heap peaked at %s MB; want under %d MB with MaxCost %d", mb(peak), heapBound>>20, maxCost)
	}
	if s.Gets != uint64(keys) || s.Loads != uint64(keys) || s.Misses != uint64(keys) {
		t.Errorf("Stats: Gets %d, Loads %d, Misses %d; want %d each (every key is new)", s.Gets, s.Loads, s.Misses, keys)
	}
	if s.InFlight != 0 || s.Waiting != 0 {
		t.Errorf("Stats: InFlight %d, Waiting %d after every Get returned; want 0", s.InFlight, s.Waiting)
	}
}

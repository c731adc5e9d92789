package flightcache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// Values whose Cost exceeds MaxCost reach their callers but are never
// cached, and what the cache holds never costs more than MaxCost
// (docs/design.md rule 10), however a value arrives: a first load, a reload
// of a key whose old entry is still in ristretto, or Set over an existing
// entry.
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
			// MaxCost bounds what the cache holds once the writes have
			// settled: Set returns before ristretto applies its write
			// (docs/design.md rule 17), and until then the value waits in
			// its pending write.
			synctest.Wait()
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
// flat (docs/design.md rule 10). Under -race or -short the test runs 50,000
// keys; run it without either for the full ten million (about two minutes on
// 2 cores).
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
	var bad, returned atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := w; k < keys; k += workers {
				v, err := l.Get(context.Background(), k)
				if err != nil || len(v) != valueSize || binary.LittleEndian.Uint64(v) != uint64(k) {
					bad.Add(1)
				}
				returned.Add(1)
			}
		})
	}
	// The full run takes minutes: fail when the Gets stop returning, not
	// after a fixed time.
	waitProgress(t, "Gets not returned", patience, func() int64 { return int64(keys) - returned.Load() })
	waitGroup(t, "the workers", &wg)
	took := time.Since(start)
	close(stop)
	waitGroup(t, "the heap sampler", &sampler)
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

// A LoadFunc that returns the zero value with a nil error has loaded a value
// like any other: Get returns it with a nil error, it is cached, and the
// next Get is a hit, whatever the zero value is (an empty string, 0, a nil
// pointer, slice, map or interface, an empty struct), also when Cost says
// it costs 0. Set of a zero value is cached too.
func TestZeroValueIsCached(t *testing.T) {
	t.Run("string", func(t *testing.T) { checkZeroValueIsCached[string](t, nil) })
	t.Run("string costing 0", func(t *testing.T) {
		checkZeroValueIsCached(t, func(v string) int64 { return int64(len(v)) })
	})
	t.Run("int", func(t *testing.T) { checkZeroValueIsCached[int](t, nil) })
	t.Run("pointer", func(t *testing.T) { checkZeroValueIsCached[*int](t, nil) })
	t.Run("slice", func(t *testing.T) { checkZeroValueIsCached[[]byte](t, nil) })
	t.Run("map", func(t *testing.T) { checkZeroValueIsCached[map[string]int](t, nil) })
	t.Run("interface", func(t *testing.T) { checkZeroValueIsCached[any](t, nil) })
	t.Run("struct", func(t *testing.T) { checkZeroValueIsCached[struct{}](t, nil) })
}

func checkZeroValueIsCached[V any](t *testing.T, cost func(V) int64) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		var events eventLog
		l, err := New(func(context.Context, string) (V, error) {
			calls++
			var zero V
			return zero, nil
		}, Options[string, V]{TTL: time.Minute, MaxCost: 100, Cost: cost, OnLoad: events.add})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		isZero := func(v V) bool { return reflect.ValueOf(&v).Elem().IsZero() }
		for _, want := range []Source{SourceLoaded, SourceHit} {
			v, info, err := l.GetInfo(t.Context(), "k")
			if !isZero(v) || info.Source != want || err != nil {
				t.Errorf("Get(%q) = %v, %v, %v; want the zero value, %v, nil", "k", v, info.Source, err, want)
			}
			synctest.Wait() // the load's write is applied
		}
		var zero V
		l.Set("s", zero)
		if v, info, err := l.GetInfo(t.Context(), "s"); !isZero(v) || info.Source != SourceHit || err != nil {
			t.Errorf("Get(%q) after Set of the zero value = %v, %v, %v; want the zero value, hit, nil", "s", v, info.Source, err)
		}
		if calls != 1 {
			t.Errorf("%d downstream calls; want 1: the zero value is cached", calls)
		}
		if evs := events.all(); len(evs) != 1 || evs[0].Err != nil || !evs[0].Stored {
			t.Errorf("LoadEvents = %+v; want one, stored, without an error", evs)
		}
		if s := l.Stats(); s.Hits != 2 || s.Misses != 1 || s.Loads != 1 || s.LoadErrors != 0 || s.SetsRejected != 0 {
			t.Errorf("Stats = %+v; want Hits 2, Misses 1, Loads 1, no LoadErrors, no SetsRejected", s)
		}
	})
}

// Keys are compared exactly however large, and are not costed (Options.Cost
// says so): 1 MB string keys that differ only in their last byte, with one
// a prefix of the others and one longer, each load once and are cached,
// although each key alone is a thousand times MaxCost; Gets of all of them
// at once, Set and Invalidate of some, and a Hash under which they all
// collide never mix their values.
func TestHugeKeys(t *testing.T) {
	const size = 1 << 20
	prefix := strings.Repeat("k", size-1)
	keys := []string{prefix, prefix + "aa"} // a prefix of the others, and a longer key
	for c := 'a'; c < 'a'+8; c++ {
		keys = append(keys, prefix+string(c))
	}
	// A key's value names its length and its last two bytes: unique here.
	valueOf := func(k string) string { return fmt.Sprintf("%d:%s", len(k), k[len(k)-2:]) }
	build := func(t *testing.T, hash func(string) uint64) (*Loader[string, string], func(string) int) {
		var mu sync.Mutex
		calls := map[string]int{} // by value: the keys themselves are large
		l, err := New(func(_ context.Context, k string) (string, error) {
			mu.Lock()
			calls[valueOf(k)]++
			mu.Unlock()
			return valueOf(k), nil
		}, Options[string, string]{
			TTL: time.Hour, MaxCost: 1000, Hash: hash,
			Cost: func(v string) int64 { return int64(len(v)) }, // values cost ~10; keys cost nothing
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l, func(k string) int {
			mu.Lock()
			defer mu.Unlock()
			return calls[valueOf(k)]
		}
	}
	check := func(t *testing.T, l *Loader[string, string], k, want string, src Source) {
		t.Helper()
		v, info, err := l.GetInfo(t.Context(), k)
		if v != want || err != nil || (src != SourceNone && info.Source != src) {
			t.Errorf("Get(key of %d bytes ending %q) = %q, %v, %v; want %q, %v", len(k), k[len(k)-2:], v, info.Source, err, want, src)
		}
	}

	t.Run("default hash", func(t *testing.T) {
		l, calls := build(t, nil)
		for _, k := range keys {
			check(t, l, k, valueOf(k), SourceLoaded)
		}
		// docs/design.md rule 2: every fill above returned, so these are
		// hits whether or not the writer has applied them yet. (A Set of
		// another key used to stand here, when Set waited for ristretto
		// and so flushed the fills before it.)
		for _, k := range keys {
			check(t, l, k, valueOf(k), SourceHit)
		}
		var wg sync.WaitGroup
		for g := range len(keys) {
			wg.Go(func() {
				for i := range 50 {
					k := keys[(g+i)%len(keys)]
					if v, err := l.Get(t.Context(), k); v != valueOf(k) || err != nil {
						t.Errorf("concurrent Get(key of %d bytes ending %q) = %q, %v; want %q", len(k), k[len(k)-2:], v, err, valueOf(k))
						return
					}
				}
			})
		}
		waitGroup(t, "the concurrent Gets", &wg)
		for _, k := range keys {
			if n := calls(k); n != 1 {
				t.Errorf("key of %d bytes ending %q: %d downstream calls; want 1", len(k), k[len(k)-2:], n)
			}
		}
		l.Set(keys[2], "set")
		l.Invalidate(keys[3])
		check(t, l, keys[2], "set", SourceHit)
		check(t, l, keys[3], valueOf(keys[3]), SourceLoaded)
		for _, k := range append(keys[:2:2], keys[4:]...) { // their neighbours are untouched
			check(t, l, k, valueOf(k), SourceHit)
		}
		if s := l.Stats(); s.SetsRejected != 0 || s.Evicted != 0 {
			t.Errorf("Stats = %+v; want nothing rejected or evicted: keys are not costed", s)
		}
	})

	t.Run("colliding hash", func(t *testing.T) {
		// Every key has the same hash: they share one cache slot and one
		// in-flight shard, and only an exact comparison tells them apart.
		l, _ := build(t, func(k string) uint64 { return uint64(k[0]) })
		var wg sync.WaitGroup
		for g := range 2 * len(keys) {
			wg.Go(func() {
				for i := range 20 {
					k := keys[(g+i)%len(keys)]
					switch i % 7 {
					case 5:
						l.Invalidate(k)
					case 6:
						l.Set(k, valueOf(k))
					default:
						if v, err := l.Get(t.Context(), k); v != valueOf(k) || err != nil {
							t.Errorf("Get(key of %d bytes ending %q) = %q, %v; want %q", len(k), k[len(k)-2:], v, err, valueOf(k))
							return
						}
					}
				}
			})
		}
		waitGroup(t, "the colliding Gets, Sets and Invalidates", &wg)
		for _, k := range keys {
			check(t, l, k, valueOf(k), SourceNone)
		}
	})
}

// Close racing Gets, Sets and Invalidates from 64 goroutines, round after
// round and under both policies, with stale windows and early refreshes so
// background refreshes race it too: nothing panics; every Get returns, with
// a value of its key, its own context's error, or ErrClosed (an error
// caused by Close is never covered by a stale value); once Close has
// returned no load runs or starts and every Get returns ErrClosed; Stats
// add up; and no goroutine is left behind.
func TestCloseRacingEverything(t *testing.T) {
	const (
		workers = 64
		keys    = 200
		rounds  = 8
	)
	for round := range rounds {
		closeRacingRound(t, round, Policy(round%2), workers, keys)
	}
	goleak.VerifyNone(t)
}

func closeRacingRound(t *testing.T, round int, policy Policy, workers, keys int) {
	var calls, inside, lateCalls atomic.Int64
	var closeReturned, stop atomic.Bool
	l, err := New(func(ctx context.Context, k int) (string, error) {
		calls.Add(1)
		inside.Add(1)
		defer inside.Add(-1)
		if closeReturned.Load() { // entered after Close returned: Close waits for running loads
			lateCalls.Add(1)
		}
		n := calls.Load()
		d := time.Duration(rand.N(2000)) * time.Microsecond
		if k%10 == 0 { // ignores its context
			time.Sleep(d)
			return fmt.Sprintf("%d#%d", k, n), nil
		}
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return fmt.Sprintf("%d#%d", k, n), nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}, Options[int, string]{
		TTL: 10 * time.Millisecond, Jitter: 0.5, StaleWhileRevalidate: 10 * time.Millisecond,
		StaleIfError: time.Minute, EarlyRefresh: 1, MaxCost: int64(keys), Policy: policy,
	})
	if err != nil {
		t.Fatal(err)
	}
	isValueOf := func(k int, v string) bool {
		return v == fmt.Sprintf("set%d", k) || strings.HasPrefix(v, fmt.Sprintf("%d#", k))
	}

	var gets, values, ctxErrs, closedErrs, afterClose atomic.Int64
	var bad atomic.Int64
	report := func(format string, args ...any) {
		if bad.Add(1) <= 5 {
			t.Errorf("round %d (%v): "+format, append([]any{round, policy}, args...)...)
		}
	}
	get := func(rng *rand.Rand, k int) {
		ctx := context.Background()
		switch rng.IntN(3) {
		case 1:
			c, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Microsecond)
			defer cancel()
			ctx = c
		case 2:
			c, cancel := context.WithCancel(ctx)
			defer cancel()
			defer time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, cancel).Stop()
			ctx = c
		}
		gets.Add(1)
		v, info, err := l.GetInfo(ctx, k)
		switch {
		case err == nil && isValueOf(k, v):
			values.Add(1)
			if info.Source == SourceStaleOnError {
				report("Get(%d) = %q, stale-on-error: only Close failed loads, and its errors are not covered", k, v)
			}
		case err == nil:
			report("Get(%d) = %q; want a value of key %d", k, v, k)
		case errors.Is(err, ErrClosed):
			closedErrs.Add(1)
		case ctx.Err() != nil && err == ctx.Err():
			ctxErrs.Add(1)
		default:
			report("Get(%d) = %v, %v; want a value, the context's error or ErrClosed", k, info.Source, err)
		}
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(w)))
			for !stop.Load() {
				k := rng.IntN(keys)
				switch p := rng.IntN(100); {
				case p < 5:
					l.Set(k, fmt.Sprintf("set%d", k))
				case p < 10:
					l.Invalidate(k)
				default:
					get(rng, k)
				}
			}
			for deadline := time.Now().Add(time.Minute); !closeReturned.Load(); {
				if time.Now().After(deadline) {
					report("Close had not returned a minute after the workers were told to stop")
					return
				}
				time.Sleep(time.Millisecond)
			}
			// Close has returned: Gets are refused, Set and Invalidate do nothing.
			l.Set(0, "set0")
			l.Invalidate(1)
			gets.Add(1)
			if v, info, err := l.GetInfo(context.Background(), rng.IntN(keys)); !errors.Is(err, ErrClosed) || info.Source != SourceNone {
				report("Get after Close returned = %q, %v, %v; want ErrClosed", v, info.Source, err)
			}
			afterClose.Add(1)
			closedErrs.Add(1)
		})
	}

	time.Sleep(time.Duration(5+rand.N(30)) * time.Millisecond)
	var closers sync.WaitGroup
	for range 3 { // Close is idempotent; every Close from outside waits for everything
		closers.Go(func() {
			if err := l.Close(); err != nil {
				report("Close = %v", err)
			}
		})
	}
	closed := make(chan struct{})
	go func() { closers.Wait(); close(closed) }()
	start := time.Now()
	select {
	case <-closed: // the workers kept going until Close returned
	case <-time.After(time.Minute): // 1-5s on an idle 2-core machine under -race; starvation is TestCloseReturnsWhileGetsKeepComing's
		report("Close did not return within a minute while %d goroutines kept calling the Loader (see TestCloseReturnsWhileGetsKeepComing)", workers)
		stop.Store(true)
		recv(t, "Close, once the workers stopped", closed)
	}
	closeTook := time.Since(start)
	stop.Store(true)
	closeReturned.Store(true)
	if n, s := inside.Load(), l.Stats(); n != 0 || s.InFlight != 0 {
		report("Close returned with %d LoadFuncs running, Stats.InFlight %d", n, s.InFlight)
	}
	waitOrDump(t, &wg, 30*time.Second, fmt.Sprintf("round %d: Gets racing Close", round))

	s := l.Stats()
	if n := lateCalls.Load(); n > 0 {
		report("%d LoadFunc calls began after Close returned", n)
	}
	if s.Gets != uint64(gets.Load()) || s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed {
		report("Stats: Gets %d (%d made) != Hits %d + StaleHits %d + Misses %d + Closed %d", s.Gets, gets.Load(), s.Hits, s.StaleHits, s.Misses, s.Closed)
	}
	if s.Canceled != uint64(ctxErrs.Load()) {
		report("Stats.Canceled = %d; %d Gets returned their context's error", s.Canceled, ctxErrs.Load())
	}
	if s.Closed < uint64(afterClose.Load()) || s.Closed > uint64(closedErrs.Load()) {
		report("Stats.Closed = %d; want between the %d Gets after Close returned and the %d that got ErrClosed", s.Closed, afterClose.Load(), closedErrs.Load())
	}
	if s.Loads != uint64(calls.Load()) || s.InFlight != 0 || s.Waiting != 0 || s.StaleOnError != 0 || s.Panics != 0 {
		report("Stats = %+v; want Loads = %d LoadFunc calls, nothing in flight or waiting, no StaleOnError, no Panics", s, calls.Load())
	}
	if round == 0 || testing.Verbose() {
		t.Logf("round %d (%v): Close took %v; %d Gets: %d values, %d context errors, %d ErrClosed; %d loads; Stats %+v",
			round, policy, closeTook.Round(time.Millisecond), gets.Load(), values.Load(), ctxErrs.Load(), closedErrs.Load(), calls.Load(), s)
	}
}

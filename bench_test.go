package flightcache

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2"
)

// The hit path is measured beside a raw ristretto Get on the same keys, in
// the same run: the goal is a hit within 1.2x of it, with 0 allocs/op.

const benchKeys = 1 << 14

// zipfTrace returns a precomputed Zipf(s=1.01) sequence of key indexes.
func zipfTrace(n int) []int {
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.01, 1, benchKeys-1)
	tr := make([]int, n)
	for i := range tr {
		tr[i] = int(z.Uint64())
	}
	return tr
}

var benchNames = func() []string {
	k := make([]string, benchKeys)
	for i := range k {
		k[i] = "product:" + strconv.Itoa(i)
	}
	return k
}()

func newBenchLoader(b *testing.B, opts Options[string, string]) *Loader[string, string] {
	b.Helper()
	if opts.TTL == 0 {
		opts.TTL = time.Hour
	}
	opts.MaxCost = 4 * benchKeys
	l, err := New(func(_ context.Context, k string) (string, error) { return k, nil }, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	for _, k := range benchNames {
		l.Get(context.Background(), k)
	}
	return l
}

func newBenchRistretto(b *testing.B) *ristretto.Cache[string, string] {
	b.Helper()
	c, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters: 40 * benchKeys, MaxCost: 4 * benchKeys, BufferItems: 64, IgnoreInternalCost: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	for _, k := range benchNames {
		c.SetWithTTL(k, k, 1, time.Hour) // a cache-aside sets a TTL
	}
	c.Wait()
	return c
}

// ristrettoGets is the baseline: raw ristretto Gets of the keys in trace,
// every key cached with a TTL, serially.
func ristrettoGets(b *testing.B, trace []int) {
	c := newBenchRistretto(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Get(benchNames[trace[i&(len(trace)-1)]])
		i++
	}
}

func BenchmarkGetHit(b *testing.B) {
	trace := zipfTrace(1 << 16)
	ctx := context.Background()
	b.Run("impl=ristretto/mode=serial", func(b *testing.B) { ristrettoGets(b, trace) })
	b.Run("impl=flightcache/mode=serial", func(b *testing.B) {
		l := newBenchLoader(b, Options[string, string]{})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
			i++
		}
		reportHitRatio(b, l)
	})
	b.Run("impl=ristretto/mode=parallel", func(b *testing.B) {
		c := newBenchRistretto(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(trace))
			for pb.Next() {
				c.Get(benchNames[trace[i&(len(trace)-1)]])
				i++
			}
		})
	})
	b.Run("impl=flightcache/mode=parallel", func(b *testing.B) {
		l := newBenchLoader(b, Options[string, string]{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(trace))
			for pb.Next() {
				l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
				i++
			}
		})
		reportHitRatio(b, l)
	})
}

// reportHitRatio reports the share of hits among the timed Gets (the
// Loader was warmed with one Get per key before the timer started).
func reportHitRatio(b *testing.B, l *Loader[string, string]) {
	s := l.Stats()
	if gets := s.Gets - benchKeys; gets > 0 {
		b.ReportMetric(float64(s.Hits)/float64(gets), "hits/get")
	}
}

// BenchmarkGetStale: every Get finds a stale entry inside the
// StaleWhileRevalidate window, with its background refresh backing off;
// beside a raw ristretto Get of the same keys.
func BenchmarkGetStale(b *testing.B) {
	trace := zipfTrace(1 << 16)
	ctx := context.Background()
	b.Run("impl=ristretto", func(b *testing.B) { ristrettoGets(b, trace) })
	b.Run("impl=flightcache", func(b *testing.B) {
		l, err := New(func(context.Context, string) (string, error) { return "", errBoom },
			Options[string, string]{TTL: time.Nanosecond, StaleWhileRevalidate: time.Hour, MaxCost: 4 * benchKeys,
				Retry: Retry{InitialInterval: time.Hour, MaxInterval: time.Hour}, Breaker: Breaker{Disabled: true}})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		for _, k := range benchNames {
			l.Set(k, k)
		}
		// One failed refresh per key, so every key is backing off.
		// MaxRefreshes lets 64 run at a time: go round until all keys had
		// theirs.
		for round := 0; l.Stats().Refreshes < benchKeys; round++ {
			if round == 1000 {
				b.Fatalf("only %d of %d keys refreshed", l.Stats().Refreshes, benchKeys)
			}
			for _, k := range benchNames {
				l.Get(ctx, k)
			}
			waitFor(b, "the round's refreshes to end", 10*time.Second, func() bool { return l.Stats().InFlight == 0 })
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
			i++
		}
	})
}

// BenchmarkCoalesce: 64 goroutines Get one cold key with an instant
// loader; one op is the whole burst. Beside it, the same burst on a raw
// ristretto cache-aside (Get, then load and Set on a miss), which loads once
// per caller that misses.
func BenchmarkCoalesce(b *testing.B) {
	const callers = 64
	ctx := context.Background()
	load := func(_ context.Context, k string) (string, error) { return k, nil }
	b.Run("impl=ristretto", func(b *testing.B) {
		c := newBenchRistretto(b)
		var loads atomic.Int64
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			key := "cold:" + strconv.Itoa(n)
			n++
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() {
					if _, ok := c.Get(key); !ok {
						loads.Add(1)
						v, _ := load(ctx, key)
						c.SetWithTTL(key, v, 1, time.Hour)
					}
				})
			}
			wg.Wait()
			c.Del(key)
		}
		b.ReportMetric(float64(loads.Load())/float64(n), "loads/op")
	})
	b.Run("impl=flightcache", func(b *testing.B) {
		l, err := New(load, Options[string, string]{TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			key := "cold:" + strconv.Itoa(n)
			n++
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() { l.Get(ctx, key) })
			}
			wg.Wait()
			l.Invalidate(key) // keep the cache small: admission is not measured here
		}
		b.ReportMetric(float64(l.Stats().Loads)/float64(n), "loads/op")
	})
}

// BenchmarkMiss: one goroutine Gets a never-seen key per op, with an
// instant loader: the whole miss path (a load goroutine, its context, the
// wake-up, the pending write) once per op. Past the first 64k keys every
// fill evicts one; bench/ measures the same beside its peers.
func BenchmarkMiss(b *testing.B) {
	l, err := New(func(_ context.Context, k uint64) (uint64, error) { return k, nil },
		Options[uint64, uint64]{TTL: time.Hour, MaxCost: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	b.ReportAllocs()
	k := uint64(0)
	for b.Loop() {
		if _, err := l.Get(ctx, k); err != nil {
			b.Fatal(err)
		}
		k++
	}
}

// BenchmarkGetMany: one GetMany of 100 distinct keys, every one of them
// cached and fresh: the batch's hit path, 100 keys per op; and the same
// through GetManyInfo, which also builds each key's Info. bench/ measures
// GetMany with misses beside its peers.
func BenchmarkGetMany(b *testing.B) {
	const batch = 100
	ctx := context.Background()
	b.Run("api=GetMany", func(b *testing.B) {
		l := newBenchLoader(b, Options[string, string]{})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			at := (i * batch) % (benchKeys - batch)
			if m, err := l.GetMany(ctx, benchNames[at:at+batch]); err != nil || len(m) != batch {
				b.Fatalf("GetMany: %d values, %v", len(m), err)
			}
			i++
		}
		reportHitRatio(b, l)
	})
	b.Run("api=GetManyInfo", func(b *testing.B) {
		l := newBenchLoader(b, Options[string, string]{})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			at := (i * batch) % (benchKeys - batch)
			if m, infos, err := l.GetManyInfo(ctx, benchNames[at:at+batch]); err != nil || len(m) != batch || len(infos) != batch {
				b.Fatalf("GetManyInfo: %d values, %d infos, %v", len(m), len(infos), err)
			}
			i++
		}
		reportHitRatio(b, l)
	})
}

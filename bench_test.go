package flightcache

import (
	"context"
	"math/rand/v2"
	"slices"
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
	b.Run("impl=ristretto/mode=serial", func(b *testing.B) { ristrettoGets(b, trace) })
	b.Run("impl=flightcache/mode=serial", func(b *testing.B) { loaderHits(b, Options[string, string]{}, trace, false) })
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
	b.Run("impl=flightcache/mode=parallel", func(b *testing.B) { loaderHits(b, Options[string, string]{}, trace, true) })
	// With Options.Limit (rule 22): the hit path never reaches the
	// limiter, so these must stay at 0 allocs/op and within noise of the
	// rows without one.
	for _, lim := range []Limit{{MaxLoads: 50}, {Adaptive: true}} {
		for _, parallel := range []bool{false, true} {
			mode := "serial"
			if parallel {
				mode = "parallel"
			}
			b.Run("impl=flightcache-"+limitName(lim)+"/mode="+mode, func(b *testing.B) {
				loaderHits(b, Options[string, string]{Limit: lim}, trace, parallel)
			})
		}
	}
}

// BenchmarkGetHitLimitPaired measures what BenchmarkGetHit's rows with a
// Limit are for, paired: on a shared machine two runs a minute apart
// differ by a third, far more than the 2% a Limit may cost a hit. Four
// Loaders (no Limit; MaxLoads 50; Adaptive; no Limit again, the control)
// take turns, each op a round in which each makes hitPairChunk Gets of
// the trace, in an order that rotates from round to round; a round's
// ratio is a Loader's time over the first's. It reports the median of
// the rounds' ratios (ns/op is a whole round). none/none, two Loaders
// alike, is the spread between instances (where their memory lies, what
// their caches hold): a Limit costs a hit something only if its ratio
// stands beyond that one, run after run.
//
//	go test -run '^$' -bench GetHitLimitPaired -benchtime 2000x .
func BenchmarkGetHitLimitPaired(b *testing.B) {
	trace := zipfTrace(1 << 16)
	ctx := context.Background()
	ls := []*Loader[string, string]{
		newBenchLoader(b, Options[string, string]{}),
		newBenchLoader(b, Options[string, string]{Limit: Limit{MaxLoads: 50}}),
		newBenchLoader(b, Options[string, string]{Limit: Limit{Adaptive: true}}),
		newBenchLoader(b, Options[string, string]{}),
	}
	var ratios [3][]float64
	round := 0
	for b.Loop() {
		var took [4]time.Duration
		for j := range ls {
			k := (j + round) % len(ls)
			off := (round*len(ls) + k) * hitPairChunk
			t0 := time.Now()
			for i := range hitPairChunk {
				ls[k].Get(ctx, benchNames[trace[(off+i)&(len(trace)-1)]])
			}
			took[k] = time.Since(t0)
		}
		for i := range ratios {
			ratios[i] = append(ratios[i], float64(took[i+1])/float64(took[0]))
		}
		round++
	}
	for i, unit := range []string{"maxloads50/none", "adaptive/none", "none/none"} {
		s := slices.Sorted(slices.Values(ratios[i]))
		b.ReportMetric(s[len(s)/2], unit)
	}
}

// hitPairChunk is the Gets each Loader makes per round of
// BenchmarkGetHitLimitPaired: long enough to time, short enough that the
// machine's load changes little within a round.
const hitPairChunk = 8192

// loaderHits is BenchmarkGetHit's flightcache case: Gets of the keys in
// trace on a Loader made with opts, every key cached, serially or from
// b.RunParallel's goroutines.
func loaderHits(b *testing.B, opts Options[string, string], trace []int, parallel bool) {
	l := newBenchLoader(b, opts)
	ctx := context.Background()
	b.ReportAllocs()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(trace))
			for pb.Next() {
				l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
				i++
			}
		})
	} else {
		i := 0
		for b.Loop() {
			l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
			i++
		}
	}
	reportHitRatio(b, l)
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

// BenchmarkIsolation measures docs/design.md rule 17: a write of one key
// never holds up a reader of another. Two goroutines miss on never-seen
// keys of one in-flight shard (key 64·n, with a Hash that keeps every key's
// shard at key % 64 = 0) while, with setloop=on, a third Sets and
// Invalidates key 0 of the same shard in a tight loop. One op is one miss.
// Two controls: with setloop=other-shard the loop writes a key of another
// shard of the same Loader (the writer goroutine and ristretto are still
// shared, the shard lock is not), and with setloop=elsewhere it runs on
// another Loader: the same competition for the CPU, and nothing shared but
// the process. It reports the misses' latency percentiles: compare the three
// from the same run, with and without -race, e.g.
//
//	go test -run '^$' -bench Isolation -benchtime 20000x -count 6 .
//	go test -race -run '^$' -bench Isolation -benchtime 20000x -count 6 .
//
// The first core held the shard lock while ristretto drained its write
// buffer in Set, so under -race a miss of another key could wait tens of
// milliseconds behind it.
func BenchmarkIsolation(b *testing.B) {
	newLoader := func(b *testing.B) *Loader[uint64, uint64] {
		l, err := New(func(_ context.Context, k uint64) (uint64, error) { return k, nil },
			Options[uint64, uint64]{TTL: time.Hour, MaxCost: 1 << 16, Hash: func(k uint64) uint64 { return k }})
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	for _, loop := range []string{"off", "same-shard", "other-shard", "elsewhere"} {
		b.Run("setloop="+loop, func(b *testing.B) {
			l := newLoader(b)
			defer l.Close()
			var stop atomic.Bool
			var setter sync.WaitGroup
			if loop != "off" {
				target := l
				if loop == "elsewhere" {
					target = newLoader(b)
					defer target.Close()
				}
				k := uint64(0)
				if loop == "other-shard" {
					k = 1
				}
				setter.Go(func() {
					for v := uint64(0); !stop.Load(); v++ {
						target.Set(k, v)
						target.Invalidate(k)
					}
				})
			}
			const missers = 2
			lat := make([][]time.Duration, missers)
			var ops, keys atomic.Uint64
			ctx := context.Background()
			b.ResetTimer()
			var wg sync.WaitGroup
			for g := range missers {
				wg.Go(func() {
					for int(ops.Add(1)) <= b.N {
						k := 64 * keys.Add(1) // a key no one has asked for
						start := time.Now()
						if _, err := l.Get(ctx, k); err != nil {
							b.Error(err)
							return
						}
						lat[g] = append(lat[g], time.Since(start))
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			stop.Store(true)
			setter.Wait()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) == 0 {
				return
			}
			at := func(q float64) float64 { return float64(all[min(int(q*float64(len(all))), len(all)-1)]) }
			b.ReportMetric(at(0.5), "p50-ns")
			b.ReportMetric(at(0.999), "p99.9-ns")
			b.ReportMetric(float64(all[len(all)-1]), "max-ns")
		})
	}
}

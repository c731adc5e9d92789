package flightcache

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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

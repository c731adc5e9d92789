package flightcache

import (
	"context"
	"fmt"
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
// It reports the misses' latency percentiles: compare setloop=on with
// setloop=off from the same run, with and without -race, e.g.
//
//	go test -run '^$' -bench Isolation -benchtime 20000x -count 6 .
//	go test -race -run '^$' -bench Isolation -benchtime 20000x -count 6 .
//
// The first core held the shard lock while ristretto drained its write
// buffer in Set, so under -race a miss of another key could wait tens of
// milliseconds behind it.
func BenchmarkIsolation(b *testing.B) {
	for _, loop := range []bool{false, true} {
		b.Run(fmt.Sprintf("setloop=%v", loop), func(b *testing.B) {
			l, err := New(func(_ context.Context, k uint64) (uint64, error) { return k, nil },
				Options[uint64, uint64]{TTL: time.Hour, MaxCost: 1 << 16, Hash: func(k uint64) uint64 { return k }})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			var stop atomic.Bool
			var setter sync.WaitGroup
			if loop {
				setter.Go(func() {
					for v := uint64(0); !stop.Load(); v++ {
						l.Set(0, v)
						l.Invalidate(0)
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

package bench

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache"
)

// Scale: how the cost of a hit and of a miss grows with the working set,
// for flightcache and raw ristretto, at 10k, 100k and 1M keys. Keys are
// uint64 here, so that a miss can ask for a key never seen before without
// allocating one.
//
//   - hit: the cache holds all n keys (MaxCost 2n, NumCounters 10n), the
//     accesses are uniform over them, so a larger n means colder memory.
//     flightcache is filled with Set and checked with Gets until every key
//     is cached (fillLoader).
//   - miss: the cache is full with n keys (MaxCost n) and every Get asks for
//     a new key: a lookup, a load (instant) and a fill that makes ristretto
//     evict or refuse. For raw ristretto the miss is Get, then SetWithTTL.

var scaleSizes = []int{10_000, 100_000, 1_000_000}

func scaleTrace(n int) []uint32 {
	r := rand.New(rand.NewPCG(5, uint64(n)))
	t := make([]uint32, traceLen)
	for i := range t {
		t[i] = uint32(r.IntN(n))
	}
	return t
}

func loadU64(ctx context.Context, key uint64) (string, error) { return value, nil }

func newScaleFlightcache(b *testing.B, n int, maxCost int64) *flightcache.Loader[uint64, string] {
	b.Helper()
	l, err := flightcache.New(loadU64, flightcache.Options[uint64, string]{
		TTL:         longTTL,
		MaxCost:     maxCost,
		NumCounters: 10 * int64(n),
	})
	if err != nil {
		b.Fatal(err)
	}
	fillLoader(b, l, n, func(i int) uint64 { return uint64(i) })
	return l
}

func newScaleRistretto(b *testing.B, n int, maxCost int64) *ristretto.Cache[uint64, string] {
	b.Helper()
	c, err := ristretto.NewCache(&ristretto.Config[uint64, string]{
		NumCounters:        10 * int64(n),
		MaxCost:            maxCost,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	for k := range uint64(n) {
		retryUntil(b, "ristretto to take a Set", func() bool { return c.SetWithTTL(k, value, 1, longTTL) }, c.Wait)
	}
	c.Wait()
	return c
}

func BenchmarkScaleHit(b *testing.B) {
	for _, n := range scaleSizes {
		trace := scaleTrace(n)
		b.Run("ristretto/keys="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			c := newScaleRistretto(b, n, 2*int64(n))
			defer c.Close()
			var misses int64
			i := 0
			for b.Loop() {
				if _, ok := c.Get(uint64(trace[i&mask])); !ok {
					misses++
				}
				i++
			}
			reportHitRatio(b, misses)
		})
		b.Run("flightcache/keys="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			l := newScaleFlightcache(b, n, 2*int64(n))
			defer l.Close()
			filled := l.Stats().Misses // the fill's, if any
			ctx := context.Background()
			i := 0
			for b.Loop() {
				if _, err := l.Get(ctx, uint64(trace[i&mask])); err != nil {
					b.Fatal(err)
				}
				i++
			}
			reportHitRatio(b, int64(l.Stats().Misses-filled))
		})
	}
}

func BenchmarkScaleMiss(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run("ristretto/keys="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			c := newScaleRistretto(b, n, int64(n))
			defer c.Close()
			ctx := context.Background()
			k := uint64(n)
			for b.Loop() {
				if _, ok := c.Get(k); !ok {
					v, _ := loadU64(ctx, k)
					c.SetWithTTL(k, v, 1, longTTL)
				}
				k++
			}
		})
		b.Run("flightcache/keys="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			l := newScaleFlightcache(b, n, int64(n))
			defer l.Close()
			ctx := context.Background()
			k := uint64(n)
			for b.Loop() {
				if _, err := l.Get(ctx, k); err != nil {
					b.Fatal(err)
				}
				k++
			}
		})
	}
}

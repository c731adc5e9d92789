package bench

import (
	"context"
	"testing"

	"github.com/flightcache/flightcache"
	"github.com/maypok86/otter/v2"
)

// The cold miss, one goroutine: every op Gets a uint64 key nobody asked for
// before, with an instant loader, so that an op is the whole miss path
// (lookup, load, fill) and nothing else. Every implementation holds
// missCapacity entries and is filled to capacity before the timer starts,
// so every fill evicts an entry or is refused by the admission policy, as
// in a cache that has been running for a while.
//
//   - otter: Get(ctx, key, loader), expire-after-write.
//   - ristretto: Get, then load and SetWithTTL on a miss (no coalescing),
//     10 counters per entry as flightcache configures it by default.
//   - flightcache: Loader.Get with default options, MaxCost missCapacity.
//
// BenchmarkCoalesce/*/g=1 is the same measure on string keys in a cache
// large enough that nothing is evicted.

const missCapacity = 10_000

func BenchmarkMiss(b *testing.B) {
	for _, impl := range []struct {
		name string
		run  func(b *testing.B)
	}{
		{"ristretto", missRistretto},
		{"otter", missOtter},
		{"flightcache", missFlightcache},
	} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			impl.run(b)
		})
	}
}

func missRistretto(b *testing.B) {
	c := newScaleRistretto(b, missCapacity, missCapacity)
	defer c.Close()
	ctx := context.Background()
	k := uint64(missCapacity)
	for b.Loop() {
		if _, ok := c.Get(k); !ok {
			v, _ := loadU64(ctx, k)
			c.SetWithTTL(k, v, 1, longTTL)
		}
		k++
	}
}

func missOtter(b *testing.B) {
	c, err := otter.New(&otter.Options[uint64, string]{
		MaximumSize:      missCapacity,
		ExpiryCalculator: otter.ExpiryWriting[uint64, string](longTTL),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.StopAllGoroutines()
	for k := range uint64(missCapacity) {
		c.Set(k, value)
	}
	c.CleanUp()
	var loader otter.Loader[uint64, string] = otter.LoaderFunc[uint64, string](loadU64)
	ctx := context.Background()
	k := uint64(missCapacity)
	for b.Loop() {
		if _, err := c.Get(ctx, k, loader); err != nil {
			b.Fatal(err)
		}
		k++
	}
}

func missFlightcache(b *testing.B) {
	l, err := flightcache.New(loadU64, flightcache.Options[uint64, string]{
		TTL:     longTTL,
		MaxCost: missCapacity,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	fillLoader(b, l, missCapacity, func(i int) uint64 { return uint64(i) })
	ctx := context.Background()
	k := uint64(missCapacity)
	for b.Loop() {
		if _, err := l.Get(ctx, k); err != nil {
			b.Fatal(err)
		}
		k++
	}
}

package bench

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache"
	"github.com/maypok86/otter/v2"
	xsingleflight "golang.org/x/sync/singleflight"
)

// Eviction pressure: a working set a hundred times larger than the cache.
// Zipf(1.01) accesses over 1M uint64 keys (one precomputed trace of 2M
// accesses, the same for every implementation), a cache of 10k entries, 8
// goroutines, an instant loader. The trace is cut into 8 contiguous parts,
// one per goroutine, played as fast as they go. About a third of the Gets
// miss, so the cache evicts (or refuses a fill) all the time, and the
// question is how many downstream calls each implementation lets through:
// a fill that ristretto's set buffer drops, or that its admission policy
// refuses, is a call made again on the next Get of that key.
//
// This is a timed scenario, not a throughput benchmark: each run plays the
// 2M Gets once, whatever b.N. Its metrics are
//
//	ns/op          wall time of the run divided by the 2M Gets
//	B/get          heap allocated during the run (background goroutines
//	               included) divided by the 2M Gets; B/op is the same, rounded
//	allocs/get     allocations during the run divided by the 2M Gets;
//	               allocs/op is the same, rounded
//	calls          downstream calls during the run
//	hit-ratio      share of the Gets that made no downstream call of their own
//	sets-dropped   fills ristretto's set buffer dropped (flightcache: Stats;
//	               ristretto: SetWithTTL returning false)
//	sets-rejected  fills ristretto's admission policy refused (flightcache:
//	               Stats; ristretto: its OnReject callback)
//
// Implementations, all with 10k entries:
//
//   - flightcache: default options, TTL one hour, MaxCost 10,000 (so 100k
//     counters).
//   - ristretto-singleflight: the hand-rolled cache-aside. ristretto with
//     the same configuration flightcache gives it (100k counters, cost 1,
//     64 buffer items, a TTL on every entry); Get, and on a miss
//     golang.org/x/sync/singleflight's Do(load, then SetWithTTL) on the
//     decimal key. No second look inside the flight.
//   - otter: Get with a Loader, MaximumSize 10,000, expire-after-write.

const (
	pressureKeys     = 1_000_000
	pressureCapacity = 10_000
	pressureGets     = 2_000_000
	pressureWorkers  = 8
)

var pressureTrace once[[]uint32]

func loadPressureTrace() []uint32 {
	return pressureTrace.get(func() []uint32 {
		r := rand.New(rand.NewPCG(7, 8))
		z := rand.NewZipf(r, zipfS, 1, pressureKeys-1)
		t := make([]uint32, pressureGets)
		for i := range t {
			t[i] = uint32(z.Uint64())
		}
		return t
	})
}

// pressureRun is what one implementation reports after a run.
type pressureRun struct {
	dropped, rejected int64 // -1: not known for this implementation
}

// pressureImpl builds one contender on a downstream that counts its calls;
// get asks for one key; done closes it and says what it knows.
type pressureImpl struct {
	name string
	new  func(b *testing.B, calls *atomic.Int64) (get func(ctx context.Context, key uint64), done func() pressureRun)
}

var pressureImpls = []pressureImpl{
	{"ristretto-singleflight", newPressureRistretto},
	{"otter", newPressureOtter},
	{"flightcache", newPressureFlightcache},
}

func BenchmarkEvictionPressure(b *testing.B) {
	trace := loadPressureTrace()
	for _, impl := range pressureImpls {
		b.Run(impl.name, func(b *testing.B) {
			var (
				calls atomic.Int64
				run   pressureRun
				p     played
			)
			for b.Loop() {
				if p.elapsed > 0 {
					continue
				}
				get, done := impl.new(b, &calls)
				p = playPressure(trace, get)
				run = done()
			}
			n := calls.Load()
			b.ReportMetric(float64(p.elapsed)/pressureGets, "ns/op")
			// The framework's B/op and allocs/op would be the whole run's:
			// they are replaced by the per-Get figures, rounded (the
			// framework prints them as integers), and given exactly as
			// B/get and allocs/get.
			perGet := func(v uint64) float64 { return float64(v) / pressureGets }
			b.ReportMetric(math.Round(perGet(p.bytes)), "B/op")
			b.ReportMetric(math.Round(perGet(p.allocs)), "allocs/op")
			b.ReportMetric(perGet(p.bytes), "B/get")
			b.ReportMetric(perGet(p.allocs), "allocs/get")
			b.ReportMetric(float64(n), "calls")
			b.ReportMetric(1-float64(n)/pressureGets, "hit-ratio")
			if run.dropped >= 0 {
				b.ReportMetric(float64(run.dropped), "sets-dropped")
			}
			if run.rejected >= 0 {
				b.ReportMetric(float64(run.rejected), "sets-rejected")
			}
		})
	}
}

// played is what playPressure measured.
type played struct {
	elapsed       time.Duration
	bytes, allocs uint64
}

// playPressure plays trace on pressureWorkers goroutines, each its own
// contiguous part, and returns the wall time and the heap allocated.
func playPressure(trace []uint32, get func(ctx context.Context, key uint64)) played {
	ctx := context.Background()
	part := len(trace) / pressureWorkers
	var (
		ready, wg sync.WaitGroup
		start     = make(chan struct{})
	)
	for w := range pressureWorkers {
		ready.Add(1)
		wg.Go(func() {
			mine := trace[w*part : (w+1)*part]
			ready.Done()
			<-start
			for _, k := range mine {
				get(ctx, uint64(k))
			}
		})
	}
	ready.Wait()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	runtime.ReadMemStats(&m1)
	return played{elapsed: elapsed, bytes: m1.TotalAlloc - m0.TotalAlloc, allocs: m1.Mallocs - m0.Mallocs}
}

func pressureLoad(calls *atomic.Int64) func(context.Context, uint64) (string, error) {
	return func(context.Context, uint64) (string, error) {
		calls.Add(1)
		return value, nil
	}
}

func newPressureRistretto(b *testing.B, calls *atomic.Int64) (func(context.Context, uint64), func() pressureRun) {
	var dropped, rejected atomic.Int64
	c, err := ristretto.NewCache(&ristretto.Config[uint64, string]{
		NumCounters:        10 * pressureCapacity,
		MaxCost:            pressureCapacity,
		BufferItems:        64,
		IgnoreInternalCost: true,
		OnReject:           func(*ristretto.Item[string]) { rejected.Add(1) },
	})
	if err != nil {
		b.Fatal(err)
	}
	load := pressureLoad(calls)
	var g xsingleflight.Group
	get := func(ctx context.Context, k uint64) {
		if _, ok := c.Get(k); ok {
			return
		}
		g.Do(strconv.FormatUint(k, 10), func() (any, error) {
			v, err := load(ctx, k)
			if err == nil && !c.SetWithTTL(k, v, 1, longTTL) {
				dropped.Add(1)
			}
			return v, err
		})
	}
	return get, func() pressureRun {
		c.Wait()
		c.Close()
		return pressureRun{dropped: dropped.Load(), rejected: rejected.Load()}
	}
}

func newPressureOtter(b *testing.B, calls *atomic.Int64) (func(context.Context, uint64), func() pressureRun) {
	c, err := otter.New(&otter.Options[uint64, string]{
		MaximumSize:      pressureCapacity,
		ExpiryCalculator: otter.ExpiryWriting[uint64, string](longTTL),
	})
	if err != nil {
		b.Fatal(err)
	}
	var loader otter.Loader[uint64, string] = otter.LoaderFunc[uint64, string](pressureLoad(calls))
	get := func(ctx context.Context, k uint64) {
		if _, err := c.Get(ctx, k, loader); err != nil {
			b.Error(err)
		}
	}
	return get, func() pressureRun {
		c.StopAllGoroutines()
		return pressureRun{dropped: -1, rejected: -1}
	}
}

func newPressureFlightcache(b *testing.B, calls *atomic.Int64) (func(context.Context, uint64), func() pressureRun) {
	l, err := flightcache.New(pressureLoad(calls), flightcache.Options[uint64, string]{
		TTL:     longTTL,
		MaxCost: pressureCapacity,
	})
	if err != nil {
		b.Fatal(err)
	}
	get := func(ctx context.Context, k uint64) {
		if _, err := l.Get(ctx, k); err != nil {
			b.Error(err)
		}
	}
	return get, func() pressureRun {
		l.Close()
		s := l.Stats()
		return pressureRun{dropped: int64(s.SetsDropped), rejected: int64(s.SetsRejected)}
	}
}

package bench

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/flightcache/flightcache"
	"github.com/maypok86/otter/v2"
	"github.com/viccon/sturdyc"
	xsingleflight "golang.org/x/sync/singleflight"
	rsingleflight "resenje.org/singleflight"
)

// Coalescing: one op is a burst of G concurrent Gets of one key nobody has
// asked for before, with an instant loader. The benchmark goroutine is one
// of the G callers; the other G-1 wait on a condition variable and are all
// released at once, so the harness allocates nothing.
//
// loads/op is downstream calls per burst: 1 is perfect coalescing. A plain
// single-flight group forgets a key the moment its call returns, so a
// caller that arrives just after it calls again; a cache in front remembers
// the value and answers the late caller from memory.

var coalesceGoroutines = []int{1, 8, 64}

// coldKeyCount is how many distinct keys the bursts use before the
// implementation is rebuilt (with the timer stopped), so that every burst's
// key is cold.
const coldKeyCount = 1 << 20

var coldKeys once[[]string]

func loadColdKeys() []string {
	return coldKeys.get(func() []string {
		keys := make([]string, coldKeyCount)
		for i := range keys {
			keys[i] = "cold:" + strconv.Itoa(i)
		}
		return keys
	})
}

// coalescer is one implementation under test: get asks for key; close frees
// what new made.
type coalescer struct {
	get   func(ctx context.Context, key string)
	close func()
}

var coalesceImpls = []struct {
	name string
	new  func(b *testing.B, d *downstream) coalescer
}{
	{"x-singleflight", func(b *testing.B, d *downstream) coalescer {
		var g xsingleflight.Group
		return coalescer{
			get: func(ctx context.Context, key string) {
				g.Do(key, func() (any, error) { return d.load(ctx, key) })
			},
			close: func() {},
		}
	}},
	{"resenje-singleflight", func(b *testing.B, d *downstream) coalescer {
		var g rsingleflight.Group[string, string]
		return coalescer{
			get: func(ctx context.Context, key string) {
				g.Do(ctx, key, func(ctx context.Context) (string, error) { return d.load(ctx, key) })
			},
			close: func() {},
		}
	}},
	{"sturdyc", func(b *testing.B, d *downstream) coalescer {
		c := sturdyc.New[string](coldKeyCount, 64, longTTL, 10, sturdyc.WithNoContinuousEvictions())
		return coalescer{
			get: func(ctx context.Context, key string) {
				if _, err := c.GetOrFetch(ctx, key, d.fetch(key)); err != nil {
					b.Error(err)
				}
			},
			close: func() {},
		}
	}},
	{"otter", func(b *testing.B, d *downstream) coalescer {
		c, err := otter.New(&otter.Options[string, string]{
			MaximumSize:      coldKeyCount,
			ExpiryCalculator: otter.ExpiryWriting[string, string](longTTL),
		})
		if err != nil {
			b.Fatal(err)
		}
		var loader otter.Loader[string, string] = otter.LoaderFunc[string, string](d.load)
		return coalescer{
			get: func(ctx context.Context, key string) {
				if _, err := c.Get(ctx, key, loader); err != nil {
					b.Error(err)
				}
			},
			close: func() { c.StopAllGoroutines() },
		}
	}},
	{"flightcache", func(b *testing.B, d *downstream) coalescer {
		l, err := flightcache.New(d.load, flightcache.Options[string, string]{
			TTL:     longTTL,
			MaxCost: coldKeyCount,
		})
		if err != nil {
			b.Fatal(err)
		}
		return coalescer{
			get: func(ctx context.Context, key string) {
				if _, err := l.Get(ctx, key); err != nil {
					b.Error(err)
				}
			},
			close: func() { l.Close() },
		}
	}},
}

func BenchmarkCoalesce(b *testing.B) {
	keys := loadColdKeys()
	for _, impl := range coalesceImpls {
		for _, g := range coalesceGoroutines {
			b.Run(impl.name+"/g="+strconv.Itoa(g), func(b *testing.B) {
				b.ReportAllocs()
				d := &downstream{}
				c := impl.new(b, d)
				defer func() { c.close() }()
				bursts(b, g, keys, func(ctx context.Context, key string) { c.get(ctx, key) }, func() {
					c.close()
					c = impl.new(b, d)
				})
				b.ReportMetric(float64(d.calls.Load())/float64(b.N), "loads/op")
				b.ReportMetric(float64(d.calls.Load())/float64(b.N*g), "loads/get")
			})
		}
	}
}

// bursts runs b.N bursts of g concurrent gets, burst i on keys[i]. When the
// keys run out, reset rebuilds the implementation (timer stopped) and the
// keys are used again, cold once more.
func bursts(b *testing.B, g int, keys []string, get func(ctx context.Context, key string), reset func()) {
	ctx := context.Background()
	var (
		mu      sync.Mutex
		wake    = sync.NewCond(&mu)
		gen     int    // guarded by mu: the burst number
		key     string // guarded by mu: the key of burst gen
		stop    bool   // guarded by mu: the workers must exit
		done    sync.WaitGroup
		workers sync.WaitGroup
	)
	for range g - 1 {
		workers.Go(func() {
			seen := 0
			for {
				mu.Lock()
				for gen == seen && !stop {
					wake.Wait()
				}
				if stop {
					mu.Unlock()
					return
				}
				seen = gen
				k := key
				mu.Unlock()
				get(ctx, k)
				done.Done()
			}
		})
	}
	i := 0
	for b.Loop() {
		if i == len(keys) {
			b.StopTimer()
			reset()
			i = 0
			b.StartTimer()
		}
		k := keys[i]
		i++
		done.Add(g - 1)
		mu.Lock()
		gen++
		key = k
		wake.Broadcast()
		mu.Unlock()
		get(ctx, k)
		done.Wait()
	}
	mu.Lock()
	stop = true
	wake.Broadcast()
	mu.Unlock()
	workers.Wait()
}

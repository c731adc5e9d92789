package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache"
	"github.com/maypok86/otter/v2"
	"github.com/viccon/sturdyc"
)

// The hit path: Zipf(1.01) accesses over 100k keys, every key cached before
// the timer starts, with a TTL long enough that nothing expires. Each
// implementation is configured the way a cache-aside user would configure
// it: a TTL on every entry, and a loader for the (rare) miss.
//
// Every Get that does not find its key is counted, and the hit ratio is
// reported: ristretto's admission policy and set buffer may refuse a few
// fills even when the cache has room. flightcache is filled with Set and
// then checked with Gets until every key is cached (fillLoader): a Set is
// applied by ristretto later and may be dropped by its set buffer.

var hitWork once[hitWorkload]

type hitWorkload struct {
	keys  []string
	trace []uint32 // indexes into keys, Zipf(1.01)
}

func loadHitWorkload() hitWorkload {
	return hitWork.get(func() hitWorkload {
		return hitWorkload{keys: makeKeys(hitKeys), trace: zipfTrace(hitKeys, zipfS)}
	})
}

// hitImpls are the implementations of the hit-path benchmarks, in report
// order. serial runs b.Loop; parallel runs b.RunParallel. Each returns the
// number of Gets that missed.
var hitImpls = []struct {
	name     string
	serial   func(b *testing.B, w hitWorkload) (misses int64)
	parallel func(b *testing.B, w hitWorkload) (misses int64)
}{
	{"map-rwmutex", hitMapSerial, hitMapParallel},
	{"ristretto", hitRistrettoSerial, hitRistrettoParallel},
	{"otter", hitOtterSerial, hitOtterParallel},
	{"sturdyc", hitSturdycSerial, hitSturdycParallel},
	{"flightcache", hitFlightcacheSerial, hitFlightcacheParallel},
}

func BenchmarkHitSerial(b *testing.B) {
	w := loadHitWorkload()
	for _, impl := range hitImpls {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			misses := impl.serial(b, w)
			reportHitRatio(b, misses)
		})
	}
}

func BenchmarkHitParallel(b *testing.B) {
	w := loadHitWorkload()
	for _, impl := range hitImpls {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			misses := impl.parallel(b, w)
			reportHitRatio(b, misses)
		})
	}
}

func reportHitRatio(b *testing.B, misses int64) {
	b.ReportMetric(1-float64(misses)/float64(max(b.N, 1)), "hit-ratio")
}

// workerStart returns where a parallel worker begins in the trace, so that the
// workers do not walk it in lockstep.
func workerStart(worker *atomic.Int64) int {
	return int(worker.Add(1)) * (traceLen / 7)
}

const mask = traceLen - 1

// --- map behind a sync.RWMutex: the floor ---

type lockedMap struct {
	mu sync.RWMutex
	m  map[string]string
}

func newLockedMap(keys []string) *lockedMap {
	m := &lockedMap{m: make(map[string]string, len(keys))}
	for _, k := range keys {
		m.m[k] = value
	}
	return m
}

func (m *lockedMap) get(k string) (string, bool) {
	m.mu.RLock()
	v, ok := m.m[k]
	m.mu.RUnlock()
	return v, ok
}

func hitMapSerial(b *testing.B, w hitWorkload) int64 {
	m := newLockedMap(w.keys)
	var misses int64
	i := 0
	for b.Loop() {
		if _, ok := m.get(w.keys[w.trace[i&mask]]); !ok {
			misses++
		}
		i++
	}
	return misses
}

func hitMapParallel(b *testing.B, w hitWorkload) int64 {
	m := newLockedMap(w.keys)
	var misses, worker atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var miss int64
		for i := workerStart(&worker); pb.Next(); i++ {
			if _, ok := m.get(w.keys[w.trace[i&mask]]); !ok {
				miss++
			}
		}
		misses.Add(miss)
	})
	return misses.Load()
}

// --- raw ristretto, every entry with a TTL ---

func newRistretto(b *testing.B, keys []string) *ristretto.Cache[string, string] {
	b.Helper()
	c, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters:        10 * int64(len(keys)),
		MaxCost:            2 * int64(len(keys)),
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range keys {
		// A full set buffer refuses the Set: let it drain and retry.
		retryUntil(b, "ristretto to take a Set", func() bool { return c.SetWithTTL(k, value, 1, longTTL) }, c.Wait)
	}
	c.Wait()
	return c
}

func hitRistrettoSerial(b *testing.B, w hitWorkload) int64 {
	c := newRistretto(b, w.keys)
	defer c.Close()
	var misses int64
	i := 0
	for b.Loop() {
		if _, ok := c.Get(w.keys[w.trace[i&mask]]); !ok {
			misses++
		}
		i++
	}
	return misses
}

func hitRistrettoParallel(b *testing.B, w hitWorkload) int64 {
	c := newRistretto(b, w.keys)
	defer c.Close()
	var misses, worker atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var miss int64
		for i := workerStart(&worker); pb.Next(); i++ {
			if _, ok := c.Get(w.keys[w.trace[i&mask]]); !ok {
				miss++
			}
		}
		misses.Add(miss)
	})
	return misses.Load()
}

// --- otter/v2: Get with a Loader, expire-after-write ---

func newOtter(b *testing.B, keys []string) *otter.Cache[string, string] {
	b.Helper()
	c, err := otter.New(&otter.Options[string, string]{
		MaximumSize:      2 * len(keys),
		ExpiryCalculator: otter.ExpiryWriting[string, string](longTTL),
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range keys {
		c.Set(k, value)
	}
	c.CleanUp()
	return c
}

func hitOtterSerial(b *testing.B, w hitWorkload) int64 {
	c := newOtter(b, w.keys)
	defer c.StopAllGoroutines()
	d := &downstream{}
	var loader otter.Loader[string, string] = otter.LoaderFunc[string, string](d.load)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := c.Get(ctx, w.keys[w.trace[i&mask]], loader); err != nil {
			b.Fatal(err)
		}
		i++
	}
	return d.calls.Load()
}

func hitOtterParallel(b *testing.B, w hitWorkload) int64 {
	c := newOtter(b, w.keys)
	defer c.StopAllGoroutines()
	d := &downstream{}
	var loader otter.Loader[string, string] = otter.LoaderFunc[string, string](d.load)
	ctx := context.Background()
	var worker atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := workerStart(&worker); pb.Next(); i++ {
			if _, err := c.Get(ctx, w.keys[w.trace[i&mask]], loader); err != nil {
				b.Error(err)
				return
			}
		}
	})
	return d.calls.Load()
}

// --- sturdyc: GetOrFetch ---

// newSturdyc fills a sturdyc client. Continuous evictions are off: their
// goroutine has no way to stop, and with capacity for every key they have
// nothing to do.
func newSturdyc(keys []string) *sturdyc.Client[string] {
	c := sturdyc.New[string](2*len(keys), 64, longTTL, 10, sturdyc.WithNoContinuousEvictions())
	for _, k := range keys {
		c.Set(k, value)
	}
	return c
}

func hitSturdycSerial(b *testing.B, w hitWorkload) int64 {
	c := newSturdyc(w.keys)
	d := &downstream{}
	// One fetch function for every key: it only runs on a miss, and a
	// per-call closure would charge sturdyc for an allocation of ours.
	fetch := d.fetch("")
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := c.GetOrFetch(ctx, w.keys[w.trace[i&mask]], fetch); err != nil {
			b.Fatal(err)
		}
		i++
	}
	return d.calls.Load()
}

func hitSturdycParallel(b *testing.B, w hitWorkload) int64 {
	c := newSturdyc(w.keys)
	d := &downstream{}
	fetch := d.fetch("")
	ctx := context.Background()
	var worker atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := workerStart(&worker); pb.Next(); i++ {
			if _, err := c.GetOrFetch(ctx, w.keys[w.trace[i&mask]], fetch); err != nil {
				b.Error(err)
				return
			}
		}
	})
	return d.calls.Load()
}

// --- flightcache: Loader.Get ---

func newFlightcache(b *testing.B, d *downstream, keys []string) *flightcache.Loader[string, string] {
	b.Helper()
	l, err := flightcache.New(d.load, flightcache.Options[string, string]{
		TTL:         longTTL,
		MaxCost:     2 * int64(len(keys)),
		NumCounters: 10 * int64(len(keys)),
	})
	if err != nil {
		b.Fatal(err)
	}
	fillLoader(b, l, len(keys), func(i int) string { return keys[i] })
	return l
}

func hitFlightcacheSerial(b *testing.B, w hitWorkload) int64 {
	d := &downstream{}
	l := newFlightcache(b, d, w.keys)
	defer l.Close()
	filled := d.calls.Load() // the fill's loads, if any
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := l.Get(ctx, w.keys[w.trace[i&mask]]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	return d.calls.Load() - filled
}

func hitFlightcacheParallel(b *testing.B, w hitWorkload) int64 {
	d := &downstream{}
	l := newFlightcache(b, d, w.keys)
	defer l.Close()
	filled := d.calls.Load() // the fill's loads, if any
	ctx := context.Background()
	var worker atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := workerStart(&worker); pb.Next(); i++ {
			if _, err := l.Get(ctx, w.keys[w.trace[i&mask]]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	return d.calls.Load() - filled
}

package bench

import (
	"runtime"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache"
)

// Memory: the heap an entry costs once 1M entries are cached, measured as
// the live heap after a GC with the cache full, minus the live heap after a
// GC with the cache just created (ristretto allocates its counters up
// front, so they are not counted), divided by the entries actually stored.
// Keys are made before the first measurement and every entry maps to one
// shared value, so the figure is the per-entry bookkeeping of the cache.
//
// ristretto is filled with SetWithTTL, waiting for its buffer whenever it
// refuses one; flightcache with Set, then Gets until every key is cached
// (fillLoader: ristretto's admission may refuse a Set, and the Get that
// finds the key missing loads it again).
//
// Each run fills once, whatever b.N; ns/op is the fill time per entry, until
// every entry is readable from the cache.

const memEntries = 1_000_000

var memKeys once[[]string]

func loadMemKeys() []string { return memKeys.get(func() []string { return makeKeys(memEntries) }) }

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func BenchmarkMemory(b *testing.B) {
	keys := loadMemKeys()
	for _, impl := range []struct {
		name string
		fill func(b *testing.B, keys []string) (bytes, stored, fillNs float64)
	}{
		{"ristretto", func(b *testing.B, keys []string) (float64, float64, float64) { return memRistretto(b, keys, true) }},
		{"ristretto-no-ttl", func(b *testing.B, keys []string) (float64, float64, float64) { return memRistretto(b, keys, false) }},
		{"flightcache", memFlightcache},
	} {
		b.Run(impl.name, func(b *testing.B) {
			var bytes, stored, fillNs float64
			filled := false
			for b.Loop() {
				if !filled {
					bytes, stored, fillNs = impl.fill(b, keys)
					filled = true
				}
			}
			b.ReportMetric(bytes/stored, "B/entry")
			b.ReportMetric(stored/memEntries, "stored-ratio")
			b.ReportMetric(fillNs/memEntries, "ns/op")
		})
	}
}

func memRistretto(b *testing.B, keys []string, ttl bool) (bytes, stored, fillNs float64) {
	c, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters:        10 * memEntries,
		MaxCost:            2 * memEntries,
		BufferItems:        64,
		IgnoreInternalCost: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	before := liveHeap()
	start := time.Now()
	for _, k := range keys {
		set := func() bool { return c.Set(k, value, 1) }
		if ttl {
			set = func() bool { return c.SetWithTTL(k, value, 1, longTTL) }
		}
		retryUntil(b, "ristretto to take a Set", set, c.Wait) // a full set buffer refuses it: let it drain and retry
	}
	c.Wait()
	fillNs = float64(time.Since(start))
	after := liveHeap()
	n := 0
	for _, k := range keys {
		if _, ok := c.Get(k); ok {
			n++
		}
	}
	runtime.KeepAlive(c)
	return float64(after) - float64(before), float64(n), fillNs
}

func memFlightcache(b *testing.B, keys []string) (bytes, stored, fillNs float64) {
	d := &downstream{}
	l, err := flightcache.New(d.load, flightcache.Options[string, string]{
		TTL:         longTTL,
		MaxCost:     2 * memEntries,
		NumCounters: 10 * memEntries,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	before := liveHeap()
	start := time.Now()
	missed := fillLoader(b, l, len(keys), func(i int) string { return keys[i] })
	fillNs = float64(time.Since(start))
	after := liveHeap()
	n := uint64(memEntries) - missed - l.Stats().Evicted
	runtime.KeepAlive(l)
	return float64(after) - float64(before), float64(n), fillNs
}

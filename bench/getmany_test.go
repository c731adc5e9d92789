package bench

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/flightcache/flightcache"
	"github.com/maypok86/otter/v2"
	"github.com/viccon/sturdyc"
)

// Batches, one goroutine: one op asks for manyBatch string keys at once
// through each implementation's batch API, with an instant batch loader.
// Every implementation holds manyCapacity entries, a hundredth of the
// manyKeys key space, so that in the steady state about half of each op's
// keys are cached and the other half are loaded in one batch call.
//
// The trace is precomputed once and is the same for every implementation:
// one stream of Zipf(1.01) draws over manyKeys keys (fixed seed), cut into
// manyOps ops of manyBatch distinct keys each (a draw already in the op
// being built is skipped, so that no implementation is charged for
// duplicates it may or may not remove). Before the timer starts, the first
// manyWarmOps ops are played to fill the cache and train its admission
// policy; the timed ops go on from there, round the trace.
//
// The batch loader returns a fresh map with the shared value for every key
// it is asked for, at once. It counts its calls (one call of the batch
// function is one downstream call) and the keys it is asked for; only
// those of the timed ops are reported:
//
//	calls/op        downstream batch calls per op (1 if any key missed, 0
//	                if every key was cached)
//	keys-loaded/op  keys asked of the downstream per op
//	hit-ratio       1 − keys-loaded / manyBatch: the share of each op's
//	                keys answered from the cache
//
// ns/op and allocs/op are per op (manyBatch keys), background goroutines'
// allocations included. Implementations, all with a TTL of one hour (so
// nothing expires: every miss is a key evicted or never admitted):
//
//   - flightcache: Loader.GetMany with Options.LoadMany, MaxCost
//     manyCapacity (so 10 × manyCapacity counters), MaxBatch left at its
//     default of 100, otherwise default options. Its LoadFunc, unused by
//     GetMany with a LoadMany, is counted in the same way (one call, one
//     key).
//   - sturdyc: GetOrFetchBatch with the batch loader as its fetch function
//     and the identity as its key function (the ids are the cache keys),
//     capacity manyCapacity in 64 shards, 10% evicted when a shard is
//     full, continuous evictions off.
//   - otter: BulkGet with the batch loader as its BulkLoader, MaximumSize
//     manyCapacity, expire-after-write.

const (
	manyKeys     = 1_000_000 // key space
	manyCapacity = 10_000    // entries every implementation holds
	manyBatch    = 100       // keys per op
	manyOps      = 1 << 13   // ops in the precomputed trace; a power of two
	manyWarmOps  = 2_000     // ops played before the timer starts
)

var manyTrace once[[]string]

// loadManyTrace returns manyOps × manyBatch keys: op i is
// trace[i*manyBatch : (i+1)*manyBatch], manyBatch distinct keys.
func loadManyTrace() []string {
	return manyTrace.get(func() []string {
		r := rand.New(rand.NewPCG(9, 10))
		z := rand.NewZipf(r, zipfS, 1, manyKeys-1)
		names := make([]string, manyKeys) // built on first use: most keys never are
		trace := make([]string, 0, manyOps*manyBatch)
		inOp := make(map[uint64]struct{}, manyBatch)
		for len(trace) < cap(trace) {
			k := z.Uint64()
			if _, dup := inOp[k]; dup {
				continue
			}
			inOp[k] = struct{}{}
			if names[k] == "" {
				names[k] = "key:" + strconv.FormatUint(k, 10)
			}
			trace = append(trace, names[k])
			if len(inOp) == manyBatch {
				clear(inOp)
			}
		}
		return trace
	})
}

// manyOp returns the keys of op i of trace, capped so that nobody can
// append to them.
func manyOp(trace []string, i int) []string {
	j := (i & (manyOps - 1)) * manyBatch
	return trace[j : j+manyBatch : j+manyBatch]
}

// batchDownstream is an instant fake service with a batch endpoint. calls
// counts its calls (batch or single) and keys the keys they asked for.
type batchDownstream struct {
	downstream
	keys atomic.Int64
}

// loadMany is the batch endpoint: one call, a fresh map holding the shared
// value for every key asked.
func (d *batchDownstream) loadMany(ctx context.Context, keys []string) (map[string]string, error) {
	d.calls.Add(1)
	d.keys.Add(int64(len(keys)))
	d.inside.Add(1)
	defer d.inside.Add(-1)
	m := make(map[string]string, len(keys))
	for _, k := range keys {
		m[k] = value
	}
	return m, nil
}

// loadOne is the single-key endpoint, counted as one call and one key.
func (d *batchDownstream) loadOne(ctx context.Context, key string) (string, error) {
	d.keys.Add(1)
	return d.load(ctx, key)
}

// manyImpl builds one contender on d: getMany asks for a batch of keys;
// done frees what new made.
type manyImpl struct {
	name string
	new  func(b *testing.B, d *batchDownstream) (getMany func(ctx context.Context, keys []string) (map[string]string, error), done func())
}

var manyImpls = []manyImpl{
	{"sturdyc", newManySturdyc},
	{"otter", newManyOtter},
	{"flightcache", newManyFlightcache},
}

func BenchmarkGetMany(b *testing.B) {
	trace := loadManyTrace()
	for _, impl := range manyImpls {
		b.Run(impl.name, func(b *testing.B) {
			d := &batchDownstream{}
			getMany, done := impl.new(b, d)
			defer done()
			ctx := context.Background()
			play := func(i int) {
				m, err := getMany(ctx, manyOp(trace, i))
				if err != nil {
					b.Fatal(err)
				}
				if len(m) != manyBatch {
					b.Fatalf("op %d: %d values for %d keys", i, len(m), manyBatch)
				}
			}
			for i := range manyWarmOps {
				play(i)
			}
			calls0, keys0 := d.calls.Load(), d.keys.Load()
			b.ReportAllocs()
			ops := 0
			for b.Loop() {
				play(manyWarmOps + ops)
				ops++
			}
			calls, keys := float64(d.calls.Load()-calls0), float64(d.keys.Load()-keys0)
			n := float64(max(ops, 1))
			b.ReportMetric(calls/n, "calls/op")
			b.ReportMetric(keys/n, "keys-loaded/op")
			b.ReportMetric(1-keys/(n*manyBatch), "hit-ratio")
		})
	}
}

func newManySturdyc(b *testing.B, d *batchDownstream) (func(context.Context, []string) (map[string]string, error), func()) {
	c := sturdyc.New[string](manyCapacity, 64, longTTL, 10, sturdyc.WithNoContinuousEvictions())
	keyFn := func(id string) string { return id }
	getMany := func(ctx context.Context, keys []string) (map[string]string, error) {
		return c.GetOrFetchBatch(ctx, keys, keyFn, d.loadMany)
	}
	// A batch fetch runs on a goroutine of sturdyc's that nobody waits for
	// to end: let the last one finish before goleak looks.
	return getMany, func() { d.quiesce(b) }
}

func newManyOtter(b *testing.B, d *batchDownstream) (func(context.Context, []string) (map[string]string, error), func()) {
	c, err := otter.New(&otter.Options[string, string]{
		MaximumSize:      manyCapacity,
		ExpiryCalculator: otter.ExpiryWriting[string, string](longTTL),
	})
	if err != nil {
		b.Fatal(err)
	}
	var loader otter.BulkLoader[string, string] = otter.BulkLoaderFunc[string, string](d.loadMany)
	getMany := func(ctx context.Context, keys []string) (map[string]string, error) {
		return c.BulkGet(ctx, keys, loader)
	}
	return getMany, func() { c.StopAllGoroutines() }
}

func newManyFlightcache(b *testing.B, d *batchDownstream) (func(context.Context, []string) (map[string]string, error), func()) {
	l, err := flightcache.New(d.loadOne, flightcache.Options[string, string]{
		TTL:      longTTL,
		MaxCost:  manyCapacity,
		LoadMany: d.loadMany,
	})
	if err != nil {
		b.Fatal(err)
	}
	return l.GetMany, func() { l.Close() }
}

package flightcache

import (
	"context"
	"runtime"
	"strconv"
	"testing"
)

// BenchmarkTagsHit measures a hit of a value with t tags (Options.Tags):
// t=0 is a Loader without Tags, whose hit must match BenchmarkGetHit's
// (compare both against main in interleaved runs, docs/benchmarks.md);
// each tag costs the hit one atomic load and a compare.
//
//	go test -run '^$' -bench TagsHit -count 5 .
func BenchmarkTagsHit(b *testing.B) {
	trace := zipfTrace(1 << 16)
	for _, t := range []int{0, 1, 4, 8} {
		opts := Options[string, string]{}
		if t > 0 {
			tags := keyRange("tag", t)
			opts.Tags = func(string, string) []string { return tags }
		}
		b.Run("tags="+strconv.Itoa(t), func(b *testing.B) { loaderHits(b, opts, trace, false) })
	}
}

// BenchmarkInvalidateTag measures InvalidateTag with 1,000 and 1,000,000
// tagged values held (100 tags): the same, whatever the cache holds, and
// no allocation.
//
//	go test -run '^$' -bench InvalidateTag .
func BenchmarkInvalidateTag(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			l, err := New(func(_ context.Context, k string) (string, error) { return k, nil }, Options[string, string]{
				TTL: 1 << 62, MaxCost: int64(n) * 2, MaxPendingWrites: 1 << 16,
				Tags: func(k, _ string) []string { i, _ := strconv.Atoi(k); return []string{"t" + strconv.Itoa(i%100)} },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			for i := range n {
				k := strconv.Itoa(i)
				l.Set(k, k)
			}
			waitFor(b, "the writes applied", 10*60e9, func() bool { return l.Stats().PendingWrites == 0 })
			tags := keyRange("t", 100)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				l.InvalidateTag(tags[i%100])
				i++
			}
		})
	}
}

// BenchmarkTagsMemory reports the heap a tagged value costs beyond an
// untagged one (bytes/value, t tags each, 100,000 values over 1,000 tags
// held), and a tag's own state (bytes/tag, 100,000 tags of one value
// each, less that value's cost with one tag).
//
//	go test -run '^$' -bench TagsMemory -benchtime 1x .
func BenchmarkTagsMemory(b *testing.B) {
	const n = 100_000
	heap := func(tagsOf func(i int) []string) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		opts := Options[string, string]{TTL: 1 << 62, MaxCost: 4 * n, MaxPendingWrites: 1 << 16}
		if tagsOf != nil {
			opts.Tags = func(k, _ string) []string { i, _ := strconv.Atoi(k); return tagsOf(i) }
		}
		l, err := New(func(_ context.Context, k string) (string, error) { return k, nil }, opts)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		for i := range n {
			k := strconv.Itoa(i)
			l.Set(k, k)
		}
		waitFor(b, "the writes applied", 10*60e9, func() bool { return l.Stats().PendingWrites == 0 })
		if got := l.Len(); got < n*99/100 {
			b.Fatalf("%d values held; want %d", got, n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(l)
		return float64(after.HeapAlloc-before.HeapAlloc) / n
	}
	shared := keyRange("tag", 1_000)
	for b.Loop() {
		none := heap(nil)
		for _, t := range []int{1, 4, 8} {
			per := heap(func(i int) []string {
				out := make([]string, t)
				for j := range out {
					out[j] = shared[(i+j)%len(shared)]
				}
				return out
			})
			b.ReportMetric(per-none, "bytes/value-t"+strconv.Itoa(t))
		}
		one := heap(func(i int) []string { return []string{shared[i%len(shared)]} })
		own := heap(func(i int) []string { return []string{"own" + strconv.Itoa(i)} })
		b.ReportMetric(own-one, "bytes/tag")
	}
}

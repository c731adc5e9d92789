package flightcache

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The storms of docs/design.md rule 19: pending writes stay under
// Options.MaxPendingWrites whatever comes in, and no Get waits for writes
// other callers made. Each test runs on the real clock (the producers must
// truly run at once, and they never block for long, so a bubble's clock
// would never move); every Get has a deadline, so a stall fails the test at
// once rather than hanging the suite, and the bounds are on memory and on
// Gets completing, not on speed: a loaded machine runs fewer operations but
// cannot fail for being slow. BenchmarkStorm measures the latencies.

// stormFor is how long a storm test lasts.
func stormFor() time.Duration {
	if testing.Short() {
		return 500 * time.Millisecond
	}
	return 2 * time.Second
}

// stormGetDeadline bounds every Get of a storm test: far beyond what a cold
// Get of an instant LoadFunc takes even under -race on a busy machine, far
// short of the test timeout.
const stormGetDeadline = 5 * time.Second

// runFor runs f on n goroutines until d has passed, each call with its
// goroutine's index and iteration. It fails t if they have not all returned
// within d plus a margin: a producer stuck for good.
func runFor(t testing.TB, n int, d time.Duration, f func(g, i int)) {
	t.Helper()
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				f(g, i)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d + 30*time.Second):
		t.Fatalf("storm producers still running 30s after the storm ended")
	}
}

// liveHeap is the heap and the stacks in use after a collection: what is
// live, not what other goroutines allocated between the collection and the
// read (on a loaded machine the reader may wait in between), so the
// smaller of two reads.
func liveHeap() uint64 {
	v := uint64(math.MaxUint64)
	for range 2 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		v = min(v, m.HeapAlloc+m.StackInuse)
	}
	return v
}

// sampleWhile samples f every 10 ms until stop is called, keeping the
// largest value; stop returns it. Call stop on t's goroutine: it fails t
// if the sampler has not ended within patience.
func sampleWhile(t testing.TB, f func() int64) (stop func() int64) {
	var peak atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			storeMax(&peak, f())
			select {
			case <-quit:
				return
			case <-t.C:
			}
		}
	})
	return func() int64 { close(quit); waitGroup(t, "the sampler", &wg); return peak.Load() }
}

// Four goroutines Set never-seen keys as fast as they can into MaxCost
// 10,000: the pending writes, and with them the heap, stay bounded (rule
// 19). The previous writer let Sets pile up without limit: 2.4-2.9 million
// pending writes and a heap of 696-862 MB after 5 s.
func TestSetStormStaysBounded(t *testing.T) {
	l, err := New(func(_ context.Context, k uint64) ([]byte, error) { return nil, nil },
		Options[uint64, []byte]{TTL: time.Hour, MaxCost: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	base := liveHeap()
	pending := sampleWhile(t, func() int64 { return l.Stats().PendingWrites })
	heap := sampleWhile(t, func() int64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapInuse)
	})
	var keys, sets atomic.Uint64
	runFor(t, 4, stormFor(), func(int, int) {
		l.Set(keys.Add(1), make([]byte, 64))
		sets.Add(1)
	})
	peakPending, peakHeap := pending(), heap()
	const bound = 2 * DefaultMaxPendingWrites
	if peakPending > bound {
		t.Errorf("PendingWrites reached %d; want at most %d (2 × MaxPendingWrites)", peakPending, bound)
	}
	// The heap in use, garbage included, sampled without forcing a
	// collection: well under 64 MB over the start.
	if grown := peakHeap - int64(base); grown > 64<<20 {
		t.Errorf("heap in use grew by %d MB during the storm; want under 64 MB", grown>>20)
	}
	s := l.Stats()
	t.Logf("%d Sets in %v (%.0f/s), %d waited their turn; peak PendingWrites %d, heap in use +%d MB",
		sets.Load(), stormFor(), float64(sets.Load())/stormFor().Seconds(), s.WriteWaits, peakPending, (peakHeap-int64(base))>>20)
}

// coldGets runs cold Gets of never-seen keys of l on one goroutine until d
// has passed, each under stormGetDeadline; it fails t for any error (a
// stall ends at the deadline) and returns their latencies.
func coldGets(t testing.TB, l *Loader[uint64, []byte], first uint64, d time.Duration) []time.Duration {
	t.Helper()
	var lat []time.Duration
	stop := time.Now().Add(d)
	for k := first; time.Now().Before(stop); k++ {
		ctx, cancel := context.WithTimeout(context.Background(), stormGetDeadline)
		start := time.Now()
		_, err := l.Get(ctx, k)
		lat = append(lat, time.Since(start))
		cancel()
		if err != nil { // on a goroutine of the test's: Errorf, then stop
			t.Errorf("cold Get of key %d during the storm: %v after %v", k, err, lat[len(lat)-1])
			break
		}
	}
	return lat
}

// quantile returns the q-quantile of sorted latencies.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

func newStormLoader(t testing.TB) *Loader[uint64, []byte] {
	t.Helper()
	l, err := New(func(_ context.Context, k uint64) ([]byte, error) { return make([]byte, 64), nil },
		Options[uint64, []byte]{TTL: time.Hour, MaxCost: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Cold Gets go on while two goroutines Set never-seen keys, on the same
// Loader and, as the control, on another one (rule 19: a Get never waits
// for other callers' writes). The previous write path made a finished load
// wait for the writer before it woke its waiters, and the Sets kept the
// writer behind: 2 to 19 cold Gets in 3 s, each ending at its deadline.
func TestColdGetsDuringSetStorm(t *testing.T) {
	for _, where := range []string{"same-loader", "other-loader"} {
		t.Run(where, func(t *testing.T) {
			l := newStormLoader(t)
			defer l.Close()
			target := l
			if where == "other-loader" {
				target = newStormLoader(t)
				defer target.Close()
			}
			var keys atomic.Uint64
			keys.Store(1 << 40) // apart from the Gets' keys
			var lat []time.Duration
			var wg sync.WaitGroup
			wg.Go(func() { lat = coldGets(t, l, 0, stormFor()) })
			runFor(t, 2, stormFor(), func(int, int) { target.Set(keys.Add(1), make([]byte, 64)) })
			waitGroup(t, "the cold Gets", &wg)
			slices.Sort(lat)
			t.Logf("%s: %d cold Gets, p99.9 %v, max %v; %d Sets", where, len(lat), quantile(lat, 0.999), quantile(lat, 1), keys.Load()-1<<40)
		})
	}
}

// Cold Gets go on while two goroutines loop Set and Invalidate over 256
// keys (rule 19). Before, the loop kept the writer's backlog above the
// point where finished loads waited for it: p99.9 of the cold Gets was 94
// times its quiet value.
func TestColdGetsDuringSetInvalidateLoop(t *testing.T) {
	l := newStormLoader(t)
	defer l.Close()
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() { lat = coldGets(t, l, 1<<40, stormFor()) })
	runFor(t, 2, stormFor(), func(g, i int) {
		k := uint64(i % 256)
		if g == 0 {
			l.Set(k, make([]byte, 64))
		} else {
			l.Invalidate(k)
		}
	})
	waitGroup(t, "the cold Gets", &wg)
	slices.Sort(lat)
	t.Logf("%d cold Gets, p99.9 %v, max %v", len(lat), quantile(lat, 0.999), quantile(lat, 1))
}

// A GetMany of many never-seen keys (each its own instant load, no
// LoadMany) must not hold up an unrelated cold Get (rule 19). Before, every
// finished load of the batch waited in a herd for the writer's backlog, and
// an unrelated Get with a LoadTimeout of 100 ms waited 12.7 s.
func TestMissStormBesideAnUnrelatedGet(t *testing.T) {
	n := 100_000
	if testing.Short() || raceEnabled {
		n = 20_000
	}
	l, err := New(func(_ context.Context, k uint64) ([]byte, error) { return make([]byte, 64), nil },
		Options[uint64, []byte]{TTL: time.Hour, MaxCost: 10_000, LoadTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i)
	}
	batch := make(chan error, 1)
	go func() {
		_, err := l.GetMany(context.Background(), keys)
		batch <- err
	}()
	var worst time.Duration
	for i := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), stormGetDeadline)
		start := time.Now()
		_, err := l.Get(ctx, uint64(1<<40+i))
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Fatalf("unrelated Get %d during a GetMany of %d keys: %v after %v", i, n, err, took)
		}
		worst = max(worst, took)
	}
	// The GetMany takes what the machine gives it (68s once on a loaded
	// one): it fails only when its loads stop for patience. Loads counts
	// the 8 unrelated Gets' too.
	waitProgress(t, "keys of the GetMany not loaded", patience, func() int64 { return int64(n+8) - int64(l.Stats().Loads) })
	err = recv(t, "the GetMany's return once its keys are loaded", batch)
	if err != nil {
		t.Fatalf("GetMany of %d keys: %v", n, err)
	}
	s := l.Stats()
	t.Logf("GetMany of %d keys; slowest of 8 unrelated Gets %v; %d fills dropped", n, worst, s.FillsDropped)
}

// Many concurrent cold Gets of an instant LoadFunc take time linear in
// their number: nothing herds (rule 19). Each Get has a deadline.
func TestConcurrentColdGetsDoNotHerd(t *testing.T) {
	n := 50_000
	if testing.Short() || raceEnabled {
		n = 5_000
	}
	l := newStormLoader(t)
	defer l.Close()
	var wg sync.WaitGroup
	var left atomic.Int64 // Gets not returned yet
	left.Store(int64(n))
	errs := make(chan error, 1)
	for i := range n {
		wg.Go(func() {
			defer left.Add(-1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := l.Get(ctx, uint64(i)); err != nil {
				select {
				case errs <- fmt.Errorf("Get(%d): %w", i, err):
				default:
				}
			}
		})
	}
	waitProgress(t, "cold Gets not returned", patience, left.Load)
	waitGroup(t, "the cold Gets", &wg)
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if p := l.Stats().PendingWrites; p > 2*DefaultMaxPendingWrites {
		t.Errorf("PendingWrites = %d; want at most %d", p, 2*DefaultMaxPendingWrites)
	}
}

// BenchmarkStorm measures rule 19's storms for docs/reliability.md: one op
// is one cold Get of a never-seen key (instant LoadFunc) while, in the
// background,
//
//   - quiet: nothing else runs;
//   - sets=same: two goroutines Set never-seen keys on the same Loader;
//   - sets=other: the same storm on another Loader (the same competition
//     for the CPU, nothing shared but the process): the control;
//   - loop=same: two goroutines loop Set and Invalidate over 256 keys of
//     the same Loader;
//   - loop=other: the same loop on another Loader: its control.
//
// It reports the Gets' p99.9 and max latency and the storm's writes per
// second. Compare the rows of one run, interleaved, e.g.
//
//	go test -run '^$' -bench Storm -benchtime 100000x -count 6 .
func BenchmarkStorm(b *testing.B) {
	for _, storm := range []string{"quiet", "sets=same", "sets=other", "loop=same", "loop=other"} {
		b.Run(storm, func(b *testing.B) {
			l := newStormLoader(b)
			defer l.Close()
			target := l
			loop := strings.HasPrefix(storm, "loop")
			if strings.HasSuffix(storm, "=other") {
				target = newStormLoader(b)
				defer target.Close()
			}
			var stop atomic.Bool
			var writes atomic.Uint64
			var wg sync.WaitGroup
			if storm != "quiet" {
				for g := range 2 {
					wg.Go(func() {
						k := uint64(1<<40) + uint64(g)<<32
						for i := 0; !stop.Load(); i++ {
							switch {
							case !loop:
								k++
								target.Set(k, make([]byte, 64))
							case g == 0:
								target.Set(uint64(i%256), make([]byte, 64))
							default:
								target.Invalidate(uint64(i % 256))
							}
							writes.Add(1)
						}
					})
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				ctx, cancel := context.WithTimeout(context.Background(), stormGetDeadline)
				t0 := time.Now()
				_, err := l.Get(ctx, uint64(i))
				lat = append(lat, time.Since(t0))
				cancel()
				if err != nil {
					b.Fatalf("cold Get %d: %v", i, err)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(quantile(lat, 0.999)), "p99.9-ns")
			b.ReportMetric(float64(quantile(lat, 1)), "max-ns")
			b.ReportMetric(float64(writes.Load())/elapsed.Seconds(), "writes/s")
		})
	}
}

// BenchmarkColdBurst is n concurrent cold Gets of an instant LoadFunc, one
// burst per op: time linear in n means nothing herds (rule 19).
func BenchmarkColdBurst(b *testing.B) {
	for _, n := range []int{5_000, 20_000, 50_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				l := newStormLoader(b)
				b.StartTimer()
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if _, err := l.Get(ctx, uint64(i)); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				l.Close()
				b.StartTimer()
			}
		})
	}
}

// A miss storm of distinct keys must hold no more than MaxCost allows,
// plus what the callers hold (docs/design.md rule 10). Loads used to wake
// their waiters and then wait, each on its own goroutine holding its value,
// for ristretto's single goroutine to apply their writes: callers moving on
// to new keys outpaced it and thousands of goroutines piled up (with 64 KiB
// values and MaxCost 100, 6.4 MB, the live heap reached 120-170 MB). Today a
// finishing load never waits: its write takes a place of the fills' share
// (Options.MaxPendingWrites, at most MaxCost of cost), or is not cached
// when none is free (docs/design.md rule 19).
//
// Real clock: the storm must outpace ristretto's goroutine and the writer
// with callers running truly at once, and the callers never block, so a
// bubble's clock would never move. The duration is only how long the storm
// lasts; the bounds are on goroutines and memory, not on time, so a loaded
// machine runs fewer Gets but cannot fail for being slow.
func TestMissStormIsBoundedByMaxCost(t *testing.T) {
	const (
		callers   = 32
		valueSize = 64 << 10
		maxCost   = 100
	)
	dur := 2 * time.Second
	if testing.Short() {
		dur = time.Second
	}
	l, err := New(func(context.Context, int) ([]byte, error) { return make([]byte, valueSize), nil },
		Options[int, []byte]{TTL: time.Hour, MaxCost: maxCost})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	base := runtime.NumGoroutine()
	// What other tests of the process keep live (package fixtures, under
	// -shuffle any of them first) is not the storm's: the bound is on the
	// growth from here.
	baseMem := liveHeap()

	var peakG, peakInFlight atomic.Int64
	var peakMem atomic.Uint64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			storeMax(&peakG, int64(runtime.NumGoroutine()))
			storeMax(&peakInFlight, l.Stats().InFlight)
			if i%10 == 0 {
				if v := liveHeap(); v > peakMem.Load() {
					peakMem.Store(v)
				}
			}
		}
	})
	var next atomic.Int64
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for time.Now().Before(end) {
				l.Get(context.Background(), int(next.Add(1)))
			}
		})
	}
	waitGroup(t, "the storm's callers", &wg)
	close(stop)
	waitGroup(t, "the sampler", &sampler)

	// By design: the callers, the sampler, one load per caller waiting and
	// one per caller finishing; no background refreshes here.
	maxG := base + 1 + 3*callers + 16
	maxMem := baseMem + uint64((maxCost+2*callers)*valueSize) + 48<<20
	t.Logf("%d Gets in %v: peak goroutines %d (bound %d), peak Stats.InFlight %d, peak live heap+stacks %.0f MB (bound %.0f MB: %.0f MB live before the storm)",
		next.Load(), dur, peakG.Load(), maxG, peakInFlight.Load(), float64(peakMem.Load())/(1<<20), float64(maxMem)/(1<<20), float64(baseMem)/(1<<20))
	if int(peakG.Load()) > maxG {
		t.Errorf("%d goroutines at once with %d callers; want at most %d: finished loads wait on ristretto's write buffer, unbounded",
			peakG.Load(), callers, maxG)
	}
	if peakMem.Load() > maxMem {
		t.Errorf("live heap and stacks peaked at %.0f MB; want at most %.0f MB with MaxCost %d × %d KiB values and %d callers",
			float64(peakMem.Load())/(1<<20), float64(maxMem)/(1<<20), maxCost, valueSize>>10, callers)
	}
}

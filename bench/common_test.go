package bench

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"go.uber.org/goleak"
)

// TestMain checks that every cache and loader a benchmark created was closed
// and left no goroutine behind. When benchmarks run, it first prints, as
// benchfmt configuration lines, what the report needs and the benchmark
// output lacks: the Go version, GOMAXPROCS and the flags of this run.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		fmt.Printf("goversion: %s\n", runtime.Version())
		fmt.Printf("gomaxprocs: %d\n", runtime.GOMAXPROCS(0))
		fmt.Printf("benchflags: %s\n", benchFlags())
	}
	goleak.VerifyTestMain(m)
}

// benchFlags rebuilds the go test flags of this run from the test binary's.
func benchFlags() string {
	var parts []string
	flag.Visit(func(f *flag.Flag) {
		name, ok := strings.CutPrefix(f.Name, "test.")
		switch {
		case !ok && f.Name == "walltrace":
			parts = append(parts, "-walltrace "+f.Value.String())
		case ok && slices.Contains([]string{"run", "bench", "benchmem", "benchtime", "count", "cpu", "timeout"}, name):
			v := f.Value.String()
			if name == "benchmem" {
				parts = append(parts, "-benchmem")
				break
			}
			if strings.ContainsAny(v, "^$*|()[] ") {
				v = "'" + v + "'"
			}
			parts = append(parts, "-"+name+" "+v)
		}
	})
	return strings.Join(parts, " ")
}

// wallTrace, if set, is a directory where the expiry-wall benchmark writes
// the latency of every Get, one CSV file per implementation, for the charts
// of cmd/report.
var wallTrace = flag.String("walltrace", "", "directory for the per-Get latency traces of BenchmarkExpiryWall")

const (
	hitKeys   = 100_000 // keys of the hit-path working set
	zipfS     = 1.01    // Zipf exponent of the hit-path trace
	traceLen  = 1 << 20 // precomputed accesses; a power of two
	longTTL   = time.Hour
	valueSize = 64 // bytes of the value every key maps to
)

// value is what every key maps to: one shared payload, so that memory
// figures measure per-entry bookkeeping, not the payloads.
var value = string(make([]byte, valueSize))

// makeKeys returns n distinct string keys.
func makeKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "key:" + strconv.Itoa(i)
	}
	return keys
}

// zipfTrace returns traceLen key indexes in [0, n) drawn from Zipf(s), with
// a fixed seed so every implementation replays the same accesses. The most
// popular index is 0.
func zipfTrace(n int, s float64) []uint32 {
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, s, 1, uint64(n-1))
	t := make([]uint32, traceLen)
	for i := range t {
		t[i] = uint32(z.Uint64())
	}
	return t
}

// uniformTrace returns traceLen key indexes drawn uniformly from [0, n).
func uniformTrace(n int) []uint32 {
	r := rand.New(rand.NewPCG(3, 4))
	t := make([]uint32, traceLen)
	for i := range t {
		t[i] = uint32(r.IntN(n))
	}
	return t
}

// downstream is an instant (or slow, with delay) fake service that counts
// its calls.
type downstream struct {
	delay  time.Duration
	calls  atomic.Int64 // calls started
	inside atomic.Int64 // calls running now
}

func (d *downstream) load(ctx context.Context, key string) (string, error) {
	d.calls.Add(1)
	d.inside.Add(1)
	defer d.inside.Add(-1)
	if d.delay > 0 {
		t := time.NewTimer(d.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return value, nil
}

// fetch is load in sturdyc's FetchFn shape, for one key.
func (d *downstream) fetch(key string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) { return d.load(ctx, key) }
}

// quiesce waits until no call is running: libraries whose background
// refreshes are not owned by a Close (sturdyc) finish them here, before
// goleak looks. A call still running after pollTimeout fails tb.
func (d *downstream) quiesce(tb testing.TB) {
	tb.Helper()
	retryUntil(tb, "every downstream call to return", func() bool { return d.inside.Load() == 0 }, sleepMs)
	time.Sleep(time.Millisecond) // let the goroutine that made the call store its result and exit
}

// pollTimeout bounds every wait of the benchmarks' setup and teardown for
// something to happen (retryUntil): past it the benchmark fails, saying
// what it waited for, instead of running on into the whole run's timeout.
const pollTimeout = time.Minute

// retryUntil calls try until it reports true, calling between after each
// failed try, and fails tb if that takes longer than pollTimeout. A try
// that succeeds at once costs one call: the clock is read only after a
// failure.
func retryUntil(tb testing.TB, what string, try func() bool, between func()) {
	tb.Helper()
	var deadline time.Time
	for !try() {
		switch now := time.Now(); {
		case deadline.IsZero():
			deadline = now.Add(pollTimeout)
		case now.After(deadline):
			tb.Fatalf("waited %v for %s: it did not happen", pollTimeout, what)
		}
		between()
	}
}

// sleepMs is retryUntil's pause between polls of a condition.
func sleepMs() { time.Sleep(time.Millisecond) }

// once caches the result of an expensive setup shared by benchmarks.
type once[T any] struct {
	sync.Once
	v T
}

func (o *once[T]) get(f func() T) T {
	o.Do(func() { o.v = f() })
	return o.v
}

// fillLoader caches value under key(0) … key(n-1) in l and returns once
// every one of them is in the cache.
//
// Set alone does not guarantee that: a Set hands its write to ristretto
// later, and ristretto's admission policy may refuse it (Stats.SetsRejected);
// before the writer re-issued what ristretto's set buffer refused
// (Stats.SetsDropped), a burst of a million Sets also lost some. So
// after the Sets, fillLoader Gets every key, which loads and caches again
// any key that was dropped, and goes round until one whole pass finds
// every key (no Get missed) and no write was dropped meanwhile nor in the
// 10 ms after it; or until a
// pass where ristretto's admission policy refused fills, and dropped none,
// misses no fewer keys than the one before (a cache filled to exactly its
// capacity); or after maxFillPasses. It returns how many Gets of its last
// pass missed.
//
// fillLoader is compiled against older cores too (compare.sh), so it reads
// Stats.PendingWrites only where that field exists (pendingWrites).
func fillLoader[K comparable](b *testing.B, l *flightcache.Loader[K, string], n int, key func(int) K) (missed uint64) {
	b.Helper()
	for i := range n {
		l.Set(key(i), value)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
	defer cancel()
	before := uint64(n) + 1
	for pass := 1; ; pass++ {
		// Let the writer apply what is pending: a Get of a key whose write
		// is pending is answered from it, on the slower locked path, and
		// the writer's work would run on into the measurement.
		retryUntil(b, "the writer to apply every pending write", func() bool { return pendingWrites(l.Stats()) == 0 }, sleepMs)
		s0 := l.Stats()
		for i := range n {
			if _, err := l.Get(ctx, key(i)); err != nil {
				b.Fatal(err)
			}
		}
		s1 := l.Stats()
		missed = s1.Misses - s0.Misses
		dropped := s1.SetsDropped != s0.SetsDropped
		rejected := s1.SetsRejected != s0.SetsRejected
		switch {
		case missed == 0 && !dropped:
			// A write still on its way to ristretto could yet be dropped:
			// give the writer a moment, and go round again if it was.
			time.Sleep(10 * time.Millisecond)
			if l.Stats().SetsDropped == s1.SetsDropped {
				return 0
			}
		case pass == maxFillPasses, rejected && !dropped && missed >= before:
			return missed
		}
		before = missed
	}
}

const maxFillPasses = 10

// pendingWrites is s.PendingWrites, or 0 on a core whose Stats has no such
// field (one older than the writer): compare.sh runs these benchmarks on
// earlier cores as well.
func pendingWrites(s flightcache.Stats) int64 {
	if f := reflect.ValueOf(s).FieldByName("PendingWrites"); f.IsValid() {
		return f.Int()
	}
	return 0
}

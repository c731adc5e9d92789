package flightcache

import (
	"context"
	"errors"
	"flag"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loadDuration is how long TestLoadFigure drives the Loader.
var loadDuration = flag.Duration("load.duration", 10*time.Second, "how long TestLoadFigure runs")

const (
	loadWorkers  = 256
	loadKeys     = 100_000
	loadMaxCost  = 10_000 // a tenth of the keys: misses keep happening
	loadCapacity = 50     // downstream calls it serves at once; the rest queue
	loadMinLat   = time.Millisecond
	loadMaxLat   = 20 * time.Millisecond
)

// TestLoadFigure measures a Loader under a steady mixed load, in real time,
// and reports the figures (-v): 256 goroutines Get 100,000 keys (Zipf
// s=1.1) as fast as they can, through a cache of 10,000 entries, in front
// of a downstream that serves at most 50 calls at once, each taking
// 1–20ms. Then Close comes, under load. It asserts invariants only, never
// timings: every Get returns a value of its key (or ErrClosed once Close
// has begun), the downstream never runs more than 50 calls at once, no key
// is loaded twice at once, no more loads run than goroutines wait on them,
// and Stats agree with what the Gets saw. Skipped with -short.
func TestLoadFigure(t *testing.T) {
	if *loadDuration <= 0 {
		t.Skip("-load.duration is 0")
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "load.duration" })
	if testing.Short() && !set {
		t.Skip("-short without -load.duration")
	}

	d := &loadDownstream{sem: make(chan struct{}, loadCapacity), perKey: make([]atomic.Int32, loadKeys)}
	l, err := New(d.load, Options[int, loadVal]{TTL: time.Hour, MaxCost: loadMaxCost})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	var (
		closeStart atomic.Int64 // since start; 0 until Close is called
		bad        atomic.Int64
		workers    sync.WaitGroup
		results    [loadWorkers]loadWorker
	)
	report := func(format string, args ...any) {
		if bad.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}
	start := time.Now()
	end := start.Add(*loadDuration)
	for w := range loadWorkers {
		workers.Go(func() {
			r := &results[w]
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			zipf := rand.NewZipf(rng, 1.1, 1, loadKeys-1)
			for {
				key := int(zipf.Uint64())
				t0 := time.Now()
				v, info, err := l.GetInfo(context.Background(), key)
				ret := time.Now()
				r.gets++
				switch {
				case err == nil && v.key == key:
					r.sources[info.Source]++
				case err == nil:
					report("Get(%d) = %+v; want a value of key %d", key, v, key)
				case errors.Is(err, ErrClosed) && closeStart.Load() != 0:
					r.closed++
					if info.Source == SourceNone {
						return // refused: the Loader is closed
					}
					r.sources[info.Source]++ // its load was stopped by Close
					continue
				default:
					report("Get(%d) = %v, %v; want a value (or ErrClosed once Close has begun)", key, info.Source, err)
					return
				}
				if ret.Before(end) {
					lat := ret.Sub(t0)
					r.all.add(lat)
					if info.Source != SourceHit {
						r.missed.add(lat)
					}
				}
			}
		})
	}

	time.Sleep(time.Until(end))
	closeStart.Store(int64(time.Since(start)))
	t1 := time.Now()
	l.Close() // under load
	closeTook := time.Since(t1)
	if n, s := d.inside.Load(), l.Stats(); n != 0 || s.InFlight != 0 {
		t.Errorf("Close returned with %d LoadFuncs running, Stats.InFlight %d", n, s.InFlight)
	}
	waitOrDump(t, &workers, 30*time.Second, "load workers after Close")

	var sum loadWorker
	for i := range results {
		sum.merge(&results[i])
	}
	s := l.Stats()
	secs := loadDuration.Seconds()
	t.Logf("load: %v, %d goroutines, %d keys (Zipf s=1.1), MaxCost %d, downstream %v–%v behind %d slots, GOMAXPROCS %d, race %v",
		*loadDuration, loadWorkers, loadKeys, loadMaxCost, loadMinLat, loadMaxLat, loadCapacity, runtime.GOMAXPROCS(0), raceEnabled)
	t.Logf("Gets/s %.0f; latency p50 %v, p99 %v, max %v; of misses p50 %v, p99 %v; hit ratio %.1f%%",
		float64(sum.all.count)/secs, sum.all.quantile(0.5), sum.all.quantile(0.99), round3(sum.all.max),
		sum.missed.quantile(0.5), sum.missed.quantile(0.99), 100*float64(sum.all.count-sum.missed.count)/float64(sum.all.count))
	t.Logf("loads %d (%.0f/s), shared %d, peak downstream concurrency %d (LoadFuncs running at once %d); evicted %d, sets rejected %d, dropped %d; "+
		"Close under load took %v, %d Gets got ErrClosed",
		s.Loads, float64(s.Loads)/secs, s.Shared, d.peakDown.Load(), d.peakCalls.Load(), s.Evicted, s.SetsRejected, s.SetsDropped,
		closeTook.Round(time.Microsecond), sum.closed)

	if p := d.peakDown.Load(); p > loadCapacity {
		t.Errorf("peak downstream concurrency %d; the downstream serves at most %d", p, loadCapacity)
	}
	if p := d.peakCalls.Load(); p > loadWorkers {
		t.Errorf("%d LoadFuncs ran at once; want at most one per goroutine waiting (%d): no deadlines, no refreshes", p, loadWorkers)
	}
	if n := d.overlaps.Load(); n > 0 {
		t.Errorf("%d times a key was loaded while a load of it ran; want one load per key at a time", n)
	}
	want := Stats{
		Gets: sum.gets, Hits: sum.sources[SourceHit], Shared: sum.sources[SourceShared],
		Loads: uint64(d.calls.Load()), LoadErrors: uint64(d.errs.Load()),
	}
	got := Stats{Gets: s.Gets, Hits: s.Hits, Shared: s.Shared, Loads: s.Loads, LoadErrors: s.LoadErrors}
	if got != want {
		t.Errorf("Stats = %+v;\nthe Gets and the downstream saw %+v", got, want)
	}
	if s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed || s.InFlight != 0 || s.Waiting != 0 ||
		s.StaleHits+s.StaleOnError+s.Canceled+s.Refreshes+s.Panics+s.Retries != 0 {
		t.Errorf("Stats after Close = %+v; want Gets = Hits + StaleHits + Misses + Closed, nothing in flight or waiting, "+
			"no stale, canceled, refresh, panic or retry", s)
	}
	if sum.all.count == 0 || sum.missed.count == 0 || sum.missed.count == sum.all.count {
		t.Errorf("%d Gets measured, %d of them misses; want both hits and misses", sum.all.count, sum.missed.count)
	}
}

// loadVal is the value the load figure's downstream returns.
type loadVal struct {
	key int
	n   int64
}

// loadDownstream serves at most loadCapacity calls at once (the others
// queue for a slot), each taking loadMinLat–loadMaxLat, and watches its
// concurrency.
type loadDownstream struct {
	sem       chan struct{}
	perKey    []atomic.Int32 // calls of each key running
	calls     atomic.Int64
	errs      atomic.Int64 // calls that returned an error (stopped by Close)
	overlaps  atomic.Int64 // calls that began while one of the same key ran
	running   atomic.Int64 // LoadFuncs running, queued for a slot or not
	inside    atomic.Int64 // LoadFuncs holding a slot
	peakCalls atomic.Int64
	peakDown  atomic.Int64
}

func (d *loadDownstream) load(ctx context.Context, key int) (v loadVal, err error) {
	n := d.calls.Add(1)
	if d.perKey[key].Add(1) > 1 {
		d.overlaps.Add(1)
	}
	defer d.perKey[key].Add(-1)
	storeMax(&d.peakCalls, d.running.Add(1))
	defer d.running.Add(-1)
	defer func() {
		if err != nil {
			d.errs.Add(1)
		}
	}()
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return v, ctx.Err()
	}
	defer func() { <-d.sem }()
	storeMax(&d.peakDown, d.inside.Add(1))
	defer d.inside.Add(-1)
	tm := time.NewTimer(loadMinLat + rand.N(loadMaxLat-loadMinLat))
	defer tm.Stop()
	select {
	case <-tm.C:
		return loadVal{key: key, n: n}, nil
	case <-ctx.Done():
		return v, ctx.Err()
	}
}

// loadWorker is what one goroutine of the load figure saw.
type loadWorker struct {
	gets, closed uint64
	sources      [SourceShared + 1]uint64 // Gets that returned a value, by Source
	all, missed  latencies                // Gets that returned a value before the end
}

func (w *loadWorker) merge(o *loadWorker) {
	w.gets += o.gets
	w.closed += o.closed
	for i := range w.sources {
		w.sources[i] += o.sources[i]
	}
	w.all.merge(&o.all)
	w.missed.merge(&o.missed)
}

// latencies is a histogram of durations with 32 buckets per power of two
// (each about 3% wide), so quantiles need no list of samples.
type latencies struct {
	n     [40 * 32]uint64 // up to 2^40ns, about 18 minutes
	count uint64
	max   time.Duration
}

func (h *latencies) add(d time.Duration) {
	v := uint64(max(d, 1))
	e := bits.Len64(v) - 1 // 2^e <= v < 2^(e+1)
	var sub uint64
	if e >= 5 {
		sub = v >> (e - 5) & 31
	} else {
		sub = v << (5 - e) & 31
	}
	h.n[min(e*32+int(sub), len(h.n)-1)]++
	h.count++
	h.max = max(h.max, d)
}

func (h *latencies) merge(o *latencies) {
	for i, c := range o.n {
		h.n[i] += c
	}
	h.count += o.count
	h.max = max(h.max, o.max)
}

// quantile returns the upper bound of the bucket holding quantile q,
// at most the largest duration seen.
func (h *latencies) quantile(q float64) time.Duration {
	target := uint64(math.Ceil(q * float64(h.count)))
	var seen uint64
	for i, c := range h.n {
		if seen += c; seen >= max(target, 1) {
			e, sub := i/32, i%32
			upper := time.Duration(math.Ldexp(float64(33+sub)/32, e))
			return round3(min(upper, h.max))
		}
	}
	return round3(h.max)
}

// round3 rounds d to three significant digits, for the log.
func round3(d time.Duration) time.Duration {
	m := time.Duration(1)
	for d/m >= 1000 {
		m *= 10
	}
	return d.Round(m)
}

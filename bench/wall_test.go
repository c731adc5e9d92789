package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache"
	"github.com/maypok86/otter/v2"
	"github.com/viccon/sturdyc"
	xsingleflight "golang.org/x/sync/singleflight"
)

// The expiry wall: one hot key, TTL 200 ms, a downstream that takes 50 ms,
// 8 readers for 3 s. A cache with a TTL and nothing else makes every reader
// that arrives while the key reloads wait for the reload: a wall of slow
// requests every TTL. Each reader asks once per millisecond (sleeping in
// between, like a request handler, so that CPU contention on a small
// machine does not pass for cache latency), and every Get's latency is
// recorded.
//
// This is a timed scenario, not a throughput benchmark: each run plays it
// once, whatever b.N. Its metrics are
//
//	ns/op      mean Get latency
//	max-ms     the slowest Get
//	p99-us     99th percentile Get latency
//	slow-gets  Gets slower than 40 ms
//	calls      downstream calls during the 3 s (the warm-up load excluded)
//
// With -walltrace DIR, every Get of the run is written to DIR/<impl>.csv
// (milliseconds since the start, latency in microseconds) for the chart.

const (
	wallTTL      = 200 * time.Millisecond
	wallLoad     = 50 * time.Millisecond
	wallReaders  = 8
	wallDuration = 3 * time.Second
	wallInterval = time.Millisecond // between one reader's Gets
	wallSlow     = 40 * time.Millisecond
	wallKey      = "hot"
)

// wallImpl builds one contender on d; get asks for the hot key.
type wallImpl struct {
	name string
	new  func(b *testing.B, d *downstream) (get func(ctx context.Context) error, close func())
}

var wallImpls = []wallImpl{
	{"ristretto-singleflight-ttl", newWallRistretto},
	{"otter-refresh-after", newWallOtter},
	{"sturdyc-early-refresh", newWallSturdyc},
	{"flightcache-swr", func(b *testing.B, d *downstream) (func(context.Context) error, func()) {
		return newWallFlightcache(b, d, flightcache.Options[string, string]{
			TTL:                  wallTTL,
			StaleWhileRevalidate: time.Second,
		})
	}},
	{"flightcache-early-refresh", func(b *testing.B, d *downstream) (func(context.Context) error, func()) {
		return newWallFlightcache(b, d, flightcache.Options[string, string]{
			TTL:          wallTTL,
			EarlyRefresh: 1,
		})
	}},
}

// newWallRistretto is the cache-aside most code starts with, done with
// care: ristretto with a TTL, x/sync singleflight around the load, a second
// look at the cache inside the flight (a caller that missed just as the
// previous flight ended must not load again), and Wait after the fill so
// that the next Get sees it. No refresh of any kind.
func newWallRistretto(b *testing.B, d *downstream) (func(context.Context) error, func()) {
	c, err := ristretto.NewCache(&ristretto.Config[string, string]{
		NumCounters: 1000, MaxCost: 100, BufferItems: 64, IgnoreInternalCost: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	var g xsingleflight.Group
	get := func(ctx context.Context) error {
		if _, ok := c.Get(wallKey); ok {
			return nil
		}
		_, err, _ := g.Do(wallKey, func() (any, error) {
			if v, ok := c.Get(wallKey); ok { // filled by the call that just left
				return v, nil
			}
			v, err := d.load(ctx, wallKey)
			if err == nil {
				c.SetWithTTL(wallKey, v, 1, wallTTL)
				c.Wait()
			}
			return v, err
		})
		return err
	}
	return get, c.Close
}

// newWallOtter expires entries 200 ms after their write and refreshes them
// in the background once they are 100 ms old, so that a 50 ms reload lands
// well before expiry. (With a refresh at 150 ms, a reload that lands just
// after expiry makes otter discard the Get's own load and load again.)
func newWallOtter(b *testing.B, d *downstream) (func(context.Context) error, func()) {
	c, err := otter.New(&otter.Options[string, string]{
		MaximumSize:       100,
		ExpiryCalculator:  otter.ExpiryWriting[string, string](wallTTL),
		RefreshCalculator: otter.RefreshWriting[string, string](wallTTL / 2),
	})
	if err != nil {
		b.Fatal(err)
	}
	var loader otter.Loader[string, string] = otter.LoaderFunc[string, string](d.load)
	get := func(ctx context.Context) error {
		_, err := c.Get(ctx, wallKey, loader)
		return err
	}
	return get, func() {
		d.quiesce(b)
		c.StopAllGoroutines()
	}
}

// newWallSturdyc keeps entries 200 ms and refreshes them in the background
// at a random age between 100 and 150 ms. Its retry base delay is also the
// pause before another Get may start a second refresh of the same entry,
// so it is set above the load time: with 10 ms, a 50 ms reload is started
// three or four times.
func newWallSturdyc(b *testing.B, d *downstream) (func(context.Context) error, func()) {
	c := sturdyc.New[string](100, 1, wallTTL, 10,
		sturdyc.WithNoContinuousEvictions(),
		sturdyc.WithEarlyRefreshes(wallTTL/2, wallTTL-wallLoad, wallTTL, wallTTL/2))
	fetch := d.fetch(wallKey)
	get := func(ctx context.Context) error {
		_, err := c.GetOrFetch(ctx, wallKey, fetch)
		return err
	}
	// sturdyc's background refreshes run on goroutines it does not track:
	// wait for the last one to finish.
	return get, func() { d.quiesce(b) }
}

func newWallFlightcache(b *testing.B, d *downstream, opts flightcache.Options[string, string]) (func(context.Context) error, func()) {
	l, err := flightcache.New(d.load, opts)
	if err != nil {
		b.Fatal(err)
	}
	get := func(ctx context.Context) error {
		_, err := l.Get(ctx, wallKey)
		return err
	}
	return get, func() { l.Close() }
}

func BenchmarkExpiryWall(b *testing.B) {
	for _, impl := range wallImpls {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			var r wallResult
			played := false
			for b.Loop() {
				if !played { // one 3 s scenario per run, whatever b.N
					r = playWall(b, impl)
					played = true
				}
			}
			r.report(b)
			if *wallTrace != "" {
				if err := r.write(filepath.Join(*wallTrace, impl.name+".csv")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// wallGet is one Get of the scenario.
type wallGet struct {
	at      time.Duration // since the start
	latency time.Duration
}

type wallResult struct {
	gets  []wallGet
	calls int64
}

func playWall(b *testing.B, impl wallImpl) wallResult {
	d := &downstream{delay: wallLoad}
	get, closeImpl := impl.new(b, d)
	defer closeImpl()
	ctx := context.Background()
	if err := get(ctx); err != nil { // warm up: the key is cached when the readers start
		b.Fatal(err)
	}
	warm := d.calls.Load()

	per := make([][]wallGet, wallReaders)
	var wg sync.WaitGroup
	begin := time.Now()
	for r := range wallReaders {
		wg.Go(func() {
			gets := make([]wallGet, 0, int(wallDuration/wallInterval)+16)
			// Spread the readers over one interval.
			next := begin.Add(time.Duration(r) * wallInterval / wallReaders)
			for {
				time.Sleep(time.Until(next))
				t0 := time.Now()
				if t0.Sub(begin) >= wallDuration {
					break
				}
				if err := get(ctx); err != nil {
					b.Error(err)
					return
				}
				gets = append(gets, wallGet{at: t0.Sub(begin), latency: time.Since(t0)})
				next = t0.Add(wallInterval)
			}
			per[r] = gets
		})
	}
	wg.Wait()
	res := wallResult{calls: d.calls.Load() - warm}
	for _, g := range per {
		res.gets = append(res.gets, g...)
	}
	slices.SortFunc(res.gets, func(a, b wallGet) int { return int(a.at - b.at) })
	return res
}

func (r wallResult) report(b *testing.B) {
	if len(r.gets) == 0 {
		return
	}
	lat := make([]time.Duration, len(r.gets))
	var sum time.Duration
	slow := 0
	for i, g := range r.gets {
		lat[i] = g.latency
		sum += g.latency
		if g.latency > wallSlow {
			slow++
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(sum.Nanoseconds())/float64(len(lat)), "ns/op")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(slow), "slow-gets")
	b.ReportMetric(float64(r.calls), "calls")
}

// write saves every Get as "ms since start,latency in µs".
func (r wallResult) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "at_ms,latency_us")
	for _, g := range r.gets {
		fmt.Fprintf(w, "%.3f,%.1f\n", float64(g.at.Microseconds())/1000, float64(g.latency.Nanoseconds())/1000)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errBoom = errors.New("boom")

// slow is a fake downstream: every call sleeps delay (virtual time inside a
// synctest bubble), then returns the key, ErrNotFound for "missing", or
// fail's error.
type slow struct {
	delay time.Duration
	fail  error
}

func (s slow) load(ctx context.Context, key string) (string, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	switch {
	case key == "missing":
		return "", fmt.Errorf("no %q: %w", key, flightcache.ErrNotFound)
	case s.fail != nil:
		return "", s.fail
	}
	return "value of " + key, nil
}

// setup builds a Metrics on a manual reader and an observed Loader wired to
// it. Call it inside the synctest bubble; both are closed when the test ends.
func setup(t *testing.T, d slow, opts flightcache.Options[string, string]) (*Metrics[string], *flightcache.Loader[string, string], *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	m, err := New[string](mp, Options{Name: "test"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if opts.TTL == 0 {
		opts.TTL = time.Minute
	}
	opts.OnLoad = m.OnLoad
	l, err := flightcache.New(d.load, opts)
	if err != nil {
		t.Fatalf("flightcache.New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	if err := m.Observe(l); err != nil {
		t.Fatalf("Observe: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m, l, reader
}

// point is one data point, flattened for assertions.
type point struct {
	value        float64 // sum or gauge value; histogram sum
	count        uint64  // histogram count
	bucketCounts []uint64
}

// collect reads every data point as name{k=v,...} (attributes sorted).
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]point{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[name(mt.Name, p.Attributes.ToSlice())] = point{value: float64(p.Value)}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[name(mt.Name, p.Attributes.ToSlice())] = point{value: float64(p.Value)}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[name(mt.Name, p.Attributes.ToSlice())] = point{value: p.Sum, count: p.Count, bucketCounts: p.BucketCounts}
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					out[name(mt.Name, p.Attributes.ToSlice())] = point{value: float64(p.Sum), count: p.Count, bucketCounts: p.BucketCounts}
				}
			default:
				t.Fatalf("%s: unexpected aggregation %T", mt.Name, mt.Data)
			}
		}
	}
	return out
}

// name renders a data point's key; attribute.Set keeps attributes sorted.
func name(n string, attrs []attribute.KeyValue) string {
	parts := make([]string, len(attrs))
	for i, kv := range attrs {
		parts[i] = string(kv.Key) + "=" + kv.Value.Emit()
	}
	return n + "{" + strings.Join(parts, ",") + "}"
}

// wantValue checks one data point's value.
func wantValue(t *testing.T, got map[string]point, key string, want float64) {
	t.Helper()
	p, ok := got[key]
	if !ok {
		t.Errorf("no data point %s; have:\n%s", key, keys(got))
		return
	}
	if math.Abs(p.value-want) > 1e-9 {
		t.Errorf("%s = %v; want %v", key, p.value, want)
	}
}

// wantHistogram checks one histogram data point's count and sum.
func wantHistogram(t *testing.T, got map[string]point, key string, count uint64, sum float64) {
	t.Helper()
	p, ok := got[key]
	if !ok {
		t.Errorf("no data point %s; have:\n%s", key, keys(got))
		return
	}
	if p.count != count || math.Abs(p.value-sum) > 1e-9 {
		t.Errorf("%s: count %d, sum %v; want count %d, sum %v", key, p.count, p.value, count, sum)
	}
}

func keys(m map[string]point) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, "\n")
}

func TestLoadsWaitsAndStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, l, reader := setup(t, slow{delay: 50 * time.Millisecond}, flightcache.Options[string, string]{NotFoundTTL: time.Minute})
		ctx := context.Background()

		// Three concurrent Gets of one cold key share one 50 ms load.
		var wg sync.WaitGroup
		infos := make([]flightcache.Info, 3)
		for i := range infos {
			wg.Go(func() {
				_, infos[i], _ = l.GetInfo(ctx, "a")
				m.RecordWait(ctx, infos[i])
			})
		}
		wg.Wait()
		// Then a hit, which waits for nothing, and a not-found load.
		_, info, err := l.GetInfo(ctx, "a")
		if err != nil || info.Source != flightcache.SourceHit {
			t.Fatalf(`GetInfo("a") = %v, %v; want a hit`, info, err)
		}
		m.RecordWait(ctx, info)
		_, info, err = l.GetInfo(ctx, "missing")
		if !errors.Is(err, flightcache.ErrNotFound) {
			t.Fatalf(`GetInfo("missing") = %v; want ErrNotFound`, err)
		}
		m.RecordWait(ctx, info)
		synctest.Wait() // OnLoad runs after the waiters are released

		got := collect(t, reader)
		wantHistogram(t, got, `flightcache.load.duration{background=false,cache=test,outcome=ok}`, 1, 0.05)
		wantHistogram(t, got, `flightcache.load.duration{background=false,cache=test,outcome=not_found}`, 1, 0.05)
		wantHistogram(t, got, `flightcache.load.callers{cache=test,outcome=ok}`, 1, 3)
		wantHistogram(t, got, `flightcache.load.callers{cache=test,outcome=not_found}`, 1, 1)
		wantHistogram(t, got, `flightcache.wait.duration{cache=test,source=loaded}`, 2, 0.1)
		wantHistogram(t, got, `flightcache.wait.duration{cache=test,source=shared}`, 2, 0.1)
		if _, ok := got[`flightcache.wait.duration{cache=test,source=hit}`]; ok {
			t.Errorf("a hit was recorded as a wait")
		}

		wantValue(t, got, `flightcache.gets{cache=test,result=hit}`, 1)
		wantValue(t, got, `flightcache.gets{cache=test,result=miss}`, 4)
		wantValue(t, got, `flightcache.gets{cache=test,result=stale}`, 0)
		wantValue(t, got, `flightcache.loads{cache=test}`, 2)
		wantValue(t, got, `flightcache.load.errors{cache=test}`, 1)
		wantValue(t, got, `flightcache.shared{cache=test}`, 2)
		wantValue(t, got, `flightcache.shared.errors{cache=test}`, 0)
		wantValue(t, got, `flightcache.load.max_callers{cache=test}`, 3)
		wantValue(t, got, `flightcache.loads.in_flight{cache=test}`, 0)
		wantValue(t, got, `flightcache.waiting{cache=test}`, 0)
		wantValue(t, got, `flightcache.breaker.state{cache=test,state=closed}`, 1)
		wantValue(t, got, `flightcache.breaker.state{cache=test,state=open}`, 0)
	})
}

// fakeStats is a StatsReader that returns the snapshots a test sets.
type fakeStats struct {
	mu sync.Mutex
	s  flightcache.Stats
}

func (f *fakeStats) Stats() flightcache.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeStats) set(s flightcache.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s = s
}

// A Get counted as a miss in one snapshot can be a hit in the next; the
// miss counter must not go down with it. Gauges report what they read.
func TestCountersNeverGoDown(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	m, err := New[string](mp, Options{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	stats := &fakeStats{s: flightcache.Stats{Gets: 5, Misses: 5, Loads: 1, InFlight: 1, Waiting: 5}}
	if err := m.Observe(stats); err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	wantValue(t, got, `flightcache.gets{cache=test,result=miss}`, 5)
	wantValue(t, got, `flightcache.waiting{cache=test}`, 5)

	stats.set(flightcache.Stats{Gets: 5, Hits: 1, Misses: 4, Loads: 1})
	got = collect(t, reader)
	wantValue(t, got, `flightcache.gets{cache=test,result=miss}`, 5)
	wantValue(t, got, `flightcache.gets{cache=test,result=hit}`, 1)
	wantValue(t, got, `flightcache.loads.in_flight{cache=test}`, 0)
	wantValue(t, got, `flightcache.waiting{cache=test}`, 0)

	stats.set(flightcache.Stats{Gets: 7, Hits: 1, Misses: 6, Loads: 2})
	got = collect(t, reader)
	wantValue(t, got, `flightcache.gets{cache=test,result=miss}`, 6)
	wantValue(t, got, `flightcache.loads{cache=test}`, 2)
}

func TestBreakerOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, l, reader := setup(t, slow{delay: time.Millisecond, fail: errBoom},
			flightcache.Options[string, string]{Breaker: flightcache.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour}})
		ctx := context.Background()
		if _, err := l.Get(ctx, "a"); !errors.Is(err, errBoom) {
			t.Fatalf(`Get("a") = %v; want %v`, err, errBoom)
		}
		if _, err := l.Get(ctx, "a"); !errors.Is(err, flightcache.ErrBreakerOpen) {
			t.Fatalf(`Get("a") = %v; want ErrBreakerOpen`, err)
		}
		synctest.Wait()

		got := collect(t, reader)
		wantHistogram(t, got, `flightcache.load.duration{background=false,cache=test,outcome=error}`, 1, 0.001)
		wantHistogram(t, got, `flightcache.load.duration{background=false,cache=test,outcome=breaker_open}`, 1, 0)
		wantValue(t, got, `flightcache.breaker.rejected{cache=test}`, 1)
		wantValue(t, got, `flightcache.load.errors{cache=test}`, 2)
		wantValue(t, got, `flightcache.breaker.state{cache=test,state=open}`, 1)
		wantValue(t, got, `flightcache.breaker.state{cache=test,state=closed}`, 0)
	})
}

func TestObserveOnceAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, l, reader := setup(t, slow{}, flightcache.Options[string, string]{})
		if err := m.Observe(l); err == nil || !strings.HasPrefix(err.Error(), "otelflightcache: ") {
			t.Errorf("second Observe = %v; want an otelflightcache error", err)
		}
		if err := m.Observe(nil); err == nil {
			t.Errorf("Observe(nil) = nil; want an error")
		}
		if _, ok := collect(t, reader)[`flightcache.gets{cache=test,result=hit}`]; !ok {
			t.Fatalf("no gets counter before Close")
		}
		if err := m.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := m.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, ok := collect(t, reader)[`flightcache.gets{cache=test,result=hit}`]; ok {
			t.Errorf("gets counter still reported after Close")
		}
	})
}

func TestNewValidates(t *testing.T) {
	mp := sdkmetric.NewMeterProvider()
	defer mp.Shutdown(context.Background())
	for _, tc := range []struct {
		opts  Options
		field string
	}{
		{Options{DurationBuckets: []float64{1, 1}}, "DurationBuckets"},
		{Options{DurationBuckets: []float64{math.NaN()}}, "DurationBuckets"},
		{Options{CallerBuckets: []float64{5, 1}}, "CallerBuckets"},
	} {
		_, err := New[string](mp, tc.opts)
		if err == nil || !strings.Contains(err.Error(), "Options."+tc.field) || !strings.HasPrefix(err.Error(), "otelflightcache: ") {
			t.Errorf("New(%+v) = %v; want an error naming %s", tc.opts, err, tc.field)
		}
	}
	if _, err := New[string](nil, Options{}); err == nil {
		t.Errorf("New(nil provider) = nil error")
	}
	if _, err := New[string](mp, Options{DurationBuckets: []float64{}, CallerBuckets: []float64{1}}); err != nil {
		t.Errorf("New with valid buckets: %v", err)
	}
}

// A load error that only the Loader's IsNotFound calls a not-found is
// recorded as not_found, from LoadEvent.NotFound.
func TestOwnNotFoundOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errNoRow := errors.New("db: no row")
		_, l, reader := setup(t, slow{delay: 10 * time.Millisecond, fail: errNoRow}, flightcache.Options[string, string]{
			IsNotFound: func(err error) bool { return errors.Is(err, errNoRow) },
		})
		if _, err := l.Get(context.Background(), "a"); !errors.Is(err, errNoRow) {
			t.Fatalf(`Get("a") = %v; want the LoadFunc's error`, err)
		}
		synctest.Wait() // OnLoad runs after the waiters are released
		got := collect(t, reader)
		wantHistogram(t, got, `flightcache.load.callers{cache=test,outcome=not_found}`, 1, 1)
		if _, ok := got[`flightcache.load.callers{cache=test,outcome=error}`]; ok {
			t.Errorf("the not-found was recorded as an error")
		}
	})
}

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("x: %w", flightcache.ErrNotFound), "not_found"},
		{fmt.Errorf("%w: %w", flightcache.ErrLoadTimeout, context.DeadlineExceeded), "timeout"},
		{fmt.Errorf("%w: open", flightcache.ErrBreakerOpen), "breaker_open"},
		{context.Canceled, "canceled"},
		{fmt.Errorf("%w: %w", flightcache.ErrClosed, context.Canceled), "canceled"},
		{errBoom, "error"},
	} {
		if got := Outcome(tc.err); got != tc.want {
			t.Errorf("Outcome(%v) = %q; want %q", tc.err, got, tc.want)
		}
	}
}

func TestPrometheusExposition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
		if err != nil {
			t.Fatalf("prometheus exporter: %v", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		defer mp.Shutdown(context.Background())
		m, err := New[string](mp, Options{Name: "prices"})
		if err != nil {
			t.Fatal(err)
		}
		l, err := flightcache.New(slow{delay: 20 * time.Millisecond}.load,
			flightcache.Options[string, string]{TTL: time.Minute, OnLoad: m.OnLoad})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := m.Observe(l); err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		for range 2 {
			_, info, err := l.GetInfo(context.Background(), "a")
			if err != nil {
				t.Fatal(err)
			}
			m.RecordWait(context.Background(), info)
		}
		synctest.Wait()

		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body := rec.Body.String()
		for _, want := range []string{
			`flightcache_gets_total{cache="prices",result="hit"} 1`,
			`flightcache_gets_total{cache="prices",result="miss"} 1`,
			`flightcache_loads_total{cache="prices"} 1`,
			`flightcache_load_duration_seconds_count{background="false",cache="prices",outcome="ok"} 1`,
			`flightcache_load_duration_seconds_bucket{background="false",cache="prices",outcome="ok",le="0.025"} 1`,
			`flightcache_load_callers_sum{cache="prices",outcome="ok"} 1`,
			`flightcache_wait_duration_seconds_count{cache="prices",source="loaded"} 1`,
			`flightcache_breaker_state{cache="prices",state="closed"} 1`,
			`flightcache_load_max_callers{cache="prices"} 1`,
			`flightcache_loads_in_flight{cache="prices"} 0`,
			`flightcache_waiting{cache="prices"} 0`,
		} {
			if !strings.Contains(body, want+"\n") {
				t.Errorf("exposition lacks %s", want)
			}
		}
		if t.Failed() {
			t.Logf("exposition:\n%s", body)
		}
	})
}

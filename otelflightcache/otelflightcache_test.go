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

// One load shared by three Gets, a hit, and a not-found load: the loads'
// durations and callers by outcome, the waits by source (a hit waits for
// nothing), and the counters and gauges read from the Loader's Stats.
func TestLoadsWaitsAndStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, l := wired(t, slow{delay: 50 * time.Millisecond}.load, flightcache.Options[string, string]{NotFoundTTL: time.Minute})
		ctx := context.Background()

		// Three concurrent Gets of one cold key share one 50 ms load.
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { l.GetInfo(ctx, "a") })
		}
		wg.Wait()
		// Then a hit, which waits for nothing, and a not-found load.
		_, info, err := l.GetInfo(ctx, "a")
		if err != nil || info.Source != flightcache.SourceHit {
			t.Fatalf(`GetInfo("a") = %v, %v; want a hit`, info, err)
		}
		if _, err := l.Get(ctx, "missing"); !errors.Is(err, flightcache.ErrNotFound) {
			t.Fatalf(`Get("missing") = %v; want ErrNotFound`, err)
		}
		synctest.Wait() // LoadEnd runs after the waiters are released

		got := collect(t, r.reader)
		wantHistogram(t, got, `flightcache.load.duration{flightcache.load.background=false,flightcache.load.outcome=ok,flightcache.name=test}`, 1, 0.05)
		wantHistogram(t, got, `flightcache.load.duration{flightcache.load.background=false,flightcache.load.outcome=not_found,flightcache.name=test}`, 1, 0.05)
		wantHistogram(t, got, `flightcache.load.callers{flightcache.load.outcome=ok,flightcache.name=test}`, 1, 3)
		wantHistogram(t, got, `flightcache.load.callers{flightcache.load.outcome=not_found,flightcache.name=test}`, 1, 1)
		wantHistogram(t, got, `flightcache.get.wait.duration{flightcache.get.source=loaded,flightcache.name=test}`, 2, 0.1)
		wantHistogram(t, got, `flightcache.get.wait.duration{flightcache.get.source=shared,flightcache.name=test}`, 2, 0.1)
		if _, ok := got[`flightcache.get.wait.duration{flightcache.get.source=hit,flightcache.name=test}`]; ok {
			t.Errorf("a hit was recorded as a wait")
		}

		wantValue(t, got, `flightcache.gets{flightcache.get.result=hit,flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.gets{flightcache.get.result=loaded,flightcache.name=test}`, 2)
		wantValue(t, got, `flightcache.gets{flightcache.get.result=shared,flightcache.name=test}`, 2)
		wantValue(t, got, `flightcache.gets{flightcache.get.result=stale,flightcache.name=test}`, 0)
		wantValue(t, got, `flightcache.loads{flightcache.name=test}`, 2)
		wantValue(t, got, `flightcache.load.errors{flightcache.name=test}`, 0) // a not-found is an answer
		wantValue(t, got, `flightcache.load.not_founds{flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.shared{flightcache.name=test}`, 2)
		wantValue(t, got, `flightcache.shared.errors{flightcache.name=test}`, 0)
		wantValue(t, got, `flightcache.load.active{flightcache.name=test}`, 0)
		wantValue(t, got, `flightcache.get.active{flightcache.name=test}`, 0)
		wantValue(t, got, `flightcache.breaker.state{flightcache.breaker.state=closed,flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.breaker.state{flightcache.breaker.state=open,flightcache.name=test}`, 0)
	})
}

// fakeStats returns the snapshots a test sets.
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

// A Get counted as a shared one in one snapshot can be a hit in the next
// (the load it was about to join had just finished); the counter must not
// go down with it. Up-down counters report what they read.
func TestCountersNeverGoDown(t *testing.T) {
	r := newRig(t)
	stats := &fakeStats{s: flightcache.Stats{Gets: 5, Misses: 5, Loaded: 1, Shared: 4, Loads: 1, InFlight: 1, Waiting: 5}}
	r.obs.ObserveStats(stats.Stats)
	got := collect(t, r.reader)
	wantValue(t, got, `flightcache.gets{flightcache.get.result=shared,flightcache.name=test}`, 4)
	wantValue(t, got, `flightcache.get.active{flightcache.name=test}`, 5)

	stats.set(flightcache.Stats{Gets: 5, Hits: 1, Misses: 4, Loaded: 1, Shared: 3, Loads: 1})
	got = collect(t, r.reader)
	wantValue(t, got, `flightcache.gets{flightcache.get.result=shared,flightcache.name=test}`, 4)
	wantValue(t, got, `flightcache.gets{flightcache.get.result=hit,flightcache.name=test}`, 1)
	wantValue(t, got, `flightcache.load.active{flightcache.name=test}`, 0)
	wantValue(t, got, `flightcache.get.active{flightcache.name=test}`, 0)

	stats.set(flightcache.Stats{Gets: 7, Hits: 1, Misses: 6, Loaded: 1, Shared: 5, Loads: 2})
	got = collect(t, r.reader)
	wantValue(t, got, `flightcache.gets{flightcache.get.result=shared,flightcache.name=test}`, 5)
	wantValue(t, got, `flightcache.loads{flightcache.name=test}`, 2)
}

func TestBreakerOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, l := wired(t, slow{delay: time.Millisecond, fail: errBoom}.load,
			flightcache.Options[string, string]{Breaker: flightcache.Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour}})
		ctx := context.Background()
		if _, err := l.Get(ctx, "a"); !errors.Is(err, errBoom) {
			t.Fatalf(`Get("a") = %v; want %v`, err, errBoom)
		}
		if _, err := l.Get(ctx, "a"); !errors.Is(err, flightcache.ErrBreakerOpen) {
			t.Fatalf(`Get("a") = %v; want ErrBreakerOpen`, err)
		}
		synctest.Wait()

		got := collect(t, r.reader)
		wantHistogram(t, got, `flightcache.load.duration{flightcache.load.background=false,flightcache.load.outcome=error,flightcache.name=test}`, 1, 0.001)
		wantHistogram(t, got, `flightcache.load.duration{flightcache.load.background=false,flightcache.load.outcome=breaker_open,flightcache.name=test}`, 1, 0)
		wantValue(t, got, `flightcache.breaker.rejected{flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.load.errors{flightcache.name=test}`, 2)
		wantValue(t, got, `flightcache.breaker.state{flightcache.breaker.state=open,flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.breaker.state{flightcache.breaker.state=closed,flightcache.name=test}`, 0)
	})
}

// A load error that only the Loader's IsNotFound calls a not-found is
// recorded as not_found, from LoadEvent.NotFound.
func TestOwnNotFoundOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errNoRow := errors.New("db: no row")
		r, l := wired(t, slow{delay: 10 * time.Millisecond, fail: errNoRow}.load, flightcache.Options[string, string]{
			IsNotFound: func(err error) bool { return errors.Is(err, errNoRow) },
		})
		if _, err := l.Get(context.Background(), "a"); !errors.Is(err, errNoRow) {
			t.Fatalf(`Get("a") = %v; want the LoadFunc's error`, err)
		}
		synctest.Wait() // LoadEnd runs after the waiters are released
		got := collect(t, r.reader)
		wantHistogram(t, got, `flightcache.load.callers{flightcache.load.outcome=not_found,flightcache.name=test}`, 1, 1)
		if _, ok := got[`flightcache.load.callers{flightcache.load.outcome=error,flightcache.name=test}`]; ok {
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
		obs, err := NewObserver[string](WithName("prices"), WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		l, err := flightcache.New(slow{delay: 20 * time.Millisecond}.load,
			flightcache.Options[string, string]{TTL: time.Minute, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 2 {
			if _, err := l.Get(context.Background(), "a"); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()

		rec := httptest.NewRecorder()
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body := rec.Body.String()
		for _, want := range []string{
			`flightcache_gets_total{flightcache_get_result="hit",flightcache_name="prices"} 1`,
			`flightcache_gets_total{flightcache_get_result="loaded",flightcache_name="prices"} 1`,
			`flightcache_gets_total{flightcache_get_result="stale-on-error",flightcache_name="prices"} 0`,
			`flightcache_reloads_total{flightcache_name="prices",flightcache_reload_result="not_modified"} 0`,
			`flightcache_loads_total{flightcache_name="prices"} 1`,
			`flightcache_load_duration_seconds_count{flightcache_load_background="false",flightcache_load_outcome="ok",flightcache_name="prices"} 1`,
			`flightcache_load_duration_seconds_bucket{flightcache_load_background="false",flightcache_load_outcome="ok",flightcache_name="prices",le="0.025"} 1`,
			`flightcache_load_callers_sum{flightcache_load_outcome="ok",flightcache_name="prices"} 1`,
			`flightcache_get_wait_duration_seconds_count{flightcache_get_source="loaded",flightcache_name="prices"} 1`,
			`flightcache_breaker_state{flightcache_breaker_state="closed",flightcache_name="prices"} 1`,
			`flightcache_load_active{flightcache_name="prices"} 0`,
			`flightcache_get_active{flightcache_name="prices"} 0`,
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

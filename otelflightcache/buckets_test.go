package otelflightcache

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// bounds returns the bucket boundaries of each float64 histogram the
// reader collects, by name.
func bounds(t *testing.T, rd *sdkmetric.ManualReader) map[string][]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && len(h.DataPoints) > 0 {
				out[m.Name] = h.DataPoints[0].Bounds
			}
		}
	}
	return out
}

// observedBounds records one load and one wait on an Observer made with
// opts and returns the boundaries the reader sees.
func observedBounds(t *testing.T, opts ...Option) map[string][]float64 {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := NewObserver[string](append([]Option{WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatalf("NewObserver: %v", err)
	}
	ctx := context.Background()
	obs.LoadEnd(ctx, flightcache.LoadEvent[string]{Key: "a", Keys: 1, Duration: 30 * time.Millisecond, Callers: 1})
	obs.Waited(ctx, flightcache.WaitEvent[string]{Key: "a", Info: flightcache.Info{Source: flightcache.SourceLoaded, Waited: 30 * time.Millisecond}})
	return bounds(t, reader)
}

// WithDurationBuckets sets the boundaries of both duration histograms;
// without it they are DefaultDurationBuckets; the callers histogram keeps
// its own.
func TestWithDurationBuckets(t *testing.T) {
	given := []float64{0.0005, 0.002, 0.02, 0.2, 2}
	arg := slices.Clone(given)
	opt := WithDurationBuckets(arg...)
	arg[0] = 99 // the option keeps its own copy
	got := observedBounds(t, opt)
	for _, name := range []string{"flightcache.load.duration", "flightcache.get.wait.duration"} {
		if !slices.Equal(got[name], given) {
			t.Errorf("%s bounds = %v; want %v", name, got[name], given)
		}
	}
	def := observedBounds(t)
	for _, name := range []string{"flightcache.load.duration", "flightcache.get.wait.duration"} {
		if !slices.Equal(def[name], DefaultDurationBuckets) {
			t.Errorf("%s bounds without the option = %v; want DefaultDurationBuckets %v", name, def[name], DefaultDurationBuckets)
		}
	}
}

func TestWithDurationBucketsInvalid(t *testing.T) {
	for _, b := range [][]float64{
		nil,
		{0.1, 0.1},
		{1, 0.5},
		{0.1, math.NaN()},
		{0.1, math.Inf(1)},
		{math.Inf(-1), 0.1},
	} {
		_, err := NewObserver[string](WithDurationBuckets(b...))
		if err == nil || !strings.HasPrefix(err.Error(), "otelflightcache: WithDurationBuckets") {
			t.Errorf("NewObserver(WithDurationBuckets(%v)) = %v; want an error naming WithDurationBuckets", b, err)
		}
	}
}

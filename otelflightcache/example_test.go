package otelflightcache_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/otelflightcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The whole wiring: an Observer on the application's providers, set in the
// Loader's one field. A Get that waits on a load makes a flightcache.get
// span under its own span, linked to the load's flightcache.load span; a
// hit makes none.
func Example() {
	spans := tracetest.NewInMemoryExporter() // an OTLP or stdout exporter in a service
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())

	obs, err := otelflightcache.NewObserver[string](
		otelflightcache.WithName("prices"),
		otelflightcache.WithMeterProvider(mp),
		otelflightcache.WithTracerProvider(tp),
	)
	if err != nil {
		log.Fatal(err)
	}
	prices, err := flightcache.New(func(ctx context.Context, sku string) (int, error) {
		return 1999, nil // the downstream call, under the load's span
	}, flightcache.Options[string, int]{TTL: time.Minute, Observer: obs})
	if err != nil {
		log.Fatal(err)
	}

	ctx, request := tp.Tracer("app").Start(context.Background(), "GET /prices/sku-1")
	prices.Get(ctx, "sku-1") // a miss: a load span and a get span
	prices.Get(ctx, "sku-1") // a hit: no span
	request.End()
	prices.Close() // waits for the load's LoadEnd

	var names []string
	for _, s := range spans.GetSpans() {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	fmt.Println(strings.Join(names, "\n"))
	// Output:
	// GET /prices/sku-1
	// flightcache.get
	// flightcache.load
}

// An Observer's metrics, exposed for Prometheus: the exporter is the
// meter provider's reader, and a handler serves promhttp.HandlerFor(reg,
// ...) on /metrics.
func Example_prometheus() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())

	obs, err := otelflightcache.NewObserver[string](otelflightcache.WithName("prices"), otelflightcache.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	loader, err := flightcache.New(func(ctx context.Context, sku string) (int, error) {
		return 1999, nil // the downstream call
	}, flightcache.Options[string, int]{TTL: time.Minute, Observer: obs})
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	for range 3 {
		if _, err := loader.Get(ctx, "sku-1"); err != nil { // a miss, then two hits
			log.Fatal(err)
		}
	}
	loader.Close() // waits for LoadEnd: the example reads everything below

	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	lines := bufio.NewScanner(rec.Body)
	for lines.Scan() {
		line := lines.Text()
		for _, prefix := range []string{"flightcache_gets_total", "flightcache_loads_total", "flightcache_load_callers_sum"} {
			if strings.HasPrefix(line, prefix) {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// flightcache_gets_total{flightcache_get_result="canceled",flightcache_name="prices"} 0
	// flightcache_gets_total{flightcache_get_result="closed",flightcache_name="prices"} 0
	// flightcache_gets_total{flightcache_get_result="hit",flightcache_name="prices"} 2
	// flightcache_gets_total{flightcache_get_result="loaded",flightcache_name="prices"} 1
	// flightcache_gets_total{flightcache_get_result="shared",flightcache_name="prices"} 0
	// flightcache_gets_total{flightcache_get_result="stale",flightcache_name="prices"} 0
	// flightcache_gets_total{flightcache_get_result="stale-limited",flightcache_name="prices"} 0
	// flightcache_gets_total{flightcache_get_result="stale-on-error",flightcache_name="prices"} 0
	// flightcache_load_callers_sum{flightcache_load_outcome="ok",flightcache_name="prices"} 1
	// flightcache_loads_total{flightcache_name="prices"} 1
}

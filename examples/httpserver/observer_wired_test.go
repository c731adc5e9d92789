package main

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
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

// The one Observer gives /metrics its flightcache instruments and the
// traces their cache spans: the request span, its wait span linked to the
// load span, and the pricing call under the load span.
func TestObserverMetricsAndTraces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
		if err != nil {
			t.Fatal(err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		defer mp.Shutdown(context.Background())
		spans := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
		defer tp.Shutdown(context.Background())
		obs, err := otelflightcache.NewObserver[string](otelflightcache.WithName("products"),
			otelflightcache.WithMeterProvider(mp), otelflightcache.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		tracer := tp.Tracer("test")
		down := &faults{next: (&pricingService{Latency: 100 * time.Millisecond}).Handler()}
		repo, err := NewCachedRepository(&HTTPRepository{Client: &http.Client{Transport: tracedTransport{inProcess{down}, tracer}}, BaseURL: "http://pricing.test"},
			flightcache.Options[string, Product]{TTL: time.Minute, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		defer repo.Close()
		h := (&api{repo: repo, stats: repo.Stats, metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
			log: slog.New(slog.DiscardHandler), tracer: tracer}).routes()

		want(t, "GET", get(h, "/products/9"), http.StatusOK, "X-Cache", "loaded")
		want(t, "GET", get(h, "/products/9"), http.StatusOK, "X-Cache", "hit")
		synctest.Wait() // the load has been counted and reported

		rec := get(h, "/metrics")
		want(t, "/metrics", rec, http.StatusOK)
		for _, line := range []string{
			`flightcache_gets_total{flightcache_get_result="hit",flightcache_name="products"} 1`,
			`flightcache_loads_total{flightcache_name="products"} 1`,
			`flightcache_load_duration_seconds_count{flightcache_load_background="false",flightcache_load_outcome="ok",flightcache_name="products"} 1`,
			`flightcache_load_callers_count{flightcache_load_outcome="ok",flightcache_name="products"} 1`,
			`flightcache_get_wait_duration_seconds_sum{flightcache_get_source="loaded",flightcache_name="products"} 0.1`,
			`flightcache_breaker_state{flightcache_breaker_state="closed",flightcache_name="products"} 1`,
		} {
			if !strings.Contains(rec.Body.String(), line+"\n") {
				t.Errorf("/metrics lacks %s", line)
			}
		}
		if t.Failed() {
			t.Logf("/metrics:\n%s", rec.Body.String())
		}

		byName := map[string]tracetest.SpanStub{}
		for _, s := range spans.GetSpans() {
			if _, ok := byName[s.Name]; !ok {
				byName[s.Name] = s
			}
		}
		req, wait, load, call := byName["GET /products/{id}"], byName["flightcache.get"], byName["flightcache.load"], byName["pricing GET /prices/{id}"]
		switch {
		case wait.Parent.SpanID() != req.SpanContext.SpanID():
			t.Errorf("the wait span is not under the request span")
		case load.Parent.SpanID() != req.SpanContext.SpanID():
			t.Errorf("the load span is not under the request that started it")
		case len(wait.Links) != 1 || wait.Links[0].SpanContext.SpanID() != load.SpanContext.SpanID():
			t.Errorf("the wait span does not link to the load span")
		case call.Parent.SpanID() != load.SpanContext.SpanID():
			t.Errorf("the pricing call is not under the load span")
		}
	})
}

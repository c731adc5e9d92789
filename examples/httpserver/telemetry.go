package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/flightcache/flightcache/otelflightcache"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// telemetry is where the server's metrics and traces go.
type telemetry struct {
	metrics  http.Handler                      // GET /metrics, in the Prometheus format
	observer *otelflightcache.Observer[string] // the Loader's Options.Observer: both
	tracer   trace.Tracer                      // the server's own spans
	stop     func(context.Context) error       // flushes and stops the exporters
}

// newTelemetry sets up the metrics (an OpenTelemetry meter provider read
// by the Prometheus exporter, so nothing runs until /metrics is scraped),
// the traces (newTracerProvider) and the Observer that reports both for
// the Loader.
func newTelemetry(ctx context.Context, cfg config, out io.Writer) (*telemetry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	// The exporter labels every series with its instrumentation scope
	// (otel_scope_name="github.com/flightcache/flightcache/otelflightcache",
	// otel_scope_version): which library made the metric.
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	tracing, stopTracing, err := newTracerProvider(ctx, cfg, out)
	if err != nil {
		return nil, errors.Join(err, meters.Shutdown(ctx))
	}
	stop := func(ctx context.Context) error { return errors.Join(meters.Shutdown(ctx), stopTracing(ctx)) }
	observer, err := otelflightcache.NewObserver[string](
		otelflightcache.WithName("products"),
		otelflightcache.WithMeterProvider(meters),
		otelflightcache.WithTracerProvider(tracing),
	)
	if err != nil {
		return nil, errors.Join(err, stop(ctx))
	}
	return &telemetry{
		metrics:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		observer: observer,
		tracer:   tracing.Tracer("github.com/flightcache/flightcache/examples/httpserver"),
		stop:     stop,
	}, nil
}

// newTracerProvider returns where the server's spans go: to out as JSON
// lines with -trace stdout, to an OTLP/HTTP collector with -otlp, to both,
// or nowhere (a no-op provider). shutdown flushes the spans not yet
// exported and stops the exporters.
func newTracerProvider(ctx context.Context, cfg config, out io.Writer) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	var opts []sdktrace.TracerProviderOption
	if cfg.trace == "stdout" {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(out))
		if err != nil {
			return nil, nil, fmt.Errorf("-trace stdout: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if cfg.otlp != "" {
		// The exporter connects lazily: a collector that is down loses
		// spans, and never stops the server.
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(cfg.otlp), otlptracehttp.WithInsecure())
		if err != nil {
			return nil, nil, fmt.Errorf("-otlp %s: %w", cfg.otlp, err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if len(opts) == 0 {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	opts = append(opts, sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "httpserver"))))
	p := sdktrace.NewTracerProvider(opts...)
	return p, p.Shutdown, nil
}

// traced starts a server span for every request h serves, named after the
// route that matched it, so the spans the cache makes under the request's
// context (a Get's wait, the load it started) have a parent.
func traced(tracer trace.Tracer, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), r.Method, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		r = r.WithContext(ctx)
		h.ServeHTTP(rec, r)
		if r.Pattern != "" { // set by the mux once it routed r
			span.SetName(r.Pattern)
		}
		span.SetAttributes(attribute.String("http.request.method", r.Method), attribute.Int("http.response.status_code", rec.status))
		if rec.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(rec.status))
		}
	})
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// tracedTransport makes a client span of every request to the pricing
// service: made by a load, it nests under the load's span.
type tracedTransport struct {
	next   http.RoundTripper
	tracer trace.Tracer
}

func (t tracedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	route := req.URL.Path
	if strings.HasPrefix(route, "/prices/") {
		route = "/prices/{id}" // a span name names the route, not the id
	}
	ctx, span := t.tracer.Start(req.Context(), "pricing "+req.Method+" "+route, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case resp.StatusCode >= 500:
		span.SetStatus(codes.Error, resp.Status)
	}
	if resp != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	}
	return resp, err
}

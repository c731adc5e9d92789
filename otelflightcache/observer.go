package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Observer reports what one [flightcache.Loader] with keys of type K does
// as OpenTelemetry traces and metrics: set it as
// [flightcache.Options.Observer], the only wiring there is. Create it with
// [NewObserver]; see the package documentation for its spans and
// instruments. It implements [flightcache.Observer] and its optional
// capabilities [flightcache.StatsObserver], [flightcache.AttemptObserver],
// [flightcache.EvictionObserver] and [flightcache.TagObserver]. It is safe for concurrent use, and
// never blocks the Loader: a span or a measurement is handed to the
// providers' SDK, which exports it on its own goroutines.
//
// NOTE: one Observer serves one Loader. Its counters read from Stats are
// that Loader's: a second Loader given the same Observer replaces the
// first as the source of them (the histograms and spans of both are still
// reported, under the same name).
type Observer[K comparable] struct {
	tracer trace.Tracer
	name   attribute.KeyValue // flightcache.name
	inst   *instruments

	stats     atomic.Pointer[func() flightcache.Stats] // from ObserveStats; nil before
	evictions [numCauses]atomic.Int64                  // by cause; [0]: an unknown cause
	reloads   [len(reloadResults)]atomic.Int64         // by result, as reloadResults
	tagsFleet atomic.Int64                             // TagInvalidated events from the fleet
}

var (
	_ flightcache.Observer[string]         = (*Observer[string])(nil)
	_ flightcache.StatsObserver            = (*Observer[string])(nil)
	_ flightcache.AttemptObserver[string]  = (*Observer[string])(nil)
	_ flightcache.EvictionObserver[string] = (*Observer[string])(nil)
	_ flightcache.TagObserver              = (*Observer[string])(nil)
)

// Option configures [NewObserver].
type Option func(*config)

type config struct {
	name      string
	mp        metric.MeterProvider
	tp        trace.TracerProvider
	durations []float64 // the duration histograms' bucket boundaries
	err       error     // the first invalid option
}

// WithName sets the value of the flightcache.name attribute on every span
// and measurement, to tell Loaders apart. The default is "default"; the
// name must not be empty.
func WithName(name string) Option {
	return func(c *config) {
		if name == "" && c.err == nil {
			c.err = errors.New("otelflightcache: WithName of an empty name")
		}
		c.name = name
	}
}

// WithMeterProvider sets where the metrics go. The default is
// otel.GetMeterProvider(), the global one, at the time of NewObserver.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) {
		if mp == nil && c.err == nil {
			c.err = errors.New("otelflightcache: WithMeterProvider of a nil provider")
		}
		c.mp = mp
	}
}

// WithTracerProvider sets where the spans go. The default is
// otel.GetTracerProvider(), the global one, at the time of NewObserver.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp == nil && c.err == nil {
			c.err = errors.New("otelflightcache: WithTracerProvider of a nil provider")
		}
		c.tp = tp
	}
}

// WithDurationBuckets sets the bucket boundaries, in seconds, of the
// duration histograms, flightcache.load.duration and
// flightcache.get.wait.duration: at least one, finite, strictly
// increasing. The default is [DefaultDurationBuckets], 1 ms to 10 s. The
// option keeps a copy of bounds. A View of the meter provider still
// overrides them, as it does any instrument's advice.
func WithDurationBuckets(bounds ...float64) Option {
	bounds = slices.Clone(bounds)
	return func(c *config) {
		if msg := badBuckets(bounds); msg != "" && c.err == nil {
			c.err = fmt.Errorf("otelflightcache: WithDurationBuckets: %s, got %v", msg, bounds)
		}
		c.durations = bounds
	}
}

// badBuckets says what is wrong with bucket boundaries b, or "".
func badBuckets(b []float64) string {
	if len(b) == 0 {
		return "no boundaries"
	}
	for i, v := range b {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0):
			return "boundaries must be finite"
		case i > 0 && !(v > b[i-1]):
			return "boundaries must be strictly increasing"
		}
	}
	return ""
}

// NewObserver returns an Observer on a tracer and a meter named
// [ScopeName]. It returns an error for an invalid option, or the meter's
// error if an instrument cannot be created. Its counters from Stats are
// reported from the moment the Loader it is given to is created (the
// Loader hands it its Stats then), for as long as the meter provider
// runs, and keep their last values after the Loader's Close.
func NewObserver[K comparable](opts ...Option) (*Observer[K], error) {
	c := config{name: "default", durations: DefaultDurationBuckets}
	for _, opt := range opts {
		opt(&c)
	}
	if c.err != nil {
		return nil, c.err
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	o := &Observer[K]{
		tracer: c.tp.Tracer(ScopeName),
		name:   attribute.String(keyName, c.name),
	}
	inst, err := newInstruments(c.mp.Meter(ScopeName), o.name, c.durations, o.observe)
	if err != nil {
		return nil, err
	}
	o.inst = inst
	return o, nil
}

// spanKey is the context key under which the load's context holds its
// span, for this Observer: LoadEnd and Attempt find their own span there,
// never one a LoadFunc (or another Observer) put in a context derived
// from it.
type spanKey[K comparable] struct{ o *Observer[K] }

// LoadStart starts the load's span, flightcache.load: a child of the span
// in ctx (the starting caller's), or for a background load a root span
// linked to the span of the Get that triggered it. The context it returns
// holds the span, so the LoadFunc's own spans nest under it.
func (o *Observer[K]) LoadStart(ctx context.Context, ev flightcache.LoadStartEvent[K]) context.Context {
	opts := []trace.SpanStartOption{trace.WithAttributes(
		o.name,
		attribute.Int(keyLoadKeys, max(ev.Keys, 1)),
		attribute.Bool(keyLoadBackground, ev.Background),
		attribute.Bool(keyLoadReload, ev.Reload),
	)}
	if ev.Background {
		trigger := ev.Trigger
		if trigger == nil {
			trigger = ctx
		}
		opts = append(opts, trace.WithNewRoot())
		if sc := trace.SpanContextFromContext(trigger); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
	}
	ctx, span := o.tracer.Start(ctx, "flightcache.load", opts...)
	return context.WithValue(ctx, spanKey[K]{o}, span)
}

// LoadEnd records the load's duration and callers, counts a reload by its
// result, and ends its span with what the load came to.
func (o *Observer[K]) LoadEnd(ctx context.Context, ev flightcache.LoadEvent[K]) {
	outcome := loadOutcome(ev)
	o.inst.recordLoad(ctx, ev.Duration, ev.Callers, ev.Background, outcome)
	if i := slices.Index(reloadResults[:], reloadResult(ev)); i >= 0 {
		o.reloads[i].Add(1)
	}
	span, ok := ctx.Value(spanKey[K]{o}).(trace.Span)
	if !ok {
		return // not a context LoadStart returned: no span of ours to end
	}
	span.SetAttributes(
		attribute.Int(keyLoadCallers, ev.Callers),
		attribute.Int(keyLoadAttempts, ev.Attempts),
		attribute.Bool(keyLoadNotModified, ev.NotModified),
		attribute.String(keyLoadOutcome, outcome),
	)
	if failed(outcome) {
		span.SetAttributes(attribute.String(keyErrorType, outcome))
		span.SetStatus(codes.Error, ev.Err.Error())
	}
	span.End()
}

// Waited records the Get's wait and its span, flightcache.get: a child of
// the span in ctx (the Get's own), from when it began to wait to now,
// linked to the load's span.
func (o *Observer[K]) Waited(ctx context.Context, ev flightcache.WaitEvent[K]) {
	o.inst.recordWait(ctx, ev.Info)
	opts := []trace.SpanStartOption{
		trace.WithTimestamp(ev.Start),
		trace.WithAttributes(o.name, attribute.String(keyGetSource, ev.Info.Source.String())),
	}
	if sc := o.loadSpan(ev.Load); sc.IsValid() {
		// At creation: samplers only see the links given then.
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	_, span := o.tracer.Start(ctx, "flightcache.get", opts...)
	if outcome := classify(ev.Err); failed(outcome) {
		span.SetAttributes(attribute.String(keyErrorType, outcome))
		span.SetStatus(codes.Error, ev.Err.Error())
	}
	span.End()
}

// loadSpan returns the span context of the load whose context is load:
// this Observer's span in it, or whatever span it holds.
func (o *Observer[K]) loadSpan(load context.Context) trace.SpanContext {
	if load == nil {
		return trace.SpanContext{}
	}
	if span, ok := load.Value(spanKey[K]{o}).(trace.Span); ok {
		return span.SpanContext()
	}
	return trace.SpanContextFromContext(load)
}

// Attempt adds an event to the load's span: flightcache.retry for a
// failed attempt that will be retried, flightcache.breaker.rejected for a
// call the breaker refused.
func (o *Observer[K]) Attempt(ctx context.Context, ev flightcache.AttemptEvent[K]) {
	span, ok := ctx.Value(spanKey[K]{o}).(trace.Span)
	if !ok {
		return
	}
	attempt := attribute.Int(keyLoadAttempt, ev.Attempt)
	if ev.Rejected {
		span.AddEvent("flightcache.breaker.rejected", trace.WithAttributes(attempt))
		return
	}
	attrs := []attribute.KeyValue{attempt, attribute.Float64(keyRetryDelay, ev.Delay.Seconds())}
	if ev.Err != nil {
		attrs = append(attrs, attribute.String(keyErrorType, classify(ev.Err)), attribute.String(keyExceptionMessage, ev.Err.Error()))
	}
	span.AddEvent("flightcache.retry", trace.WithAttributes(attrs...))
}

// Evicted counts one entry that left the cache, by cause, for
// flightcache.evictions.
func (o *Observer[K]) Evicted(ev flightcache.EvictionEvent[K]) {
	i := int(ev.Cause)
	if i >= len(o.evictions) {
		i = 0
	}
	o.evictions[i].Add(1)
}

// TagInvalidated counts the tag invalidations another process of the
// fleet made (ev.Remote), reported as flightcache.tag.invalidations.fleet;
// every tag invalidation, this Loader's own included, is in
// flightcache.tag.invalidations, read from Stats.
func (o *Observer[K]) TagInvalidated(ev flightcache.TagEvent) {
	if ev.Remote {
		o.tagsFleet.Add(1)
	}
}

// ObserveStats makes stats the source of the counters, up-down counters
// and gauge read from Stats at every collection. The Loader calls it at
// New; a later call replaces the source.
func (o *Observer[K]) ObserveStats(stats func() flightcache.Stats) {
	if stats != nil {
		o.stats.Store(&stats)
	}
}

// observe is the instruments' collection callback's source: the Stats, if
// there is a source, and the counts of events.
func (o *Observer[K]) observe() (st flightcache.Stats, ok bool, ev eventCounts) {
	for i := range o.evictions {
		ev.evictions[i] = o.evictions[i].Load()
	}
	for i := range o.reloads {
		ev.reloads[i] = o.reloads[i].Load()
	}
	ev.tagsFleet = o.tagsFleet.Load()
	if p := o.stats.Load(); p != nil {
		return (*p)(), true, ev
	}
	return st, false, ev
}

// loadOutcome is the flightcache.load.outcome of a finished load: the
// Loader's own judgement of a not-found and of an abandoned load first.
func loadOutcome[K comparable](ev flightcache.LoadEvent[K]) string {
	var pe *flightcache.PanicError
	switch {
	case ev.Err == nil:
		return "ok"
	case errors.As(ev.Err, &pe):
		return "panic"
	case ev.Abandoned:
		return "canceled"
	case ev.NotFound:
		return "not_found"
	}
	return classify(ev.Err)
}

// failed reports whether outcome is a failure: neither ok nor a
// not-found, which is the downstream's answer that the key does not
// exist.
func failed(outcome string) bool { return outcome != "ok" && outcome != "not_found" }

// classify is the low-cardinality error.type of an error: "ok" for nil,
// then the first that matches of "panic" (a [*flightcache.PanicError]),
// "not_found", "timeout" (LoadTimeout, or any deadline),
// "breaker_open", "canceled" (context.Canceled, Close), "error".
func classify(err error) string {
	var pe *flightcache.PanicError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &pe):
		return "panic"
	case errors.Is(err, flightcache.ErrNotFound):
		return "not_found"
	case errors.Is(err, flightcache.ErrLoadTimeout), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, flightcache.ErrBreakerOpen):
		return "breaker_open"
	case errors.Is(err, context.Canceled), errors.Is(err, flightcache.ErrClosed):
		return "canceled"
	}
	return "error"
}

// The attribute keys of spans and measurements.
const (
	keyName             = "flightcache.name"
	keyLoadKeys         = "flightcache.load.keys"
	keyLoadCallers      = "flightcache.load.callers"
	keyLoadAttempts     = "flightcache.load.attempts"
	keyLoadAttempt      = "flightcache.load.attempt"
	keyLoadBackground   = "flightcache.load.background"
	keyLoadReload       = "flightcache.load.reload"
	keyLoadNotModified  = "flightcache.load.not_modified"
	keyLoadOutcome      = "flightcache.load.outcome"
	keyRetryDelay       = "flightcache.retry.delay"
	keyGetSource        = "flightcache.get.source"
	keyGetResult        = "flightcache.get.result"
	keyReloadResult     = "flightcache.reload.result"
	keyEvictionCause    = "flightcache.eviction.cause"
	keyBreakerState     = "flightcache.breaker.state"
	keyErrorType        = "error.type"
	keyExceptionMessage = "exception.message"
)

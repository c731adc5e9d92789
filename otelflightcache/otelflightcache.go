// Package otelflightcache reports what a [flightcache.Loader] does as
// OpenTelemetry traces and metrics, so that any OpenTelemetry exporter
// (OTLP, Prometheus, stdout...) shows them where the rest of a service's
// telemetry already is.
//
// It lives in its own module: the flightcache core does not depend on
// OpenTelemetry.
//
// # Wiring
//
// One value in one field: an [Observer], set as
// [flightcache.Options.Observer].
//
//	obs, err := otelflightcache.NewObserver[string](
//		otelflightcache.WithName("prices"),
//		otelflightcache.WithMeterProvider(mp),  // default: otel.GetMeterProvider()
//		otelflightcache.WithTracerProvider(tp), // default: otel.GetTracerProvider()
//	)
//	prices, err := flightcache.New(load, flightcache.Options[string, Price]{TTL: time.Minute, Observer: obs})
//
// The Loader calls it for every load and every Get that waited on one,
// never for a hit, and hands it its Stats for the counters.
//
// # Spans
//
// The instrumentation scope of spans and metrics is [ScopeName]. Spans:
//
//   - flightcache.load, one per load (one per LoadMany call): a child of
//     the span of the Get that started it; for a background refresh, a
//     root span linked to the span of the Get (or Refresh) that triggered
//     it. The LoadFunc receives the load's context, so its own spans nest
//     under it. Attributes: flightcache.name, flightcache.load.keys,
//     flightcache.load.background, flightcache.load.reload, and, set at
//     the end, flightcache.load.callers (the blast radius),
//     flightcache.load.attempts, flightcache.load.not_modified,
//     flightcache.load.outcome. A failed load has status Error and
//     error.type, its outcome; a not-found is an answer, not a failure:
//     outcome not_found, no error status. An event per retry (flightcache.retry:
//     flightcache.load.attempt, flightcache.retry.delay in seconds,
//     error.type, exception.message) and per breaker refusal
//     (flightcache.breaker.rejected: flightcache.load.attempt).
//   - flightcache.get, one per Get that waited on a load: a child of that
//     Get's own span, from when it began to wait to when it had its
//     answer, linked to the load's span (the link is given at creation,
//     where samplers see it). Attributes: flightcache.name,
//     flightcache.get.source; a Get that returned an error other than a
//     not-found ([flightcache.ErrNotFound]) has status Error and
//     error.type. A hit makes no span.
//
// An outcome is one of ok, not_found, timeout, breaker_open, canceled,
// panic, error. not_found is the Loader's own judgement
// ([flightcache.LoadEvent].NotFound, [flightcache.Options.IsNotFound]
// included), and never counts as an error.
//
// # Metrics
//
// Names are OpenTelemetry's (the Prometheus exporter turns dots into
// underscores and adds _seconds and _total). Every measurement has the
// attribute flightcache.name.
//
// Histograms, as loads end and Gets finish waiting:
//
//	flightcache.load.duration      s      one load, retries included      flightcache.load.outcome, flightcache.load.background
//	flightcache.load.callers       {get}  Gets one load's result reached  flightcache.load.outcome
//	flightcache.get.wait.duration  s      one Get's wait on a load        flightcache.get.source
//
// The duration histograms' bucket boundaries are [DefaultDurationBuckets],
// or those given to [WithDurationBuckets].
//
// Read at collection time, from the Loader's Stats (counters never go
// down, see [Metrics.Observe]) and, for evictions, from the Loader's
// eviction events:
//
//	flightcache.gets               counter         {get}    flightcache.get.result: hit, stale, miss, closed
//	flightcache.loads              counter         {load}   loads ended, those refused by the breaker or the limit included (Stats.Loads)
//	flightcache.load.errors        counter         {load}   loads that failed: not-founds excluded (Stats.LoadErrors − Stats.LoadNotFounds)
//	flightcache.load.not_founds    counter         {key}    keys a load answered not-found (Stats.NotFounds)
//	flightcache.downstream.calls   counter         {call}   calls the downstream saw, retries included (Stats.DownstreamCalls)
//	flightcache.shared             counter         {get}    Gets served by a load they did not start
//	flightcache.shared.errors      counter         {get}    of those, the ones that got its error
//	flightcache.refreshes          counter         {load}   background loads started
//	flightcache.evictions          counter         {entry}  flightcache.eviction.cause: policy, expired, rejected, replaced, invalidated
//	flightcache.breaker.rejected   counter         {call}   calls the breaker refused
//	flightcache.panics             counter         {panic}  panics recovered in user code
//	flightcache.load.active        up-down counter {load}   loads running now
//	flightcache.get.active         up-down counter {get}    Gets waiting on a load now
//	flightcache.breaker.state      gauge                    1 for the current flightcache.breaker.state (closed, half-open, open), 0 for the others
//
// After the Loader's Close the counters keep their last values.
//
// # The Metrics API (deprecated)
//
// [New] and [Metrics], the metrics-only API that came first, keep
// working, but are deprecated: wire an Observer instead. Their attribute
// is cache rather than flightcache.name, their wait histogram is
// flightcache.wait.duration, and several of their instruments differ
// (flightcache.loads.in_flight, flightcache.waiting,
// flightcache.cache.evictions...); its flightcache.load.errors counts
// not-founds, as Stats.LoadErrors does, where the Observer's leaves them
// out. Do not wire both for one Loader: the
// counters they share, flightcache.gets among them, would be reported
// twice. A Metrics has three inputs: [Metrics.OnLoad], set as (or called
// from) [flightcache.Options.OnLoad]; [Metrics.RecordWait], called with
// the [flightcache.Info] of every GetInfo; and [Metrics.Observe], which
// reads [flightcache.Loader.Stats] at every collection. Its instruments:
//
//	flightcache.load.duration  s         histogram  outcome, background
//	flightcache.load.callers   {caller}  histogram  outcome
//	flightcache.wait.duration  s         histogram  source
//	flightcache.gets                {get}    result=hit|stale|miss|closed
//	flightcache.shared              {get}    misses served by a load they did not start
//	flightcache.shared.errors       {get}    of those, the ones that received an error
//	flightcache.stale_on_error      {get}    misses answered with a stale value
//	flightcache.canceled            {get}    misses whose context ended first
//	flightcache.loads               {load}   downstream loads
//	flightcache.load.errors         {load}   loads that failed (not-found, abandoned included)
//	flightcache.retries             {call}   downstream calls beyond each load's first
//	flightcache.refreshes           {load}   background refreshes started
//	flightcache.abandoned           {load}   loads cancelled when every caller left
//	flightcache.breaker.rejected    {call}   downstream calls the breaker refused
//	flightcache.panics              {panic}  panics recovered in user code
//	flightcache.cache.sets.dropped  {set}    fills the cache's set buffer dropped
//	flightcache.cache.sets.rejected {set}    fills the cache's admission policy refused
//	flightcache.cache.evictions     {entry}  entries evicted to make room
//	flightcache.loads.in_flight     {load}    gauge: loads running now
//	flightcache.waiting             {get}     gauge: Gets waiting on a load now
//	flightcache.load.max_callers    {caller}  gauge: the most Gets one load reached
//	flightcache.breaker.state                 gauge: 1 for the current state, 0 for the others; state=closed|half-open|open
//
// outcome is one of ok, not_found, timeout, breaker_open, canceled, error
// ([Outcome]); source is the [flightcache.Source] of the Get.
package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the tracer and the meter an
// Observer (or a Metrics) creates: this module's import path.
const ScopeName = "github.com/flightcache/flightcache/otelflightcache"

// DefaultDurationBuckets are the bucket boundaries, in seconds, of the
// duration histograms: an Observer's without [WithDurationBuckets], a
// Metrics' when [Options.DurationBuckets] is nil. 1 ms to 10 s.
var DefaultDurationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// DefaultCallerBuckets are the bucket boundaries of the callers-per-load
// histogram when [Options.CallerBuckets] is nil. The first bucket (0)
// holds background refreshes nobody joined.
var DefaultCallerBuckets = []float64{0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000}

// Options configures [New]. Its zero value is valid.
//
// Deprecated: Options belongs to [Metrics]; see [NewObserver].
type Options struct {
	// Name is the value of the cache attribute on every measurement, to
	// tell several Loaders apart. "" means "default".
	Name string

	// DurationBuckets are the histogram bucket boundaries, in seconds, of
	// flightcache.load.duration and flightcache.wait.duration, strictly
	// increasing. nil means DefaultDurationBuckets.
	DurationBuckets []float64

	// CallerBuckets are the histogram bucket boundaries of
	// flightcache.load.callers, strictly increasing. nil means
	// DefaultCallerBuckets.
	CallerBuckets []float64
}

// Metrics records the behaviour of one [flightcache.Loader] with keys of
// type K. Create it with [New]. It is safe for concurrent use; its methods
// never block on the Loader.
//
// Deprecated: use an [Observer], set as [flightcache.Options.Observer]:
// metrics and traces in one field. Its attribute cache and its
// flightcache.wait.duration differ from the Observer's flightcache.name
// and flightcache.get.wait.duration, so wiring both for one Loader would
// report flightcache.gets (and the other counters they share) twice.
type Metrics[K comparable] struct {
	meter   metric.Meter
	cache   attribute.KeyValue
	loadDur metric.Float64Histogram
	callers metric.Int64Histogram
	wait    metric.Float64Histogram

	// Attribute sets, built once per combination rather than per measurement.
	loadAttrs   map[loadKey]metric.MeasurementOption
	callerAttrs map[string]metric.MeasurementOption
	waitAttrs   map[flightcache.Source]metric.MeasurementOption

	mu       sync.Mutex          // guards observed and reg
	observed bool                // Observe has been called
	reg      metric.Registration // the Stats callback; nil before Observe and after Close
}

type loadKey struct {
	outcome    string
	background bool
}

// outcomes are the values of the outcome attribute, in Outcome's order.
var outcomes = []string{"ok", "not_found", "timeout", "breaker_open", "canceled", "error"}

// sources are the values of the source attribute RecordWait uses.
var sources = []flightcache.Source{
	flightcache.SourceNone, flightcache.SourceHit, flightcache.SourceStale,
	flightcache.SourceStaleOnError, flightcache.SourceLoaded, flightcache.SourceShared,
}

// New creates the instruments of a Metrics on a meter of mp named
// [ScopeName]. It returns an error naming the field if opts is invalid, or
// the meter's error if an instrument cannot be created. Nothing is
// reported until the Metrics is wired in: see the package documentation.
//
// Deprecated: use [NewObserver], whose Observer is wired with one field
// and reports traces too. Wiring both for one Loader would report
// flightcache.gets (and the other counters they share) twice, under the
// attribute cache and under flightcache.name.
func New[K comparable](mp metric.MeterProvider, opts Options) (*Metrics[K], error) {
	if mp == nil {
		return nil, errors.New("otelflightcache: nil MeterProvider")
	}
	if opts.Name == "" {
		opts.Name = "default"
	}
	if opts.DurationBuckets == nil {
		opts.DurationBuckets = DefaultDurationBuckets
	}
	if opts.CallerBuckets == nil {
		opts.CallerBuckets = DefaultCallerBuckets
	}
	if err := increasing("DurationBuckets", opts.DurationBuckets); err != nil {
		return nil, err
	}
	if err := increasing("CallerBuckets", opts.CallerBuckets); err != nil {
		return nil, err
	}

	m := &Metrics[K]{
		meter:       mp.Meter(ScopeName),
		cache:       attribute.String("cache", opts.Name),
		loadAttrs:   make(map[loadKey]metric.MeasurementOption),
		callerAttrs: make(map[string]metric.MeasurementOption),
		waitAttrs:   make(map[flightcache.Source]metric.MeasurementOption),
	}
	var err error
	if m.loadDur, err = m.meter.Float64Histogram("flightcache.load.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of one downstream load, retries and backoff included, its wait for a Limit slot not."),
		metric.WithExplicitBucketBoundaries(opts.DurationBuckets...)); err != nil {
		return nil, fmt.Errorf("otelflightcache: %w", err)
	}
	if m.callers, err = m.meter.Int64Histogram("flightcache.load.callers",
		metric.WithUnit("{caller}"),
		metric.WithDescription("Gets that received one load's result, the starter included: the blast radius of a failed load."),
		metric.WithExplicitBucketBoundaries(opts.CallerBuckets...)); err != nil {
		return nil, fmt.Errorf("otelflightcache: %w", err)
	}
	if m.wait, err = m.meter.Float64Histogram("flightcache.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time one Get spent waiting for a load."),
		metric.WithExplicitBucketBoundaries(opts.DurationBuckets...)); err != nil {
		return nil, fmt.Errorf("otelflightcache: %w", err)
	}
	for _, o := range outcomes {
		for _, bg := range []bool{false, true} {
			m.loadAttrs[loadKey{o, bg}] = metric.WithAttributeSet(attribute.NewSet(
				m.cache, attribute.String("outcome", o), attribute.Bool("background", bg)))
		}
		m.callerAttrs[o] = metric.WithAttributeSet(attribute.NewSet(m.cache, attribute.String("outcome", o)))
	}
	for _, s := range sources {
		m.waitAttrs[s] = metric.WithAttributeSet(attribute.NewSet(m.cache, attribute.String("source", s.String())))
	}
	return m, nil
}

// increasing checks that bucket boundaries b are strictly increasing and not
// NaN, naming field in the error.
func increasing(field string, b []float64) error {
	for i := 1; i < len(b); i++ {
		if !(b[i] > b[i-1]) {
			return fmt.Errorf("otelflightcache: Options.%s must be strictly increasing, got %v", field, b)
		}
	}
	if slices.ContainsFunc(b, math.IsNaN) {
		return fmt.Errorf("otelflightcache: Options.%s must not contain NaN", field)
	}
	return nil
}

// OnLoad records one finished load: its duration and how many Gets received
// its result. Its signature is that of [flightcache.Options.OnLoad], so it
// can be set there directly, or called from the user's own OnLoad:
//
//	OnLoad: func(ev flightcache.LoadEvent[string]) {
//		m.OnLoad(ev)
//		logLoad(ev)
//	},
//
// It never blocks and is safe for concurrent use.
func (m *Metrics[K]) OnLoad(ev flightcache.LoadEvent[K]) {
	ctx := context.Background() // a LoadEvent carries no context
	o := Outcome(ev.Err)
	if ev.NotFound { // the Loader's rule, its Options.IsNotFound included
		o = "not_found"
	}
	if ev.Abandoned {
		o = "canceled"
	}
	m.loadDur.Record(ctx, ev.Duration.Seconds(), m.loadAttrs[loadKey{o, ev.Background}])
	m.callers.Record(ctx, int64(ev.Callers), m.callerAttrs[o])
}

// RecordWait records how long one Get waited for a load, from the Info
// that [flightcache.Loader.GetInfo] returned. Gets that did not wait (a
// hit, a stale value served at once) are not recorded. Call it after every
// GetInfo, whatever the error; it is safe for concurrent use.
func (m *Metrics[K]) RecordWait(ctx context.Context, info flightcache.Info) {
	if info.Waited <= 0 {
		return
	}
	attrs, ok := m.waitAttrs[info.Source]
	if !ok {
		attrs = m.waitAttrs[flightcache.SourceNone]
	}
	m.wait.Record(ctx, info.Waited.Seconds(), attrs)
}

// Outcome classifies a load error into the outcome attribute: "ok" for
// nil, then the first that matches of "not_found"
// ([flightcache.ErrNotFound]; OnLoad also says "not_found" for any error
// the Loader judged a not-found, [flightcache.LoadEvent].NotFound, which
// takes [flightcache.Options.IsNotFound] into account where Outcome cannot),
// "timeout" ([flightcache.ErrLoadTimeout]),
// "breaker_open" ([flightcache.ErrBreakerOpen]), "canceled"
// ([context.Canceled] or [flightcache.ErrClosed]), and "error" otherwise.
func Outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, flightcache.ErrNotFound):
		return "not_found"
	case errors.Is(err, flightcache.ErrLoadTimeout):
		return "timeout"
	case errors.Is(err, flightcache.ErrBreakerOpen):
		return "breaker_open"
	case errors.Is(err, context.Canceled), errors.Is(err, flightcache.ErrClosed):
		return "canceled"
	default:
		return "error"
	}
}

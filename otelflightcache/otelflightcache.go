// Package otelflightcache reports what a [flightcache.Loader] does as
// OpenTelemetry metrics, so that any OpenTelemetry exporter (Prometheus,
// OTLP, ...) can show them.
//
// It lives in its own module: the flightcache core does not depend on
// OpenTelemetry.
//
// # Wiring
//
// A [Metrics] has three inputs, one per kind of measurement:
//
//   - [Metrics.OnLoad], set as (or called from) [flightcache.Options.OnLoad],
//     feeds the per-load histograms;
//   - [Metrics.RecordWait], called with the [flightcache.Info] that
//     [flightcache.Loader.GetInfo] returned, feeds the wait-time histogram;
//   - [Metrics.Observe] reads [flightcache.Loader.Stats] at every collection
//     for the counters and gauges.
//
// Create the Metrics first, then the Loader with its OnLoad, then call
// Observe with the Loader; see the package example.
//
// # Instruments
//
// Every measurement carries the attribute cache, whose value is
// [Options.Name]. Names are OpenTelemetry's; the Prometheus exporter turns
// dots into underscores and adds _seconds to durations and _total to
// counters.
//
// Histograms, from OnLoad and RecordWait:
//
//	flightcache.load.duration  s         one load, retries included       outcome, background
//	flightcache.load.callers   {caller}  Gets that received one load's    outcome
//	                                     result: a failure's blast radius
//	flightcache.wait.duration  s         one Get's wait for a load        source
//
// outcome is one of ok, not_found, timeout, breaker_open, canceled, error
// (not_found: a load error the Loader judged a not-found, LoadEvent.NotFound);
// source is the [flightcache.Source] of the Get (loaded, shared,
// stale-on-error; none for a Get whose context ended first).
//
// Counters, from Stats (one per field, named after it). Each is reported
// as at least its last reported value, so that none ever goes down (see
// [Metrics.Observe]):
//
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
//
// Gauges, from Stats:
//
//	flightcache.loads.in_flight     {load}    loads running now
//	flightcache.waiting             {get}     Gets waiting on a load now
//	flightcache.load.max_callers    {caller}  the most Gets one load reached
//	flightcache.breaker.state                 1 for the current state, 0 for
//	                                          the others; state=closed|half-open|open
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

// ScopeName is the instrumentation scope of the meter Metrics creates.
const ScopeName = "github.com/flightcache/flightcache/otelflightcache"

// DefaultDurationBuckets are the bucket boundaries, in seconds, of the
// duration histograms when [Options.DurationBuckets] is nil: 1 ms to 10 s.
var DefaultDurationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// DefaultCallerBuckets are the bucket boundaries of the callers-per-load
// histogram when [Options.CallerBuckets] is nil. The first bucket (0)
// holds background refreshes nobody joined.
var DefaultCallerBuckets = []float64{0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000}

// Options configures [New]. Its zero value is valid.
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
		metric.WithDescription("Duration of one downstream load, retries and backoff included."),
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

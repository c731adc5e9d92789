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
// Read at collection time, from the Loader's Stats and, for evictions and
// reloads, from the Loader's events (a counter never goes down: a Get
// that one snapshot of the Stats counts as shared and the next as a hit
// leaves the shared count where it was until its count catches up):
//
//	flightcache.gets               counter         {get}    flightcache.get.result: hit, stale, stale-limited, stale-on-error, loaded, shared, canceled, closed
//	flightcache.reloads            counter         {load}   flightcache.reload.result: not_modified, modified, not_found, timeout, breaker_open, canceled, panic, error
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
//	flightcache.tag.invalidations  counter         {tag}    tags invalidated: InvalidateTag calls, and the fleet's heard (Stats.TagInvalidations)
//	flightcache.tag.invalidations.fleet counter    {tag}    of those, another process's, passed on by the Remote (the TagInvalidated events)
//	flightcache.tag.errors         counter         {value}  values not cached: Tags panicked or gave more than MaxTags (Stats.TagErrors)
//	flightcache.load.active        up-down counter {load}   loads running now
//	flightcache.get.active         up-down counter {get}    Gets waiting on a load now
//	flightcache.breaker.state      gauge                    1 for the current flightcache.breaker.state (closed, half-open, open), 0 for the others
//
// A Get is counted in flightcache.gets once answered, under the
// [flightcache.Source] its Info says (Source.String): a Get that waited on
// a load is loaded or shared (its error included: a failing downstream
// shows there, and in flightcache.load.errors), or stale-on-error when the
// stale value covered the failure; canceled is a Get whose own context
// ended first, closed one refused by Close. The results add up to
// Stats.Gets once no Get runs; the Gets waiting now are
// flightcache.get.active. flightcache.reloads counts the loads made with
// [flightcache.Options.Reload] by how they ended: not_modified
// ([flightcache.ErrNotModified]: the value held kept and renewed, an HTTP
// 304), modified (a new value), or the failure's outcome.
//
// After the Loader's Close the counters keep their last values.
package otelflightcache

import (
	"context"
	"errors"

	"github.com/flightcache/flightcache"
)

// ScopeName is the instrumentation scope of the tracer and the meter an
// Observer creates: this module's import path.
const ScopeName = "github.com/flightcache/flightcache/otelflightcache"

// DefaultDurationBuckets are the bucket boundaries, in seconds, of the
// duration histograms without [WithDurationBuckets]. 1 ms to 10 s.
var DefaultDurationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// DefaultCallerBuckets are the bucket boundaries of the callers-per-load
// histogram, flightcache.load.callers. The first bucket (0) holds
// background refreshes nobody joined.
var DefaultCallerBuckets = []float64{0, 1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000}

// Outcome classifies a load error into an outcome: "ok" for nil, then the
// first that matches of "not_found" ([flightcache.ErrNotFound]; an
// Observer also says "not_found" for any error the Loader judged a
// not-found, [flightcache.LoadEvent].NotFound, which takes
// [flightcache.Options.IsNotFound] into account where Outcome cannot),
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

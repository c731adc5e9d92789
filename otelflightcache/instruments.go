package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instruments are an Observer's metrics: three histograms it records into
// as loads end and Gets finish waiting, and the instruments read at
// collection time (collected.go).
type instruments struct {
	loadDur metric.Float64Histogram
	callers metric.Int64Histogram
	wait    metric.Float64Histogram

	// Attribute sets, built once per combination rather than per measurement.
	name        attribute.KeyValue
	loadAttrs   map[loadKey]metric.MeasurementOption
	callerAttrs map[string]metric.MeasurementOption
	waitAttrs   map[flightcache.Source]metric.MeasurementOption
}

// loadKey picks the attribute set of one flightcache.load.duration
// measurement.
type loadKey struct {
	outcome    string
	background bool
}

// sources are the values of the flightcache.get.source attribute.
var sources = []flightcache.Source{
	flightcache.SourceNone, flightcache.SourceHit, flightcache.SourceStale,
	flightcache.SourceStaleOnError, flightcache.SourceLoaded, flightcache.SourceShared,
}

// loadOutcomes are the values of flightcache.load.outcome and error.type.
var loadOutcomes = []string{"ok", "not_found", "timeout", "breaker_open", "canceled", "panic", "error"}

// newInstruments creates an Observer's instruments on m, every
// measurement with the attribute name, the duration histograms with the
// bucket boundaries durations; observe is what the collection callback
// reports.
func newInstruments(m metric.Meter, name attribute.KeyValue, durations []float64, observe observeFunc) (*instruments, error) {
	in := &instruments{
		name:        name,
		loadAttrs:   make(map[loadKey]metric.MeasurementOption),
		callerAttrs: make(map[string]metric.MeasurementOption),
		waitAttrs:   make(map[flightcache.Source]metric.MeasurementOption),
	}
	var err1, err2, err3 error
	in.loadDur, err1 = m.Float64Histogram("flightcache.load.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one load, retries and backoff included, its wait for a Limit slot not."),
		metric.WithExplicitBucketBoundaries(durations...))
	in.callers, err2 = m.Int64Histogram("flightcache.load.callers", metric.WithUnit("{get}"),
		metric.WithDescription("Gets that received one load's result, the starter included: the blast radius of a failed load."),
		metric.WithExplicitBucketBoundaries(DefaultCallerBuckets...))
	in.wait, err3 = m.Float64Histogram("flightcache.get.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time one Get spent waiting on a load."),
		metric.WithExplicitBucketBoundaries(durations...))
	if err := errors.Join(err1, err2, err3, registerCollected(m, name, observe)); err != nil {
		return nil, fmt.Errorf("otelflightcache: %w", err)
	}
	for _, o := range loadOutcomes {
		for _, bg := range []bool{false, true} {
			in.loadAttrs[loadKey{o, bg}] = metric.WithAttributeSet(attribute.NewSet(name,
				attribute.String(keyLoadOutcome, o), attribute.Bool(keyLoadBackground, bg)))
		}
		in.callerAttrs[o] = metric.WithAttributeSet(attribute.NewSet(name, attribute.String(keyLoadOutcome, o)))
	}
	for _, s := range sources {
		in.waitAttrs[s] = in.sourceAttrs(s)
	}
	return in, nil
}

// sourceAttrs is the attribute set of a wait by a Get of Source s.
func (in *instruments) sourceAttrs(s flightcache.Source) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(in.name, attribute.String(keyGetSource, s.String())))
}

// recordLoad records one finished load.
func (in *instruments) recordLoad(ctx context.Context, took time.Duration, callers int, background bool, outcome string) {
	attrs, ok := in.loadAttrs[loadKey{outcome, background}]
	if !ok {
		attrs = in.loadAttrs[loadKey{"error", background}]
	}
	in.loadDur.Record(ctx, took.Seconds(), attrs)
	attrs, ok = in.callerAttrs[outcome]
	if !ok {
		attrs = in.callerAttrs["error"]
	}
	in.callers.Record(ctx, int64(callers), attrs)
}

// recordWait records one Get's wait on a load.
func (in *instruments) recordWait(ctx context.Context, info flightcache.Info) {
	attrs, ok := in.waitAttrs[info.Source]
	if !ok { // a Source newer than this module
		attrs = in.sourceAttrs(info.Source)
	}
	in.wait.Record(ctx, info.Waited.Seconds(), attrs)
}

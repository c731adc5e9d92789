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
// collection time, from Stats and the eviction counts.
type instruments struct {
	loadDur metric.Float64Histogram
	callers metric.Int64Histogram
	wait    metric.Float64Histogram

	// Attribute sets, built once per combination rather than per measurement.
	loadAttrs   map[loadKey]metric.MeasurementOption
	callerAttrs map[string]metric.MeasurementOption
	waitAttrs   map[flightcache.Source]metric.MeasurementOption
	name        attribute.KeyValue
}

// observeFunc returns what the collection callback reports: the Stats (ok
// is false before the Loader handed any) and the eviction counts by cause.
type observeFunc func() (st flightcache.Stats, ok bool, evictions [numCauses]int64)

// loadOutcomes are the values of flightcache.load.outcome and error.type.
var loadOutcomes = []string{"ok", "not_found", "timeout", "breaker_open", "canceled", "panic", "error"}

// numCauses is the number of eviction counts: one per
// flightcache.EvictionCause, the zero one ("unknown") included.
const numCauses = int(flightcache.EvictionInvalidated) + 1

// statCounters are the counters read from Stats, besides flightcache.gets
// (by result) and flightcache.evictions (by cause, from the events).
var statCounters = []counter{
	{"flightcache.loads", "{load}", "Downstream loads, foreground and background.", func(s flightcache.Stats) uint64 { return s.Loads }},
	{"flightcache.load.errors", "{load}", "Loads that ended in an error, not-found and abandoned ones included.", func(s flightcache.Stats) uint64 { return s.LoadErrors }},
	{"flightcache.shared", "{get}", "Gets served by a load they did not start.", func(s flightcache.Stats) uint64 { return s.Shared }},
	{"flightcache.shared.errors", "{get}", "Gets served by a load they did not start that received its error: the summed blast radius.", func(s flightcache.Stats) uint64 { return s.SharedErrors }},
	{"flightcache.refreshes", "{load}", "Background loads started: refreshes, early refreshes and Refresh calls.", func(s flightcache.Stats) uint64 { return s.Refreshes }},
	{"flightcache.breaker.rejected", "{call}", "Downstream calls the circuit breaker refused.", func(s flightcache.Stats) uint64 { return s.BreakerRejected }},
	{"flightcache.panics", "{panic}", "Panics recovered in user code: the load function, callbacks, the Observer.", func(s flightcache.Stats) uint64 { return s.Panics }},
}

func newInstruments(m metric.Meter, name attribute.KeyValue, observe observeFunc) (*instruments, error) {
	in := &instruments{
		loadAttrs:   make(map[loadKey]metric.MeasurementOption),
		callerAttrs: make(map[string]metric.MeasurementOption),
		waitAttrs:   make(map[flightcache.Source]metric.MeasurementOption),
		name:        name,
	}
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	in.loadDur, err = m.Float64Histogram("flightcache.load.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one load, retries and backoff included."),
		metric.WithExplicitBucketBoundaries(DefaultDurationBuckets...))
	note(err)
	in.callers, err = m.Int64Histogram("flightcache.load.callers", metric.WithUnit("{get}"),
		metric.WithDescription("Gets that received one load's result, the starter included: the blast radius of a failed load."),
		metric.WithExplicitBucketBoundaries(DefaultCallerBuckets...))
	note(err)
	in.wait, err = m.Float64Histogram("flightcache.get.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time one Get spent waiting on a load."),
		metric.WithExplicitBucketBoundaries(DefaultDurationBuckets...))
	note(err)
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
	note(in.register(m, observe))
	if len(errs) > 0 {
		return nil, fmt.Errorf("otelflightcache: %w", errors.Join(errs...))
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

// register creates the instruments read at collection time and the
// callback that reads them.
func (in *instruments) register(m metric.Meter, observe observeFunc) error {
	var errs []error
	var all []metric.Observable
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		all = append(all, c)
		return c
	}
	upDown := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		c, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		all = append(all, c)
		return c
	}
	stats := make([]metric.Int64ObservableCounter, len(statCounters))
	for i, c := range statCounters {
		stats[i] = counter(c.name, c.unit, c.desc)
	}
	gets := counter("flightcache.gets", "{get}",
		"Gets, by how they were answered: hit (fresh), stale (served at once), miss (waited on a load), closed.")
	evictions := counter("flightcache.evictions", "{entry}",
		"Entries that left the cache or were refused by it, by cause.")
	loadActive := upDown("flightcache.load.active", "{load}", "Loads running now.")
	getActive := upDown("flightcache.get.active", "{get}",
		"Gets waiting on a load now: the blast radius if the loads running now fail.")
	breaker, err := m.Int64ObservableGauge("flightcache.breaker.state",
		metric.WithDescription("1 for the circuit breaker's current state, 0 for the others."))
	errs = append(errs, err)
	all = append(all, breaker)
	if err := errors.Join(errs...); err != nil {
		return err
	}

	set := func(k string, v string) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(in.name, attribute.String(k, v)))
	}
	base := metric.WithAttributeSet(attribute.NewSet(in.name))
	getAttrs := make([]metric.ObserveOption, len(getResults))
	for i, r := range getResults {
		getAttrs[i] = set(keyGetResult, r.name)
	}
	causeAttrs := make([]metric.ObserveOption, numCauses)
	for i := range causeAttrs {
		causeAttrs[i] = set(keyEvictionCause, flightcache.EvictionCause(i).String())
	}
	stateAttrs := make([]metric.ObserveOption, len(breakerStates))
	for i, st := range breakerStates {
		stateAttrs[i] = set(keyBreakerState, st.String())
	}

	mono := &monotonic{last: make([]uint64, len(statCounters)+len(getResults))}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st, ok, evicted := observe()
		for i, n := range evicted {
			if i > 0 || n > 0 { // an unknown cause only once seen
				o.ObserveInt64(evictions, n, causeAttrs[i])
			}
		}
		if !ok {
			return nil
		}
		for i, c := range statCounters {
			o.ObserveInt64(stats[i], mono.report(i, c.read(st)), base)
		}
		for i, r := range getResults {
			o.ObserveInt64(gets, mono.report(len(statCounters)+i, r.read(st)), getAttrs[i])
		}
		o.ObserveInt64(loadActive, st.InFlight, base)
		o.ObserveInt64(getActive, st.Waiting, base)
		for i, state := range breakerStates {
			v := int64(0)
			if st.Breaker == state {
				v = 1
			}
			o.ObserveInt64(breaker, v, stateAttrs[i])
		}
		return nil
	}, all...)
	return err
}

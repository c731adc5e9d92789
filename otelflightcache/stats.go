package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// StatsReader is what [Metrics.Observe] reads: every
// *[flightcache.Loader] is one.
type StatsReader interface {
	Stats() flightcache.Stats
}

// counter is one observable counter fed by a field of Stats.
type counter struct {
	name, unit, desc string
	read             func(flightcache.Stats) uint64
}

// counters maps the cumulative fields of Stats to counters. Gets are one
// counter with a result attribute; see getResults.
var counters = []counter{
	{"flightcache.shared", "{get}", "Misses served by a load they did not start.", func(s flightcache.Stats) uint64 { return s.Shared }},
	{"flightcache.shared.errors", "{get}", "Misses served by a load they did not start that received its error: the summed blast radius.", func(s flightcache.Stats) uint64 { return s.SharedErrors }},
	{"flightcache.stale_on_error", "{get}", "Misses answered with a stale value because the load failed.", func(s flightcache.Stats) uint64 { return s.StaleOnError }},
	{"flightcache.canceled", "{get}", "Misses whose own context ended before the load.", func(s flightcache.Stats) uint64 { return s.Canceled }},
	{"flightcache.loads", "{load}", "Downstream loads, foreground and background.", func(s flightcache.Stats) uint64 { return s.Loads }},
	{"flightcache.load.errors", "{load}", "Loads that ended in an error, not-found and abandoned ones included.", func(s flightcache.Stats) uint64 { return s.LoadErrors }},
	{"flightcache.retries", "{call}", "Downstream calls beyond the first of each load.", func(s flightcache.Stats) uint64 { return s.Retries }},
	{"flightcache.refreshes", "{load}", "Background refreshes started.", func(s flightcache.Stats) uint64 { return s.Refreshes }},
	{"flightcache.abandoned", "{load}", "Loads cancelled because every caller left.", func(s flightcache.Stats) uint64 { return s.Abandoned }},
	{"flightcache.breaker.rejected", "{call}", "Downstream calls the circuit breaker refused.", func(s flightcache.Stats) uint64 { return s.BreakerRejected }},
	{"flightcache.panics", "{panic}", "Panics recovered in the load function, Cost or OnLoad.", func(s flightcache.Stats) uint64 { return s.Panics }},
	{"flightcache.cache.sets.dropped", "{set}", "Cache fills dropped by the cache's set buffer.", func(s flightcache.Stats) uint64 { return s.SetsDropped }},
	{"flightcache.cache.sets.rejected", "{set}", "Cache fills refused by the cache's admission policy.", func(s flightcache.Stats) uint64 { return s.SetsRejected }},
	{"flightcache.cache.evictions", "{entry}", "Entries evicted to make room.", func(s flightcache.Stats) uint64 { return s.Evicted }},
}

// getResults are the values of the result attribute of flightcache.gets,
// each with the field of Stats it counts.
var getResults = []struct {
	name string
	read func(flightcache.Stats) uint64
}{
	{"hit", func(s flightcache.Stats) uint64 { return s.Hits }},
	{"stale", func(s flightcache.Stats) uint64 { return s.StaleHits }},
	{"miss", func(s flightcache.Stats) uint64 { return s.Misses }},
	{"closed", func(s flightcache.Stats) uint64 { return s.Closed }},
}

// monotonic keeps the counters Observe reports from going down. A Stats
// snapshot taken while Gets run can count a Get as a miss that a later
// snapshot counts as a hit (it found the load it was about to join just
// finished), so Stats.Misses can dip by a few between two collections. To
// Prometheus's rate() and OpenTelemetry's cumulative-to-delta conversion a
// counter that goes down is a reset, which reads as a huge spike; a dip is
// reported as the previous value until the count catches up.
type monotonic struct {
	mu   sync.Mutex // guards last; collections by several readers may overlap
	last []uint64   // the last value reported, per counter
}

// report returns v, or the last value reported for counter i if that is
// larger.
func (m *monotonic) report(i int, v uint64) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.last[i] = max(m.last[i], v)
	return int64(m.last[i])
}

// breakerStates are the values of the state attribute of
// flightcache.breaker.state.
var breakerStates = []flightcache.BreakerState{
	flightcache.BreakerClosed, flightcache.BreakerHalfOpen, flightcache.BreakerOpen,
}

// Observe starts reporting s's Stats (normally the Loader the Metrics'
// OnLoad was given to) as counters and gauges: s.Stats is called once per
// collection, on the collecting goroutine. A counter is never reported
// below its last reported value: a snapshot taken while Gets run can count
// a Get as a miss that the next one counts as a hit, and a counter that
// goes down would read as a reset. Call Observe once; a second call returns
// an error. [Metrics.Close] stops the reporting.
func (m *Metrics[K]) Observe(s StatsReader) error {
	if s == nil {
		return errors.New("otelflightcache: Observe of a nil StatsReader")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.observed {
		return errors.New("otelflightcache: Observe called twice")
	}

	attrs := metric.WithAttributeSet(attribute.NewSet(m.cache))
	var instruments []metric.Observable
	observable := make([]metric.Int64ObservableCounter, len(counters))
	for i, c := range counters {
		o, err := m.meter.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc))
		if err != nil {
			return fmt.Errorf("otelflightcache: %w", err)
		}
		observable[i] = o
		instruments = append(instruments, o)
	}
	gets, err := m.meter.Int64ObservableCounter("flightcache.gets", metric.WithUnit("{get}"),
		metric.WithDescription("Get calls, by how they were answered: hit (fresh), stale (served at once), miss (waited for a load), closed."))
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	inFlight, err := m.meter.Int64ObservableGauge("flightcache.loads.in_flight", metric.WithUnit("{load}"),
		metric.WithDescription("Loads running now."))
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	waiting, err := m.meter.Int64ObservableGauge("flightcache.waiting", metric.WithUnit("{get}"),
		metric.WithDescription("Gets waiting on a load now: the blast radius if the loads running now fail."))
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	maxCallers, err := m.meter.Int64ObservableGauge("flightcache.load.max_callers", metric.WithUnit("{caller}"),
		metric.WithDescription("The most Gets one load's result has reached."))
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	breaker, err := m.meter.Int64ObservableGauge("flightcache.breaker.state",
		metric.WithDescription("1 for the circuit breaker's current state, 0 for the others."))
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	instruments = append(instruments, gets, inFlight, waiting, maxCallers, breaker)

	getAttrs := make([]metric.ObserveOption, len(getResults))
	for i, r := range getResults {
		getAttrs[i] = metric.WithAttributeSet(attribute.NewSet(m.cache, attribute.String("result", r.name)))
	}
	stateAttrs := make([]metric.ObserveOption, len(breakerStates))
	for i, st := range breakerStates {
		stateAttrs[i] = metric.WithAttributeSet(attribute.NewSet(m.cache, attribute.String("state", st.String())))
	}

	mono := &monotonic{last: make([]uint64, len(counters)+len(getResults))}
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		for i, c := range counters {
			o.ObserveInt64(observable[i], mono.report(i, c.read(st)), attrs)
		}
		for i, r := range getResults {
			o.ObserveInt64(gets, mono.report(len(counters)+i, r.read(st)), getAttrs[i])
		}
		o.ObserveInt64(inFlight, st.InFlight, attrs)
		o.ObserveInt64(waiting, st.Waiting, attrs)
		o.ObserveInt64(maxCallers, int64(st.MaxCallersPerLoad), attrs)
		for i, state := range breakerStates {
			v := int64(0)
			if st.Breaker == state {
				v = 1
			}
			o.ObserveInt64(breaker, v, stateAttrs[i])
		}
		return nil
	}, instruments...)
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	m.observed, m.reg = true, reg
	return nil
}

// Close stops the reporting Observe started; the histograms fed by OnLoad
// and RecordWait keep working. It is idempotent and safe to call without
// Observe.
func (m *Metrics[K]) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reg == nil {
		return nil
	}
	err := m.reg.Unregister()
	m.reg = nil
	if err != nil {
		return fmt.Errorf("otelflightcache: %w", err)
	}
	return nil
}

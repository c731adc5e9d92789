package otelflightcache

import (
	"context"
	"errors"
	"fmt"

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
// counter with a result attribute; see observeGets.
var counters = []counter{
	{"flightcache.shared", "{get}", "Misses served by a load they did not start.", func(s flightcache.Stats) uint64 { return s.Shared }},
	{"flightcache.shared.errors", "{get}", "Misses served by a load they did not start that received its error: the summed blast radius.", func(s flightcache.Stats) uint64 { return s.SharedErrors }},
	{"flightcache.stale_on_error", "{get}", "Misses answered with a stale value because the load failed.", func(s flightcache.Stats) uint64 { return s.StaleOnError }},
	{"flightcache.canceled", "{get}", "Misses whose own context ended before the load.", func(s flightcache.Stats) uint64 { return s.Canceled }},
	{"flightcache.loads", "{load}", "Downstream loads, foreground and background.", func(s flightcache.Stats) uint64 { return s.Loads }},
	{"flightcache.load.errors", "{load}", "Loads that ended in an error.", func(s flightcache.Stats) uint64 { return s.LoadErrors }},
	{"flightcache.retries", "{call}", "Downstream calls beyond the first of each load.", func(s flightcache.Stats) uint64 { return s.Retries }},
	{"flightcache.refreshes", "{load}", "Background refreshes started.", func(s flightcache.Stats) uint64 { return s.Refreshes }},
	{"flightcache.abandoned", "{load}", "Loads cancelled because every caller left.", func(s flightcache.Stats) uint64 { return s.Abandoned }},
	{"flightcache.breaker.rejected", "{call}", "Downstream calls the circuit breaker refused.", func(s flightcache.Stats) uint64 { return s.BreakerRejected }},
	{"flightcache.panics", "{panic}", "Panics recovered in the load function, Cost or OnLoad.", func(s flightcache.Stats) uint64 { return s.Panics }},
	{"flightcache.cache.sets.dropped", "{set}", "Cache fills dropped by the cache's set buffer.", func(s flightcache.Stats) uint64 { return s.SetsDropped }},
	{"flightcache.cache.sets.rejected", "{set}", "Cache fills refused by the cache's admission policy.", func(s flightcache.Stats) uint64 { return s.SetsRejected }},
	{"flightcache.cache.evictions", "{entry}", "Entries evicted to make room.", func(s flightcache.Stats) uint64 { return s.Evicted }},
}

// breakerStates are the values of the state attribute of
// flightcache.breaker.state.
var breakerStates = []flightcache.BreakerState{
	flightcache.BreakerClosed, flightcache.BreakerHalfOpen, flightcache.BreakerOpen,
}

// Observe starts reporting s's Stats (normally the Loader the Metrics'
// OnLoad was given to) as counters and gauges: s.Stats is called once per
// collection, on the collecting goroutine. Call Observe once; a second call
// returns an error. [Metrics.Close] stops the reporting.
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
	instruments = append(instruments, gets, inFlight, maxCallers, breaker)

	getAttrs := map[string]metric.ObserveOption{}
	for _, r := range []string{"hit", "stale", "miss", "closed"} {
		getAttrs[r] = metric.WithAttributeSet(attribute.NewSet(m.cache, attribute.String("result", r)))
	}
	stateAttrs := make([]metric.ObserveOption, len(breakerStates))
	for i, st := range breakerStates {
		stateAttrs[i] = metric.WithAttributeSet(attribute.NewSet(m.cache, attribute.String("state", st.String())))
	}

	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		for i, c := range counters {
			o.ObserveInt64(observable[i], int64(c.read(st)), attrs)
		}
		o.ObserveInt64(gets, int64(st.Hits), getAttrs["hit"])
		o.ObserveInt64(gets, int64(st.StaleHits), getAttrs["stale"])
		o.ObserveInt64(gets, int64(st.Misses), getAttrs["miss"])
		o.ObserveInt64(gets, int64(st.Closed), getAttrs["closed"])
		o.ObserveInt64(inFlight, st.InFlight, attrs)
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

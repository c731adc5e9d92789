package otelflightcache

import (
	"context"
	"errors"
	"sync"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The instruments an Observer reports at collection time: counters,
// up-down counters and a gauge read from the Loader's Stats, and the
// eviction counts by cause.

// observeFunc returns what the collection callback reports: the Stats (ok
// is false before the Loader handed any) and the counts of events.
type observeFunc func() (st flightcache.Stats, ok bool, ev eventCounts)

// eventCounts are the counters an Observer keeps from the events it is
// told: the evictions by cause, the reloads by result.
type eventCounts struct {
	evictions [numCauses]int64
	reloads   [len(reloadResults)]int64
	tagsFleet int64 // tag invalidations another process made (TagEvent.Remote)
}

// reloadResults are the values of the result attribute of
// flightcache.reloads: a reload's load outcome, its ok told apart as
// not_modified (the Reload returned ErrNotModified) or modified.
var reloadResults = [...]string{"not_modified", "modified", "not_found", "timeout", "breaker_open", "canceled", "panic", "error"}

// reloadResult is the flightcache.reloads result of the load ev
// describes, or "" for a load that called no Reload.
func reloadResult[K comparable](ev flightcache.LoadEvent[K]) string {
	switch {
	case !ev.Reload:
		return ""
	case ev.NotModified:
		return "not_modified"
	}
	if outcome := loadOutcome(ev); outcome != "ok" {
		return outcome
	}
	return "modified"
}

// numCauses is the number of eviction counts: one per
// flightcache.EvictionCause, the zero one ("unknown") included.
const numCauses = int(flightcache.EvictionInvalidated) + 1

// counter is one observable counter fed by a field of Stats.
type counter struct {
	name, unit, desc string
	read             func(flightcache.Stats) uint64
}

// getResults are the values of the result attribute of flightcache.gets,
// each with the field of Stats it counts: one per [flightcache.Source] a
// Get can say, by its String, and for a Get answered by neither the cache
// nor a load (SourceNone), canceled and closed. They add up to the Gets
// answered: Stats.Gets once no Get is running.
var getResults = []struct {
	name string
	read func(flightcache.Stats) uint64
}{
	{"hit", func(s flightcache.Stats) uint64 { return s.Hits }},
	{"stale", func(s flightcache.Stats) uint64 { return s.StaleHits - min(s.StaleLimited, s.StaleHits) }},
	{"stale-limited", func(s flightcache.Stats) uint64 { return s.StaleLimited }},
	{"stale-on-error", func(s flightcache.Stats) uint64 { return s.StaleOnError }},
	{"loaded", func(s flightcache.Stats) uint64 { return s.Loaded }},
	{"shared", func(s flightcache.Stats) uint64 { return s.Shared }},
	{"canceled", func(s flightcache.Stats) uint64 { return s.Canceled }},
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

// statCounters are the counters read from Stats, besides flightcache.gets
// (by result); flightcache.evictions (by cause) and flightcache.reloads
// (by result) are counted from the events.
var statCounters = []counter{
	{"flightcache.loads", "{load}", "Loads ended, foreground and background: one per key loaded alone, one per LoadMany call; those the breaker or the limit refused included.", func(s flightcache.Stats) uint64 { return s.Loads }},
	{"flightcache.load.errors", "{load}", "Loads that failed: ended in an error other than a not-found (refused, timed out and abandoned ones included).", loadFailures},
	{"flightcache.load.not_founds", "{key}", "Keys a load answered not-found: an answer, not a failure.", func(s flightcache.Stats) uint64 { return s.NotFounds }},
	{"flightcache.downstream.calls", "{call}", "Calls the downstream saw: load, reload and batch calls made, retries included.", func(s flightcache.Stats) uint64 { return s.DownstreamCalls }},
	{"flightcache.shared", "{get}", "Gets served by a load they did not start.", func(s flightcache.Stats) uint64 { return s.Shared }},
	{"flightcache.shared.errors", "{get}", "Gets served by a load they did not start that received its error: the summed blast radius.", func(s flightcache.Stats) uint64 { return s.SharedErrors }},
	{"flightcache.refreshes", "{load}", "Background loads started: refreshes, early refreshes and Refresh calls.", func(s flightcache.Stats) uint64 { return s.Refreshes }},
	{"flightcache.breaker.rejected", "{call}", "Downstream calls the circuit breaker refused.", func(s flightcache.Stats) uint64 { return s.BreakerRejected }},
	{"flightcache.panics", "{panic}", "Panics recovered in user code: the load function, callbacks, the Observer.", func(s flightcache.Stats) uint64 { return s.Panics }},
	{"flightcache.tag.invalidations", "{tag}", "Tags invalidated: InvalidateTag calls, and with a Remote other processes' calls heard.", func(s flightcache.Stats) uint64 { return s.TagInvalidations }},
	{"flightcache.tag.errors", "{value}", "Values not cached because Tags panicked or gave more than MaxTags tags.", func(s flightcache.Stats) uint64 { return s.TagErrors }},
}

// loadFailures is what flightcache.load.errors counts: the loads that
// ended in an error, less those whose error is a not-found.
func loadFailures(s flightcache.Stats) uint64 {
	return s.LoadErrors - min(s.LoadNotFounds, s.LoadErrors)
}

// collected are the instruments read at collection time, with their
// attribute sets.
type collected struct {
	stats                 []metric.Int64ObservableCounter // statCounters'
	gets, evictions       metric.Int64ObservableCounter
	reloads               metric.Int64ObservableCounter
	tagsFleet             metric.Int64ObservableCounter
	loadActive, getActive metric.Int64ObservableUpDownCounter
	breaker               metric.Int64ObservableGauge

	base                    metric.ObserveOption   // flightcache.name alone
	results, causes, states []metric.ObserveOption // by getResults, cause, breakerStates
	reloadSets              []metric.ObserveOption // by reloadResults
	mono                    *monotonic
}

// registerCollected creates the collected instruments on m and registers
// the callback that reads observe.
func registerCollected(m metric.Meter, name attribute.KeyValue, observe observeFunc) error {
	c := &collected{mono: &monotonic{last: make([]uint64, len(statCounters)+len(getResults))}}
	var errs []error
	var all []metric.Observable
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		o, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs, all = append(errs, err), append(all, o)
		return o
	}
	upDown := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		o, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs, all = append(errs, err), append(all, o)
		return o
	}
	for _, s := range statCounters {
		c.stats = append(c.stats, counter(s.name, s.unit, s.desc))
	}
	c.gets = counter("flightcache.gets", "{get}",
		"Gets answered, by how (their Info.Source): hit, stale, stale-limited (served at once), stale-on-error, loaded, shared (waited on a load), canceled, closed.")
	c.evictions = counter("flightcache.evictions", "{entry}", "Entries that left the cache or were refused by it, by cause.")
	c.reloads = counter("flightcache.reloads", "{load}",
		"Loads of a value held, made with Reload, by result: not_modified (kept and renewed), modified, or the failure's outcome.")
	c.tagsFleet = counter("flightcache.tag.invalidations.fleet", "{tag}",
		"Of flightcache.tag.invalidations, those another process of the fleet made, passed on by the Remote.")
	c.loadActive = upDown("flightcache.load.active", "{load}", "Loads running now.")
	c.getActive = upDown("flightcache.get.active", "{get}", "Gets waiting on a load now: the blast radius if the loads running now fail.")
	var err error
	c.breaker, err = m.Int64ObservableGauge("flightcache.breaker.state",
		metric.WithDescription("1 for the circuit breaker's current state, 0 for the others."))
	errs, all = append(errs, err), append(all, c.breaker)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.attrs(name)
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.observe(o, observe)
		return nil
	}, all...)
	return err
}

// attrs builds c's attribute sets.
func (c *collected) attrs(name attribute.KeyValue) {
	set := func(k, v string) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(name, attribute.String(k, v)))
	}
	c.base = metric.WithAttributeSet(attribute.NewSet(name))
	for _, r := range getResults {
		c.results = append(c.results, set(keyGetResult, r.name))
	}
	for i := range numCauses {
		c.causes = append(c.causes, set(keyEvictionCause, flightcache.EvictionCause(i).String()))
	}
	for _, st := range breakerStates {
		c.states = append(c.states, set(keyBreakerState, st.String()))
	}
	for _, r := range reloadResults {
		c.reloadSets = append(c.reloadSets, set(keyReloadResult, r))
	}
}

// observe reports one collection.
func (c *collected) observe(o metric.Observer, observe observeFunc) {
	st, ok, ev := observe()
	for i, n := range ev.evictions {
		if i > 0 || n > 0 { // an unknown cause only once seen
			o.ObserveInt64(c.evictions, n, c.causes[i])
		}
	}
	for i, n := range ev.reloads {
		o.ObserveInt64(c.reloads, n, c.reloadSets[i])
	}
	o.ObserveInt64(c.tagsFleet, ev.tagsFleet, c.base)
	if !ok {
		return
	}
	for i, s := range statCounters {
		o.ObserveInt64(c.stats[i], c.mono.report(i, s.read(st)), c.base)
	}
	for i, r := range getResults {
		o.ObserveInt64(c.gets, c.mono.report(len(statCounters)+i, r.read(st)), c.results[i])
	}
	o.ObserveInt64(c.loadActive, st.InFlight, c.base)
	o.ObserveInt64(c.getActive, st.Waiting, c.base)
	for i, state := range breakerStates {
		v := int64(0)
		if st.Breaker == state {
			v = 1
		}
		o.ObserveInt64(c.breaker, v, c.states[i])
	}
}

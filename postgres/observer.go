package flightpg

import "fmt"

// Observer sees what a [Source] does, for metrics (set it as
// [Options.Observer]): each transaction applied, with its lag (a
// histogram's sample) and its changes (a counter's step), each gap and
// each reconnect. [Stats] has the same, cumulative, for an exporter that
// reads at collection time; an Observer that also implements
// [StatsObserver] is handed the function that reads them.
//
// Its methods are called on the Source's goroutine, which waits for them,
// in the order the events happen, each after the matching callback of
// [Options] (OnApplied, OnGap, OnReconnect), so they must not block. Each
// call goes through a guard: a panic is recovered, reported to
// Options.OnError (a *flightcache.PanicError), counted in
// [Stats.ObserverPanics], and changes nothing else (the Source goes on,
// the other callbacks are called).
type Observer interface {
	// Applied is called after each transaction applied that held a change
	// of the publication, in commit order.
	Applied(Applied)
	// Gap is called after the Source found changes it cannot replay and
	// distrusted every value.
	Gap(Gap)
	// Reconnected is called after each replication connection made after
	// a loss, before the stream resumes.
	Reconnected(Reconnected)
}

// StatsObserver is an optional capability of an [Observer]: one that
// reports [Stats] (a metrics exporter's gauges and counters, read at
// collection time: the confirmed position, reconnects, gaps) is handed,
// once, in [New], the function that reads them ([Source.Stats]), which is
// safe for concurrent use and keeps its last figures after Close.
type StatsObserver interface {
	ObserveStats(stats func() Stats)
}

// configure wires the Options that New hands over to the applier and the
// Observer (before the first connection, which may already report a gap).
func (s *Source[K]) configure(target Target[K]) error {
	a := s.apply
	a.onApplied = s.opts.OnApplied
	if s.opts.Version != nil {
		tombstones, ok := target.(VersionTarget[K])
		if !ok {
			return optionError("Version", "needs a target with InvalidateVersion(key, version) (flightcache's Loader), got %T", target)
		}
		a.tombstones, a.version = tombstones, s.opts.Version
	}
	obs := s.opts.Observer
	if obs == nil {
		return nil
	}
	a.onApplied = observed(s, "Applied", s.opts.OnApplied, obs.Applied)
	s.opts.OnGap = observed(s, "Gap", s.opts.OnGap, obs.Gap)
	s.opts.OnReconnect = observed(s, "Reconnected", s.opts.OnReconnect, obs.Reconnected)
	if so, ok := obs.(StatsObserver); ok {
		if err := guard(func() { so.ObserveStats(s.Stats) }); err != nil {
			s.stats.observerPanics.Add(1)
			s.report(fmt.Errorf("flightpg: Observer.ObserveStats panicked: %w", err))
		}
	}
	return nil
}

// observed returns a callback that calls the user's own (if any) and then
// the Observer's method, the latter through its own guard: a panic of the
// callback (recovered by its caller, as before) never skips the Observer,
// nor the Observer's the rest of the Source's work.
func observed[K comparable, E any](s *Source[K], method string, own, obs func(E)) func(E) {
	return func(ev E) {
		defer func() {
			if err := guard(func() { obs(ev) }); err != nil {
				s.stats.observerPanics.Add(1)
				s.report(fmt.Errorf("flightpg: Observer.%s panicked: %w", method, err))
			}
		}()
		if own != nil {
			own(ev)
		}
	}
}

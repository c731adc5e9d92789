package flightcache

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// How TestChaos judges each Get and each run, and the table it prints.

// chaosReport is one run's column of the table, and what it found.
type chaosReport struct {
	config chaosConfig
	rows   [][2]string
	v      *violations
	n      *chaosCounts
}

// unexercised lists what a run of a few seconds or more must have gone
// through, and did not: a chaos test that never opens the breaker proves
// nothing about it.
func (r *chaosReport) unexercised() []string {
	n := r.n
	musts := []struct {
		what string
		got  int64
	}{
		{"the breaker opened", n.opened.Load()},
		{"the breaker closed again", n.reclosed.Load()},
		{"a stale value covered an error", n.sources[SourceStaleOnError].Load()},
		{"an error met a cached value on record", n.staleChecked.Load()},
		{"a stale value was served while revalidating", n.sources[SourceStale].Load()},
		{"a load was shared", n.sources[SourceShared].Load()},
		{"a caller's context ended first", n.ctxErrs.Load()},
		{"the downstream panicked", n.panics.Load()},
		{"the downstream called runtime.Goexit", n.goexits.Load()},
		{"the downstream hung", n.hangs.Load()},
		{"a not-found was cached", n.notFound.Load()},
		{"a background refresh ran", n.background.Load()},
	}
	if r.config.policy == CancelAtZero {
		musts = append(musts, struct {
			what string
			got  int64
		}{"a load was abandoned", n.abandoned.Load()})
	}
	if r.config.limit.enabled() {
		musts = append(musts, []struct {
			what string
			got  int64
		}{
			{"a load queued for a slot", n.queued.Load()},
			{"a Get failed with ErrLimited", n.limitedErrs.Load()},
			{"a value was served stale-limited", n.sources[SourceStaleLimited].Load()},
			{"a refresh was dropped at the limit", n.refreshesLimited.Load()},
		}...)
	}
	var missing []string
	for _, m := range musts {
		if m.got == 0 {
			missing = append(missing, m.what)
		}
	}
	return missing
}

func (r *chaosRun) judgeValue(k *chaosKey, tok *chaosToken, key int, v chaosVal, info Info, ret time.Time) {
	if v.key != key {
		r.v.add(vOtherKey, "Get(%d) = the value of key %d (%v)", key, v.key, info.Source)
	}
	if chaosMissing(key) {
		r.v.add(vUnexpected, "Get(%d) = a value (%v); the key does not exist and is never Set", key, info.Source)
	}
	age := ret.Sub(v.stamp)
	storeMax(&r.n.maxAge, int64(age))
	if age > chaosMaxAge+chaosSlack {
		// Info.Age stays under the bound (checked below): the value is
		// too old by the time between the downstream making it and the
		// Loader stamping it as it delivered the load, ret - Info.Age. A
		// stall of the process in that stretch explains it; a slow
		// delivery without one does not.
		r.noteOverdue(vTooOld, v.stamp, ret.Add(-info.Age), "Get(%d) = a value %v old (%v, Info.Age %v)", key, age, info.Source, info.Age)
	}
	// The Loader stamps an entry no earlier than the value was made, and
	// reads its clock no later than Get returns: Info.Age cannot exceed
	// the true age, nor the bound (it is checked against the same clock
	// reading that chose the value).
	if info.Age > age || info.Age >= chaosMaxAge {
		r.v.add(vAgeDishonest, "Get(%d): Info.Age %v, true age %v, bound %v (%v)", key, info.Age, age, chaosMaxAge, info.Source)
	}
	switch info.Source {
	case SourceStaleLimited:
		if !r.config.limit.enabled() {
			r.v.add(vUnexpected, "Get(%d) = a value stale-limited without a Limit", key)
		}
		k.observe(tok, v.stamp)
	case SourceHit, SourceStale, SourceStaleOnError:
		k.observe(tok, v.stamp)
	case SourceNone:
		r.v.add(vUnexpected, "Get(%d) = a value with Source none", key)
	}
}

// judgeLoadError checks a Get that returned a load's error: it was not
// served from the cache, and no value the Loader could have served instead
// (one within StaleIfError, known to be cached) existed.
func (r *chaosRun) judgeLoadError(k *chaosKey, tok *chaosToken, key int, info Info, err error, ret time.Time) {
	var pe *PanicError
	switch {
	case errors.Is(err, ErrBreakerOpen):
		r.n.breakerErrs.Add(1)
	case errors.Is(err, ErrLimited) && r.config.limit.enabled():
		// Rule 22: the load found no slot, or waited past MaxWait. Like any
		// failure, a stale value within StaleIfError covers it (below).
		r.n.limitedErrs.Add(1)
	case errors.Is(err, errChaos), errors.Is(err, errChaosOutage), errors.As(err, &pe),
		errors.Is(err, ErrGoexit), errors.Is(err, ErrLoadTimeout):
	default:
		r.v.add(vUnexpected, "Get(%d) = %v (%v)", key, err, info.Source)
	}
	if info.Source == SourceHit || info.Source == SourceStale || info.Source == SourceStaleLimited {
		r.v.add(vErrorCached, "Get(%d) = %v served from the cache (%v)", key, err, info.Source)
	}
	if chaosMissing(key) {
		return
	}
	k.mu.Lock()
	obs, gen := k.obs, k.gen()
	k.mu.Unlock()
	// A value on record was in the cache before this Get began, and stayed:
	// nothing is evicted, refused or dropped (reconcile checks), no
	// Invalidate or Set of the key began since, and a fill only replaces it
	// with a newer value. The Loader reads the cache once the load has
	// failed, so an error means the value had expired by then.
	if !obs.ok || obs.gen != gen || !obs.at.Before(tok.begin) {
		return // no value known to be cached through the whole Get
	}
	r.n.staleChecked.Add(1)
	if !ret.Before(obs.stamp.Add(chaosMinUse)) {
		return // the value on record may have expired
	}
	if cs := r.closeStart.Load(); cs != 0 && ret.Sub(r.t0) >= time.Duration(cs) {
		// Once Close has begun the Loader no longer reads its cache, so a
		// failed load returns its error: not a violation, but counted.
		r.n.staleDuringClose.Add(1)
		return
	}
	r.v.add(vErrorDespiteStale, "Get(%d) = %v (%v) at age %v of a value cached (seen by %s) %v before the Get began; it stays servable %v",
		key, err, info.Source, ret.Sub(obs.stamp), obs.via, tok.begin.Sub(obs.at), chaosMinUse)
}

func (r *chaosRun) noteOverdue(kind chaosViolation, from, to time.Time, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overdue = append(r.overdue, chaosOverdue{kind, from, to, fmt.Sprintf(format, args...)})
}

// judgeOverdue decides, once the stall monitor has seen everything, which
// overdue Gets a stall of the whole process explains.
func (r *chaosRun) judgeOverdue() {
	for _, o := range r.overdue {
		if r.mon.overlaps(o.from, o.to) {
			r.n.lateStalled.Add(1)
			continue
		}
		r.v.add(o.kind, "%s", o.msg)
	}
}

// reconcile checks the Loader's Stats against the harness's own counts,
// once every Get has returned and the Loader is closed.
func (r *chaosRun) reconcile() {
	s := r.l.Stats()
	src := func(x Source) uint64 { return uint64(r.n.sources[x].Load()) }
	u := func(a *atomic.Int64) uint64 { return uint64(a.Load()) }
	checks := []struct {
		what      string
		got, want uint64
	}{
		{"Gets vs the harness's Gets", s.Gets, u(&r.n.gets)},
		{"Gets vs Hits+StaleHits+Misses+Closed", s.Gets, s.Hits + s.StaleHits + s.Misses + s.Closed},
		{"Hits vs Gets answered hit", s.Hits, src(SourceHit)},
		{"StaleHits vs Gets answered stale or stale-limited", s.StaleHits, src(SourceStale) + src(SourceStaleLimited)},
		{"StaleLimited vs Gets answered stale-limited", s.StaleLimited, src(SourceStaleLimited)},
		{"Limited vs OnLoad ErrLimited", s.Limited, u(&r.n.limitedLoads)},
		{"LoadLimit within the Limit", uint64(s.LoadLimit), r.loadLimit(s.LoadLimit)},
		{"QueuedLoads after Close", uint64(s.QueuedLoads), 0},
		{"StaleOnError vs Gets answered stale-on-error", s.StaleOnError, src(SourceStaleOnError)},
		{"Loaded vs Gets answered loaded", s.Loaded, src(SourceLoaded)},
		{"Shared vs Gets answered shared", s.Shared, src(SourceShared)},
		{"SharedErrors vs shared Gets with an error", s.SharedErrors, u(&r.n.sharedErrs)},
		{"Misses+Closed vs Gets answered loaded, shared, stale-on-error or none",
			s.Misses + s.Closed, src(SourceLoaded) + src(SourceShared) + src(SourceStaleOnError) + src(SourceNone)},
		{"Canceled vs Gets ended by their own context", s.Canceled, u(&r.n.ctxErrs)},
		{"Loads vs OnLoad calls", s.Loads, u(&r.n.loads)},
		{"LoadErrors vs OnLoad errors", s.LoadErrors, u(&r.n.loadEvErrs)},
		{"Abandoned vs OnLoad abandoned", s.Abandoned, u(&r.n.abandoned)},
		{"Panics vs downstream panics", s.Panics, u(&r.n.panics)},
		{"InFlight after Close", uint64(s.InFlight), 0},
		{"Waiting after Close", uint64(s.Waiting), 0},
		// The stale check assumes that a cached value leaves the cache only
		// by Invalidate: nothing may be evicted, refused or dropped.
		{"Evicted", s.Evicted, 0},
		{"SetsRejected", s.SetsRejected, 0},
		{"SetsDropped", s.SetsDropped, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			r.v.add(vStats, "%s: %d, want %d", c.what, c.got, c.want)
		}
	}
	r.n.refreshesLimited.Store(int64(s.RefreshesLimited))
}

// loadLimit is the Stats.LoadLimit the run's Limit allows, given the one
// reported (got): MaxLoads (0 without a Limit), or for an adaptive bound
// got itself if it lies between 1 and the ceiling.
func (r *chaosRun) loadLimit(got int64) uint64 {
	if l := r.config.limit; l.Adaptive && got >= 1 && got <= int64(l.MaxLoads) {
		return uint64(got)
	}
	return uint64(r.config.limit.MaxLoads)
}

func (r *chaosRun) report(closeTook time.Duration) *chaosReport {
	n := &r.n
	i := func(a *atomic.Int64) string { return fmt.Sprint(a.Load()) }
	d := func(a *atomic.Int64) string { return time.Duration(a.Load()).Round(time.Millisecond).String() }
	src := func(x Source) string { return i(&n.sources[x]) }
	stalls, longest := r.mon.summary()
	rows := [][2]string{
		{"Gets", i(&n.gets)},
		{"  hit / stale / stale-on-error", src(SourceHit) + " / " + src(SourceStale) + " / " + src(SourceStaleOnError)},
		{"  loaded / shared", src(SourceLoaded) + " / " + src(SourceShared)},
		{"  own ctx ended / ErrClosed / not found", i(&n.ctxErrs) + " / " + i(&n.closedErrs) + " / " + i(&n.notFound)},
		{"  load errors (breaker open)", i(&n.loadErrs) + " (" + i(&n.breakerErrs) + ")"},
		{"  stale-limited / ErrLimited", src(SourceStaleLimited) + " / " + i(&n.limitedErrs)},
		{"  with a deadline / cancelled at random", i(&n.deadlines) + " / " + i(&n.cancels)},
		{"Sets / Invalidates", i(&n.sets) + " / " + i(&n.invalidates)},
		{"downstream calls", i(&n.calls)},
		{"  errors / panics / Goexits / 2s hangs", i(&n.errs) + " / " + i(&n.panics) + " / " + i(&n.goexits) + " / " + i(&n.hangs)},
		{"  outage errors / not found", i(&n.outageErrs) + " / " + i(&n.notFoundCalls)},
		{"loads / background / abandoned", i(&n.loads) + " / " + i(&n.background) + " / " + i(&n.abandoned)},
		{"  queued / limited / refreshes dropped at the limit", i(&n.queued) + " / " + i(&n.limitedLoads) + " / " + i(&n.refreshesLimited)},
		{"most downstream calls at once", i(&n.peakCalls)},
		{"breaker opened / closed again", i(&n.opened) + " / " + i(&n.reclosed)},
		{"overlapping calls, detached / abandoned", i(&n.overlapDetached) + " / " + i(&n.overlapAbandoned)},
		{"errors with a cached value on record", i(&n.staleChecked)},
		{"  within SIE, during Close (allowed)", i(&n.staleDuringClose)},
		{"max value age (bound " + chaosMaxAge.String() + ")", d(&n.maxAge)},
		{"max lateness past ctx end (bound 50ms)", d(&n.maxLate)},
		{"max wait without deadline (bound " + chaosMaxWait.String() + " + Limit.MaxWait)", d(&n.maxNoDeadline)},
		{"overdue during a stall (excused)", i(&n.lateStalled)},
		{"stalls > 20ms / longest", fmt.Sprintf("%d / %v", stalls, longest.Round(time.Millisecond))},
		{"longest Set or Invalidate", d(&n.maxWrite)},
		{"Close under load took", closeTook.Round(time.Millisecond).String()},
		{"VIOLATIONS", ""},
	}
	for kind := range numViolations {
		rows = append(rows, [2]string{"  " + chaosViolationNames[kind], i(&r.v.n[kind])})
	}
	return &chaosReport{config: r.config, rows: rows, v: &r.v, n: &r.n}
}

package flightcache

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/loadctx"
)

// observing is how a Loader calls its Observer: every call through the
// Loader's guard, one member of an Observers at a time, with the rules of
// LoadStart's context applied (observer.go). A Loader holds one, made at
// New, or nil when nothing is observed; every method is a no-op on a nil
// *observing, so a caller needs no check of its own, and the hit path,
// which calls none of them, costs nothing.
//
// Where the Loader calls each:
//
//   - newObserving, once in New, when Stats can be read (the stats
//     function is handed to the StatsObserver members at once).
//   - loadStart, on the load's goroutine, once its context has its
//     deadline and the delivery of the load's result is deferred (a
//     Goexit in an Observer then ends the load as one in the LoadFunc
//     does), before the first downstream call, the Remote's included.
//     Its result is the load's context from then on: the LoadFunc,
//     ReloadFunc, LoadManyFunc and the Remote receive it, and it is kept
//     with the load for loadEnd, attempt and the waiters' WaitEvent.Load,
//     published so that a waiter leaving early reads it safely (nil
//     before loadStart has returned). One LoadMany call is one load.
//   - loadEnd, on the load's goroutine, after its waiters were woken,
//     with the event OnLoad gets.
//   - waited, on a Get's goroutine (once per key of a GetMany), for
//     every Get that waited on a load, before it returns; never on a hit
//     or a stale hit.
//   - attempt, if observesAttempts, on the load's goroutine after each
//     failed downstream call that will be retried (before its wait), and
//     for each call the breaker refused.
//   - evicted, if observesEvictions: from the write path (replaced), on
//     the goroutine of the fill, Set, Invalidate or Drop, once it is
//     counted out; and on the writer's goroutine after each of its rounds
//     (reportLeft, departures.go), for what the cache's OnEvict and
//     OnReject and the writer itself saw leave in the round; never on the
//     cache's goroutine, nor in a round; nothing while the cache is torn
//     down at Close.
//   - close, in Close, once every counter is final: the stats function
//     handed out at New freezes.
type observing[K comparable] struct {
	f         *fanout[K] // the members; never nil
	guard     guardFunc  // the Loader's guard
	stats     *statsSource
	attempts  bool // some member is an AttemptObserver
	evictions bool // some member is an EvictionObserver
}

// newObserving returns how a Loader calls o, or nil when o observes
// nothing (nil, or an Observers of none). guard is the Loader's guard;
// stats reads the Loader's Stats, and is handed to the members that are
// StatsObservers, behind a statsSource, before newObserving returns.
func newObserving[K comparable](o Observer[K], guard guardFunc, stats func() Stats) *observing[K] {
	o = Observers(o) // drops a nil pointer, flattens
	if o == nil {
		return nil
	}
	f, ok := o.(*fanout[K])
	if !ok {
		f = &fanout[K]{members: []member[K]{newMember(o)}}
	}
	ob := &observing[K]{f: f, guard: guard}
	for _, m := range f.members {
		ob.attempts = ob.attempts || m.attempt != nil
		ob.evictions = ob.evictions || m.evict != nil
		if m.stats != nil && ob.stats == nil {
			ob.stats = &statsSource{live: stats}
		}
	}
	if ob.stats != nil {
		f.observeStats(guard, ob.stats.read)
	}
	return ob
}

// loadStart calls LoadStart and returns the load's context: the one the
// Observer returned if it derives from ctx, ctx otherwise.
func (ob *observing[K]) loadStart(ctx context.Context, ev LoadStartEvent[K]) context.Context {
	if ob == nil {
		return ctx
	}
	return ob.f.start(ob.guard, ctx, ev)
}

// loadEnd calls LoadEnd with the context loadStart returned.
func (ob *observing[K]) loadEnd(ctx context.Context, ev LoadEvent[K]) {
	if ob != nil {
		ob.f.end(ob.guard, ctx, ev)
	}
}

// waited calls Waited with the Get's own context.
func (ob *observing[K]) waited(ctx context.Context, ev WaitEvent[K]) {
	if ob != nil {
		ob.f.waited(ob.guard, ctx, ev)
	}
}

// observesAttempts reports whether attempt would call anyone: the load
// path builds no AttemptEvent otherwise.
func (ob *observing[K]) observesAttempts() bool { return ob != nil && ob.attempts }

// attempt calls the AttemptObservers with the load's context.
func (ob *observing[K]) attempt(ctx context.Context, ev AttemptEvent[K]) {
	if ob.observesAttempts() {
		ob.f.attempt(ob.guard, ctx, ev)
	}
}

// observesEvictions reports whether evicted would call anyone.
func (ob *observing[K]) observesEvictions() bool { return ob != nil && ob.evictions }

// evicted calls the EvictionObservers.
func (ob *observing[K]) evicted(ev EvictionEvent[K]) {
	if ob.observesEvictions() {
		ob.f.evicted(ob.guard, ev)
	}
}

// close freezes the stats function handed out at New at the Stats it
// reads now; call it once the Loader's counters are final.
func (ob *observing[K]) close() {
	if ob != nil && ob.stats != nil {
		ob.stats.freeze()
	}
}

// statsSource is the stats function a StatsObserver is handed: the
// Loader's Stats until freeze, the final Stats after. Frozen, it no
// longer refers to the Loader, which a meter provider holding the
// Observer then does not keep alive.
type statsSource struct {
	mu    sync.Mutex   // guards live and final
	live  func() Stats // nil once frozen
	final Stats
}

// read returns the Stats now, or the final ones.
func (src *statsSource) read() Stats {
	src.mu.Lock()
	live, final := src.live, src.final
	src.mu.Unlock()
	if live == nil {
		return final
	}
	return live()
}

// freeze reads the Stats once more and keeps them; later calls do
// nothing.
func (src *statsSource) freeze() {
	src.mu.Lock()
	live := src.live
	src.mu.Unlock()
	if live == nil {
		return
	}
	final := live() // outside mu: a read meanwhile calls live too
	src.mu.Lock()
	src.live, src.final = nil, final
	src.mu.Unlock()
}

// The Loader's side: the few places of the core that call observing, in
// the order a load meets them. Each does nothing without an Observer, and
// none is on the hit path.

// observeStart calls LoadStart for a load about to make its first
// downstream call under lctx, started by caller, and publishes the context it returns in
// *at, where the load's waiters find it (call.observed), a waiter that
// leaves meanwhile included. It returns the load's context from then on.
// A background load's Trigger is the context of the Get, GetMany or
// Refresh that started it (its values only). The caller checks that
// there is an Observer (without one the load's context is lctx itself),
// so that an unobserved load builds no event.
func (l *Loader[K, V]) observeStart(lctx *loadctx.Context, caller context.Context, at *atomic.Pointer[context.Context], ev LoadStartEvent[K]) context.Context {
	if ev.Background {
		ev.Trigger = caller
	}
	ctx := l.obs.loadStart(lctx, ev)
	at.Store(&ctx)
	return ctx
}

// observed returns c's load context as the Observer made it: its batch's
// for a key of a LoadMany call; nil before LoadStart has returned, and
// without an Observer.
func (c *call[K, V]) observed() context.Context {
	at := &c.octx
	if c.batch != nil {
		at = &c.batch.octx
	}
	if ctx := at.Load(); ctx != nil {
		return *ctx
	}
	return nil
}

// waited calls Waited for a Get of key that waited on a load (a.waited;
// not a hit, a stale hit, nor a late one), on the Get's goroutine with
// its context, once its answer is final: a.err is ctx.Err() for a caller
// that left. start is when the Get began to wait.
func (l *Loader[K, V]) waited(ctx context.Context, key K, start time.Duration, a *answer[V]) {
	if l.obs == nil || !a.waited {
		return
	}
	l.obs.waited(ctx, WaitEvent[K]{Key: key, Info: a.info, Err: a.err, Start: l.epoch.Add(start), Load: a.load})
}

// attempted calls Attempt for an attempt of the load whose context is
// ctx (the one fetch passes down, or one a Remote derived from it): ev
// gets the load's Key and Keys, and the Observer the load's own context,
// both found through the load's marker in ctx. A context without the
// marker (a Remote that made its own) reports nothing.
func (l *Loader[K, V]) attempted(ctx context.Context, ev AttemptEvent[K]) {
	if !l.obs.observesAttempts() {
		return
	}
	var m *loadMarker
	if l.user.guard(func() { m = markerOf(ctx) }, nil) != nil || m == nil {
		return // ctx.Value is a Remote's code here
	}
	var own context.Context
	switch c := m.call.(type) {
	case *call[K, V]:
		ev.Key, ev.Keys, own = c.key, 1, c.observed()
	case *batch[K, V]:
		ev.Key, ev.Keys, own = c.leader.key, len(c.calls), c.leader.observed()
	}
	if own != nil {
		l.obs.attempt(own, ev)
	}
}

// retried returns the notify function of a retried downstream call
// (backoff's, the one place the delay before the next attempt is known),
// which reports each failed attempt that will be retried, numbered
// *calls; nil when no Observer sees attempts.
func (l *Loader[K, V]) retried(ctx context.Context, t *tally) func(error, time.Duration) {
	if !l.obs.observesAttempts() {
		return nil
	}
	return func(err error, delay time.Duration) {
		l.attempted(ctx, AttemptEvent[K]{Attempt: int(t.calls), Err: err, Delay: delay})
	}
}

// How an entry that leaves is reported, once: whoever marks it gone
// reports it (entry.markGone). The write path marks an entry gone as it
// always did, when a newer value takes its place (put); with an
// EvictionObserver, the cache's callbacks and the writer mark the entries
// they see leave too. Without one, nothing is marked that was not before.
//
//   - put (a fill, Set, Invalidate, a Remote's Drop) reports the entry it
//     replaced, after unlocking (replaced), and a Set, Invalidate or Drop
//     once it is counted out (write): EvictionReplaced, or
//     EvictionInvalidated for Invalidate and Drop. A value whose load said
//     ErrNotModified is renewed, not replaced: not reported.
//   - ristretto's OnEvict (leftCache) is EvictionPolicy, its OnReject
//     (refused) EvictionRejected; so is a value too big for the cache
//     (tooBig), which never reaches it. Both run in the writer's rounds,
//     OnEvict under ristretto's locks, and the writer waits for them: they
//     only mark the entry gone and keep its event (left), which the writer
//     reports after the round (departures.go).
//   - An entry past its windows when a newer value or the policy makes it
//     leave is EvictionExpired (leftBy).
//   - InvalidateAll is O(1): an entry from before it is reported as
//     EvictionInvalidated when it leaves, not at the call: at the Clear
//     the writer runs soon after, when the writer deletes it from a
//     pending write (issue), both reported after the writer's round, or
//     before either if a newer value or the policy makes it leave first. A
//     value written since, which the Clear drops and the writer issues
//     again, has not left.
//   - Nothing while the cache is torn down at Close.
//
// The Loader keeps no cost per entry (an entry fits a cache line): the
// cost reported is ristretto's for an eviction or a refusal, the write's
// for an entry a pending write held, and for an entry replaced or cleared
// in the cache 1 without Options.Cost, 0 (unknown) with it: Cost is not
// asked again.

// replaced reports e (nil: none), an entry put marked gone, as having
// left by cause: EvictionReplaced or EvictionInvalidated, refined by
// leftBy.
func (l *Loader[K, V]) replaced(e *entry[K, V], cause EvictionCause) {
	if e != nil && l.obs.observesEvictions() {
		l.obs.evicted(EvictionEvent[K]{Key: e.key, Cause: l.leftBy(e, cause), Cost: l.unknownCost()})
	}
}

// unknownCost is the cost reported for an entry whose cost only the cache
// knew: every entry costs 1 without Options.Cost.
func (l *Loader[K, V]) unknownCost() int64 {
	if l.opts.Cost == nil {
		return 1
	}
	return 0
}

// leftBy refines cause for an entry that leaves now: one from before an
// InvalidateAll left by it; one a newer value replaced or the policy
// evicted past its windows had expired.
func (l *Loader[K, V]) leftBy(e *entry[K, V], cause EvictionCause) EvictionCause {
	switch {
	case l.cleared(e):
		return EvictionInvalidated
	case (cause == EvictionReplaced || cause == EvictionPolicy) && l.phase(e, l.now()) == phaseExpired:
		return EvictionExpired
	}
	return cause
}

// leftCache takes note of an entry ristretto's OnEvict hands over, with
// its cost. While the writer clears the cache for an InvalidateAll
// (clearing, in a round of the writer, under ristretto's locks), the
// entries from before it are invalidated, and the others have not left:
// they are issued again.
func (l *Loader[K, V]) leftCache(e *entry[K, V], cost int64, clearing bool) {
	switch {
	case e == nil || !l.obs.observesEvictions():
	case clearing:
		if l.cleared(e) {
			l.left(e, EvictionInvalidated, l.unknownCost())
		}
	default:
		l.left(e, EvictionPolicy, cost)
	}
}

// refused takes note of an entry ristretto's admission policy refused.
func (l *Loader[K, V]) refused(e *entry[K, V], cost int64) {
	if e != nil && !l.tearingDown.Load() {
		l.left(e, EvictionRejected, cost)
	}
}

// left marks e gone and, if an EvictionObserver is set and e was not
// reported already, keeps its event, as having left by cause (leftBy),
// for the writer to report after its round (reportLeft). It calls no user
// code: it runs in the writer's rounds, on ristretto's goroutine too.
func (l *Loader[K, V]) left(e *entry[K, V], cause EvictionCause, cost int64) {
	if !l.obs.observesEvictions() || e.markGone() == nil {
		return
	}
	ev := EvictionEvent[K]{Key: e.key, Cause: l.leftBy(e, cause), Cost: cost}
	wr := &l.writer
	wr.leftMu.Lock()
	wr.left = append(wr.left, ev)
	wr.leftMu.Unlock()
}

// tooBigFor reports a value of key too big for the cache, which never
// reaches it, as rejected.
func (l *Loader[K, V]) tooBigFor(key K, cost int64) {
	l.obs.evicted(EvictionEvent[K]{Key: key, Cause: EvictionRejected, Cost: cost})
}

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
// which calls none of them, costs nothing. Where and on which goroutine
// the core calls each: docs/internals.md, "The Observer". loadStart runs
// once the load's delivery is deferred, so that a Goexit in an Observer
// ends the load as one in the LoadFunc does.
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

// observeStart calls LoadStart for a load about to make its first
// downstream call under lctx, started by caller, and publishes the
// context it returns in *at, where the load's waiters find it
// (call.observed), a waiter that leaves meanwhile included. It returns
// the load's context from then on. A background load's Trigger is the
// context of the Get, GetMany or Refresh that started it (its values
// only). The caller checks that ob is not nil, so that an unobserved load
// builds no event.
func (ob *observing[K]) observeStart(lctx *loadctx.Context, caller context.Context, at *atomic.Pointer[context.Context], ev LoadStartEvent[K]) context.Context {
	if ev.Background {
		ev.Trigger = caller
	}
	ctx := ob.loadStart(lctx, ev)
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

// observedLoad is a load as an AttemptEvent names it: a *call or a *batch.
type observedLoad[K comparable] interface {
	// observedAs returns the load's Key, its number of Keys, and its
	// context as the Observer made it (nil: none yet).
	observedAs() (key K, keys int, own context.Context)
}

func (c *call[K, V]) observedAs() (K, int, context.Context) { return c.key, 1, c.observed() }

func (b *batch[K, V]) observedAs() (K, int, context.Context) {
	return b.leader.key, b.distinct, b.leader.observed()
}

// attempted calls Attempt for an attempt of the load whose context is
// ctx (the one fetch passes down, or one a Remote derived from it): ev
// gets the load's Key and Keys, and the Observer the load's own context,
// both found through the load's marker in ctx. A context without the
// marker (a Remote that made its own) reports nothing.
func (ob *observing[K]) attempted(ctx context.Context, ev AttemptEvent[K]) {
	if !ob.observesAttempts() {
		return
	}
	var m *loadMarker
	if ob.guard(func() { m = markerOf(ctx) }, nil) != nil || m == nil {
		return // ctx.Value is a Remote's code here
	}
	ld, ok := m.id.(observedLoad[K])
	if !ok {
		return
	}
	var own context.Context
	if ev.Key, ev.Keys, own = ld.observedAs(); own != nil {
		ob.attempt(own, ev)
	}
}

// retried returns the notify function of a retried downstream call
// (backoff's, the one place the delay before the next attempt is known),
// which reports each failed attempt that will be retried, numbered
// t.calls; nil when no Observer sees attempts.
func (ob *observing[K]) retried(ctx context.Context, t *tally) func(error, time.Duration) {
	if !ob.observesAttempts() {
		return nil
	}
	return func(err error, delay time.Duration) {
		ob.attempted(ctx, AttemptEvent[K]{Attempt: int(t.calls), Err: err, Delay: delay})
	}
}

// tooBigFor reports a value of key too big for the cache, which never
// reaches it, as rejected. What else leaves is reported by the writer.
func (ob *observing[K]) tooBigFor(key K, cost int64) {
	ob.evicted(EvictionEvent[K]{Key: key, Cause: EvictionRejected, Cost: cost})
}

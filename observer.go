package flightcache

import (
	"context"
	"reflect"
	"time"
)

// Observer sees a Loader's loads and the Gets that waited on them, for
// metrics and traces: set it as [Options.Observer] (the otelflightcache
// module has one for OpenTelemetry). It is never called on a hit, so a hit
// costs the same with an Observer as without. Its calls are made outside
// every lock and through the guard (a panic is counted in Stats.Panics and
// changes nothing else); it must be safe for concurrent use and quick:
// [Loader.Close] waits for LoadEnd, and a Get returns only once its Waited
// has. A Loader also looks, once at [New], for the optional capabilities
// [StatsObserver], [AttemptObserver] and [EvictionObserver]. What each call
// sees, and on which goroutine: docs/observability.md.
type Observer[K comparable] interface {
	// LoadStart is called on the load's goroutine before its first
	// downstream call (the Remote's included), with the load's context:
	// the starting caller's values, never its cancellation. The context it
	// returns is the load's context from then on (the LoadFunc, LoadEnd and
	// every [WaitEvent].Load get it), and must derive from ctx, which
	// carries the load's deadline, cancellation and recursion marker; one
	// that visibly does not, nil, or a panic leaves the load with ctx.
	LoadStart(ctx context.Context, ev LoadStartEvent[K]) context.Context

	// LoadEnd is called once per LoadStart, on the load's goroutine, once
	// the load's waiters have its result, with the context LoadStart
	// returned and the event [Options.OnLoad] receives.
	LoadEnd(ctx context.Context, ev LoadEvent[K])

	// Waited is called for every Get (and every key of a GetMany) that
	// waited on a load, a caller that left included, on that caller's
	// goroutine before the Get returns, with the caller's ctx.
	Waited(ctx context.Context, ev WaitEvent[K])
}

// LoadStartEvent describes a load that is about to make its first
// downstream call: what its [LoadEvent] will say, before the fact. One
// [Options.LoadMany] call is one load, with one LoadStart and one LoadEnd.
type LoadStartEvent[K comparable] struct {
	// Key is the key to load; for a LoadMany call, its first key, as
	// [LoadEvent].Key.
	Key K
	// Keys is the number of keys the load is for: 1, or the distinct keys
	// one LoadMany call is asked for.
	Keys int
	// Background is true for a refresh nobody waits on as it starts
	// (stale-while-revalidate, early refresh, [Loader.Refresh]).
	Background bool
	// Reload is true when the load calls [Options.Reload] with the value
	// held for the key.
	Reload bool
	// Trigger is the context of the Get (or GetMany, or Refresh) that
	// started a background load, for its values (a tracer links the
	// load's span to the span in it); nil for a load callers wait on, whose
	// context has the starting caller's values already. It may have ended:
	// read its values only.
	Trigger context.Context
}

// WaitEvent describes one Get that waited on a load, for [Observer.Waited].
type WaitEvent[K comparable] struct {
	// Key is the key the caller asked for.
	Key K
	// Info is what [Loader.GetInfo] returns to the caller.
	Info Info
	// Err is the Get's error: the load's, or ctx.Err() for a caller that
	// left before the load ended; nil on success.
	Err error
	// Start is when the caller began to wait.
	Start time.Time
	// Load is the load's context, the one [Observer.LoadStart] returned,
	// so that a tracer can link the Get's span to the load's; nil for a
	// caller that left before the load started. A Get of a key that a
	// LoadMany call is loading gets that call's context. It may have
	// ended: read its values only.
	Load context.Context
}

// StatsObserver is an optional capability of an [Observer]: it is handed,
// once, at [New], the function that reads the Loader's [Stats], safe for
// concurrent use and cheap enough for every collection. At [Loader.Close]
// that function freezes at the final Stats and lets the Loader go.
type StatsObserver interface {
	ObserveStats(stats func() Stats)
}

// AttemptObserver is an optional capability of an [Observer]: Attempt is
// called on the load's goroutine, with the load's context, after every
// downstream call that failed and will be retried, and for every call the
// breaker refused.
type AttemptObserver[K comparable] interface {
	Attempt(ctx context.Context, ev AttemptEvent[K])
}

// AttemptEvent describes one attempt inside a load, for
// [AttemptObserver]: a failed downstream call that will be retried, or a
// call the breaker refused.
type AttemptEvent[K comparable] struct {
	// Key and Keys are the load's, as in its [LoadStartEvent].
	Key  K
	Keys int
	// Attempt is the attempt's number in the load, from 1. A refused call
	// is numbered as the call it would have been.
	Attempt int
	// Err is the attempt's error; for a refusal, it matches
	// [ErrBreakerOpen].
	Err error
	// Delay is how long the load waits before its next attempt; 0 for a
	// refusal, which is never retried.
	Delay time.Duration
	// Rejected is true when the breaker refused the call: nothing reached
	// the downstream.
	Rejected bool
}

// EvictionObserver is an optional capability of an [Observer]: it sees
// every entry that leaves the cache, or is refused by it, once, with the
// cause; not the entries [Loader.Close] drops. Evicted runs on the
// goroutine that made the entry leave (a Set's, an Invalidate's, a load's)
// or on the Loader's writer, never inside the cache, and may call the
// Loader's methods, the one it observes included (docs/design.md rule 28).
//
// WARNING: Evicted must not block, nor call runtime.Goexit: every write
// waiting for its turn waits for it. A Get from Evicted that misses waits
// for its load: give it a deadline, or use [Loader.Peek].
type EvictionObserver[K comparable] interface {
	Evicted(ev EvictionEvent[K])
}

// EvictionEvent describes one entry that left the cache, or was refused by
// it, for [EvictionObserver].
type EvictionEvent[K comparable] struct {
	// Key is the entry's key.
	Key K
	// Cause is why it left.
	Cause EvictionCause
	// Cost is its cost ([Options.Cost]; 1 without it), or 0 (unknown) for
	// an entry replaced or invalidated under Options.Cost.
	Cost int64
}

// EvictionCause says why an entry left the cache. The zero EvictionCause
// is no cause; its String is "unknown".
type EvictionCause uint8

const (
	// EvictionPolicy: the cache's policy evicted the entry to make room
	// (counted in Stats.Evicted).
	EvictionPolicy EvictionCause = iota + 1
	// EvictionExpired: the entry had outlived its freshness and stale
	// windows when it left, whether a new value took its place or room was
	// made: the cache keeps an expired entry until then.
	EvictionExpired
	// EvictionRejected: the cache's admission policy refused the entry; it
	// was never stored (counted in Stats.SetsRejected).
	EvictionRejected
	// EvictionReplaced: a newer value of the key (a load, a reload, a Set)
	// took the place of the entry while it was still fresh or stale.
	EvictionReplaced
	// EvictionInvalidated: [Loader.Invalidate], [Loader.InvalidateAll] or
	// a watching Remote dropped it, or a load found the key gone (a
	// not-found drops the value held, whatever Options.NotFoundTTL).
	EvictionInvalidated
)

// String returns "policy", "expired", "rejected", "replaced",
// "invalidated", or "unknown".
func (c EvictionCause) String() string {
	switch c {
	case EvictionPolicy:
		return "policy"
	case EvictionExpired:
		return "expired"
	case EvictionRejected:
		return "rejected"
	case EvictionReplaced:
		return "replaced"
	case EvictionInvalidated:
		return "invalidated"
	default:
		return "unknown"
	}
}

// Observers returns one Observer that calls each of obs in turn, skipping
// nils and flattening nested Observers; nil for none, the Observer itself
// for one. LoadStart is chained (the load's context holds every member's
// values), but each member gets back the context it returned itself. A
// member that panics does not keep the others from being called, and the
// optional capabilities are forwarded to the members that have them. It is
// safe for concurrent use if its members are.
func Observers[K comparable](obs ...Observer[K]) Observer[K] {
	var flat []member[K]
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case *fanout[K]:
			if o != nil {
				flat = append(flat, o.members...)
			}
		default:
			if v := reflect.ValueOf(o); v.Kind() == reflect.Pointer && v.IsNil() {
				continue
			}
			flat = append(flat, newMember(o))
		}
	}
	switch len(flat) {
	case 0:
		return nil
	case 1:
		return flat[0].o
	}
	return &fanout[K]{members: flat}
}

// member is one Observer of a fanout, with its capabilities found once.
type member[K comparable] struct {
	o       Observer[K]
	stats   StatsObserver       // o, if it is one
	attempt AttemptObserver[K]  // o, if it is one
	evict   EvictionObserver[K] // o, if it is one
}

func newMember[K comparable](o Observer[K]) member[K] {
	m := member[K]{o: o}
	m.stats, _ = o.(StatsObserver)
	m.attempt, _ = o.(AttemptObserver[K])
	m.evict, _ = o.(EvictionObserver[K])
	return m
}

// fanout is what Observers returns for two members or more; a Loader's
// observing uses one for a single Observer too. Its methods call the
// members through a guard (see observing); the exported ones, for a caller
// holding it as an Observer, through none: a panic reaches that caller.
type fanout[K comparable] struct {
	members []member[K] // at least one; never changed
}

// fanKey is the key under which the load's context holds, for a fanout of
// several members, the context each member returned (own). It names its
// fanout, so that a load inside a load of another fanout finds its own.
type fanKey[K comparable] struct{ f *fanout[K] }

// guardFunc is how a fanout calls user code: [userCode.guard] has this
// type. It returns a non-nil error if f panicked.
type guardFunc = func(f func(), onGoexit func()) error

// unguarded calls f as it is.
func unguarded(f func(), _ func()) error { f(); return nil }

// start calls every member's LoadStart, chained, through g; see Observers
// and observing.loadStart.
func (f *fanout[K]) start(g guardFunc, in context.Context, ev LoadStartEvent[K]) context.Context {
	if len(f.members) == 1 {
		return startOne(f.members[0].o, g, in, ev)
	}
	own := make([]context.Context, len(f.members))
	ctx := in
	for i, m := range f.members {
		ctx = startOne(m.o, g, ctx, ev)
		own[i] = ctx
	}
	return context.WithValue(ctx, fanKey[K]{f}, own)
}

// startOne calls o.LoadStart through g, and returns the context it gave
// if that derives from in, and in otherwise (nil, a panic, a context of
// its own).
func startOne[K comparable](o Observer[K], g guardFunc, in context.Context, ev LoadStartEvent[K]) context.Context {
	var out context.Context
	if g(func() { out = o.LoadStart(in, ev) }, nil) != nil || !derives(out, in) {
		return in
	}
	return out
}

// derives reports whether out may derive from in, as far as can be seen
// without making in's Done channel: it carries in's load marker (the
// marker of the load in is the context of, or none) and ends no later
// than in's deadline. context.Background() and context.WithoutCancel(in)
// fail on a load's context, which always has a deadline.
func derives(out, in context.Context) bool {
	switch {
	case out == nil:
		return false
	case out == in:
		return true
	case out.Value(loadKey{}) != in.Value(loadKey{}):
		return false
	}
	if d, ok := in.Deadline(); ok {
		if e, ok := out.Deadline(); !ok || e.After(d) {
			return false
		}
	}
	return true
}

// own returns the context member i returned from LoadStart, found in ctx
// (the load's context, or one derived from it), or ctx itself for a
// single member or a context that holds none.
func (f *fanout[K]) own(ctx context.Context, i int) context.Context {
	if len(f.members) == 1 || ctx == nil {
		return ctx
	}
	if own, ok := ctx.Value(fanKey[K]{f}).([]context.Context); ok && i < len(own) {
		return own[i]
	}
	return ctx
}

func (f *fanout[K]) end(g guardFunc, ctx context.Context, ev LoadEvent[K]) {
	for i, m := range f.members {
		c := f.own(ctx, i)
		g(func() { m.o.LoadEnd(c, ev) }, nil)
	}
}

func (f *fanout[K]) waited(g guardFunc, ctx context.Context, ev WaitEvent[K]) {
	load := ev.Load
	for i, m := range f.members {
		ev.Load = f.own(load, i)
		g(func() { m.o.Waited(ctx, ev) }, nil)
	}
}

func (f *fanout[K]) attempt(g guardFunc, ctx context.Context, ev AttemptEvent[K]) {
	for i, m := range f.members {
		if m.attempt != nil {
			c := f.own(ctx, i)
			g(func() { m.attempt.Attempt(c, ev) }, nil)
		}
	}
}

func (f *fanout[K]) evicted(g guardFunc, ev EvictionEvent[K]) {
	for _, m := range f.members {
		if m.evict != nil {
			g(func() { m.evict.Evicted(ev) }, nil)
		}
	}
}

func (f *fanout[K]) observeStats(g guardFunc, stats func() Stats) {
	for _, m := range f.members {
		if m.stats != nil {
			g(func() { m.stats.ObserveStats(stats) }, nil)
		}
	}
}

// LoadStart calls each member's LoadStart in turn, each with the context
// the one before returned; see [Observers].
func (f *fanout[K]) LoadStart(ctx context.Context, ev LoadStartEvent[K]) context.Context {
	return f.start(unguarded, ctx, ev)
}

// LoadEnd calls each member's LoadEnd with the context it returned.
func (f *fanout[K]) LoadEnd(ctx context.Context, ev LoadEvent[K]) { f.end(unguarded, ctx, ev) }

// Waited calls each member's Waited, with the load's context it returned.
func (f *fanout[K]) Waited(ctx context.Context, ev WaitEvent[K]) { f.waited(unguarded, ctx, ev) }

// Attempt calls the Attempt of each member that is an AttemptObserver.
func (f *fanout[K]) Attempt(ctx context.Context, ev AttemptEvent[K]) {
	f.attempt(unguarded, ctx, ev)
}

// Evicted calls the Evicted of each member that is an EvictionObserver.
func (f *fanout[K]) Evicted(ev EvictionEvent[K]) { f.evicted(unguarded, ev) }

// ObserveStats calls the ObserveStats of each member that is a
// StatsObserver.
func (f *fanout[K]) ObserveStats(stats func() Stats) { f.observeStats(unguarded, stats) }

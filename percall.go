package flightcache

import (
	"context"
	"sync/atomic"
	"time"
)

// maxStaleKey is the context key of WithMaxStale.
type maxStaleKey struct{}

// WithMaxStale returns a context that makes a Get accept a stale value only
// if it went stale at most d ago, like HTTP's Cache-Control max-stale.
// WithMaxStale(ctx, 0) demands a fresh value, like no-cache: the Get waits
// for a load (which still coalesces with other callers). A negative d is 0.
func WithMaxStale(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxStaleKey{}, max(d, 0))
}

// MaxStale returns the bound [WithMaxStale] put on ctx, if any. A load's
// context keeps the values of the Get that started it, so a [Remote] can
// honour the caller's bound too.
func MaxStale(ctx context.Context) (d time.Duration, ok bool) {
	d, ok = ctx.Value(maxStaleKey{}).(time.Duration)
	return d, ok
}

// caller is what a Get takes from its caller's context. The context is the
// caller's code: any of its methods may panic (or end the goroutine), and
// the panic is the caller's, so it must find the Loader as if the Get had
// not begun (docs/design.md rule 23). So callerOf reads it all, once,
// before the Get publishes, joins or reserves anything, and never under a
// lock; from there to the end of the Get the Loader calls no method of the
// context but Err, once Done is closed and the Get has settled everything
// (errLeft).
type caller struct {
	ctx        context.Context // its values go with a load the Get starts (start); the Get calls no method of it again
	done       <-chan struct{} // ctx.Done()
	marker     *loadMarker     // the load the Get is made from, if any: ErrRecursiveLoad
	maxStale   time.Duration   // WithMaxStale's bound, if bounded
	bounded    bool
	revalidate bool // WithRevalidate: revalidating(ctx), which the hit path reads before counting in
	read       bool // done, marker and the max-stale bound are read (callerOf)
}

// callerOf reads from ctx what a Get needs beyond revalidate, which the
// caller has read already.
func callerOf(ctx context.Context, revalidate bool) caller {
	c := caller{ctx: ctx, revalidate: revalidate, marker: markerOf(ctx), read: true}
	c.maxStale, c.bounded = MaxStale(ctx)
	c.done = ctx.Done()
	return c
}

// full returns c with the rest of its context read, reading it the first
// time (callerOf): a hit reads only revalidate. No lock is held when it
// first runs: wait and GetMany read it before they join.
func (c *caller) full() *caller {
	if !c.read {
		*c = callerOf(c.ctx, c.revalidate)
	}
	return c
}

// acceptsStale applies the caller's WithMaxStale, if any, to a value that
// went stale at freshUntil.
func (c *caller) acceptsStale(freshUntil, now time.Duration) bool {
	return withinMaxStale(c.maxStale, c.bounded, now-freshUntil)
}

// revalidateKey is the context key of WithRevalidate.
type revalidateKey struct{}

// WithRevalidate returns a context under which a Get is never answered from
// the cache, fresh or stale: it joins the key's load in flight (one that
// started before an [Loader.InvalidateAll] or a Distrust excepted) or
// starts one ([Options.Reload] with the value held, when there is one), so a burst
// of revalidating Gets still makes one call. Its result replaces the cached
// value. A failed revalidation is covered by the value held within
// StaleIfError, as any failed load is. This is HTTP's Cache-Control:
// no-cache. It applies to the Get it is passed to: a load's context does
// not pass it on to the Gets its LoadFunc makes. (To read your own write,
// Invalidate or Set first: a load that started before them never writes
// the cache.)
func WithRevalidate(ctx context.Context) context.Context {
	if !revalidateUsed.Load() {
		revalidateUsed.Store(true)
	}
	return context.WithValue(ctx, revalidateKey{}, true)
}

// revalidateUsed is set once WithRevalidate has been called in this
// process: until then a Get need not look for it in its context (a walk up
// the context chain, on the hit path).
var revalidateUsed atomic.Bool

// revalidating reports whether ctx comes from WithRevalidate.
func revalidating(ctx context.Context) bool {
	if !revalidateUsed.Load() {
		return false
	}
	r, _ := ctx.Value(revalidateKey{}).(bool)
	return r
}

// reloadValueKey is the context key of WithReloadValue.
type reloadValueKey struct{}

// reloadValue boxes the value WithReloadValue carries.
type reloadValue[V any] struct{ v V }

// WithReloadValue returns a context that, passed by a [Remote] to the load
// function it was given, makes that load an [Options.Reload] of v: the
// value the shared tier holds for the key, which may be newer than the
// Loader's own (or the Loader may hold none). An [ErrNotModified] then
// keeps v. Without Options.Reload it changes nothing.
func WithReloadValue[V any](ctx context.Context, v V) context.Context {
	return context.WithValue(ctx, reloadValueKey{}, &reloadValue[V]{v: v})
}

// loadKey is the context key under which a load's context carries its
// marker.
type loadKey struct{}

// loadMarker links a load to the loads it was started from, so that a Get
// made inside a LoadFunc can tell that it would wait on itself.
type loadMarker struct {
	call   any // the *call being loaded; compared by identity
	parent *loadMarker
}

// waitsOn reports whether m, or a load m was started from, is c.
func (m *loadMarker) waitsOn(c any) bool {
	for ; m != nil; m = m.parent {
		if m.call == c {
			return true
		}
	}
	return false
}

// markerOf returns the marker of the load ctx belongs to, if any.
func markerOf(ctx context.Context) *loadMarker {
	m, _ := ctx.Value(loadKey{}).(*loadMarker)
	return m
}

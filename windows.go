package flightcache

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
	"github.com/flightcache/flightcache/remote"
)

// windows returns the windows a Loader made with o (validated, defaults
// applied) applies to a value when it has no Freshness: what [Rules]
// gives as Windows.
func (o Options[K, V]) windows() remote.Windows {
	o.Freshness = nil
	w, _ := o.windowsOf(*new(K), *new(V))
	return w
}

// windowsOf returns the windows of one value v of key: o's windows (as
// windows gives them) with what [Options.Freshness], if set, says of v;
// cache is false for a value not to be cached (a negative TTL). It is
// what [Rules] gives as WindowsOf, for a Remote to store each shared
// value with its own lifetime, so every process applies the same one.
// Freshness is called on the caller's goroutine.
func (o Options[K, V]) windowsOf(key K, v V) (w remote.Windows, cache bool) {
	o = o.withDefaults()
	w = remote.Windows{
		Fresh:                timing.Jitter(o.TTL, o.Jitter, 1),
		TTL:                  o.TTL,
		Jitter:               o.Jitter,
		StaleWhileRevalidate: o.StaleWhileRevalidate,
		StaleIfError:         o.StaleIfError,
		EarlyRefresh:         o.EarlyRefresh > 0,
		LoadTimeout:          o.LoadTimeout,
	}
	if o.Freshness == nil {
		return w, true
	}
	f := o.Freshness(key, v)
	if f.TTL < 0 {
		return w, false
	}
	if f.TTL > 0 {
		w.Fresh, w.TTL = timing.Jitter(f.TTL, o.Jitter, 1), f.TTL
	}
	w.StaleWhileRevalidate = pick(f.StaleWhileRevalidate, w.StaleWhileRevalidate)
	w.StaleIfError = pick(f.StaleIfError, w.StaleIfError)
	return w, true
}

// pick is a window of [Freshness]: d, the default for 0, and none (0) for
// a negative d.
func pick(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// withinMaxStale is [remote.AcceptsStale]'s rule, for a max-stale read
// beforehand (remote.MaxStale, callerOf): no bound accepts any staleness,
// a bound of 0 none. TestWithinMaxStaleIsAcceptsStale holds the two alike.
func withinMaxStale(max time.Duration, bounded bool, d time.Duration) bool {
	return !bounded || (max > 0 && d <= max)
}

// WithMaxStale returns a context that makes a Get accept a stale value only
// if it went stale at most d ago, like HTTP's Cache-Control max-stale.
// WithMaxStale(ctx, 0) demands a fresh value, like no-cache: the Get waits
// for a load (which still coalesces with other callers). A negative d is 0.
// It is [remote.WithMaxStale]: a tier reads the bound with remote.MaxStale.
func WithMaxStale(ctx context.Context, d time.Duration) context.Context {
	return remote.WithMaxStale(ctx, d)
}

// caller is what a Get takes from its caller's context. The context is the
// caller's code: any of its methods may panic (or end the goroutine), and
// the panic is the caller's, so it must find the Loader as if the Get had
// not begun (docs/design.md rule 23). So callerOf reads it all, once,
// before the Get publishes, joins or reserves anything, and never under a
// lock; from there to the end of the Get the Loader calls no method of the
// context but Err, once Done is closed and the Get has settled everything
// (errCallerDone).
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
	c.maxStale, c.bounded = remote.MaxStale(ctx)
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

// WithRevalidate returns a context under which a Get is never answered
// from the cache, like HTTP's Cache-Control: no-cache: it joins the key's
// load in flight or starts one (a Reload of the value held, if any), so a
// burst of revalidating Gets still makes one call, and the result replaces
// the cached value (docs/design.md rules 14 and 27). It applies to the Get
// it is passed to, not to the Gets its LoadFunc makes.
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

// loadKey is the context key under which a load's context carries its
// marker.
type loadKey struct{}

// loadMarker links a load to the loads it was started from, so that a Get
// made inside a LoadFunc can tell that it would wait on itself.
type loadMarker struct {
	id     any // the load: a *call, or the *batch of a LoadMany; compared by identity
	parent *loadMarker
}

// startedFromMany is a load started from more than one load: a batch
// whose calls were started by different loads' Gets (batch.markCalls).
type startedFromMany interface {
	// alsoFrom returns the loads it was started from besides its
	// marker's parent.
	alsoFrom() []*loadMarker
}

// waitsOn reports whether m, or a load m was started from, is c.
func (m *loadMarker) waitsOn(c any) bool {
	for ; m != nil; m = m.parent {
		if m.id == c {
			return true
		}
		if b, ok := m.id.(startedFromMany); ok {
			for _, o := range b.alsoFrom() {
				if o.waitsOn(c) {
					return true
				}
			}
		}
	}
	return false
}

// markerOf returns the marker of the load ctx belongs to, if any.
func markerOf(ctx context.Context) *loadMarker {
	m, _ := ctx.Value(loadKey{}).(*loadMarker)
	return m
}

package flightcache

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// Windows is how a Loader judges a value's age, in a form a [Remote] can
// use to judge a value it shares with other processes exactly as the
// Loader will: the same freshness, the same stale windows, the same load
// timeout. [New] gives them to a [RemoteAttacher], in [Rules].
type Windows struct {
	// Fresh is the shortest time any value stays fresh: TTL·(1−Jitter),
	// never 0. Each cached value draws its own freshness from [Fresh, TTL]
	// ([Windows.Draw]); a value judged by Fresh is never served fresh past
	// any process's draw.
	Fresh time.Duration
	// TTL is the longest time a value stays fresh, the TTL its freshness
	// is drawn from: the Options' TTL, or the one [Options.Freshness] gives
	// the value. 0 in Windows made by hand: every draw is then Fresh.
	TTL time.Duration
	// Jitter is the Options' Jitter: how far below TTL a draw may go.
	Jitter float64
	// StaleWhileRevalidate and StaleIfError are the Options' windows.
	StaleWhileRevalidate time.Duration
	StaleIfError         time.Duration
	// EarlyRefresh is true when fresh values are refreshed before they
	// expire ([Options.EarlyRefresh] > 0).
	EarlyRefresh bool
	// LoadTimeout bounds one load, its default applied.
	LoadTimeout time.Duration
}

// windows returns the windows a Loader made with o (validated, defaults
// applied) applies to a value when it has no Freshness: what [Rules]
// gives as Windows.
func (o Options[K, V]) windows() Windows {
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
func (o Options[K, V]) windowsOf(key K, v V) (w Windows, cache bool) {
	o = o.withDefaults()
	w = Windows{
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

// Draw returns the freshness of one value, drawn as the Loader draws the
// freshness of each value it caches: TTL·(1−Jitter·u), for u drawn
// uniformly from [0, 1) by the caller, so within [Fresh, TTL] (u = 0
// gives TTL), never 0. A Remote that stores a value for several
// processes draws it once for the value, as one cache entry would: its
// bounds are then those of w with Fresh the draw ([Windows.Bounds]).
// Without a TTL (Windows made by hand) it returns Fresh.
func (w Windows) Draw(u float64) time.Duration {
	if w.TTL <= 0 {
		return w.Fresh
	}
	return timing.Jitter(w.TTL, w.Jitter, u)
}

// AcceptsStale reports whether a Get made under ctx accepts a value that
// went stale d ago, by the bound [WithMaxStale] put on ctx (no bound: any
// stale value the windows allow; a bound of 0: none). A [Remote] uses it
// to judge a shared value by the caller's bound, as the Loader does.
func AcceptsStale(ctx context.Context, d time.Duration) bool {
	max, ok := MaxStale(ctx)
	return withinMaxStale(max, ok, d)
}

// withinMaxStale is AcceptsStale's rule, for a max-stale read beforehand
// (MaxStale): no bound accepts any staleness, a bound of 0 none.
func withinMaxStale(max time.Duration, bounded bool, d time.Duration) bool {
	return !bounded || (max > 0 && d <= max)
}

// Phase is where a value is in its life at a given moment, by the
// Loader's rule: fresh, then stale (served at once while a background
// refresh runs), then stale-if-error (a caller loads; the value covers a
// failure), then expired. [Bounds.PhaseAt] gives it.
type Phase uint8

// The phases of a value, in the order it goes through them. They are the
// phases the Loader serves its own entries by, value for value: its rule,
// placed on times, is [Bounds.PhaseAt].
const (
	// PhaseFresh: before FreshUntil, served as a hit.
	PhaseFresh Phase = iota
	// PhaseStale: in [Windows.StaleWhileRevalidate], served at once, and
	// refreshed in the background.
	PhaseStale
	// PhaseStaleIfError: in [Windows.StaleIfError]: a caller waits for a
	// load, and the value is served only if that load fails with an error
	// it may cover ([StaleMayCover]).
	PhaseStaleIfError
	// PhaseExpired: of no use left; a miss.
	PhaseExpired
)

// String returns "fresh", "stale", "stale-if-error" or "expired".
func (p Phase) String() string {
	switch p {
	case PhaseFresh:
		return "fresh"
	case PhaseStale:
		return "stale"
	case PhaseStaleIfError:
		return "stale-if-error"
	default:
		return "expired"
	}
}

// Bounds are the ends of one value's windows, as times: what a [Remote]
// stores with a value it shares, so that every process places it in the
// same [Phase] at the same moment. Get them from [Windows.Bounds]; a
// Remote that reads them back (from another process, say) judges the
// value with [Bounds.PhaseAt]. The zero Bounds are of a value expired
// long ago.
type Bounds struct {
	// RefreshFrom is the earliest moment at which a Loader may refresh the
	// value early ([Options.EarlyRefresh]), before FreshUntil: halfway
	// through its freshness. It is FreshUntil without EarlyRefresh.
	RefreshFrom time.Time
	// FreshUntil ends [PhaseFresh], StaleUntil [PhaseStale] and UsableUntil
	// [PhaseStaleIfError]; from UsableUntil on the value is expired.
	FreshUntil, StaleUntil, UsableUntil time.Time
}

// Bounds returns the ends of the windows of a value loaded at loadedAt:
// fresh for w.Fresh, then stale for w.StaleWhileRevalidate, then usable
// to cover an error for w.StaleIfError (a negative window counts as
// none). The sums saturate at the latest time a time.Time holds, so a
// window of math.MaxInt64 ("never") gives a bound far in the future,
// never one that wrapped into the past; short of that limit, which no
// clock comes near, they are exact. A cached not-found has no stale
// windows: its bounds are those of Windows{Fresh: its time to live}.
func (w Windows) Bounds(loadedAt time.Time) Bounds {
	fresh := timing.Later(loadedAt, w.Fresh)
	stale := timing.Later(fresh, w.StaleWhileRevalidate)
	b := Bounds{RefreshFrom: fresh, FreshUntil: fresh, StaleUntil: stale, UsableUntil: timing.Later(stale, w.StaleIfError)}
	if w.EarlyRefresh {
		// The earliest early refresh of a value fresh for w.Fresh: the
		// Loader's own rule, with the longest lead it allows.
		b.RefreshFrom = timing.Later(loadedAt, timing.EarlyRefreshAt(0, w.Fresh, 1, 1, 0))
	}
	return b
}

// PhaseAt returns the phase at now of the value whose windows end at b:
// fresh before FreshUntil, stale before StaleUntil, stale-if-error before
// UsableUntil, expired from then on. It is the Loader's own rule (the one
// it applies to the values it holds), placed on times: a value of windows
// w loaded at t is, at t.Add(age), in w.Bounds(t).PhaseAt(t.Add(age)), the
// phase the Loader gives it at that age (for every age short of the
// largest Duration, where the Loader's sums of windows saturate).
func (b Bounds) PhaseAt(now time.Time) Phase {
	// The Loader's rule works on offsets from an epoch: now is the epoch
	// here. Each bound's offset is clamped to ±2⁶¹ns (about 73 years),
	// which keeps its sign and the order of the three, so the rule's sums
	// of them are exact whatever the bounds (even centuries apart).
	fresh, stale, usable := timing.Offset(b.FreshUntil, now), timing.Offset(b.StaleUntil, now), timing.Offset(b.UsableUntil, now)
	w := windows{staleWhileRevalidate: stale - fresh, staleIfError: usable - stale}
	return Phase(w.phaseAt(0, fresh))
}

// StaleMayCover reports whether a stale value may be served in place of
// the error err of a failed load, within its [Options.StaleIfError]
// window: for any error but a not-found (the key is gone, not the
// downstream: notFound is err judged by the Loader's rule,
// [Options.NotFound], which the caller has already applied), an error
// matching [ErrInvalidKey] (the caller's key, not the downstream, is at
// fault) and [ErrClosed] (the Loader is shutting down). A nil err has nothing to
// cover. It is the rule the Loader applies, for a [Remote] to decide what
// to offer with an error as the Loader would serve it.
func StaleMayCover(err error, notFound bool) bool {
	return err != nil && !notFound && !errors.Is(err, ErrClosed) && !invalidKey(err)
}

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

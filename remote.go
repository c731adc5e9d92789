package flightcache

import (
	"context"
	"time"
)

// Remote is an optional second tier, shared by several processes, that sits
// between a Loader's single-flight and its downstream path (for example the
// Redis tier of the flightredis module). With a Remote, N processes that
// miss the same key make one downstream call between them, not N.
//
// The Loader calls Remote.Load from its load goroutine, once per local
// load, outside every lock, under the load's context (LoadTimeout and Close
// bound it). Implementations must be safe for concurrent use.
type Remote[K comparable, V any] interface {
	// Load returns key's value from the shared tier or, when the tier has
	// nothing usable, by calling load: the Loader's own downstream path
	// (retries, breaker, LoadFunc). An implementation coordinates processes
	// so that one of them calls load at a time per key, and calls load
	// itself when the tier is unreachable, so a tier failure never becomes
	// an error the downstream did not cause. The error returned is load's.
	//
	// When load fails and the tier holds an older value of key, Load may
	// return that value (LoadedAt set) with the error: the Loader serves it
	// to its callers as stale-on-error if it is within the Options'
	// StaleIfError window and their [MaxStale], and never caches it. So a
	// process with no local copy is covered by the fleet's.
	//
	// load must be called on Load's own goroutine (or waited for) and must
	// not be called after Load returns: the Loader counts a load as running
	// until Load returns, and Close waits only for that.
	Load(ctx context.Context, key K, load func(context.Context) (V, error)) (RemoteValue[V], error)
	// Set stores a value for key in the shared tier ([Loader.Set]).
	Set(ctx context.Context, key K, v RemoteValue[V])
	// Invalidate drops key from the shared tier ([Loader.Invalidate]).
	Invalidate(ctx context.Context, key K)
}

// RemoteMany is what a [Remote] implements, besides Remote, to serve
// [Loader.GetMany]'s batches: with it, the misses of a GetMany that go to
// [Options.LoadMany] go through the shared tier together. Without it,
// GetMany loads key by key through Remote.Load.
type RemoteMany[K comparable, V any] interface {
	// LoadMany returns the result of each of keys (distinct): from the
	// shared tier when it has something usable, and otherwise by calling
	// load, at most once per LoadMany call for the keys nobody else is
	// loading, with those keys (the Loader's own downstream path for a
	// LoadMany call: retries, breaker, Options.LoadMany). A key load does
	// not return does not exist. It coordinates processes as Load does,
	// per key, and calls load itself for every key when the tier is
	// unreachable; the rules of Load apply to each key (load on LoadMany's
	// own goroutine, never after it returns; an older value may come with
	// a key's error). A key missing from the map returned is taken as not
	// found. load's error may be a [*ManyError] (itself, not wrapped): the
	// keys in it failed alone, each with its own error, and the others are
	// answered by load's map, as if load had returned no error.
	LoadMany(ctx context.Context, keys []K, load func(context.Context, []K) (map[K]V, error)) map[K]RemoteResult[V]
}

// RemoteResult is one key's result of [RemoteMany.LoadMany]: what
// [Remote.Load] returns for one key.
type RemoteResult[V any] struct {
	RemoteValue[V]       // the value; with Err, an older value to cover it (LoadedAt set), or none
	Err            error // the key's error; for a key that does not exist, ErrNotFound (matched with errors.Is) or an error the Loader's IsNotFound accepts
}

// RemoteValue is a value as a [Remote] stores it: with when, and how fast,
// it was loaded, so every process applies the same freshness rules to it.
type RemoteValue[V any] struct {
	// Value is the loaded value.
	Value V
	// LoadedAt is when the value was loaded, by whichever process. A value
	// loaded 5s ago elsewhere is 5s old here: fresh, stale or past use by
	// the Loader's own windows.
	LoadedAt time.Time
	// Took is how long that load took; it places the early refresh
	// ([Options.EarlyRefresh]). 0 if unknown.
	Took time.Duration
	// Loaded is true when this call ran the load itself rather than
	// finding the value in the tier.
	Loaded bool
}

// remoteSet and remoteInvalidate tell the Remote, if any, about a Set or an
// Invalidate. They run on the caller's goroutine, outside every lock.
func (l *Loader[K, V]) remoteSet(key K, v V) {
	if l.opts.Remote != nil {
		l.user.guard(func() { l.opts.Remote.Set(l.ctx, key, RemoteValue[V]{Value: v, LoadedAt: time.Now()}) }, nil)
	}
}

func (l *Loader[K, V]) remoteInvalidate(key K) {
	if l.opts.Remote != nil {
		l.user.guard(func() { l.opts.Remote.Invalidate(l.ctx, key) }, nil)
	}
}

// RemoteInvalidateAll is what a [Remote] implements, besides Remote, to
// take part in [Loader.InvalidateAll]: it drops every entry of the shared
// tier at once (without visiting them), and tells the other processes to
// drop their local copies (a [RemoteWatcher] hears it and calls
// [LocalCache.DropAll]). The Loader calls it on the caller's goroutine,
// outside every lock, before it drops its own copies: a load of this
// process that races the call either read the tier before it (and its
// result is dropped with the rest) or reads it afterwards. When it
// returns, no process reading the tier may be handed an entry written
// before the call; processes that have not heard yet may still serve
// their local copies until they do.
type RemoteInvalidateAll interface {
	InvalidateAll(ctx context.Context)
}

// remoteInvalidateAll tells the Remote, if it takes part, about an
// InvalidateAll.
func (l *Loader[K, V]) remoteInvalidateAll() {
	if r, ok := l.opts.Remote.(RemoteInvalidateAll); ok {
		l.user.guard(func() { r.InvalidateAll(l.ctx) }, nil)
	}
}

// RemoteAttacher is what a [Remote] implements, besides Remote, to be
// given the rules of the Loader it serves, rather than the Loader's
// Options a second time: [New] calls Attach once, before it returns
// (after [RemoteWatcher.Watch], if the Remote watches too), with the rules
// of the Options it has validated. An error from Attach fails New, which
// returns it; so does a panic, as a [*PanicError]. Attach is called on the
// goroutine that calls New, before the Loader calls any other method of
// the Remote.
//
// A Remote serves one Loader: an implementation should refuse a second
// Attach with an error rather than judge one Loader's values by another's
// rules.
type RemoteAttacher[K comparable, V any] interface {
	Attach(rules Rules[K, V]) error
}

// Rules are how a Loader judges its values, as a [Remote] needs them to
// judge the values it shares exactly as the Loader will: windows, each
// value's own windows, and what a not-found is. A [RemoteAttacher] is
// given them by [New]. A Rules value is read-only and its functions are
// safe for concurrent use if the Options' callbacks are.
type Rules[K comparable, V any] struct {
	// Windows are the Loader's windows: those of a value without
	// [Options.Freshness].
	Windows Windows
	// WindowsOf returns the windows of one value v of key: Windows with
	// what [Options.Freshness] says of v (cache false: a value not to be
	// cached); it calls Freshness on the caller's goroutine, and a panic
	// there is the caller's to recover. nil when the Loader has no
	// Freshness: every value has Windows.
	WindowsOf func(key K, v V) (w Windows, cache bool)
	// NotFound reports whether a load's error means that the key does not
	// exist, by the Loader's rule ([Options.NotFound]; a panic of
	// IsNotFound means no). Never nil in Rules a Loader gives.
	NotFound func(err error) bool
	// NotFoundTTL is [Options.NotFoundTTL]: how long the Loader caches a
	// not-found; 0: not cached.
	NotFoundTTL time.Duration
	// Version is [Options.Version]: a value's version, for a Remote that
	// keeps it with the shared entry so that no write of the fleet
	// replaces a value of a higher version (docs/design.md rule 30). It
	// calls Version on the caller's goroutine; a panic there is the
	// caller's to recover. nil when the Loader has no Version.
	Version func(v V) uint64
	// MaxWait is how long a load may wait for a downstream slot
	// ([Options.Limit]'s MaxWait, its default applied) before its
	// LoadTimeout starts: a Remote that holds a lease for a load holds it
	// up to LoadTimeout + MaxWait. 0 without a Limit.
	MaxWait time.Duration
}

// rules are the Rules of o, already validated.
func (o Options[K, V]) rules() Rules[K, V] {
	r := Rules[K, V]{NotFound: o.NotFound, NotFoundTTL: o.NotFoundTTL, Version: o.Version}
	if o.Limit.enabled() {
		r.MaxWait = o.Limit.MaxWait
	}
	if o.Freshness != nil {
		r.WindowsOf = o.windowsOf
	}
	r.Windows = o.windows()
	return r
}

// attachRemote hands the Loader's rules to its Remote, if the Remote takes
// them (RemoteAttacher). An error, or a panic, of Attach fails New.
func (l *Loader[K, V]) attachRemote() error {
	a, ok := l.opts.Remote.(RemoteAttacher[K, V])
	if !ok {
		return nil
	}
	r := l.opts.rules()
	var err error
	if perr := l.user.guard(func() { err = a.Attach(r) }, nil); perr != nil {
		return perr
	}
	return err
}

// This file is the Loader's side of fleet-wide writes: how a Remote that
// hears of other processes' Sets and Invalidates (or may have missed some)
// acts on this process's local copies.
//
// Every entry carries the fleet generation it was loaded in (the one its
// load started in, or the one its Set ran in), next to its gone bit. A
// Distrust moves the Loader to a new generation: each entry of an older
// one is no longer served as it stands, and the next Get of its key waits
// for a load, as a revalidating Get does (rule 18). The check on a hit is
// one comparison of two words that almost never change. A Get that finds
// a load in flight from an older generation does not join it: it detaches
// it (its waiters keep it) and starts its own.

// RemoteWatcher is what a [Remote] implements, besides Remote, to keep the
// Loader's local copies in step with the rest of a fleet: when another
// process Sets or Invalidates a key, the Remote tells this Loader to drop
// its copy; when it may have missed such a write (its subscription was
// down), it tells the Loader to distrust every copy it holds.
//
// [New] calls Watch once, before it returns, with the Loader's [LocalCache] (a
// Watch that panics fails New with a [*PanicError]). The
// Remote keeps it and calls it from any goroutine, for as long as it likes:
// after [Loader.Close] its methods do nothing.
type RemoteWatcher[K comparable] interface {
	Watch(local LocalCache[K])
}

// LocalCache is a Loader's own cache as a [RemoteWatcher] drives it. Its methods
// are safe for concurrent use, never call the Remote back, never wait for a
// load, and do nothing once the Loader is closed.
type LocalCache[K comparable] interface {
	// Drop forgets this process's copy of key, as [Loader.Invalidate]
	// does (a load of key in flight still answers its own waiters, but
	// does not fill the cache), without telling the Remote: the write
	// it answers to was made there already, by another process (or by
	// this one: a Remote may echo this process's own writes, to undo a
	// read that raced them). The next Get of key loads it, through the
	// Remote.
	Drop(key K)
	// Distrust makes every copy held now, and the result of every load
	// running now, unfit to serve as it stands: the next Get of each such
	// key waits for a new load (through the Remote), as a revalidating Get
	// does. A Reload is handed the old value; if the load fails, the old
	// value covers the failure within StaleIfError. Copies loaded or Set
	// afterwards are trusted. A Remote calls it when it may have missed
	// writes of other processes (its subscription to them was down).
	Distrust()
	// DropAll forgets every copy this process holds, as
	// [Loader.InvalidateAll] does, without telling the Remote: another
	// process called InvalidateAll, and the shared tier has dropped its
	// entries already.
	DropAll()
}

// local is a Loader's [LocalCache].
type local[K comparable, V any] struct{ l *Loader[K, V] }

func (x local[K, V]) Drop(key K) {
	if x.l.drop(key) {
		x.l.stats.remoteDrops.Add(1)
	}
}

func (x local[K, V]) Distrust() {
	if !x.l.gate.Closed() {
		x.l.generation.Add(genUnit) // below it, an entry's mark holds other bits
		x.l.stats.distrusts.Add(1)
	}
}

func (x local[K, V]) DropAll() { x.l.dropAll() }

// watch hands the Loader's LocalCache to its Remote, if the Remote watches. A
// Watch that panics fails New.
func (l *Loader[K, V]) watch() error {
	w, ok := l.opts.Remote.(RemoteWatcher[K])
	if !ok {
		return nil
	}
	return l.user.guard(func() { w.Watch(local[K, V]{l}) }, nil)
}

// raiseFloor moves the generation on and makes it the floor: every entry
// and load of an older generation is now absent (rule 20). The floor moves
// first, then the generation, so that no moment exists where a load or an
// entry of the new generation can be made while the floor still lets an
// entry of the old one live: a load published in between is of the old
// generation, below the floor (it writes nothing, and a Reload is handed no
// value from before the call, live), and a Set's entry is absent at once.
// A load reads them in the opposite order (start): the generation, then
// the floor, so that it sees the floor of any generation it was given.
// Consider the opposite order, generation first:
//
//  1. InvalidateAll: the generation moves to G; the floor is still below.
//  2. A Get publishes a Reload of generation G; the value held, of the old
//     generation, is not yet below the floor, so it is the Reload's old
//     value.
//  3. InvalidateAll: the floor moves to G, and the call returns.
//  4. The Reload answers ErrNotModified: it keeps the old value, renewed,
//     as an entry of generation G, which every later Get is served.
//
// A Distrust (or another InvalidateAll) that moves the generation between
// the two steps makes the compare-and-swap fail: the loop then raises the
// floor past it, so the generation this call leaves is newer than every
// one that existed when it began. Concurrent calls leave the floor at the
// newest of their generations.
func (l *Loader[K, V]) raiseFloor() {
	for {
		g := l.generation.Load()
		next := g + genUnit
		for {
			f := l.floor.Load()
			if int32(next-f) <= 0 || l.floor.CompareAndSwap(f, next) {
				break
			}
		}
		if l.generation.CompareAndSwap(g, next) {
			return
		}
	}
}

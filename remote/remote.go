package remote

import (
	"context"
	"time"
)

// Remote is an optional second tier, shared by several processes, that
// sits between a Loader's single-flight and its downstream path (for
// example the Redis tier of the flightredis module). With a Remote, N
// processes that miss the same key make one downstream call between them,
// not N. It is set in the Loader's Options.Remote.
//
// The Loader calls Remote.Load from its load goroutine, once per local
// load, outside every lock, under the load's context (LoadTimeout and
// Close bound it). Implementations must be safe for concurrent use.
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
	Load(ctx context.Context, key K, load func(context.Context) (V, error)) (Value[V], error)
	// Set stores a value for key in the shared tier (the Loader's Set).
	Set(ctx context.Context, key K, v Value[V])
	// Invalidate drops key from the shared tier (the Loader's Invalidate).
	Invalidate(ctx context.Context, key K)
}

// Many is what a [Remote] implements, besides Remote, to serve the
// Loader's GetMany batches: with it, the misses of a GetMany that go to
// the Options' LoadMany go through the shared tier together. Without it,
// GetMany loads key by key through Remote.Load.
type Many[K comparable, V any] interface {
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
	// found. load's error may be a *flightcache.ManyError (itself, not
	// wrapped): the keys in it failed alone, each with its own error, and
	// the others are answered by load's map, as if load had returned no
	// error.
	LoadMany(ctx context.Context, keys []K, load func(context.Context, []K) (map[K]V, error)) map[K]Result[V]
}

// Result is one key's result of [Many.LoadMany]: what [Remote.Load]
// returns for one key.
type Result[V any] struct {
	RemoteValue[V]       // the value; with Err, an older value to cover it (LoadedAt set), or none
	Err            error // the key's error; for a key that does not exist, ErrNotFound (matched with errors.Is) or an error the Loader's IsNotFound accepts
}

// RemoteValue is [Value] under the name [Result] embeds it by, so that
// r.RemoteValue, and a Result literal's RemoteValue field, read as they
// did when both were flightcache names (RemoteResult, RemoteValue).
type RemoteValue[V any] = Value[V]

// Value is a value as a [Remote] stores it: with when, and how fast, it
// was loaded, so every process applies the same freshness rules to it.
type Value[V any] struct {
	// Value is the loaded value.
	Value V
	// LoadedAt is when the value was loaded, by whichever process. A value
	// loaded 5s ago elsewhere is 5s old here: fresh, stale or past use by
	// the Loader's own windows.
	LoadedAt time.Time
	// Took is how long that load took; it places the early refresh (the
	// Options' EarlyRefresh). 0 if unknown.
	Took time.Duration
	// Loaded is true when this call ran the load itself rather than
	// finding the value in the tier.
	Loaded bool
}

// AllInvalidator is what a [Remote] implements, besides Remote, to take
// part in the Loader's InvalidateAll: it drops every entry of the shared
// tier at once (without visiting them), and tells the other processes to
// drop their local copies (a [Watcher] hears it and calls
// [LocalCache.DropAll]). The Loader calls it on the caller's goroutine,
// outside every lock, before it drops its own copies: a load of this
// process that races the call either read the tier before it (and its
// result is dropped with the rest) or reads it afterwards. When it
// returns, no process reading the tier may be handed an entry written
// before the call; processes that have not heard yet may still serve
// their local copies until they do.
type AllInvalidator interface {
	InvalidateAll(ctx context.Context)
}

// Attacher is what a [Remote] implements, besides Remote, to be given the
// rules of the Loader it serves, rather than the Loader's Options a second
// time: flightcache.New calls Attach once, before it returns (after
// [Watcher.Watch], if the Remote watches too), with the rules of the
// Options it has validated. An error from Attach fails New, which returns
// it; so does a panic, as a *flightcache.PanicError. Attach is called on
// the goroutine that calls New, before the Loader calls any other method
// of the Remote.
//
// A Remote serves one Loader: an implementation should refuse a second
// Attach with an error rather than judge one Loader's values by another's
// rules.
type Attacher[K comparable, V any] interface {
	Attach(rules Rules[K, V]) error
}

// Rules are how a Loader judges its values, as a [Remote] needs them to
// judge the values it shares exactly as the Loader will: windows, each
// value's own windows, and what a not-found is. An [Attacher] is given
// them by flightcache.New. A Rules value is read-only and its functions
// are safe for concurrent use if the Options' callbacks are.
type Rules[K comparable, V any] struct {
	// Windows are the Loader's windows: those of a value without
	// Options.Freshness.
	Windows Windows
	// WindowsOf returns the windows of one value v of key: Windows with
	// what Options.Freshness says of v (cache false: a value not to be
	// cached); it calls Freshness on the caller's goroutine, and a panic
	// there is the caller's to recover. nil when the Loader has no
	// Freshness: every value has Windows.
	WindowsOf func(key K, v V) (w Windows, cache bool)
	// NotFound reports whether a load's error means that the key does not
	// exist, by the Loader's rule (Options.NotFound; a panic of
	// IsNotFound means no). Never nil in Rules a Loader gives.
	NotFound func(err error) bool
	// NotFoundTTL is Options.NotFoundTTL: how long the Loader caches a
	// not-found; 0: not cached.
	NotFoundTTL time.Duration
	// Version is Options.Version: a value's version, for a Remote that
	// keeps it with the shared entry so that no write of the fleet
	// replaces a value of a higher version (docs/design.md rule 30). It
	// calls Version on the caller's goroutine; a panic there is the
	// caller's to recover. nil when the Loader has no Version.
	Version func(v V) uint64
	// Tags is Options.Tags: the tags of a value v of key, for a Remote
	// that keeps them with the shared entry so that the fleet's
	// InvalidateTag drops it ([TagInvalidator]). It calls Tags on the
	// caller's goroutine; a panic there is the caller's to recover. At
	// most MaxTags (8) tags: a value with more is not cached by the
	// Loader, and should not be shared. nil when the Loader has no Tags.
	Tags func(key K, v V) []string
	// MaxWait is how long a load may wait for a downstream slot (the
	// Options' Limit.MaxWait, its default applied) before its LoadTimeout
	// starts: a Remote that holds a lease for a load holds it up to
	// LoadTimeout + MaxWait. 0 without a Limit.
	MaxWait time.Duration
}

// Watcher is what a [Remote] implements, besides Remote, to keep the
// Loader's local copies in step with the rest of a fleet: when another
// process Sets or Invalidates a key, the Remote tells this Loader to drop
// its copy; when it may have missed such a write (its subscription was
// down), it tells the Loader to distrust every copy it holds.
//
// flightcache.New calls Watch once, before it returns, with the Loader's
// [LocalCache] (a Watch that panics fails New with a
// *flightcache.PanicError). The Remote keeps it and calls it from any
// goroutine, for as long as it likes: after the Loader's Close its methods
// do nothing.
type Watcher[K comparable] interface {
	Watch(local LocalCache[K])
}

// LocalCache is a Loader's own cache as a [Watcher] drives it. Its methods
// are safe for concurrent use, never call the Remote back, never wait for
// a load, and do nothing once the Loader is closed.
type LocalCache[K comparable] interface {
	// Drop forgets this process's copy of key, as the Loader's Invalidate
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
	// DropAll forgets every copy this process holds, as the Loader's
	// InvalidateAll does, without telling the Remote: another process
	// called InvalidateAll, and the shared tier has dropped its entries
	// already.
	DropAll()
}

// TagInvalidator is what a [Remote] implements, besides Remote, to take
// part in the Loader's InvalidateTag (Options.Tags): it drops every entry
// of the shared tier that carries tag, in constant time (no visit of the
// entries: a per-tag stamp, say), and tells the other processes to drop
// their local copies that carry it (a [Watcher] hears it and calls
// [TagDropper.DropTag]). The Loader calls it on the caller's goroutine,
// outside every lock, before it drops its own copies, as for
// [AllInvalidator]. When it returns, no process reading the tier may be
// handed an entry with the tag stored before the call, nor store a value
// loaded before it; processes that have not heard yet may still serve
// their local copies until they do, and one that may have missed the
// message distrusts its copies ([LocalCache.Distrust]).
type TagInvalidator interface {
	InvalidateTag(ctx context.Context, tag string)
}

// TagDropper is what the [LocalCache] a Loader with Options.Tags hands a
// [Watcher] implements besides: a Remote asserts it (a LocalCache of an
// older Loader lacks it) to act on another process's InvalidateTag.
type TagDropper interface {
	// DropTag forgets every copy this process holds that carries tag, as
	// the Loader's InvalidateTag does (a load in flight whose value
	// carries it answers its own callers and fills nothing), without
	// telling the Remote. It does nothing for a Loader without
	// Options.Tags, and once the Loader is closed.
	DropTag(tag string)
}

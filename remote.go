package flightcache

import (
	"context"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// The names below are the old names of package remote's, from before the
// tier's contract had a package of its own (as database/sql's driver): each
// is an alias, or a call, of the remote name its Deprecated line gives, kept
// so that code using it still compiles.
//
// Deprecated: use the remote package's names.
type (
	// Deprecated: use [remote.Bounds].
	Bounds = remote.Bounds
	// Deprecated: use [remote.LocalCache].
	LocalCache[K comparable] = remote.LocalCache[K]
	// Deprecated: use [remote.Phase].
	Phase = remote.Phase
	// Deprecated: use [remote.Remote].
	Remote[K comparable, V any] = remote.Remote[K, V]
	// Deprecated: use [remote.Attacher].
	RemoteAttacher[K comparable, V any] = remote.Attacher[K, V]
	// Deprecated: use [remote.AllInvalidator].
	RemoteInvalidateAll = remote.AllInvalidator
	// Deprecated: use [remote.Many].
	RemoteMany[K comparable, V any] = remote.Many[K, V]
	// Deprecated: use [remote.Result].
	RemoteResult[V any] = remote.Result[V]
	// Deprecated: use [remote.Value].
	RemoteValue[V any] = remote.Value[V]
	// Deprecated: use [remote.Watcher].
	RemoteWatcher[K comparable] = remote.Watcher[K]
	// Deprecated: use [remote.Rules].
	Rules[K comparable, V any] = remote.Rules[K, V]
	// Deprecated: use [remote.Windows].
	Windows = remote.Windows
)

// Deprecated: use [remote.PhaseFresh] and the others.
const (
	PhaseFresh        = remote.PhaseFresh
	PhaseStale        = remote.PhaseStale
	PhaseStaleIfError = remote.PhaseStaleIfError
	PhaseExpired      = remote.PhaseExpired
)

// Deprecated: use [remote.AcceptsStale].
func AcceptsStale(ctx context.Context, d time.Duration) bool { return remote.AcceptsStale(ctx, d) }

// Deprecated: use [remote.MaxStale].
func MaxStale(ctx context.Context) (d time.Duration, ok bool) { return remote.MaxStale(ctx) }

// Deprecated: use [remote.StaleMayCover].
func StaleMayCover(err error, notFound bool) bool { return remote.StaleMayCover(err, notFound) }

// Deprecated: use [remote.WithReloadValue].
func WithReloadValue[V any](ctx context.Context, v V) context.Context {
	return remote.WithReloadValue(ctx, v)
}

// remoteSet and remoteInvalidate tell the Remote, if any, about a Set or an
// Invalidate. They run on the caller's goroutine, outside every lock.
func (l *Loader[K, V]) remoteSet(key K, v V) {
	if l.opts.Remote != nil {
		l.user.guard(func() { l.opts.Remote.Set(l.ctx, key, remote.Value[V]{Value: v, LoadedAt: time.Now()}) }, nil)
	}
}

func (l *Loader[K, V]) remoteInvalidate(key K) {
	if l.opts.Remote != nil {
		l.user.guard(func() { l.opts.Remote.Invalidate(l.ctx, key) }, nil)
	}
}

// remoteInvalidateAll tells the Remote, if it takes part, about an
// InvalidateAll.
func (l *Loader[K, V]) remoteInvalidateAll() {
	if r, ok := l.opts.Remote.(remote.AllInvalidator); ok {
		l.user.guard(func() { r.InvalidateAll(l.ctx) }, nil)
	}
}

// rules are the Rules of o, already validated.
func (o Options[K, V]) rules() remote.Rules[K, V] {
	r := remote.Rules[K, V]{NotFound: o.NotFound, NotFoundTTL: o.NotFoundTTL, Version: o.Version}
	if o.Limit.enabled() {
		r.MaxWait = o.Limit.MaxWait
	}
	if o.Freshness != nil {
		r.WindowsOf = o.windowsOf
	}
	r.Windows = o.windows()
	r.Tags = o.Tags
	return r
}

// attachRemote hands the Loader's rules to its Remote, if the Remote takes
// them (RemoteAttacher). An error, or a panic, of Attach fails New.
func (l *Loader[K, V]) attachRemote() error {
	a, ok := l.opts.Remote.(remote.Attacher[K, V])
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

// local is a Loader's [remote.LocalCache].
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
	w, ok := l.opts.Remote.(remote.Watcher[K])
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

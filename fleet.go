package flightcache

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

package flightcache

import (
	"errors"

	"github.com/flightcache/flightcache/remote"
)

// Versioned writes (docs/design.md rule 30). With Options.Version every
// value entry carries its value's version, asked of Version once, when the
// entry is built, outside every lock (Version is user code: versionOf,
// through the guard). Every write of a key meets the value it would
// replace in one place, put (flight.go), under the key's shard lock, which
// every fill, Set, Invalidate and drop of the key takes: there outranks
// compares the two, against the key's current entry (its pending write's,
// if one is open and not yet applied by the cache, else the cached one).
// An outdated write changes nothing (no entry marked gone, no pending
// write opened or changed, no load detached), counts in
// Stats.WritesOutdated, and the load it came from, if any, still gives its
// callers its value. A new kind of write (a Restore) is versioned by
// building its entry with versionOf and committing it through put.
//
// The lost update of cache-aside: writer A stores row v1 in the database,
// writer B then stores v2, and their Sets reach the Loader in the other
// order.
//
//  1. B: Set(K, v2): put finds nothing held for K; opens write W with v2.
//  2. A: Set(K, v1): put finds W's entry v2, of a higher version: v1 is
//     outdated, W keeps v2. Set returns; the Remote is not told.
//  3. The writer applies W: ristretto holds v2. Every Get sees v2.
//
// A load from a lagging replica after a Set:
//
//  1. Set(K, v2): put opens write W with v2; the writer applies it.
//  2. Refresh(K) starts load L, which reads v1 from a replica.
//  3. L finishes: its waiters get v1; put finds v2 cached, of a higher
//     version: v1 is outdated, v2 stays with its freshness. L's refresh
//     backs off as a failed one does, so v2's stale window does not turn
//     into one refresh after another.
//
// The writes of a key pass put one at a time, each against what the last
// one left, so the version held never goes back. What is not a value holds
// no version and stops nothing: a cached not-found, a pending delete, a
// value from before an InvalidateAll, one past every window (served by no
// Get, as if evicted). And what is not a value is never refused: a
// not-found, Invalidate, InvalidateAll, and a value not to be cached (a
// negative Freshness TTL, a value too big for the cache, one whose Cost,
// Freshness or Version panicked) drop what is held, whatever its version.

// versionOf asks Options.Version (user code, through the guard, outside
// every lock) for v's version and records it in life. It reports false if
// Version panicked: the value is then not to be cached, and drops the one
// held, as one whose Freshness panicked does (a value of unknown version
// may be older or newer than the one held: neither is kept). Without
// Version it does nothing.
func (l *Loader[K, V]) versionOf(life *lifetime, v V, onGoexit func()) bool {
	if l.opts.Version == nil {
		return true
	}
	var ver uint64
	if l.user.guard(func() { ver = l.opts.Version(v) }, onGoexit) != nil {
		return false
	}
	life.ver, life.versioned = ver, true
	return true
}

// version returns e's version, and false for an entry that holds none (a
// cached not-found, and every entry of a Loader without Version).
func (e *entry[K, V]) version() (uint64, bool) {
	if e.extra == nil || !e.extra.versioned {
		return 0, false
	}
	return e.extra.ver, true
}

// outranks reports whether held, the key's current entry (nil: none),
// makes next (nil: a delete) outdated: both hold a version, held's is
// higher, and held stands (standing). An equal version does not: the
// write wins, as every write does without Version. A tombstone is never
// outdated: it is an invalidation. The caller holds the key's shard lock
// (put).
func (kr *keyRules[K, V]) outranks(held, next *entry[K, V]) bool {
	if next == nil || next.isTombstone() {
		return false
	}
	hv, ok := kr.standing(held)
	if !ok {
		return false
	}
	nv, ok := next.version()
	return ok && nv < hv
}

// standing returns the version of held, the key's current entry (nil:
// none), and true if that version still stops an older write: held holds
// a version and is a value a Get could still be served (live, within its
// windows), or a tombstone that is live (no InvalidateAll since).
func (kr *keyRules[K, V]) standing(held *entry[K, V]) (uint64, bool) {
	if held == nil {
		return 0, false
	}
	hv, ok := held.version()
	if !ok || kr.cleared(held) {
		return 0, false
	}
	if !held.isTombstone() && kr.phase(held, kr.now()) == remote.PhaseExpired {
		return 0, false
	}
	return hv, true
}

// superseded reports whether next, a write of its key about to be put in
// sh (seen: the key's cached entry under the lock), is older than the
// value held, and if so counts it in Stats.WritesOutdated. The caller
// holds sh.mu.
func (f *flights[K, V]) superseded(sh *shard[K, V], seen *entry[K, V], next *write[K, V]) bool {
	if !f.rules.versioned || next.entry == nil {
		return false
	}
	held := seen
	if w := sh.writes[next.key]; w != nil {
		held = w.entry
	}
	if next.entry.isTombstone() {
		// Not published yet: put is about to. The tombstone never goes back.
		if hv, ok := f.rules.standing(held); ok && hv > next.entry.extra.ver {
			next.entry.extra.ver = hv
		}
		return false
	}
	if !f.rules.outranks(held, next.entry) {
		return false
	}
	f.stats.writesOutdated.Add(1)
	return true
}

// Version tombstones (docs/design.md rule 41). InvalidateVersion(key, v)
// writes, through Set's path (write, put), a tombstone: an entry that is not a
// value (a not-found of errTombstone, past every window from birth: no Get,
// Peek, Entries, Len, Reload or stale fallback takes it; a Get of its key
// loads) and holds version v. In put it is never outdated (it is an
// invalidation: it detaches the load in flight and drops what is held, as
// Invalidate does), and it takes the version of what it replaces if that
// is higher (superseded), so the tombstone never goes back; a later write of
// the key meets it there as it meets a value (outranks, standing), but
// whatever its windows: a fill or Set below v is outdated, one at v or
// above replaces it. What drops a value drops a tombstone: Invalidate, a
// not-found, InvalidateAll (cleared), a Restore never lands on one
// (fillEmpty: it is live). It lives where every entry does, in the cache,
// at a cost of 1: its policy may evict it, or refuse it on admission, as
// it would any entry, and the tombstone is then gone (the limit the rule
// states).

// errTombstone is the not-found error a tombstone carries: what tells it from a
// cached not-found. No caller ever receives it.
var errTombstone = errors.New("flightcache: a tombstone")

// isTombstone reports whether e is a tombstone left by InvalidateVersion.
func (e *entry[K, V]) isTombstone() bool {
	return e.extra != nil && e.extra.notFound == errTombstone
}

// InvalidateVersion drops key's value as [Loader.Invalidate] does, and
// leaves the key a tombstone: from then on, until a value of version
// at least version is stored, a write of a lower version (the fill of a
// load, a Set, a Restore) stores nothing, as a write older than the value
// held does with [Options.Version] (Stats.WritesOutdated; the load still
// gives its own callers what it read). It is the invalidation of a change
// that knows the version it made (a version column, a commit position):
// a load that starts after it and reads a replica that has not replayed
// the change yet cannot store the older row.
//
// The tombstone is not a value: no Get is answered from it (a Get of key
// loads), Peek, Len and Entries do not see it. It never goes back: a
// tombstone below the version held (a value, or an earlier tombstone) keeps the
// higher one. It is dropped with the key by Invalidate, a not-found, and
// InvalidateAll; it is this Loader's alone (a Remote is told of a plain
// Invalidate); and it is held as an entry of the cache, at a cost of 1, so
// the cache's policy may evict it, or refuse it on admission, under
// pressure: then a lower version may be stored again. Without
// Options.Version, and for a key [Options.ValidateKey] rejects or that is
// not equal to itself, it is Invalidate. After Close it does nothing.
func (l *Loader[K, V]) InvalidateVersion(key K, version uint64) {
	if l.opts.Version == nil || l.checkKey(key) != nil || l.selfUnequal(key) {
		l.Invalidate(key)
		return
	}
	h, err := l.hash(key)
	if err != nil {
		return
	}
	mk := func() *entry[K, V] {
		e := &entry[K, V]{key: key, loadedAt: l.now(), freshUntil: -1}
		e.mark.Store(l.generation.Load())
		e.extra = &extra[K, V]{notFound: errTombstone, ver: version, versioned: true}
		return e
	}
	if l.write(key, h, mk, 1, EvictionInvalidated) {
		l.remoteInvalidate(key)
	}
}

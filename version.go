package flightcache

import "github.com/flightcache/flightcache/remote"

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
// higher, and held is one a Get could still be served (live, within its
// windows). An equal version does not: the write wins, as every write
// does without Version. The caller holds the key's shard lock (put).
func (kr *keyRules[K, V]) outranks(held, next *entry[K, V]) bool {
	if held == nil || next == nil {
		return false
	}
	hv, ok := held.version()
	if !ok {
		return false
	}
	nv, ok := next.version()
	if !ok || nv >= hv {
		return false
	}
	return !kr.cleared(held) && kr.phase(held, kr.now()) != remote.PhaseExpired
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
	if !f.rules.outranks(held, next.entry) {
		return false
	}
	f.stats.writesOutdated.Add(1)
	return true
}

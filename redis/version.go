package flightredis

import (
	"fmt"

	"github.com/flightcache/flightcache"
)

// Versioned writes through the tier (docs/design.md rule 30). With the
// Loader's Options.Version (Rules.Version, given at Attach), every value
// entry the tier writes keeps its value's version in the hash field "ver",
// and writeScript, for a lease holder's fill (Load, LoadMany) and a Set
// alike, refuses to replace an entry whose "ver" is higher than the
// write's; an equal version wins, as every write does without Version.
//
//   - "ver" is the version in 20 decimal digits, zero-padded (versionText):
//     Lua's numbers are doubles, which hold a uint64 above 2^53 only
//     rounded, so the script compares the two halves of 10 digits, each
//     exact as a double, never tonumber of the whole.
//   - What holds no "ver" refuses nothing: a not-found marker, an entry of
//     a Loader without Version or of an older version of the tier. A write
//     without a version (a Loader without Version) writes as before, and
//     leaves an entry without "ver". Not-found markers, Invalidate and
//     InvalidateAll are not versioned: they drop what is held.
//   - A refused fill changes no entry and publishes no invalidation (no
//     process's copy is out of date), but does what a write does for the
//     lease: it drops it and publishes on the loaded channel, so the
//     processes waiting on it look at the entry again at once (a wakeup,
//     not a poll) and judge it by their own rules. The value still goes
//     to the holder's Loader, which applies rule 30 to its own copy; its
//     callers get what the load read.
//   - A refused Set changes nothing in Redis: no entry, no lease (a load
//     in flight elsewhere is compared in its turn when it writes), no
//     message. The Set's process has its own Loader drop the key
//     (flightcache.LocalCache.Drop; the Loader stored the Set's value
//     already), so its next Get reads the fleet's newer entry rather than
//     serve the older value it was given.
//   - Both count in Stats.WritesOutdated.
//
// Version is user code: the tier asks it once per value it writes, with
// Freshness and the Codec, under the same recover (prepare). A panic
// there makes the value one the tier does not share (Stats.EncodeErrors),
// as a panic of Freshness does: a fill releases the lease, a Set deletes
// the key's shared entry. That is the Loader's own rule for a value whose
// Version panicked: a value of unknown version may be older or newer than
// the one held, and neither is kept.

// Answers of writeScript.
const (
	writeLost     = 0 // the lease was no longer the caller's: nothing written
	writeDone     = 1 // the entry was written
	writeOutdated = 2 // the entry holds a higher version: nothing written
)

// versionText returns v's version as the entry's "ver" field keeps it,
// and "" for a Loader without Version (the write is not versioned). It
// calls Options.Version, user code, which may panic: the caller recovers.
func (a *attachment[K, V]) versionText(v V) string {
	if a.rules.Version == nil {
		return ""
	}
	return fmt.Sprintf("%020d", a.rules.Version(v))
}

// outdatedSet is what a Set refused by writeScript does: it counts it, and
// has the Loader drop its own copy of key, so the next Get reads the
// fleet's newer entry.
func (t *Tier[K, V]) outdatedSet(key K) {
	t.stats.writesOutdated.Add(1)
	t.fleet.each(func(l flightcache.LocalCache[K]) { l.Drop(key) })
}

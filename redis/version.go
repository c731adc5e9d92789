package flightredis

import (
	"fmt"

	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
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
//     lease: it drops it and wakes the key's waiters, so the
//     processes waiting on it look at the entry again at once (a wakeup,
//     not a poll) and judge it by their own rules (a waiter that finds
//     the entry usable now is handed it; one that does not, a stale entry
//     under WithMaxStale(ctx, 0), takes the lease and loads). The value
//     still goes to the holder's Loader, whose callers get what the load
//     read, as rule 30 has it. If the tier handed this process the entry
//     that refused the fill, the Loader may hold it and judges the fill
//     against it by rule 30. If not, the Loader holds nothing newer and
//     would keep the older value: the tier has it drop the key
//     (remote.LocalCache.Drop, during the load, so the load answers
//     its callers but does not fill the cache), and its next Get reads
//     the fleet's entry.
//   - A refused Set changes nothing in Redis: no entry, no lease (a load
//     in flight elsewhere is compared in its turn when it writes), no
//     message. The Set's process has its own Loader drop the key
//     (remote.LocalCache.Drop; the Loader stored the Set's value
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

// writeAnswer reads writeScript's reply: writeLost or writeDone, or
// writeOutdated with held, the id of the entry that refused the write.
func writeAnswer(cmd *redis.Cmd) (n int, held string, err error) {
	v, err := cmd.Result()
	if err != nil {
		return 0, "", err
	}
	switch r := v.(type) {
	case int64:
		return int(r), "", nil
	case []any:
		if len(r) == 2 && r[0] == int64(writeOutdated) {
			held, _ = r[1].(string)
			return writeOutdated, held, nil
		}
	}
	return 0, "", fmt.Errorf("flightredis: unexpected reply from the write script: %v", v)
}

// outdatedFill is what a lease holder's fill refused by writeScript does
// (stored counted it): unless the tier handed this process the entry that
// refused it (held, its id), which the Loader then judges the fill
// against, it has the Loader drop key, so the older value the load read
// reaches its callers but not the cache.
func (t *Tier[K, V]) outdatedFill(ks keys, key K, held string) {
	if held != "" && t.copies.served.Get(ks.base) == held {
		return
	}
	t.copies.dropKey(key, ks)
}

// outdatedSet is what a Set refused by writeScript does: it counts it, and
// has the Loader drop its own copy of key, so the next Get reads the
// fleet's newer entry.
func (t *Tier[K, V]) outdatedSet(key K) {
	t.stats.writesOutdated.Add(1)
	t.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
}

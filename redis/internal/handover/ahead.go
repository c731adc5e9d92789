// Package handover keeps the tier's record of what it handed its Loader,
// by the Redis names of keys: the entry id handed over for each (Served),
// the Loads running and the cuts of their copies (Running), and the keys
// this process may be ahead of Redis on (Ahead). It knows no key or value.
package handover

import "sync"

// bound bounds each record: when full, an arbitrary name is forgotten,
// which costs at most one Redis round trip.
const bound = 1 << 16

// Never back a version. A process may serve a value newer than the key's
// shared entry: it loaded the key from the downstream without Redis (the
// tier stepping aside, a round trip that failed or took too long), while a
// write of the downstream whose Invalidate has not reached Redis yet (kept
// for replay in its writer, or late) leaves the older entry in place; or
// its own Set or Invalidate of the key is kept for replay. When it reads
// the key through Redis again (its copy was distrusted, as every copy
// loaded without Redis is at the next health check, or dropped), handing
// it that entry would take it back a version.
//
// So the tier marks such a key (Ahead.Mark), and a Load of a marked key
// takes no value from Redis (entry, not-found marker, a lease holder's
// value, a cover for a failure): it loads from the downstream, under the
// lease if it can take it, and the write of that load, once stored, is the
// newest value the process served (its load started after the mark), so
// it clears the mark. If another process holds the lease, that holder may
// have read the downstream before the value this process served, and the
// Load does not wait for it: it loads without the lease (its read of the
// entry came first, tracked, so a later write of the key still comes back)
// and the mark stays. A Set or Invalidate of this process that reaches
// Redis clears the marks made before it was sent: every value the fleet
// writes after it was loaded after it.

// ahead holds the marks: per key name, the number of its last mark.
// Bounded: when bound names are marked, every name is marked at once
// (floor), and the map starts again; a name cleared since is recorded as
// 0. Marking too much costs loads, never a version.
type Ahead struct {
	mu    sync.Mutex
	m     map[string]uint64 // name → its mark's number, or 0 if cleared since floor; guarded by mu
	seq   uint64            // the last mark's number; guarded by mu
	floor uint64            // the mark of every name not in m (0: none); guarded by mu
}

// Mark notes that this process may have served a value of name newer
// than its shared entry.
func (a *Ahead) Mark(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	if a.m == nil {
		a.m = make(map[string]uint64)
	}
	if _, ok := a.m[name]; !ok && len(a.m) >= bound {
		a.floor = a.seq // every name, this one included
		clear(a.m)
		return
	}
	a.m[name] = a.seq
}

// Now returns the number of the last mark: a load that starts after now
// was taken covers every mark up to it (clear).
func (a *Ahead) Now() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seq
}

// State reports whether name is marked, and the number of the last mark
// (now).
func (a *Ahead) State(name string) (marked bool, since uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.of(name) != 0, a.seq
}

// of is name's mark; a.mu is held.
func (a *Ahead) of(name string) uint64 {
	if n, ok := a.m[name]; ok {
		return n
	}
	return a.floor
}

// Clear drops name's mark if it is not newer than since (see now): a
// value of name stored in Redis (or an Invalidate of name that reached it)
// after since was taken is at least as new as what the process served
// before.
func (a *Ahead) Clear(name string, since uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.of(name)
	switch {
	case n == 0 || n > since:
	case a.floor == 0:
		delete(a.m, name)
	default:
		if _, in := a.m[name]; in || len(a.m) < bound {
			a.m[name] = 0
		}
	}
}

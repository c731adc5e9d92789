package flightcache

import (
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
	"github.com/flightcache/flightcache/remote"
)

// A warm restart (docs/design.md rule 29): Entries yields what a Loader
// holds, in a form that encodes as is; Restore stores such entries in a
// new Loader, each with the windows it had left, through the same bounded
// write path as Set, but only into keys that hold nothing.

// Entry is one key's cached value or cached not-found, as [Loader.Entries]
// yields it and [Loader.Restore] takes it. Its fields are plain, so an
// Entry encodes with encoding/gob or encoding/json when K and V do: a
// process can save what its Loader holds at shutdown and restore it at
// start.
type Entry[K comparable, V any] struct {
	Key K
	// Value is the value held; zero (and ignored by Restore) for a
	// not-found.
	Value V
	// NotFound marks a cached not-found ([Options.NotFoundTTL]): Restore
	// stores it as one, and a Get of the key then returns an error that
	// matches [ErrNotFound] until it expires.
	NotFound bool
	// LoadedAt is when the value was loaded or Set (the wall clock); not
	// zero. Restore counts the entry's windows from it (a time in the
	// future counts as now).
	LoadedAt time.Time
	// Freshness is the entry's life as stored, its TTL after jitter; as in
	// [Options.Freshness], a zero field takes the restoring Loader's Options
	// and a negative window means none; a negative TTL is invalid.
	Freshness Freshness
	// Tags are the tags the value carried ([Options.Tags]), at most
	// [MaxTags], stored as they are.
	Tags []string
}

// check reports the first field of en Restore cannot take, by name.
func (en *Entry[K, V]) check() error {
	switch {
	case en.LoadedAt.IsZero():
		return errors.New("Entry.LoadedAt is zero")
	case en.Freshness.TTL < 0:
		return fmt.Errorf("Entry.Freshness.TTL is negative (%v)", en.Freshness.TTL)
	}
	return checkTags(en.Tags)
}

// Len returns how many entries [Loader.Entries] would yield now, the writes
// not yet applied included. It is O(n), allocates nothing, loads nothing
// and counts as no Get; after Close it returns 0. Len is safe for
// concurrent use.
func (l *Loader[K, V]) Len() int {
	n := 0
	l.visit(func(*entry[K, V]) { n++ })
	return n
}

// Entries returns an iterator over the values and cached not-founds the
// Loader holds within their windows, each once, in no order, with the times
// and windows it was stored with: what [Loader.Restore] takes. It never
// loads or counts as a Get, and skips what a Get would not serve. Each
// iteration snapshots the entries, then yields outside every lock, so the
// loop may call the Loader. It is safe for concurrent use; after Close it
// yields nothing, so save before [Loader.Shutdown] (docs/design.md rule
// 29).
func (l *Loader[K, V]) Entries() iter.Seq[Entry[K, V]] {
	return func(yield func(Entry[K, V]) bool) {
		var es []*entry[K, V]
		if !l.visit(func(e *entry[K, V]) { es = append(es, e) }) {
			return
		}
		wall, now := time.Now().Round(0), l.now() // Round(0): the wall clock alone, as an encoding keeps it
		for i, e := range es {
			es[i] = nil // let it go once yielded
			if !l.usable(e, l.now()) {
				continue // left, or expired, since the snapshot
			}
			if !yield(l.entryOut(e, wall, now)) {
				return
			}
		}
	}
}

// visit calls fn for each entry held now (usable), once: the pending
// writes' values first, then the cache's others. fn runs inside
// ristretto's shard lock: it must only take note. visit reports false
// after Close.
func (l *Loader[K, V]) visit(fn func(*entry[K, V])) bool {
	s, open := l.gate.EnterOp()
	if !open {
		return false
	}
	defer l.gate.ExitOp(s)
	now := l.now()
	pending := l.flights.pendingEntries(nil)
	var dup map[*entry[K, V]]struct{} // a pending write's value the cache holds too (issued, not yet settled)
	if len(pending) > 0 {
		dup = make(map[*entry[K, V]]struct{}, len(pending))
	}
	for _, e := range pending {
		dup[e] = struct{}{}
		if l.usable(e, now) {
			fn(e)
		}
	}
	l.cache.IterValues(func(e *entry[K, V]) bool {
		if _, seen := dup[e]; !seen && l.usable(e, now) {
			fn(e)
		}
		return false
	})
	return true
}

// usable reports whether e is a value (or not-found) a Get could be
// served as it stands at now: not replaced or invalidated, not from
// before an InvalidateAll or a Distrust, and within its windows.
func (l *Loader[K, V]) usable(e *entry[K, V], now time.Duration) bool {
	return !e.isGone() && !l.cleared(e) && !l.distrusted(e) && l.phase(e, now) != remote.PhaseExpired
}

// entryOut is e as an Entry, its times on the wall clock: wall and now
// are the same moment on both clocks.
func (l *Loader[K, V]) entryOut(e *entry[K, V], wall time.Time, now time.Duration) Entry[K, V] {
	out := Entry[K, V]{Key: e.key, LoadedAt: wall.Add(e.loadedAt - now), Tags: e.tagNames()}
	// At least 1ns: a TTL of 0 would mean the restoring Loader's own.
	out.Freshness.TTL = max(e.freshUntil-e.loadedAt, 1)
	if e.isNotFound() {
		out.NotFound = true
		return out
	}
	out.Value = e.val
	w := l.win
	if e.extra != nil {
		w = e.extra.windows()
	}
	out.Freshness.StaleWhileRevalidate = windowOut(w.StaleWhileRevalidate)
	out.Freshness.StaleIfError = windowOut(w.StaleIfError)
	return out
}

// windowOut is a window as a Freshness field gives it: none is negative,
// since 0 would take the restoring Loader's default.
func windowOut(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// Restore stores entries, as [Loader.Entries] yielded them (in this process
// or, encoded, in an earlier one), and returns how many it stored: a Get
// after it is served each as if loaded at its LoadedAt, with no downstream
// call while it is fresh or stale. It skips, without error, an entry past
// its windows, one whose key the Loader holds already (a value, a pending
// write, a load in flight: a restored value is older than all of them), and
// one it cannot cache. Each goes through [Loader.Set]'s bounded write path,
// never to the Remote (docs/design.md rule 29).
//
// WARNING: a restored value is the row as it was saved: a row changed
// between the save and the Restore is served as saved until its freshness
// runs out. Call Restore at start, before the Loader serves.
//
// Restore stops at the first entry it cannot take, with an error naming
// the field, and returns how many it stored before; after Close it
// returns [ErrClosed]. It is safe for concurrent use.
func (l *Loader[K, V]) Restore(entries iter.Seq[Entry[K, V]]) (int, error) {
	if l.gate.Closed() {
		return 0, ErrClosed
	}
	n, i := 0, 0
	for en := range entries {
		stored, err := l.restoreOne(&en)
		if err != nil {
			if !errors.Is(err, ErrClosed) {
				err = fmt.Errorf("flightcache: Restore: entry %d: %w", i, err)
			}
			return n, err
		}
		if stored {
			n++
		}
		i++
	}
	return n, nil
}

// restoreOne stores en unless Restore skips it, and reports whether it
// did; the error is en's bad field, or ErrClosed.
func (l *Loader[K, V]) restoreOne(en *Entry[K, V]) (stored bool, err error) {
	if err := en.check(); err != nil {
		return false, err
	}
	if l.checkKey(en.Key) != nil {
		return false, nil // Options.ValidateKey rejects it: no Get could read it
	}
	h, err := l.hash(en.Key)
	if err != nil || l.selfUnequal(en.Key) || l.cached(h, en.Key) != nil {
		return false, nil // held: the cheap look, before taking a place
	}
	e, cost, ok := l.restored(en)
	if !ok {
		return false, nil
	}
	s, open := l.gate.EnterOp()
	if !open {
		return false, ErrClosed
	}
	var gone *entry[K, V]
	defer func() { l.writer.replaced(gone, EvictionReplaced) }() // after ExitOp, deferred below (write)
	defer l.gate.ExitOp(s)
	p, ok := l.writer.takeWrite(cost)
	if !ok {
		return false, ErrClosed // closed while waiting
	}
	w, back, gone, stored := l.flights.fillEmpty(en.Key, h, e, cost, p)
	if w != nil {
		l.writer.hand(w)
	}
	l.writer.giveBack(back)
	return stored, nil
}

// restored builds en's entry, loaded at en.LoadedAt on the Loader's clock,
// with its cost; ok is false for an entry Restore skips (past its
// windows, no TTL, a value that cannot be costed or never fits).
func (l *Loader[K, V]) restored(en *Entry[K, V]) (e *entry[K, V], cost int64, ok bool) {
	f, win := en.Freshness, l.win
	ttl := f.TTL
	switch {
	case ttl > 0:
	case en.NotFound:
		ttl = l.opts.NotFoundTTL
	default:
		ttl = l.opts.TTL
	}
	if ttl <= 0 {
		return nil, 0, false
	}
	cost = 1
	var life lifetime // its version (rule 30), asked as a Set asks it
	if !en.NotFound {
		if cost, ok = l.costOf(en.Value, nil); !ok || l.tooBig(cost) || !l.versionOf(&life, en.Value, nil) {
			return nil, 0, false
		}
		win = remote.Windows{
			StaleWhileRevalidate: pick(f.StaleWhileRevalidate, l.win.StaleWhileRevalidate),
			StaleIfError:         pick(f.StaleIfError, l.win.StaleIfError),
		}
	}
	// Its age on the wall clock (the only one two processes share), never
	// negative, saturated; then an offset from the epoch like every other.
	now := l.now()
	at := now - max(timing.Offset(time.Now(), en.LoadedAt), 0)
	e = &entry[K, V]{key: en.Key, loadedAt: at, freshUntil: timing.Add(at, ttl)}
	e.mark.Store(l.generation.Load())
	tags := l.restoredTags(en.Tags)
	switch {
	case en.NotFound:
		e.extra = &extra[K, V]{notFound: ErrNotFound, tags: tags}
	case win != l.win || life.versioned || tags != nil:
		e.val, e.extra = en.Value, &extra[K, V]{swr: win.StaleWhileRevalidate, sie: win.StaleIfError, ver: life.ver, versioned: life.versioned, tags: tags}
	default:
		e.val = en.Value
	}
	return e, cost, l.phase(e, now) != remote.PhaseExpired
}

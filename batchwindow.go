package flightcache

import (
	"slices"
	"sync"
	"time"

	"github.com/flightcache/flightcache/internal/life"
)

// Batch windows (Options.BatchWindow, docs/design.md rule 31). A window is
// a GetMany batch that stays open: the loads of single keys (a Get's miss,
// a revalidating Get, Refresh, a background or early refresh) that would
// each call the downstream for one key join it as its calls, published in
// their keys' shards like any other (start), so later callers of the same
// key coalesce on them as now. It goes out, one LoadMany call as a
// GetMany's batch does (runBatch), BatchWindow after it opened, at once
// when it holds MaxBatch calls (the next load opens a new one), or at
// Close. Misses and background refreshes wait in windows of their own
// (fg, bg): a window of refreshes holds one MaxRefreshes place, taken by
// its first call, as a GetMany's refreshes do, and one Limit slot, taken
// only as its call goes out (slot), so that an idle window never holds up
// a miss.
//
// A window's goroutine is the batch's: the load that opens the window
// launches it (counted in on that load's stripe, as any load), and it
// waits out the window (hold) before it runs the batch. Until it is
// sealed, under mu, calls join it (start) and, under CancelAtZero, leave
// it (drop): a key whose callers all left is not in the call, and a
// window every caller left makes no call at all.
//
// Locks: mu is taken under a shard lock (start, from flights.start) or
// under none (drop, hold); no shard lock is ever taken under mu.

// batchWindows are the Loader's open windows.
type batchWindows[K comparable, V any] struct {
	l *Loader[K, V]
	// d is Options.BatchWindow; 0: no window (also with a Remote that is
	// not a RemoteMany: its loads go key by key, as a GetMany's do).
	d time.Duration
	// mu guards fg and bg and, while a window is open, its batch's calls,
	// leader, slots and windowWait.
	mu     sync.Mutex
	fg, bg *batch[K, V] // the open windows, of misses and of refreshes; nil: none open
}

// windowWait is what a batch that is a window has besides.
type windowWait struct {
	opened time.Duration // when it opened: it goes out BatchWindow after
	full   chan struct{} // closed once it holds MaxBatch calls: it goes out at once
	// Guarded by batchWindows.mu.
	open       bool // calls may still join and leave it
	leaderGone bool // its first call was dropped: its context is the call's, its key is not in it
	// Written by its goroutine as it goes out (slot), before the call.
	queued bool // a window of refreshes found no background slot free but a Get waiting on a key: it waits its turn for a slot
}

// queues reports whether b, a window of refreshes, waits its turn for a
// Limit slot as a miss does, rather than holding a background one.
func (b *batch[K, V]) queues() bool { return b.wait != nil && b.wait.queued }

func (w *batchWindows[K, V]) init(l *Loader[K, V]) {
	w.l = l
	if _, ok := l.opts.Remote.(RemoteMany[K, V]); l.opts.Remote == nil || ok {
		w.d = l.opts.BatchWindow
	}
}

// takes reports whether a load of key, about to start with n, waits in a
// window: not one of a GetMany's batches already, not a Reload of a value
// held (it needs that value: it goes alone), not a key not equal to
// itself (a LoadMany result cannot be looked up by it).
func (w *batchWindows[K, V]) takes(key K, n *newLoad[K, V]) bool {
	return w.d > 0 && n.into == nil && (n.from == nil || w.l.opts.Reload == nil) && !w.l.selfUnequal(key)
}

// windowAct is what a start in a window leaves for its caller to do once
// the shard is unlocked (no channel operation under a shard lock): launch
// the window it opened, wake the window it filled.
type windowAct[K comparable, V any] struct {
	opened, filled *batch[K, V]
}

// do does a, counting a window it launches in on s.
func (a windowAct[K, V]) do(l *Loader[K, V], s *life.Stripe) {
	if a.filled != nil {
		close(a.filled.wait.full)
	}
	if a.opened != nil {
		l.launchBatch(a.opened, s)
	}
}

// start is flights.start for a load that waits in the open window of its
// kind, opening one if none is. The caller holds r's shard lock. It
// returns the call (nil: none started; batched whenever one is) and what
// to do after unlocking.
func (w *batchWindows[K, V]) start(f *flights[K, V], sh *shard[K, V], r *request[K, V], n newLoad[K, V]) (c *call[K, V], batched bool, act windowAct[K, V]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	slot := &w.fg
	if n.background {
		slot = &w.bg
	}
	if *slot == nil {
		*slot = w.l.newBatch(n.background)
		(*slot).wait = &windowWait{opened: w.l.now(), full: make(chan struct{}), open: true}
		act.opened = *slot
	}
	b := *slot
	n.into = b
	c, _, _ = f.start(sh, r, n)
	switch {
	case c == nil && act.opened != nil: // nothing joined the window it opened
		*slot, act.opened = nil, nil
	case c != nil && b.full():
		*slot = nil
		b.wait.open = false
		act.filled = b
	}
	return c, c != nil, act
}

// hold keeps b, a window, on its goroutine until it goes out: BatchWindow
// after it opened, at once when it is full or the Loader closes. It then
// seals b (nothing joins or leaves it any more) and reports whether b has
// calls left to load; a window every caller left ends here, no load.
func (w *batchWindows[K, V]) hold(b *batch[K, V]) bool {
	l := w.l
	if left := w.d - (l.now() - b.wait.opened); left > 0 {
		t := time.NewTimer(left)
		select {
		case <-t.C:
		case <-b.wait.full:
		case <-l.ctx.Done(): // Close: it goes out now, and meets ErrClosed as any load in flight
		}
		t.Stop()
	}
	w.mu.Lock()
	if b.wait.open {
		b.wait.open = false
		if w.fg == b {
			w.fg = nil
		} else if w.bg == b {
			w.bg = nil
		}
	}
	n := len(b.calls)
	w.mu.Unlock()
	if n == 0 {
		l.stats.inFlight.Add(-1) // counted in when launched (spawn)
		if b.slotted {
			l.refreshSlots.give()
			b.limSlot.Release()
		}
		return false
	}
	if b.background {
		if !w.slot(b) {
			return false
		}
		l.stats.refreshes.Add(1) // one per window, as a GetMany's refreshes
	}
	return true
}

// slot takes the Limit slot of b, a sealed window of refreshes, as its
// call goes out: never while it waits, so that an idle window never holds
// up a miss (rule 31). It takes a background slot if one is free
// (TryBackground), and reports true. Refused (Stats.RefreshesLimited), the
// refresh is dropped, as one refused at its start is: each call leaves its
// key's map under its shard lock, so no Get joins it from then on, and
// ends with ErrLimited (ErrClosed at Close), delivered to nobody and
// written nowhere; nothing is loaded, and slot reports false. But a call
// a Get already waits on (a Get that could not use the stale value, and
// joined the refresh) is that Get's load: then the window goes out for
// all its keys, waiting its turn for a slot as that Get's own load would
// have (queued; a key whose call had already left its map is loaded but
// not written).
func (w *batchWindows[K, V]) slot(b *batch[K, V]) bool {
	l := w.l
	if s, ok := l.lim.TryBackground(); ok {
		b.limSlot = s
		return true
	}
	if l.flights.waitedOn(b.calls, false) || l.flights.waitedOn(b.calls, true) {
		b.wait.queued = true
		return true
	}
	l.stats.inFlight.Add(-1) // counted in when launched (spawn), ended without a load
	l.refreshSlots.give()
	err := ErrLimited
	if l.gate.Closed() { // the window went out at Close: the Limit refuses everyone
		err = ErrClosed
	}
	for _, c := range b.calls {
		l.complete(c, &loaded[V]{err: err, judged: true})
	}
	return false
}

// drop takes c, one of b's calls whose callers all left (CancelAtZero), out
// of b if b is a window still open, and reports whether it did: c's key
// is then not in the call.
func (w *batchWindows[K, V]) drop(b *batch[K, V], c *call[K, V]) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !b.wait.open {
		return false
	}
	b.calls = slices.DeleteFunc(b.calls, func(x *call[K, V]) bool { return x == c })
	b.wanted.Add(-1)
	if c == b.leader {
		b.wait.leaderGone = true
	}
	return true
}

// keys returns the keys of b's calls, for its LoadMany call. A window's
// calls may share a key (a call a Set detached, and the one a later Get
// started), which LoadMany is never asked for twice.
func (b *batch[K, V]) keys() []K {
	keys := make([]K, 0, len(b.calls))
	var seen map[K]struct{}
	if b.wait != nil && len(b.calls) > 1 {
		seen = make(map[K]struct{}, len(b.calls))
	}
	for _, c := range b.calls {
		if seen != nil {
			if _, dup := seen[c.key]; dup {
				continue
			}
			seen[c.key] = struct{}{}
		}
		keys = append(keys, c.key)
	}
	return keys
}

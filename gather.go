package flightcache

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/limit"
)

// Where a load goes (docs/design.md, "The in-flight map's port"): route
// decides it, once, when the in-flight map commits a new load under its
// key's shard lock: into the GetMany's batch it was started for, into a
// gather, or alone.
//
// Gathers (Options.BatchWindow, docs/design.md rule 31; the docs' batch
// windows). A gather is a GetMany batch that stays open: the loads of
// single keys (a Get's miss, a revalidating Get, Refresh, a background or
// early refresh) that would each call the downstream for one key join it
// as its calls, published in their keys' shards like any other, so later
// callers of the same key coalesce on them as now. It goes out, one
// LoadMany call as a GetMany's batch does (runBatch), BatchWindow after
// it opened, at once when it holds MaxBatch calls (the next load opens a
// new one), or at Close. Misses and background refreshes wait in gathers
// of their own (fg, bg): a gather of refreshes holds one MaxRefreshes
// permit, taken by its first call, as a GetMany's refreshes do, and one
// Limit slot, taken only as its call goes out (takeSlot), so that an idle
// gather never holds up a miss.
//
// A gather's goroutine is the batch's: the load that opens the gather
// launches it (counted in on that load's stripe, as any load), and it
// waits out the gather (hold) before it runs the batch. Until it is
// sealed, under mu, calls join it (add) and, under CancelAtZero, leave it
// (drop): a key whose callers all left is not in the call, and a gather
// every caller left makes no call at all.
//
// Locks: mu is taken under a shard lock (add, from route) or under none
// (drop, hold); no shard lock is ever taken under mu.

// route decides where a load of r's key, about to start with n, goes, and
// builds its call: nothing after Close; into n.into, the GetMany's batch
// it was started for, if that has room; else into the open gather of its
// kind (gathers.takes); else alone. It takes what a background load holds
// (a MaxRefreshes permit and, but in a gather, a Limit slot): nil if it
// finds none free. It runs under r's shard lock (flights.start), and
// returns what the caller does once it has unlocked.
func (g *gathers[K, V]) route(r *request[K, V], n newLoad[K, V]) (c *call[K, V], after afterStart[K, V]) {
	l := g.l
	after.s = r.s
	switch {
	case l.gate.Closed():
		return nil, after
	case g.takes(r.key, &n):
		return g.add(r, n, after)
	}
	batched := n.into != nil && !n.into.full()
	var held limit.Slot // a background load's Limit slot, if not batched (its end gives back l.lim.Background())
	if n.background && !(batched && n.into.permitted) {
		var ok bool
		if held, ok = l.takeBackground(); !ok {
			return nil, after
		}
	}
	c = g.newCall(r, n)
	if !batched {
		after.alone = c
		return c, after
	}
	if n.background && !n.into.permitted {
		n.into.limSlot = held
	}
	n.into.add(c)
	return c, after
}

// newCall is the call of a new load of r's key, with n, not yet published.
func (g *gathers[K, V]) newCall(r *request[K, V], n newLoad[K, V]) *call[K, V] {
	l := g.l
	at := l.stampNow()
	if n.from != nil && l.cleared(n.from) {
		// An InvalidateAll raised the floor since the value held was
		// judged live: a load of its generation (or a newer one) must not
		// carry it (raiseFloor). The floor is read after the generation.
		n.from = nil
	}
	c := &call[K, V]{l: l, key: r.key, h: r.h, done: make(chan struct{}), background: n.background, from: n.from, at: at, seen: n.seen}
	ctx, marker := r.cl.ctx, r.cl.marker
	if n.background {
		marker = nil // nothing waits on it: a Get it makes of the key that started it is no cycle
	} else {
		c.waiters = 1
	}
	if r.cl.done != nil {
		// Keep ctx's values, never its cancellation, nor its cause: the
		// load's context.Cause must not find the caller's cancel context.
		// (A context without Done has no cancel context to find.)
		// WithoutCancel calls no method of ctx: it only wraps it.
		ctx = context.WithoutCancel(ctx)
	}
	c.vals = loadValues{caller: ctx, marker: loadMarker{id: c, parent: marker}}
	c.lctx.Init(&c.vals)
	return c
}

// afterStart is what a load's start leaves for its caller to do once the
// shard is unlocked (no goroutine start, no channel operation under a
// shard lock): launch the load alone, launch the gather it opened, wake
// the gather it filled, each counted in on s. A load in a GetMany's batch
// leaves nothing: the GetMany launches its batches.
type afterStart[K comparable, V any] struct {
	alone          *call[K, V]
	opened, filled *batch[K, V]
	s              *life.Stripe
}

// do does a.
func (a afterStart[K, V]) do() {
	if a.alone != nil {
		a.alone.l.launch(a.alone, a.s)
	}
	if a.filled != nil {
		close(a.filled.gather.full)
	}
	if a.opened != nil {
		a.opened.l.launchBatch(a.opened, a.s)
	}
}

// gathers are the Loader's open gathers, and where its new loads go
// (route): the in-flight map's port hands it route.
type gathers[K comparable, V any] struct {
	l *Loader[K, V]
	// d is Options.BatchWindow; 0: no gather (also with a Remote that is
	// not a RemoteMany: its loads go key by key, as a GetMany's do).
	d time.Duration
	// mu guards fg and bg and, while a gather is open, its batch's calls,
	// leader, permit and gatherWait.
	mu     sync.Mutex
	fg, bg *batch[K, V] // the open gathers, of misses and of refreshes; nil: none open
}

// gatherWait is what a batch that is a gather has besides.
type gatherWait struct {
	opened time.Duration // when it opened: it goes out BatchWindow after
	full   chan struct{} // closed once it holds MaxBatch calls: it goes out at once
	// Guarded by gathers.mu.
	open       bool // calls may still join and leave it
	leaderGone bool // its first call was dropped: its context is the call's, its key is not in it
	// Written by its goroutine as it goes out (takeSlot), before the call.
	queued bool // a gather of refreshes found no background slot free but a Get waiting on a key: it waits its turn for a slot
}

// queues reports whether b, a gather of refreshes, waits its turn for a
// Limit slot as a miss does, rather than holding a background one.
func (b *batch[K, V]) queues() bool { return b.gather != nil && b.gather.queued }

func (g *gathers[K, V]) init(l *Loader[K, V]) {
	g.l = l
	if _, ok := l.opts.Remote.(RemoteMany[K, V]); l.opts.Remote == nil || ok {
		g.d = l.opts.BatchWindow
	}
}

// takes reports whether a load of key, about to start with n, waits in a
// gather: not one of a GetMany's batches already, not a Reload of a value
// held (it needs that value: it goes alone), not a key not equal to
// itself (a LoadMany result cannot be looked up by it).
func (g *gathers[K, V]) takes(key K, n *newLoad[K, V]) bool {
	return g.d > 0 && n.into == nil && (n.from == nil || !g.l.reloads) && !g.l.selfUnequal(key)
}

// add is route for a load that waits in the open gather of its kind,
// opening one if none is: it builds the call and adds it, and after
// launches the gather it opened or wakes the one it filled. A load of
// refreshes takes the gather's MaxRefreshes permit if it is its first
// (nil if none is free: the gather it would have opened is dropped). The
// caller holds r's shard lock.
func (g *gathers[K, V]) add(r *request[K, V], n newLoad[K, V], after afterStart[K, V]) (*call[K, V], afterStart[K, V]) {
	g.mu.Lock()
	defer g.mu.Unlock()
	open := &g.fg
	if n.background {
		open = &g.bg
	}
	b := *open
	if b == nil {
		b = g.l.newBatch(n.background)
		b.gather = &gatherWait{opened: g.l.now(), full: make(chan struct{}), open: true}
	}
	// A gather of refreshes takes its Limit slot as its call goes out,
	// not now (takeSlot): idle, it holds none.
	if n.background && !b.permitted && !g.l.refreshPermits.take(&g.l.stats.refreshesDropped) {
		return nil, after
	}
	c := g.newCall(r, n)
	b.add(c)
	if *open != b {
		*open, after.opened = b, b
	}
	if b.full() {
		*open = nil
		b.gather.open = false
		after.filled = b
	}
	return c, after
}

// hold keeps b, a gather, on its goroutine until it goes out: BatchWindow
// after it opened, at once when it is full or the Loader closes. It then
// seals b (nothing joins or leaves it any more) and reports whether b has
// calls left to load; a gather every caller left ends here, no load.
func (g *gathers[K, V]) hold(b *batch[K, V]) bool {
	l := g.l
	if left := g.d - (l.now() - b.gather.opened); left > 0 {
		t := time.NewTimer(left)
		select {
		case <-t.C:
		case <-b.gather.full:
		case <-l.ctx.Done(): // Close: it goes out now, and meets ErrClosed as any load in flight
		}
		t.Stop()
	}
	g.mu.Lock()
	if b.gather.open {
		b.gather.open = false
		if g.fg == b {
			g.fg = nil
		} else if g.bg == b {
			g.bg = nil
		}
	}
	n := len(b.calls)
	g.mu.Unlock()
	if n == 0 {
		l.stats.inFlight.Add(-1) // counted in when launched (spawn)
		if b.permitted {
			l.refreshPermits.give()
			b.limSlot.Release()
		}
		return false
	}
	if b.background {
		if !g.takeSlot(b) {
			return false
		}
		l.stats.refreshes.Add(1) // one per gather, as a GetMany's refreshes
	}
	return true
}

// takeSlot takes the Limit slot of b, a sealed gather of refreshes, as its
// call goes out: never while it waits, so that an idle gather never holds
// up a miss (rule 31). It takes a background slot if one is free
// (TryBackground), and reports true. Refused (Stats.RefreshesLimited), the
// refresh is dropped, as one refused at its start is: each call leaves its
// key's map under its shard lock, so no Get joins it from then on, and
// ends with ErrLimited (ErrClosed at Close), delivered to nobody and
// written nowhere; nothing is loaded, and takeSlot reports false. But a call
// a Get already waits on (a Get that could not use the stale value, and
// joined the refresh) is that Get's load: then the gather goes out for
// all its keys, waiting its turn for a slot as that Get's own load would
// have (queued; a key whose call had already left its map is loaded but
// not written).
func (g *gathers[K, V]) takeSlot(b *batch[K, V]) bool {
	l := g.l
	if s, ok := l.lim.TryBackground(); ok {
		b.limSlot = s
		return true
	}
	if l.flights.waitedOn(b.calls, false) || l.flights.waitedOn(b.calls, true) {
		b.gather.queued = true
		return true
	}
	l.stats.inFlight.Add(-1) // counted in when launched (spawn), ended without a load
	l.refreshPermits.give()
	err := ErrLimited
	if l.gate.Closed() { // the gather went out at Close: the Limit refuses everyone
		err = ErrClosed
	}
	for _, c := range b.calls {
		l.complete(c, &loaded[V]{err: err, judged: true})
	}
	return false
}

// drop takes c, one of b's calls whose callers all left (CancelAtZero), out
// of b if b is a gather still open, and reports whether it did: c's key
// is then not in the call.
func (g *gathers[K, V]) drop(b *batch[K, V], c *call[K, V]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !b.gather.open {
		return false
	}
	b.calls = slices.DeleteFunc(b.calls, func(x *call[K, V]) bool { return x == c })
	b.wanted.Add(-1)
	if c == b.leader {
		b.gather.leaderGone = true
	}
	return true
}

// keys returns the keys of b's calls, for its LoadMany call. A gather's
// calls may share a key (a call a Set detached, and the one a later Get
// started), which LoadMany is never asked for twice.
func (b *batch[K, V]) keys() []K {
	keys := make([]K, 0, len(b.calls))
	var seen map[K]struct{}
	if b.gather != nil && len(b.calls) > 1 {
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

// Flush sends every open batch window's keys at once ([Options.BatchWindow],
// docs/design.md rule 39): the misses and refreshes waiting in a window go
// out in its LoadMany call now, as a full window does, instead of at the
// end of the window. A caller that knows it has asked for everything it
// will ask for (a GraphQL resolver once a level of the query is resolved)
// calls it so that no miss waits out the window after it. A load that
// starts after Flush opens a new window. Without a BatchWindow, with no
// window open, and after Close (the windows go out at Close), it does
// nothing. Flush never waits for a load, and is safe for concurrent use.
func (l *Loader[K, V]) Flush() {
	l.gathers.flush()
}

// flush seals the open gathers, of misses and of refreshes, and wakes
// their goroutines (hold): each goes out at once. Sealed, a gather takes
// no more calls (the next load opens a new one), and its calls no longer
// leave it (drop), as when it goes out at its time.
func (g *gathers[K, V]) flush() {
	if g.d == 0 {
		return
	}
	g.mu.Lock()
	fg, bg := g.fg, g.bg
	g.fg, g.bg = nil, nil
	for _, b := range [2]*batch[K, V]{fg, bg} {
		if b != nil {
			b.gather.open = false
		}
	}
	g.mu.Unlock()
	// An open gather (in fg or bg) was never closed as full (add takes a
	// full one out of fg or bg as it fills it, and afterStart closes it),
	// and out of them now, it never will be: each is closed once.
	for _, b := range [2]*batch[K, V]{fg, bg} {
		if b != nil {
			close(b.gather.full)
		}
	}
}

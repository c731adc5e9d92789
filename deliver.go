package flightcache

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// complete turns what a load produced into its result and its entry (all
// the arithmetic, before any lock), delivers them (finish), and reports the
// load.
func (l *Loader[K, V]) complete(c *call[K, V], r *loaded[V]) {
	now := r.end
	if now == 0 {
		now = l.now()
	}
	if r.notMod {
		// 304: the value held is still current. It goes on as if just
		// loaded: its callers get it, its freshness is renewed from now
		// (Freshness is asked again, below).
		r.val, r.err, r.age = r.old, nil, 0
	}
	res := delivery[K, V]{val: r.val, err: r.err, loadedAt: now - r.age, ended: now}
	// Values never cached are judged by the shortest freshness any entry
	// can draw, so that no caller's max-stale is stretched by jitter.
	shortest := timing.Jitter(l.opts.TTL, l.opts.Jitter, 1)
	res.freshUntil = timing.Add(res.loadedAt, shortest)
	if r.err != nil && !r.judged {
		// Once per load, for all its callers. The error and IsNotFound are
		// user code: if one panics, the error becomes the *PanicError; if
		// one ends the goroutine, the waiters still get the error, uncached.
		r.nf = l.callee.classifyLoad(&r.err, func() {
			var zero V
			res.val = zero
			l.deliver(c, r, &res, nil, 0)
		})
		r.judged = true
	}
	res.err, res.notFound = r.err, r.nf
	e, cost := l.entryOf(c, r, &res, now)
	if r.err != nil {
		var zero V
		res.val = zero
	}
	if e != nil {
		res.freshUntil = e.freshUntil
	}
	if fb := r.fallback; r.err != nil && fb != nil {
		at := now - max(time.Since(fb.LoadedAt), 0)
		res.fallback = &entry[K, V]{key: c.key, val: fb.Value, loadedAt: at, freshUntil: timing.Add(at, shortest)}
	}
	l.deliver(c, r, &res, e, cost)
}

// entryOf builds the entry c's result leaves in the cache, if any, with
// its cost: a value's (unless Freshness says not to cache it, or Cost
// cannot cost it, or it never fits: then res.drop, and the key keeps no
// older value), or a not-found's under NotFoundTTL (without it, res.drop:
// a not-found never leaves the deleted key's old value held). Freshness and Cost are
// user code: if one ends the goroutine, the waiters still get the value,
// uncached.
func (l *Loader[K, V]) entryOf(c *call[K, V], r *loaded[V], res *delivery[K, V], now time.Duration) (e *entry[K, V], cost int64) {
	switch {
	case r.err == nil:
		onGoexit := func() { l.deliver(c, r, res, nil, 0) }
		life, keep := l.lifeOf(c.key, r.val, onGoexit)
		keep = keep && l.versionOf(&life, r.val, onGoexit)
		keep = l.tagsOf(&life, c.key, r.val, c.at.tag, onGoexit) && keep
		res.tags = life.tags
		e = l.newEntry(c.key, r.val, life, born{at: res.loadedAt, took: r.took, gen: c.at.gen})
		cost = 1
		if l.opts.Cost != nil {
			var ok bool
			cost, ok = l.costOf(r.val, onGoexit)
			if keep && ok && l.tooBig(cost) {
				ok, res.big = false, cost
			}
			keep = keep && ok
		}
		if !keep {
			res.drop = true
			return nil, 1
		}
		return e, cost
	case r.nf && l.opts.NotFoundTTL > 0:
		var zero V
		life := lifetime{ttl: l.opts.NotFoundTTL}
		if !l.tagsOf(&life, c.key, zero, c.at.tag, func() { l.deliver(c, r, res, nil, 0) }) { // rule 38
			res.drop = true
			return nil, 1
		}
		e = l.newEntry(c.key, r.val, life, born{at: now, gen: c.at.gen})
		e.extra = &extra[K, V]{notFound: r.err, tags: life.tags}
		return e, 1
	case r.nf:
		// The downstream says the key is gone: the value held goes too,
		// though the not-found itself is not cached (rule 26).
		res.drop = true
	}
	return nil, 1
}

// deliver hands res to c's waiters, e to the cache, and reports the load.
func (l *Loader[K, V]) deliver(c *call[K, V], r *loaded[V], res *delivery[K, V], e *entry[K, V], cost int64) {
	c.endContext()
	if c.batch == nil { // a batch counts itself once (completeBatch)
		l.loadEnded(res.err, c.background, l.lim.Background())
		if res.notFound {
			l.stats.loadNotFounds.Add(1)
		}
	}
	if res.notFound { // each key of a batch too
		l.stats.notFounds.Add(1)
	}
	l.countReload(r)
	if c.background && res.err != nil && c.from != nil {
		l.backOff(c.from)
	}
	callers, stored, w, back, gone := l.flights.finish(c, res, e, cost)
	if c.background && res.outdated && c.from != nil {
		l.backOff(c.from) // the value held is newer (version.go): it stays, and is not refreshed again at once
	}
	l.writer.giveBack(back)
	dep := l.departureOf(c.key, r, res, gone) // reported last: the Observer is user code
	switch {
	case w == nil:
	case c.batch != nil:
		c.batch.writes = append(c.batch.writes, w) // handed with the batch's others
	default:
		l.writer.hand(w)
	}
	if b := c.batch; b != nil {
		// The batch's goroutine reports the batch once (completeBatch).
		b.callers += callers
		b.stored = b.stored || stored
		if dep.any() {
			b.departures = append(b.departures, dep)
		}
		close(c.done)
		return
	}
	if c.abandoned { // written under the lock before finish; read-only now
		l.stats.abandoned.Add(1)
	}
	l.stats.noteCallers(callers)
	close(c.done) // the waiters wake; this goroutine has little left to do
	if l.opts.OnLoad != nil || l.obs != nil {
		l.report(c.observed(), c.event(r, res, callers, stored))
	}
	if dep.any() {
		l.depart(dep)
	}
}

// event is the LoadEvent of c, a single key's load, which r and res
// describe and callers waited for.
func (c *call[K, V]) event(r *loaded[V], res *delivery[K, V], callers int, stored bool) LoadEvent[K] {
	return LoadEvent[K]{
		Key: c.key, Keys: 1, Duration: r.took, Err: res.err, NotFound: res.notFound, Attempts: int(r.down.calls), Queued: r.down.queued,
		Background: c.background, Callers: callers, Abandoned: c.abandoned, Stored: stored, Remote: r.remote, Reload: r.reload, NotModified: r.notMod,
	}
}

// countReload counts a load that called Options.Reload, and its
// ErrNotModified.
func (l *Loader[K, V]) countReload(r *loaded[V]) {
	if r.reload {
		l.stats.reloads.Add(1)
		if r.notMod {
			l.stats.notModified.Add(1)
		}
	}
}

// backOff puts off the next background refresh of from, whose refresh
// just failed: the more refreshes of it failed in a row, the longer.
func (l *Loader[K, V]) backOff(from *entry[K, V]) {
	n := from.failedRefresh()
	if n == maxRefreshFails {
		n = math.MaxInt // the count saturated: the backoff is at its limit
	}
	d := timing.RefreshDelay(n, l.opts.Retry.InitialInterval, l.opts.Retry.MaxInterval, rand.Float64())
	from.refreshAfter.Store(int64(timing.Add(l.now(), d)))
}

// departure is what a load made leave the cache, for an EvictionObserver:
// the entry its value replaced (put marked it gone), and its own value if
// it is too big for the cache. It is reported once the load is reported,
// last of all (a batch's, once the batch is: completeBatch).
type departure[K comparable, V any] struct {
	key      K
	gone     *entry[K, V] // replaced (or dropped by a not-found); nil: none
	big      int64        // the value's cost, too big to be cached (tooBig); 0: not
	notFound bool         // gone left because the downstream found the key gone
}

// departureOf is what a load of key (r, delivered as res) made leave the
// cache, gone being the entry finish marked gone: nothing unless an
// EvictionObserver is told.
func (l *Loader[K, V]) departureOf(key K, r *loaded[V], res *delivery[K, V], gone *entry[K, V]) (d departure[K, V]) {
	if l.obs.observesEvictions() {
		d = departure[K, V]{key: key, big: res.big, notFound: res.notFound}
		if !r.notMod { // a value ErrNotModified kept is renewed, not replaced
			d.gone = gone
		}
	}
	return d
}

// any reports whether d has something to report.
func (d *departure[K, V]) any() bool { return d.gone != nil || d.big > 0 }

// depart reports d.
func (l *Loader[K, V]) depart(d departure[K, V]) {
	cause := EvictionReplaced
	if d.notFound { // the downstream dropped the key: no newer value took its place
		cause = EvictionInvalidated
	}
	l.writer.replaced(d.gone, cause)
	if d.big > 0 {
		l.obs.tooBigFor(d.key, d.big)
	}
}

// report hands ev, a load's event, to OnLoad and to the Observer's
// LoadEnd, with ctx, the load's context as the Observer made it (nil: its
// LoadStart never returned, and it gets no LoadEnd either).
func (l *Loader[K, V]) report(ctx context.Context, ev LoadEvent[K]) {
	if l.opts.OnLoad != nil {
		l.user.guard(func() { l.opts.OnLoad(ev) }, nil)
	}
	if ctx != nil {
		l.obs.loadEnd(ctx, ev)
	}
}

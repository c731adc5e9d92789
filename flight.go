package flightcache

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/loadctx"
)

// flightShards is the number of independent in-flight maps. A key's shard
// is chosen by its hash, so keys that share a cache bucket (a hash collision)
// also share a shard.
const flightShards = 64

// flights owns the in-flight state of every key: the load running for it
// and the write ristretto has not applied yet. Its methods are the only
// code that reads or edits the shard maps, in three steps, as x/time/rate
// reserves: work out what to do before locking (the entry a key has in the
// cache is looked up then, or taken from the look the Get made, or the one
// its load started with: glance), commit it under the lock (locked, the one
// function that locks a shard for a key and unlocks it), act (launch a
// load, cancel a context, hand a write over) after unlocking. No user code,
// no channel operation and no ristretto wait ever runs under a shard lock
// (and a ristretto lookup only when locked keeps losing a race with the
// writer): the caller's context is user code too, read before any lock
// (request.who).
type flights[K comparable, V any] struct {
	port[K, V]
	shards [flightShards]shard[K, V]
}

// port is all the in-flight map is handed of its Loader, in New, and all
// it reaches of it (docs/design.md, "The in-flight map's port"): how a
// key's entries and loads are judged, the cache it looks keys up in, the
// one decision where a new load goes, a fill's place among the pending
// writes, and the counters. What comes back is the call a Get waits on
// and the writes it opens, for the writer.
type port[K comparable, V any] struct {
	rules    *keyRules[K, V]
	cache    *ristretto.Cache[uint64, *entry[K, V]]
	router   *gathers[K, V]        // where a new load goes (route, batch.go)
	takeFill func(cost int64) bool // a fill's place among the pending writes (write.go)
	stats    *counters
}

// shard is one in-flight map, singleflight-style.
type shard[K comparable, V any] struct {
	mu sync.Mutex // guards the maps and the guarded fields of their calls and writes
	// loads is the load in flight per key. Only the load's own finish, a
	// detach (Set, Invalidate) or its last waiter leaving under
	// CancelAtZero takes it out, each only if it still owns the key
	// (loads[key] == c).
	loads map[K]*call[K, V]
	// writes is the write per key that ristretto may not have applied yet.
	// While a key has one, it is the truth about the key and the cache is
	// not: a Get that finds nothing usable in the cache looks here.
	writes map[K]*write[K, V]
	// detached holds the loads a Set or Invalidate took out of loads while
	// they ran, so Close can still cancel them.
	detached map[*call[K, V]]struct{}
	// settles counts the writes closed in this shard, and the cached
	// entries a refused fill marked gone without a write (written under
	// mu): a key's cached entry changes only by one of those (or by
	// ristretto evicting it, which is as if the look came just before the
	// eviction), so an entry looked up earlier, even a whole load earlier,
	// is still the key's if settles has not moved (locked).
	settles atomic.Uint64
	// peakLoads and peakWrites are the most keys loads and writes have held
	// since they were last made (guarded by mu): see shrink.
	peakLoads, peakWrites int32
	_                     [64 - 8 - 3*8 - 8 - 2*4]byte // keep neighbouring shards off one cache line
}

// shrinkFrom is the size past which a shard map that has emptied out is
// rebuilt: a Go map keeps the buckets of the most keys it ever held, so
// without this one burst of misses or writes would keep its memory for the
// Loader's life.
const shrinkFrom = 128

// shrink rebuilds m, holding n keys now after peak at most, once it has
// lost nearly all of them; it returns the map to keep and its new peak. The
// rebuild copies at most peak/16 keys, once per peak/16·15 deletions, so it
// costs O(1) per deletion. The caller holds the shard's mu.
func shrink[M ~map[K]E, K comparable, E any](m M, peak int32) (M, int32) {
	n := int32(len(m))
	if peak <= shrinkFrom || n > peak/16 {
		return m, peak
	}
	small := make(M, n)
	for k, e := range m {
		small[k] = e
	}
	return small, n
}

// grew records that m holds n keys now, for shrink.
func grew(peak *int32, n int) {
	if int32(n) > *peak {
		*peak = int32(n)
	}
}

// call is one load and, once done is closed, its result.
type call[K comparable, V any] struct {
	l    *Loader[K, V]
	key  K
	h    uint64
	done chan struct{} // closed by finish once the result fields are set

	// Set before the call is published in a shard map; read-only after
	// (lctx's deadline and causer: set by the load goroutine, before user
	// code, with ready).
	lctx       loadctx.Context
	vals       loadValues   // what lctx's Value answers
	background bool         // a refresh nobody waited on when it started
	at         stamp        // the rules when it started (keyRules.stampNow): its entry's generation, its right to fill
	from       *entry[K, V] // the value held for the key when the load started (a refresh's, a Reload's old value), or nil
	stripe     *life.Stripe // the stripe the load goroutine is counted on (lifecycle)

	// Guarded by the shard's mu (packed into two words: a call is
	// allocated with every miss).
	waiters   int32 // Gets waiting on the result now, the starter included
	ready     bool  // the load goroutine has built lctx: it can be cancelled
	abandoned bool  // cancelled because every waiter left (CancelAtZero)
	finished  bool  // the result is set: a leaving waiter takes it instead
	cause     error // a cancellation asked for before that

	// res is the load's result: written by finish under the lock, before
	// done is closed; read-only after. The waiters read it from here.
	res delivery[K, V]

	w write[K, V] // the write this load leaves, if it fills the cache (no allocation of its own)

	batch *batch[K, V] // the LoadMany call that loads this key with others, or nil; set before publishing

	// octx is the load's context as the Observer made it (LoadStart), set
	// once by the load goroutine before its first downstream call, and
	// read by a waiter that leaves meanwhile; nil before, and without an
	// Observer. A batch's calls use the batch's (observed).
	octx atomic.Pointer[context.Context]

	seen glance[K, V] // the key's cached entry when the call started: finish's locked starts from it
}

func (f *flights[K, V]) init(p port[K, V]) {
	f.port = p
	for i := range f.shards {
		f.shards[i].loads = make(map[K]*call[K, V])
		f.shards[i].writes = make(map[K]*write[K, V])
	}
}

func (f *flights[K, V]) shard(h uint64) *shard[K, V] {
	return &f.shards[h%flightShards]
}

// joined is what join found for a Get that the cache could not answer.
type joined[K comparable, V any] struct {
	c       *call[K, V]  // the load to wait for
	e       *entry[K, V] // a value a write left, not yet in the cache, that answers the Get (judge) as src
	src     Source
	err     error // ErrClosed or ErrRecursiveLoad
	started bool  // this Get started c
	counted bool  // the wait on c is counted in Stats.Waiting already (GetMany)
	reread  bool  // the value held is distrusted (rule 18): c reads it again
}

// glance is a key's cached entry as seen before its shard was locked (nil:
// none), with the shard's settles count read before the look. While settles
// has not moved, the entry is still the key's cached one (locked), so the
// locked path of a miss and the finish of its load need no ristretto lookup
// of their own: each such lookup would also count one more access of the
// key in ristretto's admission policy.
type glance[K comparable, V any] struct {
	e  *entry[K, V]
	at uint64 // the shard's settles count + 1; 0: nothing was seen, locked looks
}

// glance looks key up in the cache for a later locked.
func (f *flights[K, V]) glance(h uint64, key K) glance[K, V] {
	n := f.shard(h).settles.Load()
	return glance[K, V]{e: f.cached(h, key), at: n + 1}
}

// lockTries is how many looks at the cache locked makes before it looks
// under the lock.
const lockTries = 4

// locked runs commit under key's shard lock, and unlocks: the one place a
// shard is locked for a key's loads and writes. commit is given key's
// cached entry as it is under the lock, with the shard's settles count then
// (seen: a load commit starts keeps it for its finish). The entry is g's if
// no write of the shard closed since g was taken; else it is looked up
// before locking (no ristretto call under a shard lock), and again if a
// write of the shard closed in between. After a few such misfortunes (the
// writer closing a burst of the shard's writes) it is looked up under the
// lock: a lookup is short and never waits, and the caller must make
// progress. commit edits the shard's maps and calls, and does the
// arithmetic that needs: no user code, no channel, no wait.
//
// The entry may have been marked gone since g was taken: only put does
// that, under the lock, and it leaves a pending write for the key that then
// stands for it (current), or moves settles (a refused fill). Ristretto may
// have evicted it since (for finish, at any time during the load): that is
// as if the caller had locked just before the eviction; at worst finish
// marks the evicted entry gone and opens a write for it.
func (f *flights[K, V]) locked(h uint64, key K, g glance[K, V], commit func(sh *shard[K, V], seen glance[K, V])) {
	sh := f.shard(h)
	for try := 0; ; try++ {
		if g.at == 0 && try < lockTries {
			g = f.glance(h, key)
		}
		sh.mu.Lock()
		n := sh.settles.Load()
		if try == lockTries {
			g.e = f.cached(h, key)
		} else if n+1 != g.at {
			sh.mu.Unlock()
			g.at = 0
			continue
		}
		commit(sh, glance[K, V]{e: g.e, at: n + 1})
		sh.mu.Unlock()
		return
	}
}

// current is what sh knows of key, under sh.mu, given seen, its cached
// entry then: its current entry (the one a pending write leaves, else the
// cached one; nil for an entry from before an InvalidateAll, rule 20) and
// its load in flight.
func (f *flights[K, V]) current(sh *shard[K, V], key K, seen glance[K, V]) (cur *entry[K, V], running *call[K, V]) {
	cur = seen.e
	if w := sh.writes[key]; w != nil {
		cur = w.entry
	}
	return f.rules.live(cur), sh.loads[key]
}

// join is what a Get the cache did not answer does under its key's lock:
// take a value a write left for the key that answers it (rule 2: never
// load twice; judge), else join the key's load in flight, else start one,
// revalidating the value held, if any. A load it starts in a batched
// GetMany is one of the GetMany's batch's calls, launched with the batch;
// except a Reload of a value held, which needs that value and goes alone.
// What it found goes in *j.
func (f *flights[K, V]) join(r *request[K, V], j *joined[K, V]) {
	var after afterStart[K, V]
	f.locked(r.h, r.key, r.g, func(sh *shard[K, V], seen glance[K, V]) {
		after = f.joinLocked(sh, seen, r, j)
	})
	after.do()
}

// joinLocked is join's decision, under the key's shard lock, into *j;
// after is what a load it started leaves to do once unlocked (route).
func (f *flights[K, V]) joinLocked(sh *shard[K, V], seen glance[K, V], r *request[K, V], j *joined[K, V]) (after afterStart[K, V]) {
	cur, c := f.current(sh, r.key, seen)
	if src := f.rules.judge(&r.cl, cur, r.start); src != SourceNone {
		*j = joined[K, V]{e: cur, src: src}
		return after
	}
	reread := cur != nil && !r.cl.revalidate && f.rules.distrusted(cur) // rule 18
	if c != nil {
		if r.cl.marker.waitsOn(c) || (c.batch != nil && r.cl.marker.waitsOn(c.batch)) {
			*j = joined[K, V]{err: ErrRecursiveLoad}
			return after
		}
		if !f.detachDistrusted(sh, c) {
			c.waiters++
			if c.batch != nil && c.batch.gather == nil && !c.batch.joined.Load() {
				c.batch.joined.Store(true) // a GetMany's batch now answers another caller too (bisect)
			}
			*j = joined[K, V]{c: c, reread: reread}
			return after
		}
		reread = true
	}
	n := newLoad[K, V]{seen: seen, from: f.rules.held(cur, r.start)}
	if r.many != nil && n.from == nil { // a Reload goes alone
		n.into = r.many.fg // open (batches.open)
	}
	if c, after = f.start(sh, r, n); c == nil {
		*j = joined[K, V]{err: ErrClosed}
		return after
	}
	*j = joined[K, V]{c: c, started: true, reread: reread}
	return after
}

// startRefresh starts a background load of r's key to replace from, unless
// from is no longer the key's entry, a load of the key is in flight, or
// MaxRefreshes are running. It reports whether it started one, and
// whether in a batch: with into not nil, the load is one of into's calls,
// launched with it by the GetMany; else it may wait in a gather.
func (f *flights[K, V]) startRefresh(r *request[K, V], from *entry[K, V], into *batch[K, V]) (started, batched bool) {
	var c *call[K, V]
	var after afterStart[K, V]
	f.locked(r.h, r.key, glance[K, V]{}, func(sh *shard[K, V], seen glance[K, V]) {
		if cur, running := f.current(sh, r.key, seen); cur == from && running == nil {
			c, after = f.start(sh, r, newLoad[K, V]{seen: seen, from: from, background: true, into: into})
		}
	})
	after.do()
	return c != nil, after.alone == nil
}

// refreshNow is what Refresh does: start a background load of r's key,
// revalidating the value held if any, unless one of the current generation
// is in flight (it then joins it, doing nothing) or MaxRefreshes are
// running (it is dropped). One from before a Distrust or an InvalidateAll
// is detached (detachDistrusted), and a new load starts; r.start is when
// Refresh was called. It reports
// whether it started one alone: one that waits in a gather is counted
// with its gather.
func (f *flights[K, V]) refreshNow(r *request[K, V]) bool {
	var after afterStart[K, V]
	f.locked(r.h, r.key, glance[K, V]{}, func(sh *shard[K, V], seen glance[K, V]) {
		if cur, running := f.current(sh, r.key, seen); running == nil || f.detachDistrusted(sh, running) {
			_, after = f.start(sh, r, newLoad[K, V]{seen: seen, from: f.rules.held(cur, r.start), background: true})
		}
	})
	after.do()
	return after.alone != nil
}

// detachDistrusted reports whether c, the load in flight for its key,
// started before the last Distrust or InvalidateAll (rules 18 and 20),
// and if so detaches it: it may carry what the fleet has overwritten
// since, or a value from before the InvalidateAll, so no Get,
// revalidating Get, GetMany or Refresh that starts now may take its
// result. It keeps its waiters, but not the key: the caller starts a load
// of its own. The caller holds sh.mu.
func (f *flights[K, V]) detachDistrusted(sh *shard[K, V], c *call[K, V]) bool {
	if !f.rules.distrustedLoad(c.at) {
		return false
	}
	sh.detach(c.key)
	return true
}

// newLoad is what start publishes a load with.
type newLoad[K comparable, V any] struct {
	seen       glance[K, V] // the key's cached entry under the lock: finish starts from it
	from       *entry[K, V] // the value held for the key (a refresh's, a Reload's old value), or nil
	background bool         // nobody waits on it: a refresh, which takes a MaxRefreshes permit
	into       *batch[K, V] // the batch whose LoadMany call loads it, or nil: alone
}

// start publishes a new load of r's key in sh, under sh.mu, for r's
// caller, whose context was read before locking (request.who: its methods
// are user code): route decides where it goes and builds it, and start
// publishes it. after is what the caller does once it has unlocked
// (launch it alone, launch or wake its gather; nothing for a GetMany's
// batch, which the GetMany launches). It returns nil after Close, and for
// a background load that finds every MaxRefreshes permit taken. Close
// sets its flag before it sweeps the shards (cancelAll), so a load is
// either swept or never started.
func (f *flights[K, V]) start(sh *shard[K, V], r *request[K, V], n newLoad[K, V]) (c *call[K, V], after afterStart[K, V]) {
	if c, after = f.router.route(r, n); c != nil {
		sh.loads[r.key] = c
		grew(&sh.peakLoads, len(sh.loads))
	}
	return c, after
}

// leave withdraws a waiter whose context ended. It returns false if the
// result was already delivered, in which case the caller must take it: it
// has been counted as one of the load's callers. Under CancelAtZero the
// last waiter out takes the load out of the map under the same lock, so no
// later caller can join the cancelled load, and cancels it after unlocking.
func (f *flights[K, V]) leave(c *call[K, V]) bool {
	sh := f.shard(c.h)
	sh.mu.Lock()
	if c.finished {
		sh.mu.Unlock()
		return false
	}
	c.waiters--
	var cancel func(error)
	var unwanted *batch[K, V]
	if c.waiters == 0 && !c.background && f.rules.policy == CancelAtZero {
		sh.forget(c)
		c.abandoned = true
		if c.batch == nil {
			cancel = c.cancelLocked(errAbandoned)
		} else {
			unwanted = c.batch // cancelled when none of its keys is wanted
		}
	}
	sh.mu.Unlock()
	if cancel != nil {
		cancel(errAbandoned)
	}
	if unwanted != nil {
		unwanted.abandon(c)
	}
	return true
}

// abandoned reports whether every caller of c has left it under
// CancelAtZero (leave): nobody reads its result. A split batch asks
// (batch.wants).
func (f *flights[K, V]) abandoned(c *call[K, V]) bool {
	sh := f.shard(c.h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return c.abandoned
}

// waitedOn reports whether a Get waits on any of calls, each read under
// its shard lock; with forget, each call nobody waits on leaves its key's
// map (forget) under that lock, so that no Get joins it from then on (a
// gather of refreshes dropped as it goes out: gathers.takeSlot).
func (f *flights[K, V]) waitedOn(calls []*call[K, V], forget bool) bool {
	found := false
	for _, c := range calls {
		sh := f.shard(c.h)
		sh.mu.Lock()
		switch {
		case c.waiters > 0:
			found = true
		case forget:
			sh.forget(c)
		}
		sh.mu.Unlock()
		if found && !forget {
			return true
		}
	}
	return found
}

// forget takes c out of sh's maps, wherever it is. The caller holds sh.mu.
func (sh *shard[K, V]) forget(c *call[K, V]) {
	if sh.loads[c.key] == c {
		delete(sh.loads, c.key)
		sh.loads, sh.peakLoads = shrink(sh.loads, sh.peakLoads)
	} else if delete(sh.detached, c); len(sh.detached) == 0 {
		sh.detached = nil
	}
}

// detach takes key's load in flight out of the map without stopping it
// (rule 6): its waiters still get its result, but it no longer owns the key
// and will not write the cache. The caller holds sh.mu.
func (sh *shard[K, V]) detach(key K) {
	if c := sh.loads[key]; c != nil {
		delete(sh.loads, key)
		sh.loads, sh.peakLoads = shrink(sh.loads, sh.peakLoads)
		if sh.detached == nil {
			sh.detached = make(map[*call[K, V]]struct{})
		}
		sh.detached[c] = struct{}{}
	}
}

// startAlone starts a load of r's key, a key not equal to itself (a NaN in
// it), for the one Get that waits on it, and launches it. No map lookup
// finds such a key and no delete removes it, so it must not be published
// in loads, where it would stay for good: it is kept in detached instead,
// where Close finds it and finish takes it out. Owning no key, it stores
// nothing. It returns nil after Close.
func (f *flights[K, V]) startAlone(r *request[K, V]) *call[K, V] {
	sh := f.shard(r.h)
	sh.mu.Lock()
	c, after := f.router.route(r, newLoad[K, V]{})
	if c != nil {
		if sh.detached == nil {
			sh.detached = make(map[*call[K, V]]struct{})
		}
		sh.detached[c] = struct{}{}
	}
	sh.mu.Unlock()
	after.do()
	return c
}

// delivery is a load's result as its waiters read it: complete makes it
// from what the downstream gave (loaded), finish stores it in the call
// (call.res) under the lock, and each waiter judges it for its own caller
// (await). The value's entry, if it is cached, goes to the writer.
type delivery[K comparable, V any] struct {
	val        V
	err        error
	loadedAt   time.Duration
	freshUntil time.Duration // when val goes stale
	fallback   *entry[K, V]  // with err: an older value a Remote offered; never cached
	ended      time.Duration // when the load ended, its result ready: a waiter's wait (Info.Waited) ends there
	notFound   bool          // err is a not-found (callee.notFound)
	drop       bool          // the value is not to be cached: the key keeps no older one either
	big        int64         // with drop: the value's cost, too big for the cache (tooBig); 0: not that
	outdated   bool          // the value was not cached: the one held has a higher version (version.go)
	tags       *tagList      // the value's tags (tags.go): a Get that started after one was invalidated loads again
}

// finish sets c's result: it takes c out of the map and leaves e (if not
// nil and c still owns its key) as the key's value. It returns how many
// Gets receive the result, whether e was stored, the write to hand to the
// writer, if a new one was opened, a place to give back, and the entry
// it replaced, if it marked one gone (put). The caller then closes c.done.
func (f *flights[K, V]) finish(c *call[K, V], r *delivery[K, V], e *entry[K, V], cost int64) (callers int, stored bool, opened *write[K, V], back place, gone *entry[K, V]) {
	f.locked(c.h, c.key, c.seen, func(sh *shard[K, V], seen glance[K, V]) {
		owned := sh.loads[c.key] == c
		sh.forget(c)
		switch {
		case !owned || !f.rules.mayFill(c.at, e): // detached, or it lost its right to fill (Close, an InvalidateAll)
		case e != nil || r.drop: // the load's write: its value, or (drop) none
			if e == nil {
				cost = 0
			}
			c.w = write[K, V]{key: c.key, h: c.h, entry: e, cost: cost, place: place{kind: fillPlace, cost: cost}}
			var ok bool
			opened, back, ok, gone = f.put(sh, seen.e, &c.w, &c.w)
			stored = ok && e != nil
			r.outdated = c.w.outdated
		}
		c.res = *r
		c.finished = true // from here a leaving waiter takes the result: done is closed soon
		callers = int(c.waiters)
	})
	return callers, stored, opened, back, gone
}

// overwrite makes e (nil: nothing) key's value for Set and Invalidate,
// which hold place p: the load in flight, if any, is detached, and the
// write wins over it, unless e is older than the value held (outdated,
// version.go: then nothing changes). It returns what put does.
func (f *flights[K, V]) overwrite(key K, h uint64, e *entry[K, V], cost int64, p place) (opened *write[K, V], back place, gone *entry[K, V], outdated bool) {
	f.locked(h, key, glance[K, V]{}, func(sh *shard[K, V], seen glance[K, V]) {
		next := write[K, V]{key: key, h: h, entry: e, cost: cost, place: p}
		opened, back, _, gone = f.put(sh, seen.e, &next, nil)
		if outdated = next.outdated; !outdated {
			sh.detach(key)
		}
	})
	return opened, back, gone, outdated
}

// fillEmpty makes e key's value, as overwrite does, only if the key holds
// nothing: no live cached entry, no pending write (a Set's, a fill's, an
// Invalidate's), no load in flight. Restore uses it: a restored value is
// older than any of those. With stored false it did nothing and back is p.
func (f *flights[K, V]) fillEmpty(key K, h uint64, e *entry[K, V], cost int64, p place) (opened *write[K, V], back place, gone *entry[K, V], stored bool) {
	back = p
	f.locked(h, key, glance[K, V]{}, func(sh *shard[K, V], seen glance[K, V]) {
		if cur, running := f.current(sh, key, seen); cur != nil || running != nil || sh.writes[key] != nil {
			return
		}
		next := write[K, V]{key: key, h: h, entry: e, cost: cost, place: p}
		opened, back, _, gone = f.put(sh, seen.e, &next, nil)
		stored = true
	})
	return opened, back, gone, stored
}

// pendingEntries appends to es the values of the pending writes: the
// newest value of each key that has one, which the cache may not hold yet
// (Entries).
func (f *flights[K, V]) pendingEntries(es []*entry[K, V]) []*entry[K, V] {
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for _, w := range sh.writes {
			if w.entry != nil {
				es = append(es, w.entry)
			}
		}
		sh.mu.Unlock()
	}
	return es
}

// latest returns key's current entry: the one a pending write leaves, or
// the cached one. Used when a load failed, to find a value to cover it.
func (f *flights[K, V]) latest(key K, h uint64) (cur *entry[K, V]) {
	f.locked(h, key, glance[K, V]{}, func(sh *shard[K, V], seen glance[K, V]) {
		cur, _ = f.current(sh, key, seen)
	})
	return cur
}

// cancelAll cancels every load running (in the maps or detached) with
// cause. Close calls it after setting its flag, so no load starts after a
// shard has been swept.
func (f *flights[K, V]) cancelAll(cause error) {
	var cancels []func(error)
	batches := make(map[*batch[K, V]]struct{})
	collect := func(c *call[K, V]) {
		if c.batch != nil {
			batches[c.batch] = struct{}{} // its context is its first call's, maybe in another shard
		} else if cancel := c.cancelLocked(cause); cancel != nil {
			cancels = append(cancels, cancel)
		}
	}
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for _, c := range sh.loads {
			collect(c)
		}
		for c := range sh.detached {
			collect(c)
		}
		sh.mu.Unlock()
	}
	for _, cancel := range cancels {
		cancel(cause)
	}
	for b := range batches {
		b.cancel(cause)
	}
}

// markReady records that c's context is built (buildContext): from here
// it can be cancelled at once. It returns the cause of a cancellation
// asked for before, if any, for the caller to apply.
func (f *flights[K, V]) markReady(c *call[K, V]) (cause error) {
	sh := f.shard(c.h)
	sh.mu.Lock()
	c.ready = true
	cause = c.cause
	sh.mu.Unlock()
	return cause
}

// cancelLoad cancels c's context with cause, or records cause for
// buildContext if it is not built yet. The caller holds no lock.
func (f *flights[K, V]) cancelLoad(c *call[K, V], cause error) {
	sh := f.shard(c.h)
	sh.mu.Lock()
	cancel := c.cancelLocked(cause)
	sh.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// pending reports whether key has a load in flight or a write not yet
// applied (for tests).
func (f *flights[K, V]) pending(key K, h uint64) bool {
	sh := f.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.loads[key] != nil || sh.writes[key] != nil
}

// put records next.entry (nil: nothing) as next.key's value, under sh.mu;
// cur is the key's cached entry (locked). next.place is the place among
// the pending writes the producer holds (write.go); a fill asks for its
// place here instead, with a place of kind fillPlace and the entry's cost,
// and never waits for one. put may change *next. It returns the
// write it opened (rec, if not nil, is used for it: next itself, for a
// fill, which records its own write in its call), which the caller
// hands to the writer after unlocking, or nil if an open write took e; and
// the place the caller gives back after unlocking: the open write's old
// one (they swap), or p itself when there was nothing to write.
//
// A fill that finds its share full records nothing and reports ok false,
// but the key keeps no older value either (an open write is made a delete,
// a cached entry is marked gone), so no Get serves a value older than the
// load's.
//
// A write of a value older than the one held (Options.Version) records
// nothing and changes nothing: put sets next.outdated and reports ok false
// (version.go). Every write of a value goes through here, so through that
// comparison.
//
// gone is the entry put marked gone, if it was the one to (an entry the
// EvictionObserver was told of already is gone before), for the caller to
// report after unlocking: that is where a replaced or invalidated value
// leaves.
func (f *flights[K, V]) put(sh *shard[K, V], cur *entry[K, V], next *write[K, V], rec *write[K, V]) (opened *write[K, V], back place, ok bool, gone *entry[K, V]) {
	w := sh.writes[next.key]
	next.outdated = f.superseded(sh, cur, next)
	if next.outdated || (w == nil && cur == nil && next.entry == nil) { // nothing to change
		if next.place.kind == fillPlace {
			next.place = place{} // never taken
		}
		return nil, next.place, !next.outdated, nil
	}
	ok = next.place.kind != fillPlace || f.takeFill(next.place.cost)
	if !ok {
		f.stats.fillsDropped.Add(1)
		next.entry, next.cost = nil, 0
		if w == nil {
			if cur != nil {
				gone = cur.markGone()
				sh.settles.Add(1) // the key's cached entry changed: glances taken before are stale
			}
			return nil, place{}, false, gone
		}
		next.place = w.place // the open write keeps its own, and becomes a delete
	}
	if w != nil {
		if w.entry != nil {
			gone = w.entry.markGone()
		}
		back = w.place
		if !ok {
			back = place{}
		}
		w.entry, w.cost, w.place = next.entry, next.cost, next.place
		return nil, back, ok, gone
	}
	if cur != nil {
		gone = cur.markGone()
	}
	if rec == nil {
		rec = new(write[K, V])
	}
	if rec != next {
		*rec = *next
	}
	sh.writes[rec.key] = rec
	grew(&sh.peakWrites, len(sh.writes))
	return rec, place{}, true, gone
}

// settle closes w if what the writer issued last is still the key's value,
// and reports whether it did, with the place w held (the writer gives it
// back). With keepLive (a Clear comes before the next batch), a value not
// older than the floor stays open, to be issued again after the Clear.
func (f *flights[K, V]) settle(w *write[K, V], keepLive bool) (p place, closed bool) {
	sh := f.shard(w.h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if w.entry != w.issued || (keepLive && f.rules.live(w.issued) != nil) {
		return place{}, false
	}
	if sh.writes[w.key] == w {
		delete(sh.writes, w.key)
		sh.writes, sh.peakWrites = shrink(sh.writes, sh.peakWrites)
		sh.settles.Add(1)
	}
	return w.place, true
}

// markIssued returns w's latest value, with its cost, for the writer to
// hand to ristretto, and records it as the one issued (settle).
func (f *flights[K, V]) markIssued(w *write[K, V]) (e *entry[K, V], cost int64) {
	sh := f.shard(w.h)
	sh.mu.Lock()
	e, cost = w.entry, w.cost
	w.issued = e
	sh.mu.Unlock()
	return e, cost
}

// unmarkIssued records that e, which ristretto refused, was not issued
// after all (so the next batch issues it again), unless w has been issued
// since.
func (f *flights[K, V]) unmarkIssued(w *write[K, V], e *entry[K, V]) {
	sh := f.shard(w.h)
	sh.mu.Lock()
	if w.issued == e {
		w.issued = nil
	}
	sh.mu.Unlock()
}

// cached returns key's entry in the cache, or nil if there is none (or only
// a gone one, or another key's).
func (f *flights[K, V]) cached(h uint64, key K) *entry[K, V] {
	if e, ok := f.cache.Get(h); ok && e.key == key && !e.isGone() {
		return e
	}
	return nil
}

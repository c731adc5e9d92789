package flightcache

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"
)

// flightShards is the number of independent in-flight maps. A key's shard
// is chosen by its hash, so keys that share a cache slot (a hash collision)
// also share a shard lock, and every write of one slot is serialised.
const flightShards = 64

// call is one load in flight and, once done is closed, its result.
type call[K comparable, V any] struct {
	done chan struct{} // closed by finish once the result fields are set

	// Set before the call is published in a shard map; read-only after.
	ctx        context.Context
	cancel     context.CancelCauseFunc
	release    func()
	background bool         // a refresh nobody waited on when it started
	from       *entry[K, V] // the entry a background refresh replaces

	// Guarded by the shard's mu.
	waiters   int          // Gets waiting on the result now, the starter included
	abandoned bool         // cancelled because every waiter left (CancelAtZero)
	finished  bool         // the result is set: a leaving waiter takes it instead
	queued    bool         // finished, its entry in ristretto's write buffer; in the map until applied
	entry     *entry[K, V] // the entry queued

	// fallback, set with a failed result, is an older value a Remote offered
	// to cover the failure; never cached.
	fallback *entry[K, V]

	// Written by finish before done is closed; read-only after.
	val        V
	err        error
	loadedAt   time.Duration
	freshUntil time.Duration // when val goes stale
}

// shard is one in-flight map, singleflight-style.
type shard[K comparable, V any] struct {
	mu sync.Mutex        // guards m and the guarded fields of its calls
	m  map[K]*call[K, V] // the load in flight per key; the finishing goroutine deletes its key only if it still owns it (m[key] == c)
	_  [64 - 8 - 8]byte  // keep neighbouring shards off one cache line
}

type flights[K comparable, V any] struct {
	shards [flightShards]shard[K, V]
}

func (f *flights[K, V]) init() {
	for i := range f.shards {
		f.shards[i].m = make(map[K]*call[K, V])
	}
}

func (f *flights[K, V]) shard(h uint64) *shard[K, V] {
	return &f.shards[h%flightShards]
}

// join makes ctx's caller a waiter of key's load, starting one if none is in
// flight; started reports whether it did. A background join (a refresh)
// never waits: it returns a nil call when a load is already in flight.
//
// A load that has finished may still be in the map while ristretto applies
// its write, and a load may have finished between the caller's lookup and
// now; either way join returns the fresh entry as hit instead of loading
// twice (rule 2).
func (l *Loader[K, V]) join(ctx context.Context, key K, h uint64, from *entry[K, V]) (c *call[K, V], started bool, hit *entry[K, V], err error) {
	background := from != nil
	marker, _ := ctx.Value(loadKey{}).(*loadMarker) // user code: outside the locks
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed.Load() {
		return nil, false, nil, ErrClosed
	}
	now := l.now()
	sh := l.flights.shard(h)
	sh.mu.Lock()
	for {
		c = sh.m[key]
		if c == nil || !c.finished || l.phase(c.entry, now) == phaseFresh {
			break
		}
		// A finished load whose value expired before ristretto applied its
		// write: apply it, outside the lock, before the call leaves the
		// map. No write of a key may be left in ristretto's buffer once no
		// call of the key is in the map: Set and Invalidate rely on that,
		// and so does the next fill (a second new item of a key is refused).
		sh.mu.Unlock()
		l.cache.Wait()
		sh.mu.Lock()
		if sh.m[key] == c {
			delete(sh.m, key)
		}
	}
	if c != nil && c.finished {
		sh.mu.Unlock()
		if background {
			return nil, false, nil, nil
		}
		return nil, false, c.entry, nil
	} else if c != nil {
		if background {
			sh.mu.Unlock()
			return nil, false, nil, nil
		}
		for m := marker; m != nil; m = m.parent {
			if m.call == c {
				sh.mu.Unlock()
				return nil, false, nil, ErrRecursiveLoad
			}
		}
		c.waiters++
		sh.mu.Unlock()
		return c, false, nil, nil
	} else if e, ok := l.cache.Get(h); !background && ok && e.key == key && l.phase(e, now) == phaseFresh {
		sh.mu.Unlock()
		return nil, false, e, nil
	} else if background && (!ok || e != from) {
		sh.mu.Unlock() // a Set or a load replaced the entry this refresh was for
		return nil, false, nil, nil
	}
	c = &call[K, V]{done: make(chan struct{}), background: background, from: from}
	if background {
		marker = nil // nothing waits on a refresh: it cannot be part of a cycle
	}
	c.ctx, c.cancel, c.release = loadContext(ctx, marker, l.base, l.opts.LoadTimeout, c)
	if !background {
		c.waiters = 1
	}
	sh.m[key] = c
	sh.mu.Unlock()
	// Still under closeMu: Close cannot have started waiting for goroutines.
	l.active.Add(1)
	l.stats.inFlight.Add(1)
	go l.run(c, key, h)
	return c, true, nil, nil
}

// leave withdraws a waiter whose context ended. It returns false if the
// result was already delivered, in which case the caller must take it: it
// has been counted as one of the load's callers. Under CancelAtZero the
// last waiter out cancels the load and removes it from the map under the
// same lock, so no later caller can join the cancelled load.
func (l *Loader[K, V]) leave(key K, h uint64, c *call[K, V]) bool {
	sh := l.flights.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.finished {
		return false
	}
	c.waiters--
	// A queued call has its value already and is applying its write under
	// backpressure: there is nothing left to cancel, and it must stay in
	// the map until ristretto has applied that write.
	if c.waiters == 0 && !c.background && !c.queued && l.opts.Policy == CancelAtZero {
		if sh.m[key] == c {
			delete(sh.m, key)
		}
		c.abandoned = true
		c.cancel(errAbandoned)
	}
	return true
}

// run is the goroutine of one load.
func (l *Loader[K, V]) run(c *call[K, V], key K, h uint64) {
	defer l.exit()
	defer c.release()
	r := loaded[V]{err: errGoexit} // stays if the LoadFunc ends the goroutine
	defer func() { l.finish(c, key, h, r) }()
	l.fetch(c.ctx, key, &r)
}

// finish stores a load's result (if it still owns its key), hands it to the
// waiters, and reports it. It runs deferred, so it also runs when the
// LoadFunc called runtime.Goexit.
func (l *Loader[K, V]) finish(c *call[K, V], key K, h uint64, r loaded[V]) {
	now := l.now()
	loadedAt := now - r.age
	v, err := r.val, r.err
	var e *entry[K, V]
	cost := int64(1)
	switch {
	case err == nil:
		e = l.newEntry(key, v, loadedAt, l.opts.TTL, r.took)
		if l.opts.Cost != nil {
			// Cost is user code: if it ends the goroutine (runtime.Goexit),
			// still hand the value to the waiters, uncached.
			costed := false
			defer func() {
				if !costed {
					l.complete(c, key, h, r, loadedAt, nil, 0)
				}
			}()
			var ok bool
			if cost, ok = l.costOf(v); !ok {
				e = nil
			}
			costed = true
		}
	case l.opts.NotFoundTTL > 0 && errors.Is(err, ErrNotFound):
		e = l.newEntry(key, v, now, l.opts.NotFoundTTL, 0)
		e.err = err
	}
	l.complete(c, key, h, r, loadedAt, e, cost)
}

// complete publishes a load's result: it queues e (if not nil and the load
// still owns its key), wakes the waiters, and reports the load.
func (l *Loader[K, V]) complete(c *call[K, V], key K, h uint64, r loaded[V], loadedAt time.Duration, e *entry[K, V], cost int64) {
	now := l.now()
	v, err := r.val, r.err
	if err != nil {
		var zero V
		v = zero
	}

	sh := l.flights.shard(h)
	sh.mu.Lock()
	owned := sh.m[key] == c
	if owned && e != nil && !l.closed.Load() {
		c.queued, c.entry = l.enqueue(h, e, cost), e
	}
	stored := c.queued
	if c.queued && l.applier.backlogged() {
		// Backpressure: with many writes waiting for ristretto, apply this
		// one before waking the waiters, so a storm of misses slows down
		// instead of piling up values in ristretto's buffer.
		sh.mu.Unlock()
		l.cache.Wait()
		sh.mu.Lock()
		c.queued = false // applied
	}
	if sh.m[key] == c && !c.queued {
		delete(sh.m, key)
	}
	c.val, c.err, c.loadedAt = v, err, loadedAt
	// Judge values that were never cached by the shortest freshness any
	// entry can draw, so that no caller's max-stale is stretched by jitter.
	shortest := jitter(l.opts.TTL, l.opts.Jitter, 1)
	c.freshUntil = addSat(loadedAt, shortest)
	if e != nil {
		c.freshUntil = e.freshUntil
	}
	if fb := r.fallback; err != nil && fb != nil {
		at := now - max(time.Since(fb.LoadedAt), 0)
		c.fallback = &entry[K, V]{key: key, val: fb.Value, loadedAt: at, freshUntil: addSat(at, shortest)}
	}
	c.finished = true
	abandoned := c.abandoned
	// Count before the waiters wake, so Stats read after a Get returns
	// includes the load that answered it.
	l.stats.inFlight.Add(-1)
	l.stats.loads.Add(1)
	if err != nil {
		l.stats.loadErrors.Add(1)
	}
	if abandoned {
		l.stats.abandoned.Add(1)
	}
	if c.background {
		l.stats.refreshing.Add(-1)
		if err != nil {
			n := c.from.refreshFails.Add(1)
			d := refreshDelay(int(n), l.opts.Retry.InitialInterval, l.opts.Retry.MaxInterval, rand.Float64())
			c.from.refreshAfter.Store(int64(now + d))
		}
	}
	close(c.done)
	callers := c.waiters
	sh.mu.Unlock()

	if c.queued {
		l.applier.add(pendingWrite[K, V]{c: c, key: key, h: h}) // out of the map once applied
	}
	l.stats.noteCallers(callers)

	if l.opts.OnLoad != nil {
		l.onLoad(LoadEvent[K]{
			Key: key, Duration: r.took, Err: err, Attempts: r.attempts, Background: c.background,
			Callers: callers, Abandoned: abandoned, Stored: stored, Remote: r.remote,
		})
	}
}

// costOf calls the user's Cost, turning a panic into ok == false.
func (l *Loader[K, V]) costOf(v V) (cost int64, ok bool) {
	if l.opts.Cost == nil {
		return 1, true
	}
	defer func() {
		if recover() != nil {
			l.stats.panics.Add(1)
			cost, ok = 0, false
		}
	}()
	return max(l.opts.Cost(v), 1), true
}

// onLoad calls the user's OnLoad, recovering a panic.
func (l *Loader[K, V]) onLoad(ev LoadEvent[K]) {
	defer func() {
		if recover() != nil {
			l.stats.panics.Add(1)
		}
	}()
	l.opts.OnLoad(ev)
}

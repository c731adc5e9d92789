// Package flightcache is a cache-aside loader for an expensive downstream
// call. When a hot key expires and hundreds of requests miss at once, one
// load serves them all, so the downstream sees one call instead of hundreds.
//
// # Layers
//
// A [Loader] answers [Loader.Get] through these layers, outside in:
//
//   - a ristretto cache with jittered expiry and stale serving
//     ([Options.StaleWhileRevalidate], [Options.StaleIfError],
//     [Options.EarlyRefresh]);
//   - a single-flight registry: one load per key serves every concurrent
//     caller, and [Options.Policy] decides what happens when they all leave;
//   - retries with jittered backoff ([Options.Retry]);
//   - a circuit breaker ([Options.Breaker]);
//   - the [LoadFunc], under [Options.LoadTimeout].
//
// # Observability
//
// [Loader.GetInfo] says where one value came from ([Info]); [Options.OnLoad]
// reports every load, with how many callers its result reached
// ([LoadEvent.Callers]: the blast radius of a failure); [Loader.Stats] gives
// cumulative counters.
//
// # Per-call freshness
//
// [WithMaxStale] bounds how stale a value one Get accepts, like HTTP's
// Cache-Control max-stale; WithMaxStale(ctx, 0) demands a fresh value.
//
// # Beyond one process
//
// [Options.Remote] adds a tier shared by processes (the flightredis module
// implements one on Redis), and [Breaker.Custom] a breaker whose state they
// share, so a fleet makes one downstream call per key, not one per process.
package flightcache

import (
	"context"
	"errors"
	"hash/maphash"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
)

// LoadFunc loads the value of key from the downstream. It runs on a
// goroutine of the Loader, under a context that keeps the values of the Get
// that started the load but not its cancellation, and that ends at
// LoadTimeout or Close (or, under CancelAtZero, when every waiter has left).
// Return an error matching [ErrNotFound] for a key that does not exist.
//
// NOTE: the value returned is shared by every caller of the load and stored
// in the cache: treat it as read-only.
//
// WARNING: a LoadFunc that calls Get must pass its own ctx (or one derived
// from it): that is how a Get of a key whose load it is part of is
// recognised and fails with [ErrRecursiveLoad]. Under an unrelated context
// such a Get waits on itself until that context ends.
type LoadFunc[K comparable, V any] func(ctx context.Context, key K) (V, error)

// Loader is a cache-aside loader: a cache in front of a LoadFunc, with one
// load per key at a time. Create it with [New]; it is safe for concurrent
// use by any number of goroutines. Call [Loader.Close] when done with it, to
// stop its loads and free its goroutines.
type Loader[K comparable, V any] struct {
	loadFn  LoadFunc[K, V]
	opts    Options[K, V] // validated, defaults applied
	win     windows
	cache   *ristretto.Cache[uint64, *entry[K, V]]
	flights flights[K, V]
	applier applier[K, V] // takes finished loads out of flights once ristretto applied them
	breaker CircuitBreaker
	stats   counters
	seed    maphash.Seed
	// checkKeys: a custom Hash with keys whose dynamic type may not be
	// comparable (an interface inside K); such a key must panic before Get
	// counts it or takes a lock, as it would with the default hash.
	checkKeys bool
	epoch     time.Time // every time offset in entries is measured from here

	base   context.Context         // parent of every load; cancelled by Close
	cancel context.CancelCauseFunc // cancels base

	closed      atomic.Bool
	closeMu     sync.RWMutex // Close holds it to wait out everything that starts a load or writes the cache; those hold it shared
	drained     atomic.Bool  // set by Close once no load can start any more: active only falls from then on
	active      atomic.Int64 // load goroutines running
	tearingDown atomic.Bool  // ristretto's own Close evicts everything: do not count it
	teardown    sync.Once
	closeDone   chan struct{} // closed once everything has stopped
}

// entry is one cached value (or cached not-found error) with its timing.
// Times are offsets from the Loader's epoch.
type entry[K comparable, V any] struct {
	key          K
	val          V
	err          error // a cached not-found error; nil for a value
	loadedAt     time.Duration
	freshUntil   time.Duration
	refreshAt    time.Duration // from here to freshUntil a Get refreshes early; = freshUntil when off
	refreshFails atomic.Int32  // consecutive failed background refreshes
	refreshAfter atomic.Int64  // no background refresh before this offset; max while one runs
}

const refreshing = int64(^uint64(0) >> 1)

// New returns a Loader that loads missing keys with load. It returns an
// error naming the field if opts is invalid, or if load is nil.
func New[K comparable, V any](load LoadFunc[K, V], opts Options[K, V]) (*Loader[K, V], error) {
	if load == nil {
		return nil, optionError("LoadFunc", "(the load argument) must not be nil")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	l := &Loader[K, V]{
		loadFn:    load,
		opts:      opts,
		win:       windows{staleWhileRevalidate: opts.StaleWhileRevalidate, staleIfError: opts.StaleIfError},
		breaker:   newBreaker(opts.Breaker),
		seed:      maphash.MakeSeed(),
		epoch:     time.Now(),
		closeDone: make(chan struct{}),
	}
	l.checkKeys = opts.Hash != nil && mayHoldInterface(reflect.TypeFor[K]())
	l.stats.init()
	l.flights.init()
	cache, err := ristretto.NewCache(&ristretto.Config[uint64, *entry[K, V]]{
		NumCounters: opts.NumCounters,
		MaxCost:     opts.MaxCost,
		BufferItems: 64,
		// Costs are ours (1 per entry, or Options.Cost): without this,
		// ristretto adds its own item size and a small MaxCost keeps nothing.
		IgnoreInternalCost: true,
		OnEvict: func(*ristretto.Item[*entry[K, V]]) {
			if !l.tearingDown.Load() {
				l.stats.evicted.Add(1)
			}
		},
		OnReject: func(*ristretto.Item[*entry[K, V]]) { l.stats.setsRejected.Add(1) },
	})
	if err != nil {
		return nil, optionError("MaxCost", "or NumCounters rejected by ristretto: %v", err)
	}
	l.cache = cache
	l.base, l.cancel = context.WithCancelCause(context.Background())
	l.applier.init()
	go l.runApplier()
	return l, nil
}

// now is the current time as an offset from the epoch. time.Since reads
// only the monotonic clock, which is cheaper than time.Now.
func (l *Loader[K, V]) now() time.Duration { return time.Since(l.epoch) }

func (l *Loader[K, V]) hash(key K) uint64 {
	if l.opts.Hash != nil {
		return l.opts.Hash(key)
	}
	return maphash.Comparable(l.seed, key)
}

// newEntry builds the entry of a value loaded (or Set) now, fresh for a
// jittered ttl. took is how long the load took (0 for Set): it places the
// entry's early refresh.
func (l *Loader[K, V]) newEntry(key K, v V, now, ttl, took time.Duration) *entry[K, V] {
	life := jitter(ttl, l.opts.Jitter, rand.Float64())
	until := addSat(now, life)
	e := &entry[K, V]{key: key, val: v, loadedAt: now, freshUntil: until, refreshAt: until}
	if l.opts.EarlyRefresh > 0 {
		e.refreshAt = earlyRefreshAt(now, life, took, l.opts.EarlyRefresh, 1-rand.Float64())
	}
	return e
}

func (l *Loader[K, V]) phase(e *entry[K, V], now time.Duration) phase {
	if e.err != nil {
		return windows{}.phaseAt(now, e.freshUntil) // a cached not-found is never stale
	}
	return l.win.phaseAt(now, e.freshUntil)
}

// Get returns the value of key: from the cache when fresh (or stale within
// the windows Options allow), otherwise from a load shared with every other
// caller of key. If ctx ends first, Get returns ctx.Err() and the load goes
// on according to [Options.Policy]. Get is safe for concurrent use.
func (l *Loader[K, V]) Get(ctx context.Context, key K) (V, error) {
	v, _, err := l.GetInfo(ctx, key)
	return v, err
}

// GetInfo is [Loader.Get] that also says where the value came from.
func (l *Loader[K, V]) GetInfo(ctx context.Context, key K) (V, Info, error) {
	var zero V
	if ctx == nil {
		return zero, Info{}, errNilContext
	}
	// Hash first: a panicking Hash (or a key whose dynamic type is not
	// comparable) must not leave a stripe counting a Get that never ends,
	// nor a lock held.
	h := l.hash(key)
	if l.checkKeys {
		_ = maphash.Comparable(l.seed, key) // panics here, before any count or lock
	}
	if l.closed.Load() {
		// Refused at the door, off the stripes: Close waits for the stripes
		// to settle, and a stream of refused Gets must not keep them moving.
		l.stats.closedEarly.Add(1)
		return zero, Info{}, ErrClosed
	}
	s := l.stats.acquire()
	s.gets.Add(1)
	if l.closed.Load() { // Close began between the two checks
		s.closed.Add(1)
		l.stats.release(s)
		return zero, Info{}, ErrClosed
	}
	e, ok := l.cache.Get(h)
	now := l.now()
	if ok && e.key == key {
		switch l.phase(e, now) {
		case phaseFresh:
			s.hits.Add(1)
			l.stats.release(s)
			if now >= e.refreshAt && e.err == nil {
				l.refresh(ctx, key, h, e, now)
			}
			return e.val, Info{Source: SourceHit, Age: now - e.loadedAt}, e.err
		case phaseStale:
			if acceptsStale(ctx, e.freshUntil, now) {
				s.stale.Add(1)
				l.stats.release(s)
				l.refresh(ctx, key, h, e, now)
				return e.val, Info{Source: SourceStale, Age: now - e.loadedAt}, nil
			}
		}
	}
	s.passed.Add(1)
	l.stats.release(s)
	return l.wait(ctx, key, h, now)
}

// wait joins (or starts) key's load and waits for it or for ctx.
func (l *Loader[K, V]) wait(ctx context.Context, key K, h uint64, start time.Duration) (V, Info, error) {
	return l.waitFor(ctx, key, h, start, false)
}

// waitFor is wait; again is true on the one retry for a value that was
// stale beyond the caller's max-stale (the Get was counted already).
func (l *Loader[K, V]) waitFor(ctx context.Context, key K, h uint64, start time.Duration, again bool) (V, Info, error) {
	var zero V
	c, started, hit, err := l.join(ctx, key, h, nil)
	if hit != nil { // a load finished as this Get looked: no need to wait
		if !again {
			l.stats.lateHits.Add(1)
		}
		return hit.val, Info{Source: SourceHit, Age: l.now() - hit.loadedAt}, hit.err
	}
	if !again {
		l.stats.misses.Add(1)
	}
	if err != nil {
		return zero, Info{}, err
	}
	l.stats.waiting.Add(1)
	select {
	case <-c.done:
	case <-ctx.Done():
		if l.leave(key, h, c) {
			l.stats.waiting.Add(-1)
			l.stats.canceled.Add(1)
			return zero, Info{Waited: l.now() - start}, ctx.Err()
		}
		<-c.done // the result was delivered as ctx ended: it is ours
	}
	l.stats.waiting.Add(-1)
	end := l.now()
	info := Info{Source: SourceShared, Waited: end - start}
	if started {
		info.Source = SourceLoaded
	}
	if c.err != nil {
		if v, age, ok := l.staleOnError(ctx, key, h, c, end); ok {
			l.stats.staleOnError.Add(1)
			return v, Info{Source: SourceStaleOnError, Age: age, Waited: info.Waited}, nil
		}
	} else {
		info.Age = end - c.loadedAt
		if !again && end >= c.freshUntil && !acceptsStale(ctx, c.freshUntil, end) {
			// A Remote gave the load a value already stale, and this caller's
			// max-stale refuses it (the load carried only its starter's
			// bound): load once more, and this caller's bound goes with it.
			return l.waitFor(ctx, key, h, start, true)
		}
	}
	if !started {
		l.stats.shared.Add(1)
		if c.err != nil {
			l.stats.sharedErrors.Add(1)
		}
	}
	return c.val, info, c.err
}

// staleOnError looks for a value to return instead of c's error: a cached
// stale one within the windows, a fresh one that a Set stored during the
// wait, or, failing those, the older value a Remote offered with the error.
// It reads the cache afresh, so an Invalidate during the wait leaves nothing
// local to fall back on.
func (l *Loader[K, V]) staleOnError(ctx context.Context, key K, h uint64, c *call[K, V], now time.Duration) (v V, age time.Duration, ok bool) {
	if l.opts.StaleIfError == 0 || errors.Is(c.err, ErrNotFound) || errors.Is(c.err, ErrClosed) {
		return v, 0, false
	}
	l.closeMu.RLock()
	var e *entry[K, V]
	if !l.closed.Load() {
		e, ok = l.cache.Get(h)
	}
	l.closeMu.RUnlock()
	if !ok || e.key != key || e.err != nil {
		e = nil // nothing of this key's cached, or a cached not-found
	}
	for _, e := range [2]*entry[K, V]{e, c.fallback} {
		if e == nil {
			continue
		}
		switch p := l.phase(e, now); {
		case p == phaseExpired:
			continue
		case p != phaseFresh && !acceptsStale(ctx, e.freshUntil, now):
			continue
		}
		return e.val, now - e.loadedAt, true
	}
	return v, 0, false
}

// refresh starts a background refresh of key from entry e, unless one is
// running, a failed one is backing off, or MaxRefreshes are running.
func (l *Loader[K, V]) refresh(ctx context.Context, key K, h uint64, e *entry[K, V], now time.Duration) {
	after := e.refreshAfter.Load()
	if after > int64(now) || !e.refreshAfter.CompareAndSwap(after, refreshing) {
		return // backing off, or another Get is starting (or ran) one
	}
	if l.stats.refreshing.Add(1) > int64(l.opts.MaxRefreshes) {
		l.stats.refreshing.Add(-1)
		e.refreshAfter.Store(after)
		return
	}
	c, _, _, _ := l.join(ctx, key, h, e)
	if c == nil { // a load is already in flight, or the Loader closed
		l.stats.refreshing.Add(-1)
		e.refreshAfter.Store(after)
		return
	}
	l.stats.refreshes.Add(1)
}

// Set stores value for key as if it had just been loaded. A load of key in
// flight when Set is called still delivers its result to its own waiters,
// but never overwrites the value Set stored. A Get that starts after Set
// returns sees value (unless ristretto's admission policy refused it, which
// Stats.SetsRejected shows). Set after Close does nothing.
func (l *Loader[K, V]) Set(key K, value V) {
	if l.set(key, value) {
		l.remoteSet(key, value)
	}
}

func (l *Loader[K, V]) set(key K, value V) bool {
	h := l.hash(key) // user code (Hash, Cost): outside the locks
	cost, ok := l.costOf(value)
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed.Load() {
		return false
	}
	e := l.newEntry(key, value, l.now(), l.opts.TTL, 0)
	sh := l.lockSettled(key, h)
	if !ok {
		l.remove(h, key) // the value cannot be costed: at least drop the old one
	} else if l.enqueue(h, e, cost) {
		// Readable when Set returns, and applied before the shard is
		// unlocked: another write of key queued while this one is still
		// in ristretto's buffer would reach it as a second new item, which
		// its policy refuses, keeping this value instead of the later one.
		l.cache.Wait()
	}
	sh.mu.Unlock()
	return true
}

// Invalidate drops key's cached value. A load of key in flight delivers its
// result to its own waiters but does not write the cache; the next Get
// starts a fresh load. Invalidate after Close does nothing.
func (l *Loader[K, V]) Invalidate(key K) {
	if l.invalidate(key) {
		l.remoteInvalidate(key)
	}
}

func (l *Loader[K, V]) invalidate(key K) bool {
	h := l.hash(key) // user code: outside the locks
	l.closeMu.RLock()
	defer l.closeMu.RUnlock()
	if l.closed.Load() {
		return false
	}
	sh := l.lockSettled(key, h)
	l.remove(h, key)
	sh.mu.Unlock()
	return true
}

// lockSettled returns key's shard locked, with no call of key in its map
// and no write of key left in ristretto's buffer. A load in flight is
// detached: taken out of the map without being stopped, its waiters still
// get its result, but it will not write the cache (rule 6). A call whose
// write may still be queued (a finished load, or one applying its own write
// under backpressure) is waited for first, outside the lock, so that a miss
// on another key of the shard does not wait on ristretto: deleting behind
// that write would leave a moment where the old value is back, and a new
// write behind it would be refused by ristretto. The call stays in the map
// while ristretto applies it, so no other write of key can slip in between.
func (l *Loader[K, V]) lockSettled(key K, h uint64) *shard[K, V] {
	sh := l.flights.shard(h)
	for {
		sh.mu.Lock()
		c := sh.m[key]
		if c == nil || !c.queued {
			delete(sh.m, key)
			return sh
		}
		sh.mu.Unlock()
		l.cache.Wait()
		sh.mu.Lock()
		if sh.m[key] == c {
			delete(sh.m, key)
		}
		sh.mu.Unlock()
	}
}

// enqueue hands e to ristretto, which applies it from a buffer; Wait makes
// it readable. The caller holds the shard lock of h, which orders every
// write of the slot.
func (l *Loader[K, V]) enqueue(h uint64, e *entry[K, V], cost int64) bool {
	if l.opts.Cost != nil {
		// ristretto replaces a value it already holds in place and only
		// records the new cost: no admission, no eviction, so a reload or
		// a Set could push the cache past MaxCost. Deleting first sends
		// every costed write through admission and eviction. (Without
		// Cost every entry costs 1 and a replacement changes nothing.)
		l.cache.Del(h)
	}
	if !l.cache.Set(h, e, cost) {
		l.stats.setsDropped.Add(1)
		return false
	}
	return true
}

// remove deletes key's entry, leaving another key's entry in the slot alone.
// The caller holds the shard lock of h.
func (l *Loader[K, V]) remove(h uint64, key K) {
	if e, ok := l.cache.Get(h); ok && e.key == key {
		l.cache.Del(h)
	}
}

// Stats returns the Loader's counters. It never blocks Gets. It is safe to
// call at any time, also after Close.
func (l *Loader[K, V]) Stats() Stats {
	s := l.stats.snapshot()
	s.Breaker = l.breaker.State()
	return s
}

// Close stops the Loader: later Gets return [ErrClosed], loads and
// refreshes in flight have their contexts cancelled (their waiters get
// ErrClosed), and Close waits for every goroutine the Loader started before
// it frees the cache. It is idempotent and always returns nil.
//
// WARNING: Close waits for LoadFuncs to return; one that ignores its
// context delays Close until it does.
//
// NOTE: Close called on a load goroutine (from a LoadFunc, Cost, OnLoad,
// Retryable, IsFailure, a Remote or a custom breaker) cannot wait for
// itself: it starts the shutdown and returns at once, and the Loader
// finishes closing when the last of its load goroutines ends. Close cannot
// tell which Loader a load goroutine belongs to, so it returns at once too
// when called from another Loader's callback while this Loader has loads
// running; a later Close from outside waits for everything.
func (l *Loader[K, V]) Close() error {
	if !l.closed.Swap(true) {
		l.closeMu.Lock() // wait out Sets, Invalidates and joins in progress
		l.closeMu.Unlock()
		l.drained.Store(true)
		l.cancel(ErrClosed)
		if l.active.Load() == 0 {
			l.stop()
		}
	}
	if l.active.Load() > 0 && onLoaderGoroutine() {
		return nil
	}
	<-l.closeDone
	return nil
}

// mayHoldInterface reports whether values of t can hold an interface value,
// whose dynamic type may not be comparable.
func mayHoldInterface(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.Array:
		return mayHoldInterface(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if mayHoldInterface(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

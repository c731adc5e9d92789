package flightcache

import (
	"context"
	"errors"
	"hash/maphash"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
)

// LoadFunc loads the value of key from the downstream. It runs on a
// goroutine of the Loader, under a context that keeps the values of the Get
// that started the load but not its cancellation, and that ends at
// LoadTimeout or Close (or, under CancelAtZero, when every waiter has left);
// [context.Cause] tells which ([ErrLoadTimeout], [ErrClosed], or a
// [context.Canceled] error). Return an error matching [ErrNotFound] for a
// key that does not exist, or one [Options.IsNotFound] accepts: any other
// error is a failure.
//
// NOTE: the value returned is shared by every caller of the load and stored
// in the cache: treat it as read-only. Load goroutines are reused: the
// LoadFunc runs with the profiler labels of the context of the Get that
// started the load, and must not leave its goroutine locked to its thread
// (runtime.LockOSThread) when it returns.
//
// WARNING: a LoadFunc that calls Get must pass its own ctx (or one derived
// from it): that is how a Get of a key whose load it is part of is
// recognised and fails with [ErrRecursiveLoad]. Under an unrelated context
// such a Get waits on itself until that context ends.
type LoadFunc[K comparable, V any] func(ctx context.Context, key K) (V, error)

// ReloadFunc reloads key given the value the Loader holds for it (fresh,
// stale, or within StaleIfError); see [Options.Reload]. It runs as a
// LoadFunc does, on a goroutine of the Loader, under the load's context,
// through the same retries and breaker. It may return [ErrNotModified]: the
// old value is kept and its freshness renewed from now, as HTTP's 304 does.
//
// NOTE: old is shared with every caller that got it: treat it as
// read-only.
type ReloadFunc[K comparable, V any] func(ctx context.Context, key K, old V) (V, error)

// LoadManyFunc loads several keys in one downstream call, for
// [Loader.GetMany] (see [Options.LoadMany]), and one key at a time for a
// Loader made without a LoadFunc (see [New]). A key missing from the map it
// returns does not exist (as if its load returned [ErrNotFound]); a key it
// returns that was not asked for is ignored. An error fails every key of
// the call. It runs as a LoadFunc does, on a goroutine of the Loader, under
// a context that carries the values of the Get or GetMany that started it,
// through the same retries, breaker and LoadTimeout; it is never called
// with more than [Options.MaxBatch] keys, nor with a key twice.
type LoadManyFunc[K comparable, V any] func(ctx context.Context, keys []K) (map[K]V, error)

// Loader is a cache-aside loader: a cache in front of a LoadFunc, with one
// load per key at a time. Create it with [New]; it is safe for concurrent
// use by any number of goroutines. Call [Loader.Close] when done with it, to
// stop its loads and free its goroutines.
type Loader[K comparable, V any] struct {
	loadFn   LoadFunc[K, V]
	opts     Options[K, V] // validated, defaults applied
	win      windows
	cache    *ristretto.Cache[uint64, *entry[K, V]]
	flights  flights[K, V] // loads in flight and writes ristretto has not applied (flight.go)
	writer   writer[K, V]  // the goroutine that writes ristretto (write.go)
	workers  workers       // the load goroutines (lifecycle.go)
	timeouts *timeouts     // ends loads at LoadTimeout (loadctx.go); apart from the Loader (newTimeouts)
	breaker  CircuitBreaker
	stats    counters
	seed     maphash.Seed
	// hashMayPanic: a custom Hash, or keys whose dynamic type may not be
	// comparable (an interface inside K): hashing goes through the guard.
	hashMayPanic bool
	checkKeys    bool          // a custom Hash with such keys: check them as a map would
	nanKeys      bool          // K can hold a float: a key may not equal itself (selfUnequal)
	epoch        time.Time     // every time offset in entries is measured from here
	generation   atomic.Uint32 // the fleet generation, in steps of genUnit (fleet.go)
	floor        atomic.Uint32 // the generation of the last InvalidateAll: older entries are absent (fleet.go)

	// Shutdown (lifecycle.go).
	ctx         context.Context         // the Loader's own work (Remote.Set, Remote.Invalidate); ends at Close
	stop        context.CancelCauseFunc // ends ctx
	closed      atomic.Bool
	idleOnce    atomic.Bool
	idle        chan struct{} // closed once closed and nothing runs
	tearingDown atomic.Bool   // ristretto's own Close evicts everything: do not count it
	clearing    atomic.Bool   // nor its Clear, for InvalidateAll (write.go)
	closeDone   chan struct{} // closed once everything has stopped
}

// entry is one cached value (or cached not-found error) with its timing.
// Times are offsets from the Loader's epoch. An entry is immutable once
// published, but for its atomics.
type entry[K comparable, V any] struct {
	key          K
	val          V
	extra        *extra[K, V] // nil for a value with the Options' windows (8 bytes on every entry, not 32)
	loadedAt     time.Duration
	freshUntil   time.Duration
	refreshAfter atomic.Int64 // no background refresh before this offset; max while one runs
	// early is how long before freshUntil a Get starts an early refresh,
	// in microseconds (rounded up; at most about 71 minutes, a longer lead
	// starts the refresh later); 0 when off. Four bytes, not a
	// time.Duration: with mark, it keeps an entry of a one-word key and a
	// string value in 64 bytes, one cache line.
	early uint32
	// mark: bit 0, gone (replaced or invalidated: a Get treats it as
	// absent, write.go); bits 1-4, the consecutive failed background
	// refreshes (saturating at 15); above, the fleet generation (fleet.go).
	mark atomic.Uint32
}

const (
	goneBit         = 1
	failsUnit       = 1 << 1
	maxRefreshFails = 15 // the failed-refresh count saturates here
	failsMask       = maxRefreshFails * failsUnit
	genUnit         = 1 << 5 // the fleet generation's step: it wraps after 2^27 Distrusts
)

// refreshAt is when a Get starts refreshing e early (freshUntil when off).
func (e *entry[K, V]) refreshAt() time.Duration {
	return e.freshUntil - time.Duration(e.early)*time.Microsecond
}

// isGone reports whether e was replaced or invalidated.
func (e *entry[K, V]) isGone() bool { return e.mark.Load()&goneBit != 0 }

// setGone marks e replaced or invalidated.
func (e *entry[K, V]) setGone() { e.mark.Or(goneBit) }

// failedRefresh counts one more failed background refresh of e and
// returns the count (at most 15, where the backoff is long reached its
// limit).
func (e *entry[K, V]) failedRefresh() int {
	for {
		m := e.mark.Load()
		n := min(m&failsMask+failsUnit, failsMask)
		if e.mark.CompareAndSwap(m, m&^failsMask|n) {
			return int(n / failsUnit)
		}
	}
}

// extra is what few entries need: a cached not-found's error, or a value's
// own stale windows ([Options.Freshness]).
type extra[K comparable, V any] struct {
	notFound error   // a cached not-found error; nil for a value
	win      windows // the entry's stale windows (none for a not-found)
}

// error returns the cached not-found error, or nil for a value.
func (e *entry[K, V]) error() error {
	if e.extra == nil {
		return nil
	}
	return e.extra.notFound
}

// isNotFound reports whether e is a cached not-found.
func (e *entry[K, V]) isNotFound() bool { return e.extra != nil && e.extra.notFound != nil }

const refreshing = int64(^uint64(0) >> 1)

// New returns a Loader that loads missing keys with load.
//
// load may be nil when opts.LoadMany is set, for a downstream that only
// answers batches: every load that is not one of GetMany's batches (a
// Get's, GetInfo's, a refresh's, Refresh's, a revalidating Get's) is then a
// LoadMany call for its one key, whose map gives the value (a key missing
// from it does not exist: [ErrNotFound]), through the same retries,
// breaker and LoadTimeout; [Options.Reload], if set, still reloads a key
// the Loader holds. Such a call counts as a load, not in Stats.BatchLoads.
//
// It returns an error naming the field if opts is invalid, or if load is
// nil and opts.LoadMany too.
func New[K comparable, V any](load LoadFunc[K, V], opts Options[K, V]) (*Loader[K, V], error) {
	if load == nil && opts.LoadMany == nil {
		return nil, optionError("LoadMany", "must be set when the load argument (the LoadFunc) is nil")
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
		idle:      make(chan struct{}),
		closeDone: make(chan struct{}),
	}
	if load == nil {
		l.loadFn = l.loadOne
	}
	l.checkKeys = mayHoldInterface(reflect.TypeFor[K]())
	l.hashMayPanic = opts.Hash != nil || l.checkKeys
	l.checkKeys = l.checkKeys && opts.Hash != nil
	l.nanKeys = mayHoldFloat(reflect.TypeFor[K]())
	l.stats.init()
	l.flights.init(l)
	l.writer.init(opts.MaxPendingWrites, opts.MaxCost)
	l.workers.init()
	l.timeouts = newTimeouts(opts.LoadTimeout, l.epoch)
	cache, err := ristretto.NewCache(&ristretto.Config[uint64, *entry[K, V]]{
		NumCounters: opts.NumCounters,
		MaxCost:     opts.MaxCost,
		BufferItems: 64,
		// Costs are ours (1 per entry, or Options.Cost): without this,
		// ristretto adds its own item size and a small MaxCost keeps nothing.
		IgnoreInternalCost: true,
		OnEvict: func(*ristretto.Item[*entry[K, V]]) {
			if !l.tearingDown.Load() && !l.clearing.Load() {
				l.stats.evicted.Add(1)
			}
		},
		OnReject: func(*ristretto.Item[*entry[K, V]]) { l.stats.setsRejected.Add(1) },
	})
	if err != nil {
		return nil, optionError("MaxCost", "or NumCounters rejected by ristretto: %v", err)
	}
	l.cache = cache
	l.ctx, l.stop = context.WithCancelCause(context.Background())
	_ = l.ctx.Done() // made here, not by a load goroutine: it may run in a synctest bubble
	go l.runWriter()
	if err := l.watch(); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.attachRemote(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// loadOne is the LoadFunc of a Loader made without one: key's load is a
// LoadMany call for key alone; a key missing from its map does not exist.
func (l *Loader[K, V]) loadOne(ctx context.Context, key K) (V, error) {
	m, err := l.opts.LoadMany(ctx, []K{key})
	v, ok := m[key]
	switch {
	case err != nil:
		var zero V
		return zero, err
	case !ok:
		return v, ErrNotFound
	}
	return v, nil
}

// now is the current time as an offset from the epoch. time.Since reads
// only the monotonic clock, which is cheaper than time.Now.
func (l *Loader[K, V]) now() time.Duration { return time.Since(l.epoch) }

// hash returns key's hash. Hash (user code), or a key whose dynamic type is
// not comparable, may panic: that comes back as a *PanicError, before
// anything is counted or locked.
func (l *Loader[K, V]) hash(key K) (h uint64, err error) {
	if !l.hashMayPanic {
		return maphash.Comparable(l.seed, key), nil
	}
	err = l.guard(func() {
		if l.opts.Hash == nil {
			h = maphash.Comparable(l.seed, key) // panics for a key no map could hold
			return
		}
		h = l.opts.Hash(key)
		if l.checkKeys {
			_ = maphash.Comparable(l.seed, key) // as the default hash would
		}
	}, nil)
	return h, err
}

// mustHash is hash for keys known to hash (tests).
func (l *Loader[K, V]) mustHash(key K) uint64 {
	h, _ := l.hash(key)
	return h
}

// cached returns key's entry in the cache, or nil if there is none (or only
// a gone one, or another key's).
func (l *Loader[K, V]) cached(h uint64, key K) *entry[K, V] {
	if e, ok := l.cache.Get(h); ok && e.key == key && !e.isGone() {
		return e
	}
	return nil
}

func (l *Loader[K, V]) phase(e *entry[K, V], now time.Duration) phase {
	if e.extra != nil {
		return e.extra.win.phaseAt(now, e.freshUntil) // a cached not-found has no windows: never stale
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
func (l *Loader[K, V]) GetInfo(ctx context.Context, key K) (v V, info Info, err error) {
	if ctx == nil {
		return v, info, errNilContext
	}
	h, err := l.hash(key)
	if err != nil {
		return v, info, err
	}
	// The caller's context is user code too (rule 23): the hit path reads
	// WithRevalidate from it, before counting in, and nothing else; the
	// other paths read the rest (callerOf) before they start or join
	// anything. Not Done on the hit path: a cancel context makes its
	// channel on the first call.
	revalidate := revalidating(ctx)
	s, ok := l.enterGet(1)
	if !ok {
		return v, info, ErrClosed
	}
	var out *atomic.Uint64 // the outcome the Get counts out through; nil until it has one
	defer func() { l.exitGet(s, out, 1) }()
	g := l.flights.glance(h, key)
	e := g.e
	now := l.now()
	// A miss unless a value is cached, the caller does not revalidate, and
	// the fleet has not written the key since it was cached (rule 18).
	p := phaseExpired
	if e != nil && !revalidate && !l.distrusted(e) {
		p = l.phase(e, now)
	}
	if p == phaseFresh {
		out = &s.hits
		if now >= e.refreshAt() && !e.isNotFound() {
			cl := callerOf(ctx, revalidate)
			l.refresh(&cl, s, key, h, e, now, nil) // early refresh
		}
		return e.val, Info{Source: SourceHit, Age: now - e.loadedAt}, e.error()
	}
	cl := callerOf(ctx, revalidate)
	if p == phaseStale && cl.acceptsStale(e.freshUntil, now) {
		out = &s.stale
		l.refresh(&cl, s, key, h, e, now, nil)
		return e.val, Info{Source: SourceStale, Age: now - e.loadedAt}, nil
	}
	// Expired, past the caller's max-stale, or within StaleIfError: wait
	// for a load; a stale value covers its failure (staleOnError).
	out = &s.passed
	if revalidate {
		l.stats.revalidations.Add(1)
	}
	v, info, _, err = l.wait(&cl, s, key, h, g, now, false)
	if err == errLeft {
		err = ctx.Err()
	}
	return v, info, err
}

// held returns cur if it is a value the Loader still holds for its key
// (fresh, stale or within StaleIfError), which a Reload revalidates; nil
// when there is no Reload.
func (l *Loader[K, V]) held(cur *entry[K, V], now time.Duration) *entry[K, V] {
	if l.opts.Reload == nil || cur == nil || cur.isNotFound() || l.phase(cur, now) == phaseExpired {
		return nil
	}
	return cur
}

// wait joins (or starts) key's load for cl and waits for it or for cl's
// context. g is what the caller saw of key in the cache, if anything.
// again is true on the one retry for a value that was stale beyond the
// caller's max-stale (the Get was counted already). nf reports that err is
// a not-found (Options.IsNotFound), as the load judged it.
func (l *Loader[K, V]) wait(cl *caller, s *stripe, key K, h uint64, g glance[K, V], start time.Duration, again bool) (v V, info Info, nf bool, err error) {
	j := l.join(cl, s, key, h, g, start, nil)
	return l.await(cl, s, key, h, start, again, j)
}

// errLeft is what await returns when the caller's context ended first. The
// caller returns ctx.Err() instead, read once it has settled everything
// else (Err is the caller's code too: rule 23); errLeft never reaches the
// caller of a Get.
var errLeft = errors.New("flightcache: the caller's context ended")

// join is flights.join for a Get (or a key of GetMany) the cache did not
// answer, but for a key not equal to itself (selfUnequal): that one is
// loaded alone, through the LoadFunc (a LoadMany result cannot be looked up
// by it), for this caller only, and leaves nothing behind.
func (l *Loader[K, V]) join(cl *caller, s *stripe, key K, h uint64, g glance[K, V], now time.Duration, into *batch[K, V]) joined[K, V] {
	if !l.selfUnequal(key) {
		return l.flights.join(cl, s, key, h, g, now, into)
	}
	c := l.flights.startAlone(cl, key, h)
	if c == nil {
		return joined[K, V]{err: ErrClosed}
	}
	l.launch(c, s)
	return joined[K, V]{c: c, started: true}
}

// selfUnequal reports whether key is not equal to itself (a float NaN in
// it): no map lookup finds such a key, nor any comparison with a cached
// entry's, so it is never kept anywhere (docs/design.md rule 24). Only the
// miss and write paths ask, and only for a K that can hold a float.
func (l *Loader[K, V]) selfUnequal(key K) bool { return l.nanKeys && key != key }

// await is the rest of wait once the key's load is joined (or started):
// it waits for the load or for cl's context, and judges the result for
// this caller.
func (l *Loader[K, V]) await(cl *caller, s *stripe, key K, h uint64, start time.Duration, again bool, j joined[K, V]) (v V, info Info, nf bool, err error) {
	if j.hit != nil { // a load (or Set) finished as this Get looked: no need to wait
		if !again {
			l.stats.lateHits.Add(1)
		}
		return j.hit.val, Info{Source: SourceHit, Age: l.now() - j.hit.loadedAt}, j.hit.isNotFound(), j.hit.error()
	}
	if j.stale != nil { // the same, with a value stale within StaleWhileRevalidate
		if !again {
			l.stats.lateStale.Add(1)
		}
		now := l.now()
		l.refresh(cl, s, key, h, j.stale, now, nil)
		return j.stale.val, Info{Source: SourceStale, Age: now - j.stale.loadedAt}, false, nil
	}
	if !again {
		l.stats.misses.Add(1)
		if j.reread {
			l.stats.rereads.Add(1)
		}
	}
	if j.err != nil {
		return v, info, false, j.err
	}
	c := j.c
	if !j.counted {
		l.stats.waiting.Add(1)
	}
	select {
	case <-c.done:
	case <-cl.done:
		if l.flights.leave(c) {
			l.stats.waiting.Add(-1)
			l.stats.canceled.Add(1)
			return v, Info{Waited: l.now() - start}, false, errLeft
		}
		<-c.done // the result was delivered as ctx ended: it is ours
	}
	l.stats.waiting.Add(-1)
	// The wait ended with the load, not when this goroutine woke or, in a
	// GetMany, got round to this key: Waited and Age are as of then (never
	// before the caller started: the clock was read before the join).
	end := l.now()
	if c.ended < end {
		end = max(c.ended, start)
	}
	info = Info{Source: SourceShared, Waited: end - start}
	if j.started {
		info.Source = SourceLoaded
	}
	switch {
	case c.err != nil:
		if v, age, ok := l.staleOnError(cl, key, h, c, end); ok {
			l.stats.staleOnError.Add(1)
			return v, Info{Source: SourceStaleOnError, Age: age, Waited: info.Waited}, false, nil
		}
	case !again && end >= c.freshUntil && !cl.acceptsStale(c.freshUntil, end):
		// A Remote gave the load a value already stale, and this caller's
		// max-stale refuses it (the load carried only its starter's
		// bound): load once more, and this caller's bound goes with it.
		return l.wait(cl, s, key, h, glance[K, V]{}, start, true)
	default:
		info.Age = end - c.loadedAt
	}
	if !j.started {
		l.stats.shared.Add(1)
		if c.err != nil {
			l.stats.sharedErrors.Add(1)
		}
	}
	return c.val, info, c.notFound, c.err
}

// staleOnError looks for a value to return instead of c's error: the key's
// current value if still within the windows (a stale one, or a fresh one a
// Set stored during the wait), or, failing that, the older value a Remote
// offered with the error. It looks afresh, so an Invalidate during the wait
// leaves nothing local to fall back on.
func (l *Loader[K, V]) staleOnError(cl *caller, key K, h uint64, c *call[K, V], now time.Duration) (v V, age time.Duration, ok bool) {
	if l.opts.StaleIfError == 0 || c.notFound || errors.Is(c.err, ErrClosed) {
		return v, 0, false
	}
	e := l.flights.latest(key, h)
	if e != nil && e.isNotFound() {
		e = nil // a cached not-found
	}
	for _, e := range [2]*entry[K, V]{e, c.fallback} {
		if e == nil {
			continue
		}
		switch p := l.phase(e, now); {
		case p == phaseExpired:
			continue
		case p != phaseFresh && !cl.acceptsStale(e.freshUntil, now):
			continue
		}
		return e.val, now - e.loadedAt, true
	}
	return v, 0, false
}

// refresh starts a background refresh of key from entry e, unless one is
// running, a failed one is backing off, or MaxRefreshes are running.
//
// With into not nil (GetMany with a LoadMany, no Reload), the refresh is
// one of into's calls, launched (and counted in Stats.Refreshes) with it by
// the caller; into takes one MaxRefreshes place for all its calls, with its
// first, and the caller gives it back if into stays empty.
func (l *Loader[K, V]) refresh(cl *caller, s *stripe, key K, h uint64, e *entry[K, V], now time.Duration, into *batch[K, V]) {
	after := e.refreshAfter.Load()
	if after > int64(now) || !e.refreshAfter.CompareAndSwap(after, refreshing) {
		return // backing off, or another Get is starting (or ran) one
	}
	if into == nil || !into.reserved {
		if !l.reserveRefresh() {
			e.refreshAfter.Store(after)
			return
		}
		if into != nil {
			into.reserved = true
		}
	}
	if !l.flights.startRefresh(cl, s, key, h, e, into) {
		if into == nil {
			l.stats.refreshing.Add(-1)
		}
		e.refreshAfter.Store(after)
		return
	}
	if into == nil {
		l.stats.refreshes.Add(1)
	}
}

// reserveRefresh takes one of the MaxRefreshes places for a background
// load, or counts it dropped.
func (l *Loader[K, V]) reserveRefresh() bool {
	if l.stats.refreshing.Add(1) > int64(l.opts.MaxRefreshes) {
		l.stats.refreshing.Add(-1)
		l.stats.refreshesDropped.Add(1)
		return false
	}
	return true
}

// Refresh reloads key in the background (with [Options.Reload] when the
// Loader holds a value for key). Until the new value is stored, Gets keep
// being answered from the current one. It joins a load of key in flight
// instead of starting a second one; a key with no value is loaded as if by
// a Get that nobody waits for. ctx gives the load its values (trace IDs),
// never its cancellation. Like every background load it counts in
// Stats.Refreshes and is bounded by [Options.MaxRefreshes]: one beyond the
// bound is dropped (Stats.RefreshesDropped). After Close, for a key whose
// Hash panics, and for a key not equal to itself (see [Options.Hash]), it
// does nothing. Refresh is safe for concurrent use.
func (l *Loader[K, V]) Refresh(ctx context.Context, key K) {
	if ctx == nil {
		return
	}
	h, err := l.hash(key)
	if err != nil || l.selfUnequal(key) {
		return
	}
	cl := callerOf(ctx, false) // user code: before counting in (rule 23)
	s, open := l.enterOp()
	if !open {
		return
	}
	defer l.exitOp(s)
	if l.flights.refreshNow(&cl, s, key, h) {
		l.stats.refreshes.Add(1)
	}
}

// Set stores value for key as if it had just been loaded. A load of key in
// flight when Set is called still delivers its result to its own waiters,
// but never overwrites the value Set stored. A Get that starts after Set
// returns sees value, until the cache evicts it (ristretto's admission
// policy may also refuse it at once when the cache is full, which
// Stats.SetsRejected counts).
//
// Set does not wait for the cache to apply the value, unless
// [Options.MaxPendingWrites] writes of Set and Invalidate are waiting for
// it already: then Set waits its turn, first come first served, until the
// cache has caught up by one (Stats.WriteWaits counts the Sets and
// Invalidates that waited). It never waits for a load. So a storm of Sets
// runs at the pace the cache applies them, in bounded memory.
//
// Set after Close does nothing; so does Set of a key whose Hash panics, and
// of a key not equal to itself (see [Options.Hash]).
func (l *Loader[K, V]) Set(key K, value V) {
	h, err := l.hash(key)
	if err != nil || l.selfUnequal(key) {
		return
	}
	// User code first, before counting in.
	cost, ok := l.costOf(value, nil)
	life, keep := l.lifeOf(key, value, nil)
	var mk func() *entry[K, V] // nil: cannot be costed, never fits, or not to be cached: drop the old one
	if ok && keep && !l.tooBig(cost) {
		mk = func() *entry[K, V] { return l.newEntry(key, value, l.now(), life, 0, l.generation.Load()) }
	} else {
		cost = 0
	}
	if l.write(key, h, mk, cost) {
		l.remoteSet(key, value)
	}
}

// Invalidate drops key's cached value. A load of key in flight delivers its
// result to its own waiters but does not write the cache; the next Get
// starts a fresh load. Like [Loader.Set] it may wait its turn behind
// [Options.MaxPendingWrites] other writes, never for a load, and it is
// never lost. Invalidate after Close does nothing.
func (l *Loader[K, V]) Invalidate(key K) {
	if l.drop(key) {
		l.remoteInvalidate(key)
	}
}

// drop is Invalidate without the Remote. It reports false when it did
// nothing (a Hash that panicked, or the Loader closed).
func (l *Loader[K, V]) drop(key K) bool {
	h, err := l.hash(key)
	if err != nil {
		return false
	}
	return l.write(key, h, nil, 0)
}

// write makes the entry mk builds (mk nil: none) key's value for Set and
// Invalidate, once it has a place among the pending writes (write.go). The
// entry is built then, so that a Set that waited is as new, and of the
// generation, of the moment it takes effect. It reports false after Close.
func (l *Loader[K, V]) write(key K, h uint64, mk func() *entry[K, V], cost int64) bool {
	s, open := l.enterOp()
	if !open {
		return false
	}
	defer l.exitOp(s)
	p, ok := l.writer.takeWrite(cost)
	if !ok {
		return false // closed while waiting
	}
	var e *entry[K, V]
	if mk != nil {
		e = mk()
	}
	w, back := l.flights.overwrite(key, h, e, cost, p)
	if w != nil {
		l.hand(w)
	}
	l.writer.giveBack(back) // the open write's old place, or p if there was nothing to drop
	return true
}

// InvalidateAll drops every key's value at once, in constant time whatever
// the cache holds: every value cached or pending is gone, every load in
// flight delivers its result to its own waiters but writes nothing (as
// Invalidate does for one key), and a Get that starts after InvalidateAll
// returns never sees a value from before it: not as a hit, a stale value,
// a stale-on-error fallback, nor as the old value of a Reload. The cache's
// memory is given back by the writer shortly after. With a Remote that
// implements [RemoteInvalidateAll] the shared tier is invalidated first,
// then this Loader's copies, so that no load of this process can fill the
// cache with a shared entry from before the call. It counts in
// Stats.InvalidateAlls; after Close it does nothing.
func (l *Loader[K, V]) InvalidateAll() {
	if l.closed.Load() {
		return
	}
	l.remoteInvalidateAll()
	l.dropAll()
}

// dropAll is InvalidateAll without the Remote. It reports false after
// Close.
func (l *Loader[K, V]) dropAll() bool {
	s, open := l.enterOp()
	if !open {
		return false
	}
	defer l.exitOp(s)
	l.writer.clears.Add(1) // before the floor moves: see write.go
	l.raiseFloor()
	l.stats.invalidateAlls.Add(1)
	l.writer.signal()
	return true
}

// Stats returns the Loader's counters. It never blocks Gets. It is safe to
// call at any time, also after Close.
func (l *Loader[K, V]) Stats() Stats {
	s := l.stats.snapshot()
	s.PendingWrites = l.writer.backlog.Load()
	s.WriteWaits = l.writer.turns.waited()
	l.guard(func() { s.Breaker = l.breaker.State() }, nil)
	return s
}

// mayHoldFloat reports whether values of t can hold a floating-point
// number, which may be a NaN: directly, or inside an interface value.
func mayHoldFloat(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.Interface:
		return true
	}
	return mayHold(t, mayHoldFloat)
}

// mayHoldInterface reports whether values of t can hold an interface value,
// whose dynamic type may not be comparable.
func mayHoldInterface(t reflect.Type) bool {
	return t.Kind() == reflect.Interface || mayHold(t, mayHoldInterface)
}

// mayHold reports whether t is an array or a struct with an element or a
// field for which f reports true.
func mayHold(t reflect.Type, f func(reflect.Type) bool) bool {
	switch t.Kind() {
	case reflect.Array:
		return f(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if f(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

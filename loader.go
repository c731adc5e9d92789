// Package flightcache is a cache-aside loader for an expensive downstream
// call: when a hot key expires and hundreds of requests miss at once, one
// load serves them all, so the downstream sees one call instead of hundreds.
//
// A [Loader] answers [Loader.Get] through these layers, outside in: a
// ristretto cache with jittered expiry and stale windows; single-flight, one
// load per key for every concurrent caller ([Options.Policy] for when they
// all leave); retries ([Retry]); a circuit breaker ([Breaker]); an optional
// bound on the calls at once ([Limit]); then the [LoadFunc] (or a
// [LoadManyFunc] for [Loader.GetMany]'s batches), under [Options.LoadTimeout].
// [Options.Remote] adds a tier shared by a fleet (package remote is its
// contract; the flightredis module implements it on Redis).
//
// Besides Get: [Loader.GetInfo] says where a value came from; [Loader.Set],
// [Loader.Invalidate], [Loader.InvalidateAll] and [Loader.InvalidateTag]
// write; [Loader.Refresh] and [Loader.Peek] never make a caller wait;
// [Loader.Entries] and [Loader.Restore] save and warm a cache; per call,
// [WithMaxStale] and [WithRevalidate]; [Loader.Stats], [Options.OnLoad] and
// [Options.Observer] tell what happened. A panic in user code reaches
// callers as a [*PanicError]; [Loader.Close] stops everything it started.
//
// The README is the first hour; docs/options.md every option;
// docs/design.md the architecture and the numbered rules the tests check;
// docs/observability.md metrics and traces ([Observer]); docs/distributed.md
// the Redis tier; docs/internals.md the Loader from inside.
package flightcache

import (
	"context"
	"errors"
	"hash/maphash"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/limit"
	"github.com/flightcache/flightcache/internal/loadctx"
	"github.com/flightcache/flightcache/remote"
)

// LoadFunc loads the value of key from the downstream. It runs on a
// goroutine of the Loader, under the load's own context: the values of the
// Get that started the load, never its cancellation, ending at LoadTimeout,
// Close or (under CancelAtZero) when every waiter has left; [context.Cause]
// tells which. Return an error matching [ErrNotFound] (or one
// [Options.IsNotFound] accepts) for a key that does not exist: any other
// error is a failure.
//
// NOTE: the value returned is shared by every caller and the cache: treat
// it as read-only. Load goroutines are reused: do not leave one locked to
// its thread (runtime.LockOSThread).
//
// WARNING: a LoadFunc that calls Get must pass its own ctx (or one derived
// from it), so that a Get of a key whose load it is part of fails with
// [ErrRecursiveLoad] instead of waiting on itself.
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
// [Loader.GetMany] and [Options.BatchWindow] (see [Options.LoadMany]),
// never with more than [Options.MaxBatch] keys nor a key twice. A key
// missing from its map does not exist ([ErrNotFound]); one not asked for is
// ignored. It runs as a LoadFunc does, through the same retries, breaker
// and LoadTimeout. An error fails every key of the call, unless it is a
// [*ManyError] (not wrapped): then each key in its Errs fails alone, and
// the others are answered from the map. A call that fails as a whole for
// keys of more than one caller is split down to the failing key
// (docs/design.md rules 15 and 31; docs/options.md, "Batches").
type LoadManyFunc[K comparable, V any] func(ctx context.Context, keys []K) (map[K]V, error)

// Loader is a cache-aside loader: a cache in front of a LoadFunc, with one
// load per key at a time. Create it with [New]; it is safe for concurrent
// use by any number of goroutines. Call [Loader.Close] when done with it, to
// stop its loads and free its goroutines.
type Loader[K comparable, V any] struct {
	// keyRules judge a key's entries and loads (entry.go): the windows,
	// the clock, the generation and the floor, the Limit's fullness. The
	// in-flight map is handed them as part of its port (flight.go).
	keyRules[K, V]
	loadFn   LoadFunc[K, V]
	opts     Options[K, V] // validated, defaults applied
	cache    *ristretto.Cache[uint64, *entry[K, V]]
	flights  flights[K, V]     // loads in flight and writes ristretto has not applied (flight.go)
	writer   writer[K, V]      // the goroutine that writes ristretto (write.go)
	pool     life.Pool         // the load goroutines
	gate     life.Gate         // counts calls in and out; refuses them after Close (loader.go)
	timeouts *loadctx.Timeouts // ends loads at LoadTimeout (downstream.go); apart from the Loader
	user     userCode          // the one guard around user code (callee.go)
	stats    counters
	obs      *observing[K] // calls Options.Observer (observing.go); nil when nothing is observed
	// callee holds the breaker, and says what a downstream call's error
	// means (callee.go).
	callee callee
	// gathers decides where a new load goes (route) and holds the open gathers single-key loads wait in
	// (Options.BatchWindow, batch.go).
	gathers gathers[K, V]
	// refreshPermits bounds the background loads (MaxRefreshes, downstream.go).
	refreshPermits refreshPermits
	seed           maphash.Seed
	// hashMayPanic: a custom Hash, or keys whose dynamic type may not be
	// comparable (an interface inside K): hashing goes through the guard.
	hashMayPanic bool
	checkKeys    bool // a custom Hash with such keys: check them as a map would
	nanKeys      bool // K can hold a float: a key may not equal itself (selfUnequal)

	// Shutdown (loader.go).
	ctx         context.Context         // the Loader's own work (Remote.Set, Remote.Invalidate); ends at Close
	stop        context.CancelCauseFunc // ends ctx
	tearingDown atomic.Bool             // ristretto's own Close evicts everything: do not count it
	closeDone   chan struct{}           // closed once everything has stopped
}

// New returns a Loader that loads missing keys with load. load may be nil
// when opts.LoadMany is set: every load is then a LoadMany call (a key
// loaded alone, a call of that one key), and [Options.Reload], if set,
// still reloads a key held. New returns an error naming the field if opts
// is invalid, or if load and opts.LoadMany are both nil.
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
		seed:      maphash.MakeSeed(),
		closeDone: make(chan struct{}),
	}
	l.keyRules.init(&opts, &l.gate)
	if load == nil {
		l.loadFn = l.loadOne
	}
	l.user = userCode{panics: &l.stats.panics}
	l.callee = newCallee(l.user, opts.Breaker, opts.Retry, opts.IsNotFound)
	l.checkKeys, l.hashMayPanic, l.nanKeys = keyChecks[K](opts.Hash != nil)
	l.refreshPermits.max = int64(opts.MaxRefreshes)
	l.lim = limit.New(opts.Limit.config(opts.LoadTimeout), l.now)
	l.gathers.init(l)
	l.writer.init(opts.MaxPendingWrites, opts.MaxCost)
	l.gate.Init()
	l.timeouts = newTimeouts(opts.LoadTimeout, l.epoch)
	if err := l.newCache(); err != nil {
		return nil, err
	}
	l.flights.init(port[K, V]{rules: &l.keyRules, cache: l.cache, router: &l.gathers, takeFill: l.writer.takeFill, stats: &l.stats})
	l.ctx, l.stop = context.WithCancelCause(context.Background())
	l.pool.Init(l.ctx.Done()) // made here, not by a load goroutine: it may run in a synctest bubble
	// Last, once Stats reads everything it reports; before anything can
	// load, write or evict (the writer, a watching Remote).
	l.obs = newObserving(opts.Observer, l.user.guard, l.Stats)
	l.writer.attach(l)
	go life.RunWriter(func() { l.writer.run(l.gate.Idle(), l.teardown) })
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

// keyChecks says what hashing keys of type K takes: whether a key may
// have a dynamic type that is not comparable (an interface inside K), so
// that a custom Hash's keys are checked as a map would (checkKeys) and
// hashing goes through the guard (mayPanic, also for any custom Hash);
// and whether a key may hold a float, which may be a NaN (nanKeys).
func keyChecks[K comparable](customHash bool) (checkKeys, mayPanic, nanKeys bool) {
	iface := mayHoldInterface(reflect.TypeFor[K]())
	return iface && customHash, customHash || iface, mayHoldFloat(reflect.TypeFor[K]())
}

// newCache makes the Loader's ristretto cache.
func (l *Loader[K, V]) newCache() error {
	cache, err := ristretto.NewCache(&ristretto.Config[uint64, *entry[K, V]]{
		NumCounters: l.opts.NumCounters,
		MaxCost:     l.opts.MaxCost,
		BufferItems: 64,
		// Costs are ours (1 per entry, or Options.Cost): without this,
		// ristretto adds its own item size and a small MaxCost keeps nothing.
		IgnoreInternalCost: true,
		OnEvict: func(item *ristretto.Item[*entry[K, V]]) {
			if l.tearingDown.Load() {
				return
			}
			clearing := l.writer.clearing.Load()
			if !clearing {
				l.stats.evicted.Add(1)
			}
			l.writer.noteEvicted(item.Value, item.Cost, clearing)
		},
		OnReject: func(item *ristretto.Item[*entry[K, V]]) {
			l.stats.setsRejected.Add(1)
			if !l.tearingDown.Load() {
				l.writer.refused(item.Value, item.Cost)
			}
		},
	})
	if err != nil {
		return optionError("MaxCost", "or NumCounters rejected by ristretto: %v", err)
	}
	l.cache = cache
	return nil
}

// loadOne is the LoadFunc of a Loader made without one: key's load is a
// LoadMany call for key alone; a key missing from its map does not exist,
// and a *ManyError fails it with key's own error (none for key: the map
// answers).
func (l *Loader[K, V]) loadOne(ctx context.Context, key K) (V, error) {
	m, err := l.opts.LoadMany(ctx, []K{key})
	if me, many := err.(*ManyError[K]); many { // a type assertion runs no user code
		err = nil
		if me != nil {
			err = me.Errs[key]
		}
	}
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
func (kr *keyRules[K, V]) now() time.Duration { return time.Since(kr.epoch) }

// hash returns key's hash. Hash (user code), or a key whose dynamic type is
// not comparable, may panic: that comes back as a *PanicError, before
// anything is counted or locked.
func (l *Loader[K, V]) hash(key K) (h uint64, err error) {
	if !l.hashMayPanic {
		return maphash.Comparable(l.seed, key), nil
	}
	err = l.user.guard(func() {
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
	if err = l.checkKey(key); err != nil {
		return v, info, err // the caller's key: no load, not a Get (Options.ValidateKey)
	}
	h, err := l.hash(key)
	if err != nil {
		return v, info, err
	}
	// The caller's context is user code (rule 23): the hit path reads
	// WithRevalidate from it, before counting in, and nothing else (not
	// Done: a cancel context makes its channel on the first call); the
	// other paths read the rest once (caller.full) before they start or
	// join anything. A hit builds no request unless a refresh is due: it
	// is serve, on the Get's own variables.
	cl := caller{ctx: ctx, revalidate: revalidating(ctx)}
	var in life.Gets
	if !l.gate.EnterGets(&in, 1) {
		return v, info, ErrClosed
	}
	defer l.exitGets(&in)
	g := l.flights.glance(h, key)
	now := l.now()
	if src := l.judge(&cl, g.e, now); src != SourceNone {
		answered(&in, src)
		if e := g.e; now < e.refreshAt() {
			return e.val, Info{Source: src, Age: now - e.loadedAt}, e.error()
		}
		return l.serve(&request[K, V]{key: key, h: h, cl: cl, s: in.Stripe(), g: g, start: now}, g.e, src)
	}
	r := request[K, V]{key: key, h: h, cl: cl, s: in.Stripe(), g: g, start: now, tagAt: l.tags.now()}
	a := l.wait(&r)
	answered(&in, a.outcome())
	if a.err == errCallerDone {
		a.err = ctx.Err()
	}
	if l.obs != nil && a.waited {
		l.obs.waited(ctx, waitEvent(key, l.epoch.Add(now), &a)) // the wait began at now: a late answer moves r.start
	}
	return a.v, a.info, a.err
}

// request is one Get's question about one key (a GetMany asks one per
// key): the key, who asks, and since when. It is what the read path
// passes along, instead of a list of positional arguments.
type request[K comparable, V any] struct {
	key   K
	h     uint64
	cl    caller         // read from its ctx once, on first need (who); revalidate is set before
	s     *life.Stripe   // the stripe the Get is counted on: a load it starts is counted in there
	g     glance[K, V]   // what the Get saw of key in the cache
	start time.Duration  // when it looked: its waits and ages count from here
	many  *batches[K, V] // the GetMany it belongs to, if batched: where its loads and refreshes go
	tagAt uint64         // the tag clock as it started (tags.go)
}

// who returns r's caller, reading its context the first time
// (caller.full).
func (r *request[K, V]) who() *caller { return r.cl.full() }

// judge is the read decision, the one place that says how a key's value
// answers a Get: e is the key's entry as cl's Get found it (in the cache, or in a
// write on its way there; nil: none). It returns SourceHit for a fresh
// value (or a cached not-found), SourceStale for one stale within
// StaleWhileRevalidate that r's caller accepts, and SourceNone when r must
// wait for a load: nothing held, cl revalidates (rule 14), the fleet wrote
// the key since (rule 18), or the value is past what cl accepts. It reads
// nothing but e, the clock value now and cl, so it may run under a shard
// lock (join), where cl is read already.
func (kr *keyRules[K, V]) judge(cl *caller, e *entry[K, V], now time.Duration) Source {
	switch {
	case e == nil || cl.revalidate || kr.distrusted(e) || kr.tagDropped(e):
		return SourceNone
	case now < e.freshUntil: // every window starts where freshness ends
		return SourceHit
	}
	return kr.judgeStale(cl, e, now)
}

// judgeStale is judge for a value past its freshness.
// Within StaleIfError, while Options.Limit has no slot free, the value
// answers at once (SourceStaleLimited, rule 22) rather than queue a load.
func (kr *keyRules[K, V]) judgeStale(cl *caller, e *entry[K, V], now time.Duration) Source {
	switch kr.phase(e, now) {
	case remote.PhaseStale:
		if cl.full().acceptsStale(e.freshUntil, now) {
			return SourceStale
		}
	case remote.PhaseStaleIfError:
		if kr.lim.Full() && cl.full().acceptsStale(e.freshUntil, now) {
			return SourceStaleLimited
		}
	}
	return SourceNone
}

// serve answers r with e, which judge found answers it as src, and starts
// the refresh e is due: a stale value's, or a fresh one's early refresh.
func (l *Loader[K, V]) serve(r *request[K, V], e *entry[K, V], src Source) (V, Info, error) {
	if r.start >= e.refreshAt() {
		if src == SourceStaleLimited {
			l.lim.CountStale() // no load: the downstream is at its limit
		} else {
			l.refresh(r, e)
		}
	}
	return e.val, Info{Source: src, Age: r.start - e.loadedAt}, e.error()
}

// answer is what a Get that waited got: its value, Info and error, and
// whether the error is a not-found (Options.IsNotFound), as the load
// judged it.
type answer[V any] struct {
	v      V
	info   Info
	nf     bool
	err    error
	served bool // answered at once from a value a write left (late): a hit or a stale hit, not a miss
	// waited: the Get waited on a load (the Observer's Waited is called);
	// load is that load's context, as the Observer made it (the last
	// load's, after collect's second try), read only when observed.
	waited bool
	load   context.Context
}

// waitEvent is the Waited event of a Get of key that waited on a load
// since start (never a hit, a stale hit, nor a late one: a.waited), with
// its answer a once final: a.err is ctx.Err() for a caller that left.
func waitEvent[K comparable, V any](key K, start time.Time, a *answer[V]) WaitEvent[K] {
	return WaitEvent[K]{Key: key, Info: a.info, Err: a.err, Start: start, Load: a.load}
}

// outcome is the Source a's Get is counted out by (gets.answer): its own
// for a value served at once, SourceNone for a miss.
func (a *answer[V]) outcome() Source {
	if a.served {
		return a.info.Source
	}
	return SourceNone
}

// wait answers r from key's load: it joins the load in flight or starts
// one (ask), then waits for it (collect). It is a frame of its own so
// that what a wait holds (the join, the answer) stays off GetInfo's
// frame, which every hit sets up.
func (l *Loader[K, V]) wait(r *request[K, V]) answer[V] {
	var j joined[K, V]
	l.ask(r, &j)
	return l.collect(r, &j)
}

// ask is the first join of a request the cache did not answer, into *j:
// its caller's context is read first, outside every lock.
func (l *Loader[K, V]) ask(r *request[K, V], j *joined[K, V]) {
	if r.who().revalidate {
		l.stats.revalidations.Add(1)
	}
	l.join(r, j)
}

// errCallerDone is what a wait returns when the caller's context ended first.
// The caller returns ctx.Err() instead, read once it has settled
// everything else (Err is the caller's code too: rule 23); errCallerDone never
// reaches the caller of a Get.
var errCallerDone = errors.New("flightcache: the caller's context ended")

// join is flights.join for a request the cache did not answer, but for a
// key not equal to itself (selfUnequal): that one is loaded alone, through
// the LoadFunc (a LoadMany result cannot be looked up by it), for this
// caller only, and leaves nothing behind. What it found goes in *j.
func (l *Loader[K, V]) join(r *request[K, V], j *joined[K, V]) {
	if !l.selfUnequal(r.key) {
		l.flights.join(r, j)
		return
	}
	c := l.flights.startAlone(r)
	if c == nil {
		*j = joined[K, V]{err: ErrClosed}
		return
	}
	*j = joined[K, V]{c: c, started: true}
}

// cached returns key's entry in the cache, or nil if there is none (or
// only a gone one, or another key's).
func (l *Loader[K, V]) cached(h uint64, key K) *entry[K, V] { return l.flights.cached(h, key) }

// selfUnequal reports whether key is not equal to itself (a float NaN in
// it): no map lookup finds such a key, nor any comparison with a cached
// entry's, so it is never kept anywhere (docs/design.md rule 24). Only the
// miss and write paths ask, and only for a K that can hold a float.
func (l *Loader[K, V]) selfUnequal(key K) bool { return l.nanKeys && key != key }

// collect waits out what join found for r and judges the result for r's
// caller. A load whose value is already too stale for r's caller (a Remote
// gave it, and the load carried only its starter's max-stale) is loaded
// once more, with r's bound.
func (l *Loader[K, V]) collect(r *request[K, V], j *joined[K, V]) (a answer[V]) {
	var waited *call[K, V] // the load a waited on, if any (on a second try, the first's)
	for again := false; ; again = true {
		if j.e != nil { // a load (or Set) finished as r looked: no need to wait
			a = l.late(r, j, again)
			break
		}
		if !again {
			l.stats.misses.Add(1)
			if j.reread {
				l.stats.rereads.Add(1)
			}
		}
		if j.err != nil {
			a = answer[V]{err: j.err}
			break
		}
		var stale bool
		a, stale = l.await(r, j, again)
		waited = j.c
		if !stale {
			break
		}
		r.g, r.many = glance[K, V]{}, nil
		l.join(r, j)
	}
	l.waitedOn(&a, waited)
	return a
}

// waitedOn marks a as the answer of a Get that waited on c (nil: on no
// load), with c's context as the Observer made it, for Observer.Waited.
func (l *Loader[K, V]) waitedOn(a *answer[V], c *call[K, V]) {
	if c != nil {
		a.waited = true
		if l.obs != nil {
			a.load = c.observed()
		}
	}
}

// late answers r with the value a write left for its key, not yet in the
// cache, which join found answers r (j.src), as the cache would have. On
// collect's second try the Get is counted as a miss already: it is not
// served again.
func (l *Loader[K, V]) late(r *request[K, V], j *joined[K, V], again bool) answer[V] {
	r.start = l.now()
	v, info, err := l.serve(r, j.e, j.src)
	return answer[V]{v: v, info: info, nf: j.e.isNotFound(), err: err, served: !again}
}

// await waits for j's load (or for r's context) and judges its result for
// r: a stale value covers a failure (staleOnError). stale reports a value
// too stale for r's caller, which collect loads again, unless this was
// that second try already.
func (l *Loader[K, V]) await(r *request[K, V], j *joined[K, V], again bool) (a answer[V], stale bool) {
	c := j.c
	if !j.counted {
		l.stats.waiting.Add(1)
	}
	select {
	case <-c.done:
	case <-r.cl.done:
		if l.flights.leave(c) {
			l.stats.waiting.Add(-1)
			l.stats.canceled.Add(1)
			return answer[V]{info: Info{Waited: l.now() - r.start}, err: errCallerDone}, false
		}
		<-c.done // the result was delivered as ctx ended: it is ours
	}
	l.stats.waiting.Add(-1)
	// The wait ended with the load, not when this goroutine woke or, in a
	// GetMany, got round to this key: Waited and Age are as of then (never
	// before the caller started: the clock was read before the join).
	end := max(min(c.res.ended, l.now()), r.start)
	a = answer[V]{v: c.res.val, info: Info{Source: SourceShared, Waited: end - r.start}, nf: c.res.notFound, err: c.res.err}
	if j.started {
		a.info.Source = SourceLoaded
	}
	switch {
	case c.res.err != nil:
		if v, age, ok := l.staleOnError(r, c, end); ok {
			l.stats.staleOnErrors.Add(1)
			return answer[V]{v: v, info: Info{Source: SourceStaleOnError, Age: age, Waited: a.info.Waited}}, false
		}
	case !again && end >= c.res.freshUntil && !r.cl.acceptsStale(c.res.freshUntil, end):
		return a, true
	case !again && c.res.tags.droppedFor(r.tagAt): // rule 37
		return a, true
	default:
		a.info.Age = end - c.res.loadedAt
	}
	if !j.started {
		l.stats.shared.Add(1)
		if c.res.err != nil {
			l.stats.sharedErrors.Add(1)
		}
	} else {
		l.stats.loaded.Add(1)
	}
	return a, false
}

// staleOnError looks for a value to return instead of c's error: the key's
// current value if still within the windows (a stale one, or a fresh one a
// Set stored during the wait), or, failing that, the older value a Remote
// offered with the error. It looks afresh, so an Invalidate during the wait
// leaves nothing local to fall back on. StaleMayCover inspects the error,
// user code's, so through the guard: an error that panics is covered, as a
// *PanicError is.
func (l *Loader[K, V]) staleOnError(r *request[K, V], c *call[K, V], now time.Duration) (v V, age time.Duration, ok bool) {
	if l.opts.StaleIfError == 0 {
		return v, 0, false
	}
	cover := true
	if l.user.guard(func() { cover = remote.StaleMayCover(c.res.err, c.res.notFound) }, nil); !cover {
		return v, 0, false
	}
	e := l.flights.latest(r.key, r.h)
	if e != nil && e.isNotFound() {
		e = nil // a cached not-found
	}
	for _, e := range [2]*entry[K, V]{e, c.res.fallback} {
		if e == nil {
			continue
		}
		switch p := l.phase(e, now); {
		case p == remote.PhaseExpired:
			continue
		case p != remote.PhaseFresh && !r.cl.acceptsStale(e.freshUntil, now):
			continue
		}
		return e.val, now - e.loadedAt, true
	}
	return v, 0, false
}

// held returns cur if it is a value the Loader still holds for its key
// (fresh, stale or within StaleIfError), which a Reload revalidates; nil
// when there is no Reload, or a tag of cur was invalidated since it was
// stored (rule 36).
func (kr *keyRules[K, V]) held(cur *entry[K, V], now time.Duration) *entry[K, V] {
	if !kr.reloads || cur == nil || cur.isNotFound() || kr.tagDropped(cur) || kr.phase(cur, now) == remote.PhaseExpired {
		return nil
	}
	return cur
}

// refresh starts a background refresh of r's key from entry e, unless one
// is running, a failed one is backing off, or MaxRefreshes are running. In
// a batched GetMany the refresh is one of the GetMany's background batch's
// calls (batches.background), launched and counted with it.
func (l *Loader[K, V]) refresh(r *request[K, V], e *entry[K, V]) {
	if e.isNotFound() {
		return // a cached not-found is never refreshed
	}
	after := e.refreshAfter.Load()
	if after > int64(r.start) || !e.refreshAfter.CompareAndSwap(after, refreshing) {
		return // backing off, or another Get is starting (or ran) one
	}
	var into *batch[K, V]
	if r.many != nil {
		into = r.many.background()
	}
	r.who() // before the lock: its context is user code
	started, batched := l.flights.startRefresh(r, e, into)
	if !started {
		e.refreshAfter.Store(after)
		return
	}
	if !batched { // a batch counts as one refresh (batches.launch, gathers.hold)
		l.stats.refreshes.Add(1)
	}
}

// Refresh reloads key in the background (with [Options.Reload] when the
// Loader holds a value for it): Gets keep being answered from the current
// value until the new one is stored, and a load of key in flight is joined
// (docs/design.md rule 12). ctx gives the load its values, never its
// cancellation. It counts in Stats.Refreshes, bounded by
// [Options.MaxRefreshes] (Stats.RefreshesDropped past it). After Close,
// and for a key that cannot be cached or is invalid, it does nothing.
// Refresh is safe for concurrent use.
func (l *Loader[K, V]) Refresh(ctx context.Context, key K) {
	if ctx == nil || l.checkKey(key) != nil {
		return
	}
	h, err := l.hash(key)
	if err != nil || l.selfUnequal(key) {
		return
	}
	r := request[K, V]{key: key, h: h, cl: caller{ctx: ctx}}
	r.who() // user code: before counting in (rule 23)
	r.start = l.now()
	s, open := l.gate.EnterOp()
	if !open {
		return
	}
	defer l.gate.ExitOp(s)
	r.s = s
	if l.flights.refreshNow(&r) {
		l.stats.refreshes.Add(1)
	}
}

// Peek returns key's value if it is fresh ([SourceHit]) or within
// StaleWhileRevalidate ([SourceStale]), without loading or refreshing
// anything, and ok false otherwise. It counts in Stats.Peeks, never in
// Gets. Peek is safe for concurrent use; after Close it finds nothing.
func (l *Loader[K, V]) Peek(key K) (v V, info Info, ok bool) {
	l.stats.peeks.Add(1)
	h, err := l.hash(key)
	if err != nil || l.gate.Closed() {
		return v, info, false
	}
	e := l.cached(h, key)
	if e == nil {
		e = l.flights.latest(key, h) // a write on its way into the cache
	}
	if e == nil || e.isNotFound() {
		return v, info, false
	}
	cl := caller{read: true} // a caller that accepts any stale value the windows allow
	now := l.now()
	// Not a value judge answers stale-limited either: that one stands in
	// for a load a Get would have queued for (rule 22), and a Peek starts
	// none; past StaleWhileRevalidate it finds nothing (rule 16).
	if src := l.judge(&cl, e, now); src == SourceHit || src == SourceStale {
		return e.val, Info{Source: src, Age: now - e.loadedAt}, true
	}
	return v, info, false
}

// Stats returns the Loader's counters. It never blocks Gets. It is safe to
// call at any time, also after Close.
func (l *Loader[K, V]) Stats() Stats {
	s := l.stats.snapshot(&l.gate)
	s.PendingWrites = l.writer.backlog.Load()
	s.WriteWaits = l.writer.turns.Waits()
	s.fillLimit(l.lim.Counts())
	l.user.guard(func() { s.Breaker = l.callee.breaker.State() }, nil)
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

// How a Loader shuts down: its gate (internal/life); docs/internals.md, "Shutdown".

// Close stops the Loader: later Gets return [ErrClosed], Set and Invalidate
// do nothing, loads and refreshes in flight have their contexts cancelled
// (their waiters get ErrClosed), and Close waits for every goroutine the
// Loader started before it frees the cache. It is idempotent and always
// returns nil.
//
// WARNING: Close waits for LoadFuncs to return; one that ignores its
// context delays Close until it does. [Loader.Shutdown] bounds the wait.
//
// NOTE: Close called from a callback (a LoadFunc, an Observer, Evicted...)
// cannot wait for itself: it starts the shutdown and returns at once, and
// the Loader finishes closing when the callback ends. It returns at once
// from another Loader's callback too; a later Close from outside waits.
func (l *Loader[K, V]) Close() error {
	l.shutdown()
	if life.OnPool() || life.OnWriter() {
		return nil
	}
	<-l.closeDone
	return nil
}

// Shutdown is [Loader.Close] that waits at most until ctx ends: it stops the
// Loader as Close does and returns nil once every goroutine of the Loader
// has ended, or ctx.Err() if ctx ends first (the Loader then finishes
// closing in the background). Like Close, it may be called more than once,
// and concurrently with Close.
func (l *Loader[K, V]) Shutdown(ctx context.Context) error {
	l.shutdown()
	select {
	case <-l.closeDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown closes the gate, once, and cancels every load.
func (l *Loader[K, V]) shutdown() {
	if !l.gate.Close() {
		return
	}
	l.stop(ErrClosed)      // the context Remote.Set and Remote.Invalidate run under
	l.writer.turns.Close() // Sets and Invalidates waiting their turn do nothing
	l.lim.Close()          // loads waiting for a downstream slot get ErrClosed
	l.flights.cancelAll(ErrClosed)
	l.gate.CheckIdle()
}

// answered counts one Get of in as answered: from a fresh value
// (SourceHit), at once with a stale one (SourceStale), or after the
// in-flight map (any other Source: a miss, counted in Stats.Misses where
// it waited).
func answered(in *life.Gets, src Source) {
	switch src {
	case SourceHit:
		in.Hit()
	case SourceStale, SourceStaleLimited:
		in.Stale()
	default:
		in.Passed()
	}
}

// exitGets counts out the Gets in let in. It is their one way out,
// deferred as soon as the gate has let them in, so the count balances
// whatever panics on the way (a Get's caller's context is the caller's
// code: docs/design.md rule 23). A Get a panic cut short before it was
// answered leaves as a miss that its context ended (Misses, Canceled).
func (l *Loader[K, V]) exitGets(in *life.Gets) {
	if cut := in.Unanswered(); cut > 0 {
		l.stats.misses.Add(cut)
		l.stats.canceled.Add(cut)
	}
	l.gate.ExitGets(in)
}

// teardown frees the cache; the writer goroutine runs it once the Loader is
// closed and idle, so nothing else can be inside ristretto.
func (l *Loader[K, V]) teardown() {
	l.tearingDown.Store(true)
	l.timeouts.Stop()
	l.cache.Close()
	l.pool.Wait() // idle ones leave at ctx's end; busy ones are done
	l.obs.close() // every counter is final: a StatsObserver's stats freeze
	close(l.closeDone)
}

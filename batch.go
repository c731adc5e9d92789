package flightcache

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Batches. A GetMany answers each key as Get would, but the keys it has to
// load (no value it may return, no load in flight) are loaded together by
// Options.LoadMany. Coalescing stays per key: each key of a LoadMany call
// is a load of its own (a call, published in its key's shard like any
// other), so a Get or another GetMany of that key joins it, and Set,
// Invalidate, finish and leave treat it as they treat any load. What the
// calls of one LoadMany share is a batch: one goroutine, one downstream
// call, one context (its first call's), and one report.
//
// A GetMany, step by step:
//
//  1. Each distinct key is hashed; the caller's context is read (callerOf)
//     and the keys are counted in. Each is looked up in the cache: a fresh
//     or acceptable stale value answers it at once (a stale one, or one due
//     an early refresh, joins the GetMany's background batch).
//  2. Every other key is joined (flights.join) with the GetMany's current
//     batch as the place for a load it starts; a batch holds MaxBatch keys,
//     then a new one opens. A key whose load is in flight is joined, not
//     loaded again; a Reload of a value held goes alone.
//  3. The batches are launched, one goroutine each; then the GetMany waits
//     for each key in turn (await, as a Get does).
//
// Under CancelAtZero a batch is cancelled when the last of its keys has no
// caller left (leave → abandon), never before: one key's callers leaving
// does not fail the others'.

// batch is one LoadMany call and the loads it answers.
type batch[K comparable, V any] struct {
	l          *Loader[K, V]
	background bool
	// Written by the GetMany that fills the batch, under the shard lock of
	// the call it adds; read by the batch's goroutine, and (leader) by
	// whoever finds one of its calls in a shard map.
	calls  []*call[K, V]
	leader *call[K, V] // calls[0]: its context is the batch's
	wanted atomic.Int32
	slot   *stripe // the stripe the goroutine is counted on (lifecycle)

	abandoned atomic.Bool
	reserved  bool // a background batch holds a MaxRefreshes place (GetMany's goroutine)
	// Written by the batch's goroutine as it delivers each call.
	callers int
	stored  bool
	writes  []*write[K, V] // the writes its calls opened: handed to the writer together (completeBatch)
}

func (l *Loader[K, V]) newBatch(background bool) *batch[K, V] {
	return &batch[K, V]{l: l, background: background}
}

// full reports whether b holds MaxBatch calls.
func (b *batch[K, V]) full() bool { return b != nil && len(b.calls) >= b.l.opts.MaxBatch }

// add makes c, just started and not yet visible to anyone (its shard lock
// is held), one of b's calls. It returns false if b is full.
func (b *batch[K, V]) add(c *call[K, V]) bool {
	if b.full() {
		return false
	}
	if b.leader == nil {
		b.leader = c
		c.lctx.marker.call = b // a Get from inside LoadMany of any of its keys is recursive
	}
	c.batch = b
	b.calls = append(b.calls, c)
	if !c.background {
		b.wanted.Add(1)
	}
	return true
}

// abandon records that one of b's calls has no caller left (CancelAtZero),
// and cancels b when none of them has.
func (b *batch[K, V]) abandon() {
	if b.wanted.Add(-1) == 0 {
		b.abandoned.Store(true)
		b.cancel(errAbandoned)
	}
}

// cancel cancels b's context, its leader's. The caller holds no lock.
func (b *batch[K, V]) cancel(cause error) {
	c := b.leader
	sh := b.l.flights.shard(c.h)
	sh.mu.Lock()
	cancel := c.cancelLocked(cause)
	sh.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// launchBatch starts b's goroutine, counted on s (see launch).
func (l *Loader[K, V]) launchBatch(b *batch[K, V], s *stripe) {
	b.slot = s
	l.spawn(b, s)
}

// runBatch is the body of a batch's goroutine: one LoadMany call, then
// each key's result delivered as its own load's.
func (l *Loader[K, V]) runBatch(b *batch[K, V]) {
	start := l.now()
	b.leader.buildContext(start)
	keys := make([]K, len(b.calls))
	for i, c := range b.calls {
		keys[i] = c.key
	}
	var m map[K]V
	var remote map[K]RemoteResult[V]
	err := ErrGoexit // stays if LoadMany (or the Remote) ends the goroutine
	attempts := 0
	defer func() { l.completeBatch(b, m, remote, err, attempts, l.now()-start) }()
	l.takeLabels(b.leader.lctx.caller)
	ctx := &b.leader.lctx
	rm, ok := l.opts.Remote.(RemoteMany[K, V])
	if !ok {
		m, err = l.loadMany(ctx, keys, &attempts)
		return
	}
	var res map[K]RemoteResult[V]
	if perr := l.guard(func() {
		res = rm.LoadMany(ctx, keys, func(ctx context.Context, keys []K) (map[K]V, error) {
			return l.loadMany(ctx, keys, &attempts)
		})
	}, nil); perr != nil {
		err = perr
		return
	}
	remote, err = res, nil
}

// fromRemote is one key's loaded result from a RemoteMany's.
func fromRemote[V any](rr RemoteResult[V], found bool, r *loaded[V]) {
	if !found {
		r.err = ErrNotFound
		return
	}
	r.val, r.err = rr.Value, rr.Err
	if rr.Err != nil {
		if !rr.LoadedAt.IsZero() {
			r.fallback = &rr.RemoteValue
		}
		return
	}
	r.remote = !rr.Loaded
	if rr.Took > 0 {
		r.took = rr.Took
	}
	if !rr.LoadedAt.IsZero() {
		r.age = max(time.Since(rr.LoadedAt), 0)
	}
}

// completeBatch delivers each of b's calls its key's result (complete, as
// for a single load) and reports the batch once. The results are m (or
// err, for every key) from LoadMany, or remote's from a RemoteMany.
func (l *Loader[K, V]) completeBatch(b *batch[K, V], m map[K]V, remote map[K]RemoteResult[V], err error, attempts int, took time.Duration) {
	// Count before any waiter wakes, as deliver does for a single load.
	l.stats.inFlight.Add(-1)
	l.stats.loads.Add(1)
	l.stats.batchLoads.Add(1)
	l.stats.batchKeys.Add(uint64(len(b.calls)))
	if err != nil {
		l.stats.loadErrors.Add(1)
	}
	if b.background {
		l.stats.refreshing.Add(-1)
	}
	nf := false // err is a not-found: judged below, once for all the keys
	next := 0
	defer func() {
		// A Freshness or Cost that called Goexit stops the loop below:
		// its own call got its value (uncached); the rest get ErrGoexit.
		for _, c := range b.calls[next:] {
			l.complete(c, &loaded[V]{err: ErrGoexit, attempts: attempts, took: took})
		}
		l.handAll(b.writes) // one handover for the batch, not one per key
		b.writes = nil
		l.reportBatch(b, err, nf, attempts, took)
	}()
	nf = l.notFound(err) // user code: after the defer, which covers a Goexit
	for next < len(b.calls) {
		c := b.calls[next]
		next++
		r := loaded[V]{attempts: attempts, took: took}
		if err != nil {
			r.err, r.nf, r.judged = err, nf, true
		} else if remote != nil {
			rr, ok := remote[c.key]
			fromRemote(rr, ok, &r)
		} else if v, ok := m[c.key]; ok {
			r.val = v
		} else {
			r.err, r.nf, r.judged = ErrNotFound, true, true
		}
		l.complete(c, &r)
	}
}

// reportBatch reports b once it is delivered: Stats and OnLoad. nf: err
// is a not-found.
func (l *Loader[K, V]) reportBatch(b *batch[K, V], err error, nf bool, attempts int, took time.Duration) {
	if b.abandoned.Load() {
		l.stats.abandoned.Add(1)
	}
	l.stats.noteCallers(b.callers)
	if l.opts.OnLoad == nil {
		return
	}
	ev := LoadEvent[K]{
		Key: b.leader.key, Duration: took, Err: err, NotFound: nf, Attempts: attempts, Background: b.background,
		Callers: b.callers, Abandoned: b.abandoned.Load(), Stored: b.stored, Keys: len(b.calls),
	}
	l.guard(func() { l.opts.OnLoad(ev) }, nil)
}

// dedupeOnStack is how many keys (duplicates included) GetMany dedupes
// without allocating.
const dedupeOnStack = 256

// GetMany returns the values of keys: each key answered as [Loader.Get]
// would (a hit, a stale value with its refresh, a load), with the misses
// that no load is in flight for loaded together by [Options.LoadMany] (or
// each through the LoadFunc, all at once, without it). The map holds every
// key that has a value; a key that does not exist (a not-found:
// [ErrNotFound], or [Options.IsNotFound]) is absent. The error is nil when
// every key has a value or does not exist; otherwise it is a [*ManyError]
// that holds each failed key's error (a key covered by a stale value under
// StaleIfError is not failed), and the map still holds every key that has
// a value. If ctx ends first, GetMany returns the values it has and
// ctx.Err(), and the loads go on according to [Options.Policy]. Duplicate
// keys are allowed. Each distinct key counts as one Get in Stats. GetMany
// is safe for concurrent use; after Close it returns [ErrClosed].
func (l *Loader[K, V]) GetMany(ctx context.Context, keys []K) (map[K]V, error) {
	vals, _, err := l.getMany(ctx, keys, false)
	return vals, err
}

// GetManyInfo is [Loader.GetMany] that also says where each key's answer
// came from: infos holds an [Info] for every distinct key of keys, the
// one [Loader.GetInfo] would have returned for that key at that moment (a
// hit, a stale value, a load this call started or one it shared, a stale
// value covering a failure), also for a key absent from vals (a
// not-found, a failed key: GetInfo too returns an Info with its error; a
// key whose wait ctx ended: [SourceNone]). A key's Waited runs from the
// call's start until that key's load ended, and its Age is as of then,
// however long the call then waits for its other keys. vals and the error
// are GetMany's; infos is nil when vals is (a nil ctx, Close, a key whose
// Hash panics).
func (l *Loader[K, V]) GetManyInfo(ctx context.Context, keys []K) (vals map[K]V, infos map[K]Info, err error) {
	return l.getMany(ctx, keys, true)
}

// getMany is GetMany, with each key's Info when withInfo is set (and
// nothing more to pay for it when not).
func (l *Loader[K, V]) getMany(ctx context.Context, keys []K, withInfo bool) (map[K]V, map[K]Info, error) {
	if ctx == nil {
		return nil, nil, errNilContext
	}
	type item struct {
		key K
		h   uint64
		j   joined[K, V]
	}
	items := make([]item, 0, len(keys))
	// Duplicates are dropped: up to dedupeOnStack keys (duplicates
	// included) through a table on the stack, open addressing over the
	// keys' hashes (index + 1 into items; 0 is empty), beyond through a
	// map. The table needs equal keys to have equal hashes, which
	// maphash.Comparable promises and a custom Hash may not (+0 and -0 are
	// equal float64 keys): with Options.Hash, always the map.
	var table [2 * dedupeOnStack]uint16
	var seen map[K]struct{}
	if len(keys) > dedupeOnStack || l.opts.Hash != nil {
		seen = make(map[K]struct{}, len(keys))
	}
next:
	for _, key := range keys {
		h, err := l.hash(key) // first: a key no map can hold fails here
		if err != nil {
			return nil, nil, err
		}
		if seen != nil {
			if _, dup := seen[key]; dup {
				continue
			}
			seen[key] = struct{}{}
		} else {
			i := h % uint64(len(table))
			for ; table[i] != 0; i = (i + 1) % uint64(len(table)) {
				if it := &items[table[i]-1]; it.h == h && it.key == key {
					continue next
				}
			}
			table[i] = uint16(len(items) + 1)
		}
		items = append(items, item{key: key, h: h})
	}
	// The caller's context is user code: read before anything is counted
	// or published (rule 23). Each key is counted out as it is answered
	// (answer); exitGet counts out any a panic kept it from answering.
	cl := callerOf(ctx, revalidating(ctx))
	revalidate := cl.revalidate
	n := uint64(len(items))
	s, ok := l.enterGet(n)
	if !ok {
		return nil, nil, ErrClosed
	}
	answered := uint64(0)
	defer func() { l.exitGet(s, nil, n-answered) }()
	answer := func(outcome *atomic.Uint64) {
		outcome.Add(1)
		answered++
	}

	out := make(map[K]V, len(items))
	var infos map[K]Info // nil: not asked for
	if withInfo {
		infos = make(map[K]Info, len(items))
	}
	now := l.now()
	_, remoteMany := l.opts.Remote.(RemoteMany[K, V])
	batched := l.opts.LoadMany != nil && (l.opts.Remote == nil || remoteMany)
	var fg, bg *batch[K, V]
	var batches []*batch[K, V]
	refresh := func(key K, h uint64, e *entry[K, V]) {
		if !batched || l.opts.Reload != nil {
			// A Reload needs each key's value held: refreshed one by one.
			l.refresh(&cl, s, key, h, e, now, nil)
			return
		}
		if bg == nil || bg.full() {
			bg = l.newBatch(true)
			batches = append(batches, bg)
		}
		l.refresh(&cl, s, key, h, e, now, bg)
	}
	waits := items[:0]
	for _, it := range items {
		g := l.flights.glance(it.h, it.key)
		e := g.e
		switch {
		case e == nil, revalidate, l.distrusted(e): // rule 18: read it again
		case l.phase(e, now) == phaseFresh:
			if now >= e.refreshAt() && !e.isNotFound() {
				refresh(it.key, it.h, e)
			}
			answer(&s.hits)
			if !e.isNotFound() {
				out[it.key] = e.val
			}
			if infos != nil {
				infos[it.key] = Info{Source: SourceHit, Age: now - e.loadedAt}
			}
			continue
		case l.phase(e, now) == phaseStale && cl.acceptsStale(e.freshUntil, now):
			refresh(it.key, it.h, e)
			answer(&s.stale)
			out[it.key] = e.val
			if infos != nil {
				infos[it.key] = Info{Source: SourceStale, Age: now - e.loadedAt}
			}
			continue
		}
		if revalidate {
			l.stats.revalidations.Add(1)
		}
		if batched && (fg == nil || fg.full()) {
			fg = l.newBatch(false)
			batches = append(batches, fg)
		}
		it.j = l.join(&cl, s, it.key, it.h, g, now, fg)
		if e := it.j.stale; e != nil {
			// Stale in a write not yet in the cache: as a stale hit, its
			// refresh in the background batch.
			l.stats.lateStale.Add(1)
			answer(&s.passed)
			out[it.key] = e.val
			if infos != nil {
				infos[it.key] = Info{Source: SourceStale, Age: now - e.loadedAt}
			}
			refresh(it.key, it.h, e)
			continue
		}
		if it.j.c != nil {
			// The GetMany waits on all of its keys' loads from now on,
			// though it reads their results in turn.
			l.stats.waiting.Add(1)
			it.j.counted = true
		}
		waits = append(waits, it)
	}
	for _, b := range batches {
		switch {
		case len(b.calls) > 0:
			if b.background {
				l.stats.refreshes.Add(1)
			}
			l.launchBatch(b, s)
		case b.reserved:
			l.stats.refreshing.Add(-1) // its MaxRefreshes place, unused
		}
	}

	var failed map[K]error
	left := false // the caller's context ended: the GetMany left the loads it had not got yet
	for _, it := range waits {
		v, info, nf, err := l.await(&cl, s, it.key, it.h, now, false, it.j)
		answer(&s.passed)
		if infos != nil {
			infos[it.key] = info
		}
		switch {
		case err == nil:
			out[it.key] = v
		case err == errLeft:
			left = true
		case nf: // absent (Options.IsNotFound)
		default:
			if failed == nil {
				failed = make(map[K]error)
			}
			failed[it.key] = err
		}
	}
	switch {
	case left:
		return out, infos, ctx.Err() // user code, read now that every key is answered
	case failed != nil:
		return out, infos, &ManyError[K]{Errs: failed}
	}
	return out, infos, nil
}

// ManyError reports the keys [Loader.GetMany] could not load, each with
// its error. errors.Is and errors.As see every one of them (Unwrap), so
// errors.Is(err, ErrBreakerOpen) works on a batch.
type ManyError[K comparable] struct {
	Errs map[K]error
}

// Error summarises: how many keys failed, and the distinct errors.
func (e *ManyError[K]) Error() string {
	msgs := make([]string, 0, len(e.Errs))
	for _, err := range e.Unwrap() {
		msgs = append(msgs, err.Error())
	}
	slices.Sort(msgs)
	msgs = slices.Compact(msgs)
	return fmt.Sprintf("flightcache: %d of the keys failed: %s", len(e.Errs), strings.Join(msgs, "; "))
}

// Unwrap returns the distinct errors of the failed keys (by ==; an error
// whose value cannot be compared, a struct holding a map say, is distinct).
func (e *ManyError[K]) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil && !slices.ContainsFunc(errs, func(o error) bool { return sameError(o, err) }) {
			errs = append(errs, err)
		}
	}
	return errs
}

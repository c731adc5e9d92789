package flightcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/limit"
)

// Batches: a GetMany's keys loaded together, one LoadMany call a batch (docs/internals.md, "Batches").

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
	stripe *life.Stripe // the stripe the goroutine is counted on (lifecycle)
	gather *gatherWait  // a gather single-key loads join (batch.go); nil for a GetMany's

	abandoned atomic.Bool
	joined    atomic.Bool                     // a caller other than the one that started it joined one of its calls (flights.join): a failed call is split (bisect)
	permitted bool                            // a background batch holds a MaxRefreshes permit, taken by its first call (route)
	limSlot   limit.Slot                      // and its Limit slot, taken with it (a gather's: as its call goes out, gathers.takeSlot)
	octx      atomic.Pointer[context.Context] // the LoadMany call's context as the Observer made it (call.octx)
	// distinct is how many keys its LoadMany call is for (fewer than its
	// calls when a gather holds two for one key): what its events and
	// Stats.BatchKeys count. Written by its goroutine before the call.
	distinct int
	// from are the loads its calls were started from besides its
	// leader's (markCalls): written by its goroutine before the call,
	// read-only after.
	from []*loadMarker
	// Written by the batch's goroutine as it delivers each call.
	callers    int
	stored     bool
	writes     []*write[K, V]    // the writes its calls opened: handed to the writer together (batch.complete)
	departures []departure[K, V] // what its calls made leave the cache, reported with the batch (EvictionObserver)
}

func newBatch[K comparable, V any](l *Loader[K, V], background bool) *batch[K, V] {
	return &batch[K, V]{l: l, background: background}
}

// full reports whether b holds MaxBatch calls.
func (b *batch[K, V]) full() bool { return b != nil && len(b.calls) >= b.l.opts.MaxBatch }

// add makes c, just started and not yet visible to anyone (its shard lock
// is held), one of b's calls; b is not full (flights.start checks). A
// background call has taken the MaxRefreshes permit of the batch.
func (b *batch[K, V]) add(c *call[K, V]) {
	if b.leader == nil {
		b.leader = c
		c.vals.marker.id = b // a Get from inside LoadMany of any of its keys is recursive (and see markCalls)
	}
	c.batch = b
	b.calls = append(b.calls, c)
	if c.background {
		b.permitted = true
	} else {
		b.wanted.Add(1)
	}
}

// markCalls makes the batch's context, its leader's, recognised as
// coming from every load one of its calls was started from, not only the
// leader's: a call that joined a gather another load's Get opened keeps
// its own starter's chain, so a Get from inside LoadMany that closes a
// cycle through it fails with ErrRecursiveLoad instead of waiting
// LoadTimeout. Run by the batch's goroutine before its call, once its
// calls are settled (a gather is sealed); a batch whose calls share the
// leader's starter, as a GetMany's do, adds nothing.
func (b *batch[K, V]) markCalls() {
	for _, c := range b.calls[1:] {
		if p := c.vals.marker.parent; p != nil && p != b.leader.vals.marker.parent && !slices.Contains(b.from, p) {
			b.from = append(b.from, p)
		}
	}
}

func (b *batch[K, V]) alsoFrom() []*loadMarker { return b.from }

// abandon records that c, one of b's calls, has no caller left
// (CancelAtZero), and cancels b when none of them has. A gather still
// open drops c instead (gathers.drop).
func (b *batch[K, V]) abandon(c *call[K, V]) {
	if b.gather != nil && b.l.gathers.drop(b, c) {
		return
	}
	if b.wanted.Add(-1) == 0 {
		b.abandoned.Store(true)
		b.cancel(errAbandoned)
	}
}

// cancel cancels b's context, its leader's. The caller holds no lock.
func (b *batch[K, V]) cancel(cause error) {
	b.l.flights.cancelLoad(b.leader, cause)
}

// launch starts b's goroutine, counted on s (see launch).
func (b *batch[K, V]) launch(s *life.Stripe) {
	l := b.l
	b.stripe = s
	l.spawn(b, s)
}

// run is the body of a batch's goroutine: one LoadMany call, then
// each key's result delivered as its own load's.
func (b *batch[K, V]) run() {
	l := b.l
	start := l.now()
	b.leader.buildContext(start)
	keys := b.keys()
	b.distinct = len(keys)
	b.markCalls()
	out := batchResult[K, V]{err: ErrGoexit, down: tally{lctx: &b.leader.lctx, background: b.background && !b.queues()}} // err stays if LoadMany (or the Remote) ends the goroutine
	defer func() {
		out.took = l.now() - start - out.down.queued
		if b.gather != nil && b.gather.leaderGone { // dropped from its gather: no delivery ends its context
			b.leader.endContext()
		}
		b.complete(&out)
	}()
	l.takeLabels(b.leader.vals.caller)
	var ctx context.Context = &b.leader.lctx
	if l.obs != nil {
		ctx = l.obs.observeStart(&b.leader.lctx, b.leader.vals.caller, &b.octx, LoadStartEvent[K]{Key: keys[0], Keys: len(keys), Background: b.background})
	}
	rm, ok := l.opts.Remote.(RemoteMany[K, V])
	if !ok {
		out.m, out.err = b.loadMany(ctx, keys, &out.down)
		if many, alone := out.err.(*ManyError[K]); alone { // its keys failed one by one
			out.many, out.err = many, nil
		}
		return
	}
	var res map[K]RemoteResult[V]
	if perr := l.user.guard(func() {
		res = rm.LoadMany(ctx, keys, func(ctx context.Context, keys []K) (map[K]V, error) {
			return b.loadMany(ctx, keys, &out.down) // a *ManyError: the Remote fails those keys alone
		})
	}, nil); perr != nil {
		out.err = perr
		return
	}
	out.remote, out.err = res, nil
}

// batchResult is what one LoadMany call (or RemoteMany call) produced.
type batchResult[K comparable, V any] struct {
	m      map[K]V               // LoadMany's values
	remote map[K]RemoteResult[V] // or the RemoteMany's results
	err    error                 // or an error for every key
	many   *ManyError[K]         // or, with m, the keys that failed alone (callee.go, batch.go)
	nf     bool                  // err is a not-found (judged once, by batch.complete)
	down   tally                 // what its LoadMany calls did
	took   time.Duration         // how long the call took, its wait for a Limit slot not included
}

// complete delivers each of b's calls its key's result (complete, as
// for a single load) and reports the batch once.
func (b *batch[K, V]) complete(out *batchResult[K, V]) {
	l := b.l
	l.loadEnded(out.failure(), b.background, b.limSlot) // before any waiter wakes, as deliver does for a single load
	l.stats.batchLoads.Add(1)
	l.stats.batchKeys.Add(uint64(b.distinct))
	next := 0
	defer func() {
		// A Freshness or Cost that called Goexit stops the loop below:
		// its own call got its value (uncached); the rest get ErrGoexit.
		for _, c := range b.calls[next:] {
			l.complete(c, &loaded[V]{err: ErrGoexit, down: out.down, took: out.took})
		}
		l.writer.handAll(b.writes) // one handover for the batch, not one per key
		b.writes = nil
		b.report(out)
	}()
	if out.err != nil { // user code: after the defer, which covers a Goexit
		out.nf = l.callee.classifyLoad(&out.err, nil)
		if out.nf { // the call's; each key's is counted as it is delivered
			l.stats.loadNotFounds.Add(1)
		}
	}
	for next < len(b.calls) {
		c := b.calls[next]
		next++
		var r loaded[V]
		out.of(c.key, &r)
		l.complete(c, &r)
	}
}

// of sets *r to key's own result in out. A value of LoadMany's own map
// was loaded here, in the call's time: what fromRemote makes of a Remote's
// value it loaded (Loaded, no Took of its own), without building one.
func (out *batchResult[K, V]) of(key K, r *loaded[V]) {
	*r = loaded[V]{down: out.down, took: out.took}
	var found bool
	switch {
	case out.err != nil:
		r.err, r.nf, r.judged = out.err, out.nf, true
		return
	case out.remote != nil:
		var rr RemoteResult[V]
		if rr, found = out.remote[key]; found {
			r.fromRemote(rr, out.took)
		}
	case out.many != nil:
		if r.err = out.many.Errs[key]; r.err != nil { // judged as a single load's error (complete)
			return
		}
		fallthrough
	default:
		r.val, found = out.m[key]
	}
	if !found {
		r.err, r.nf, r.judged = ErrNotFound, true, true
	}
}

// failure is the call's error: its own, or its *ManyError (one of
// Stats.LoadErrors, and LoadEvent.Err); nil if it has none.
func (out *batchResult[K, V]) failure() error {
	if out.many != nil {
		return out.many
	}
	return out.err
}

// report reports b once it is delivered: Stats, OnLoad and the
// Observer's LoadEnd.
func (b *batch[K, V]) report(out *batchResult[K, V]) {
	l := b.l
	if b.abandoned.Load() {
		l.stats.abandoned.Add(1)
	}
	l.stats.noteCallers(b.callers)
	if l.opts.OnLoad == nil && l.obs == nil {
		return
	}
	l.report(b.leader.observed(), LoadEvent[K]{
		Key: b.calls[0].key, Duration: out.took, Err: out.failure(), NotFound: out.nf, Attempts: int(out.down.calls), Background: b.background,
		Callers: b.callers, Abandoned: b.abandoned.Load(), Stored: b.stored, Keys: b.distinct, Queued: out.down.queued,
	})
	deps := b.departures
	b.departures = nil
	for _, d := range deps {
		l.depart(d)
	}
}

// dedupeOnStack is how many keys (duplicates included) GetMany dedupes
// without allocating.
const dedupeOnStack = 256

// GetMany returns the values of keys, each key answered as [Loader.Get]
// would, the misses no load is in flight for loaded together by
// [Options.LoadMany] (docs/design.md rule 15). The map holds every key that
// has a value; a key that does not exist is absent. The error is nil when
// every key has a value or does not exist, else a [*ManyError] of the
// failed keys, beside the map. If ctx ends first, GetMany returns what it
// has and ctx.Err(). Duplicate keys are allowed; each distinct key counts
// as one Get. GetMany is safe for concurrent use; after Close it returns
// [ErrClosed].
func (l *Loader[K, V]) GetMany(ctx context.Context, keys []K) (map[K]V, error) {
	vals, _, err := l.getMany(ctx, keys, false)
	return vals, err
}

// GetManyInfo is [Loader.GetMany] that also gives, for every distinct key,
// the [Info] [Loader.GetInfo] would have returned for it at that moment
// (SourceNone for a key whose wait ended or that was invalid), its Waited
// and Age as of when that key's load ended. infos is nil when vals is.
func (l *Loader[K, V]) GetManyInfo(ctx context.Context, keys []K) (vals map[K]V, infos map[K]Info, err error) {
	return l.getMany(ctx, keys, true)
}

// getMany is GetMany, with each key's Info when withInfo is set (and
// nothing more to pay for it when not): each distinct key asked as a Get
// asks (judge, serve, ask, collect), the loads it starts batched.
func (l *Loader[K, V]) getMany(ctx context.Context, keys []K, withInfo bool) (map[K]V, map[K]Info, error) {
	if ctx == nil {
		return nil, nil, errNilContext
	}
	ks, err := l.distinct(keys)
	if err != nil {
		return nil, nil, err
	}
	ks, rejected := l.validKeys(ks)
	// The caller's context is user code: read before anything is counted
	// or published (rule 23).
	cl := callerOf(ctx, revalidating(ctx))
	var in life.Gets
	if !l.gate.EnterGets(&in, uint64(len(ks))) {
		return nil, nil, ErrClosed
	}
	defer l.exitGets(&in)
	res := newMany[K, V](len(ks), withInfo, rejected)
	now := l.now()
	asks := request[K, V]{cl: cl, s: in.Stripe(), start: now, many: newBatches(l), tagAt: l.tags.now()} // what each key's request shares
	waits := ks[:0]
	for i := range ks {
		if !l.askOne(&ks[i], &asks, &in, &res) {
			waits = append(waits, ks[i])
		}
	}
	asks.many.launch(in.Stripe())
	var quit []manyCallerDone[K, V] // the waits ctx ended, for the Observer once ctx.Err() is read
	for i := range waits {
		k := &waits[i]
		r := asks
		r.key, r.h, r.many = k.key, k.h, nil
		a := l.collect(&r, &k.j)
		answered(&in, a.outcome())
		res.add(k.key, a)
		switch {
		case l.obs == nil || !a.waited:
		case a.err == errCallerDone:
			quit = append(quit, manyCallerDone[K, V]{k.key, a})
		default:
			l.obs.waited(ctx, waitEvent(k.key, l.epoch.Add(now), &a))
		}
	}
	err = res.err(ctx)
	for _, w := range quit {
		w.a.err = err // ctx.Err(), read once (res.err)
		l.obs.waited(ctx, waitEvent(w.key, l.epoch.Add(now), &w.a))
	}
	return res.vals, res.infos, err
}

// manyCallerDone is a key of a GetMany whose wait its context ended, with its
// answer.
type manyCallerDone[K comparable, V any] struct {
	key K
	a   answer[V]
}

// askOne takes k, a GetMany's key, as far as a Get would before it waits:
// answered from the cache, or from a value a write left, it reports true;
// else it keeps the load it joined (or started) in k.j, for collect. asks
// is what the GetMany's requests share; k's own is built from it only when
// needed: as in GetInfo, a value that answers with no refresh due is
// served without one.
func (l *Loader[K, V]) askOne(k *manyKey[K, V], asks *request[K, V], in *life.Gets, res *manyResult[K, V]) bool {
	g := l.flights.glance(k.h, k.key)
	src := l.judge(&asks.cl, g.e, asks.start)
	if src != SourceNone && asks.start < g.e.refreshAt() {
		answered(in, src)
		res.hit(k.key, g.e, Info{Source: src, Age: asks.start - g.e.loadedAt})
		return true
	}
	r := *asks
	r.key, r.h, r.g = k.key, k.h, g
	if src != SourceNone {
		v, info, err := l.serve(&r, g.e, src)
		answered(in, src)
		res.add(k.key, answer[V]{v: v, info: info, nf: g.e.isNotFound(), err: err})
		return true
	}
	r.many.open()
	if l.ask(&r, &k.j); k.j.e != nil {
		a := l.late(&r, &k.j, false)
		answered(in, a.outcome())
		res.add(k.key, a)
		return true
	}
	if k.j.c != nil {
		// The GetMany waits on all of its keys' loads from now on, though
		// it reads their results in turn.
		l.stats.waiting.Add(1)
		k.j.counted = true
	}
	return false
}

// validKeys asks Options.ValidateKey about each distinct key of a GetMany
// (checkKey), before anything is counted: it returns the keys it accepts,
// in ks's storage, and the rejected ones with their errors, which fail
// alone, in the ManyError, never counted as Gets.
func (l *Loader[K, V]) validKeys(ks []manyKey[K, V]) (valid []manyKey[K, V], rejected []rejectedKey[K]) {
	if l.opts.ValidateKey == nil {
		return ks, nil
	}
	valid = ks[:0]
	for _, k := range ks {
		if err := l.checkKey(k.key); err != nil {
			rejected = append(rejected, rejectedKey[K]{k.key, err})
			continue
		}
		valid = append(valid, k)
	}
	return valid, rejected
}

// rejectedKey is a key of a GetMany that Options.ValidateKey rejected,
// with the error it fails with.
type rejectedKey[K comparable] struct {
	key K
	err error
}

// manyKey is one distinct key of a GetMany, with its hash and what its
// join found.
type manyKey[K comparable, V any] struct {
	key K
	h   uint64
	j   joined[K, V]
}

// distinct hashes keys and drops their duplicates: up to dedupeOnStack
// keys (duplicates included) through a table on the stack, open addressing
// over the keys' hashes (index + 1 into the result; 0 is empty), beyond
// through a map. The table needs equal keys to have equal hashes, which
// maphash.Comparable promises and a custom Hash may not (+0 and -0 are
// equal float64 keys): with Options.Hash, always the map. A key whose
// hash fails (one no map can hold, a Hash that panics) fails it all.
func (l *Loader[K, V]) distinct(keys []K) ([]manyKey[K, V], error) {
	ks := make([]manyKey[K, V], 0, len(keys))
	var table [2 * dedupeOnStack]uint16
	var seen map[K]struct{}
	if len(keys) > dedupeOnStack || l.opts.Hash != nil {
		seen = make(map[K]struct{}, len(keys))
	}
next:
	for _, key := range keys {
		h, err := l.hash(key)
		if err != nil {
			return nil, err
		}
		if seen != nil {
			if _, dup := seen[key]; dup {
				continue
			}
			seen[key] = struct{}{}
		} else {
			i := h % uint64(len(table))
			for ; table[i] != 0; i = (i + 1) % uint64(len(table)) {
				if k := &ks[table[i]-1]; k.h == h && k.key == key {
					continue next
				}
			}
			table[i] = uint16(len(ks) + 1)
		}
		ks = append(ks, manyKey[K, V]{key: key, h: h})
	}
	return ks, nil
}

// manyResult is what a GetMany returns, gathered key by key.
type manyResult[K comparable, V any] struct {
	vals       map[K]V
	infos      map[K]Info // nil: not asked for
	failed     map[K]error
	callerDone bool // the caller's context ended: the GetMany left the loads it had not got yet
}

// newMany is the result of a GetMany of n distinct keys, with the keys
// ValidateKey rejected answered already.
func newMany[K comparable, V any](n int, withInfo bool, rejected []rejectedKey[K]) manyResult[K, V] {
	m := manyResult[K, V]{vals: make(map[K]V, n)}
	if withInfo {
		m.infos = make(map[K]Info, n)
	}
	for _, k := range rejected {
		m.add(k.key, answer[V]{err: k.err})
	}
	return m
}

// hit records key's answer from e, a cached entry that answers it with
// info: its value, or nothing for a cached not-found.
func (m *manyResult[K, V]) hit(key K, e *entry[K, V], info Info) {
	if m.infos != nil {
		m.infos[key] = info
	}
	if !e.isNotFound() {
		m.vals[key] = e.val
	}
}

// add records key's answer: its value, nothing for a not-found
// (Options.IsNotFound), or its error.
func (m *manyResult[K, V]) add(key K, a answer[V]) {
	if m.infos != nil {
		m.infos[key] = a.info
	}
	switch {
	case a.err == nil:
		m.vals[key] = a.v
	case a.err == errCallerDone:
		m.callerDone = true
	case a.nf:
	default:
		if m.failed == nil {
			m.failed = make(map[K]error)
		}
		m.failed[key] = a.err
	}
}

// err is the GetMany's error: ctx's (user code, read now that every key is
// answered) if it left, else the failed keys', else nil.
func (m *manyResult[K, V]) err(ctx context.Context) error {
	switch {
	case m.callerDone:
		return ctx.Err()
	case m.failed != nil:
		return &ManyError[K]{Errs: m.failed}
	}
	return nil
}

// batches are the LoadMany calls one GetMany fills; nil when it does not
// batch (no LoadMany, or a Remote that cannot load batches): the
// foreground batch open now, the background one for its refreshes (none
// with a Reload: each refresh needs its key's value), and every batch
// opened, to launch.
type batches[K comparable, V any] struct {
	l      *Loader[K, V]
	fg, bg *batch[K, V]
	all    []*batch[K, V]
}

func newBatches[K comparable, V any](l *Loader[K, V]) *batches[K, V] {
	if _, ok := l.opts.Remote.(RemoteMany[K, V]); l.opts.LoadMany == nil || (l.opts.Remote != nil && !ok) {
		return nil
	}
	return &batches[K, V]{l: l}
}

// open makes room in the foreground batch, fg, for one more call: before
// a join, which may start a load that joins fg.
func (bs *batches[K, V]) open() {
	if bs != nil && (bs.fg == nil || bs.fg.full()) {
		bs.fg = newBatch(bs.l, false)
		bs.all = append(bs.all, bs.fg)
	}
}

// background is the batch a refresh started now joins, with room for it;
// nil: it goes alone.
func (bs *batches[K, V]) background() *batch[K, V] {
	if bs.l.opts.Reload != nil {
		return nil
	}
	if bs.bg == nil || bs.bg.full() {
		bs.bg = newBatch(bs.l, true)
		bs.all = append(bs.all, bs.bg)
	}
	return bs.bg
}

// launch starts every batch that got calls, counted on s.
func (bs *batches[K, V]) launch(s *life.Stripe) {
	if bs == nil {
		return
	}
	for _, b := range bs.all {
		if len(b.calls) == 0 {
			continue
		}
		if b.background {
			bs.l.stats.refreshes.Add(1)
		}
		b.launch(s)
	}
}

// ManyError reports the keys [Loader.GetMany] could not load, each with its
// error; errors.Is and errors.As see every one of them (Unwrap). A
// [LoadManyFunc] returns one, with its map, to fail some keys of its call
// alone.
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

// Splitting a failed batch (docs/design.md rule 31; docs/internals.md, "Batches").

// loadMany is load for b's LoadMany call of keys (each distinct): one
// downstream call with retries and the breaker, holding one slot of
// Options.Limit for it and for its split (bisect), which follows if it
// fails as a whole and splits says so. A *ManyError comes back as such: a
// key in it failed alone.
func (b *batch[K, V]) loadMany(ctx context.Context, keys []K, t *tally) (map[K]V, error) {
	l := b.l
	if l.lim != nil && !t.background && !t.held {
		s, err := l.admit(ctx, t)
		if err != nil {
			return nil, err
		}
		t.held = true
		defer func() { t.held = false; s.Release() }()
	}
	var got manyAnswer[K, V]
	m, err := callDownstream(l, ctx, b.manyCall(ctx, keys, &got), false, t)
	if m, err = got.of(l.user, m, err); err == nil || !b.splits(ctx, keys, err) {
		return m, err
	}
	return b.bisect(ctx, keys, err, t)
}

// splits reports whether b's call of keys, which failed as a whole with
// err, is split: it has more than one key, its keys came from more than
// one caller (b is a gather, or another caller joined one of its keys),
// its context has not ended, and err is not one that would answer every
// part as it answered the whole: a not-found, the breaker's refusal,
// ErrLimited, or a *ManyError (its keys failed one by one already).
func (b *batch[K, V]) splits(ctx context.Context, keys []K, err error) bool {
	l := b.l
	if len(keys) < 2 || ctx.Err() != nil || (b.gather == nil && !b.joined.Load()) {
		return false
	}
	if _, many := err.(*ManyError[K]); many {
		return false
	}
	return l.callee.splittable(err)
}

// splittable reports whether a part that failed with err (not nil) is to
// be split: not a not-found, not a refusal of the breaker or of
// Options.Limit. err is user code's: inspected through the guard, and a
// panic says no.
func (c *callee) splittable(err error) (ok bool) {
	c.user.guard(func() {
		ok = !c.notFound(err) && !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, ErrLimited)
	}, nil)
	return ok
}

// part is some of the keys of a split call, with the error of the last
// call that held them.
type part[K comparable] struct {
	keys []K
	err  error
}

// halves splits p's keys in two; each half keeps p's error. The halves do
// not share capacity: a LoadManyFunc that appends to its keys cannot
// overwrite the other half.
func (p part[K]) halves() (part[K], part[K]) {
	mid := len(p.keys) / 2
	return part[K]{p.keys[:mid:mid], p.err}, part[K]{p.keys[mid:], p.err}
}

// bisect splits b's call of keys, which failed as a whole with err, and
// answers each key from the tries of its parts: a map of the values, and
// a *ManyError of each key that failed (alone, or with a part that could
// not be split further), nil if none did.
func (b *batch[K, V]) bisect(ctx context.Context, keys []K, err error, t *tally) (map[K]V, error) {
	l := b.l
	vals := make(map[K]V, len(keys))
	errs := make(map[K]error) // a split follows a failure: some key is likely to fail
	fail := func(keys []K, err error) {
		for _, k := range keys {
			errs[k] = err
		}
	}
	a, z := part[K]{keys, err}.halves()
	queue := []part[K]{a, z} // breadth first: both halves of a part before either is split
	for i := 0; i < len(queue); i++ {
		p := queue[i]
		queue[i] = part[K]{}
		switch {
		case ctx.Err() != nil: // Close, LoadTimeout, every caller gone
			fail(p.keys, l.callee.stopped(ctx, t.overdue(l.now()), p.err, p.err))
			continue
		case !b.wants(p.keys):
			fail(p.keys, p.err)
			continue
		}
		var got manyAnswer[K, V]
		m, _, err := callOnce(l, ctx, b.manyCall(ctx, p.keys, &got), false, t)
		m, err = got.of(l.user, m, l.callee.stopped(ctx, t.overdue(l.now()), err, err))
		many, alone := err.(*ManyError[K]) // got.of's: the keys that failed alone
		switch {
		case err == nil:
		case alone:
			maps.Copy(errs, many.Errs)
		case len(p.keys) == 1 || ctx.Err() != nil || !l.callee.splittable(err):
			fail(p.keys, err)
			continue
		default:
			p.err = err
			a, z := p.halves()
			queue = append(queue, a, z)
			continue
		}
		keepValues(vals, m, p.keys, errs)
	}
	if len(errs) == 0 {
		return vals, nil
	}
	return vals, &ManyError[K]{Errs: errs}
}

// keepValues copies into vals the values m holds for keys, but for the
// keys that failed (in errs).
func keepValues[K comparable, V any](vals, m map[K]V, keys []K, errs map[K]error) {
	for _, k := range keys {
		if _, failed := errs[k]; failed {
			continue
		}
		if v, ok := m[k]; ok {
			vals[k] = v
		}
	}
}

// wants reports whether a try of keys, some of b's, would reach a caller:
// always, but under CancelAtZero, where it does only if one of their calls
// still has one (a refresh always does) or a key is not one of its calls'
// (a key not equal to itself: kept, to be safe).
func (b *batch[K, V]) wants(keys []K) bool {
	if b.l.opts.Policy != CancelAtZero {
		return true
	}
	in := make(map[K]struct{}, len(keys))
	for _, k := range keys {
		in[k] = struct{}{}
	}
	for _, c := range b.calls {
		if _, ok := in[c.key]; ok && !b.l.flights.abandoned(c) {
			return true
		}
	}
	for _, c := range b.calls {
		delete(in, c.key)
	}
	return len(in) > 0
}

// Where a load goes (route) and the gathers of Options.BatchWindow (docs/internals.md, "Batches").

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
		a.opened.launch(a.s)
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
		b = newBatch(g.l, n.background)
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

// Flush sends every open batch window ([Options.BatchWindow]) at once, in
// its LoadMany call, instead of at the window's end: a caller that has
// asked for everything it will (a GraphQL resolver at the end of a level)
// spares its misses the wait (docs/design.md rule 39). It never waits for
// a load; with no window open, and after Close, it does nothing. It is safe
// for concurrent use.
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

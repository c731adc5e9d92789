package flightcache

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/limit"
	"github.com/flightcache/flightcache/internal/loadctx"
	"github.com/flightcache/flightcache/internal/timing"
	"github.com/flightcache/flightcache/remote"
)

// The downstream path of one load, outside in:
//
//	Remote (if any) → retry (backoff/v4) → breaker → LoadFunc
//
// Retries wrap the breaker, so every attempt asks the breaker first and a
// refusal ends the retries at once (it is marked backoff.Permanent). The
// whole sequence runs under the load's context, whose deadline is
// LoadTimeout. Each load gets its own ExponentialBackOff: it is not safe for
// concurrent use. Every call of user code on this path goes through guard,
// and so does every look at an error user code returned (inspect).

// loaded is what one load produced.
type loaded[V any] struct {
	val      V
	err      error
	reload   bool             // Options.Reload was called with the value held
	notMod   bool             // and said ErrNotModified
	old      V                // the value it was given
	down     tally            // what its downstream calls did
	end      time.Duration    // when the LoadFunc path returned, if fetch read the clock then (0: complete reads it)
	took     time.Duration    // how long the value took to load, wherever it was; here, from the Limit slot on
	age      time.Duration    // how old the value already is (from a Remote)
	remote   bool             // the value came from the Remote without a load here
	fallback *remote.Value[V] // with err: an older value the Remote offers to cover it
	nf       bool             // err is a not-found (callee.notFound), once judged
	judged   bool             // nf is set
}

// fetch gets key's value for one load, into r: through the Remote if there
// is one, else straight down the downstream path. start is when the load
// started (its deadline counts from it: timeouts.Add). r.attempts counts
// LoadFunc calls as they start; the other fields are set when fetch
// returns (a callee that ends the goroutine leaves them as they were).
func (l *Loader[K, V]) fetch(ctx context.Context, key K, old *entry[K, V], start time.Duration, r *loaded[V]) {
	if old != nil { // set by the caller only with a Reload
		r.reload, r.old = true, old.val
	}
	defer func() {
		if r.reload && r.err != nil { // a Remote's error may be its own: inspected here
			l.user.inspect(&r.err, func() { r.notMod = errors.Is(r.err, ErrNotModified) }, nil)
		}
	}()
	if l.opts.Remote == nil {
		v, err := l.load(ctx, key, old, &r.down)
		r.end = l.now()
		r.val, r.err, r.took = v, err, r.end-start-r.down.queued
		return
	}
	var rv remote.Value[V]
	var err error
	if perr := l.user.guard(func() {
		rv, err = l.opts.Remote.Load(ctx, key, func(ctx context.Context) (V, error) {
			o := old
			if fleet, ok := remote.ReloadValue[V](ctx); ok && l.opts.Reload != nil {
				o = &entry[K, V]{key: key, val: fleet} // the tier's value: revalidate that one
				r.reload, r.old = true, fleet
			}
			return l.load(ctx, key, o, &r.down)
		})
	}, nil); perr != nil {
		*r = loaded[V]{err: perr, down: r.down}
		return
	}
	r.fromRemote(remote.Result[V]{RemoteValue: rv, Err: err}, l.now()-start-r.down.queued)
}

// fromRemote is the result of a load the Remote answered with rr (a
// RemoteMany, for each key of a batch), which took here long (the whole
// call, for a batch), its wait for a Limit slot (r.down.queued) not
// included. A value the Remote did not load in this call comes with its
// own Took, or none; one it loaded took its own Took less that wait, which
// the Remote's clock cannot tell from the load, or here if it does not say.
// An error comes with an older value to cover it, if the Remote offers one.
func (r *loaded[V]) fromRemote(rr remote.Result[V], here time.Duration) {
	r.val, r.err = rr.Value, rr.Err
	if rr.Err != nil {
		if !rr.LoadedAt.IsZero() {
			fb := rr.RemoteValue // a copy: rr itself stays off the heap
			r.fallback = &fb
		}
		return
	}
	r.remote = !rr.Loaded
	r.took = rr.Took
	if rr.Loaded {
		r.took -= r.down.queued
	}
	if r.took <= 0 && rr.Loaded {
		r.took = here
	}
	if !rr.LoadedAt.IsZero() {
		r.age = max(time.Since(rr.LoadedAt), 0)
	}
}

// tally is what one load's downstream calls did, kept as they happen, so
// that a call that ends the goroutine leaves it as it was.
type tally struct {
	lctx       *loadctx.Context // the load's own context: its LoadTimeout starts again when a queued load gets its slot
	queued     time.Duration    // how long the load waited for a slot of Options.Limit; not part of its took
	calls      int32            // LoadFunc (or Reload, or LoadMany) calls made, saturating at MaxInt32
	background bool             // a refresh, which holds its Limit slot since it was published (route), or since its gather went out (gathers.takeSlot)
	held       bool             // a LoadMany call that holds its Limit slot already, for its split too (loadMany)
}

// overdue reports whether the load's LoadTimeout has passed at now, its
// context ended or not (callee.stopped).
func (t *tally) overdue(now time.Duration) bool { return t.lctx != nil && t.lctx.Overdue(now) }

// load runs the LoadFunc for key with retries and the breaker, under ctx.
// It counts the LoadFunc calls it makes in t as they start, so that the
// count survives a call that ends the goroutine.
func (l *Loader[K, V]) load(ctx context.Context, key K, old *entry[K, V], t *tally) (V, error) {
	call := func() (v V, err error) { v, err = l.loadFn(ctx, key); return }
	if old != nil {
		call = func() (v V, err error) { v, err = l.opts.Reload(ctx, key, old.val); return }
	}
	return callDownstream(l, ctx, call, old != nil, t)
}

// callDownstream makes one downstream call (a LoadFunc's, a Reload's or a
// LoadMany's) with retries and the breaker, under ctx, holding a slot of
// Options.Limit for all its attempts (admit).
func callDownstream[T any, K comparable, V any](l *Loader[K, V], ctx context.Context, call func() (T, error), reload bool, t *tally) (v T, err error) {
	if l.lim != nil && !t.background && !t.held {
		s, err := l.admit(ctx, t)
		if err != nil {
			return v, err
		}
		defer s.Release()
	}
	if l.opts.Retry.MaxAttempts <= 1 {
		v, _, err = callOnce(l, ctx, call, reload, t)
		return v, l.callee.stopped(ctx, t.overdue(l.now()), err, err)
	}
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(min(l.opts.Retry.InitialInterval, maxBackoff)),
		backoff.WithMaxInterval(min(l.opts.Retry.MaxInterval, maxBackoff)),
		backoff.WithMaxElapsedTime(0), // LoadTimeout bounds the load instead
	)
	policy := backoff.WithContext(backoff.WithMaxRetries(bo, uint64(l.opts.Retry.MaxAttempts-1)), ctx)
	var last error
	op := func() (T, error) {
		v, final, err := callOnce(l, ctx, call, reload, t)
		if err != nil {
			last = err
			if final {
				return v, backoff.Permanent(err)
			}
		}
		return v, err
	}
	// backoff inspects an error it may retry (errors.As, for its
	// Permanent): user code, so its loop runs through the guard too.
	if perr := l.user.guard(func() { v, err = backoff.RetryNotifyWithData(op, policy, l.obs.retried(ctx, t)) }, nil); perr != nil {
		var zero T
		v, err, last = zero, perr, perr
	}
	return v, l.callee.stopped(ctx, t.overdue(l.now()), err, last)
}

// admit takes the slot of Options.Limit that a foreground load's
// downstream calls hold; callDownstream calls it only with a Limit, and
// not for a background load, which holds its slot since it was published.
// An open breaker fails the load at once: it never queues for
// a downstream that would refuse it. A load that waits for its slot is
// taken off the LoadTimeout list when the limiter says it waits (the wait
// is bounded by MaxWait, and its context keeps the deadline it had), and
// has its LoadTimeout started again once it has its slot. ErrLimited is
// never retried and never reaches the breaker.
func (l *Loader[K, V]) admit(ctx context.Context, t *tally) (limit.Slot, error) {
	if l.callee.breakerIsOpen() {
		l.stats.breakerRejected.Add(1)
		err := l.callee.openRefusal()
		l.obs.attempted(ctx, AttemptEvent[K]{Attempt: int(t.calls) + 1, Err: err, Rejected: true})
		return limit.Slot{}, err
	}
	waited := false
	s, queued, err := l.lim.Acquire(ctx, func() {
		if waited = t.lctx != nil; waited {
			l.timeouts.Remove(t.lctx)
		}
	})
	t.queued = queued
	if waited && err == nil {
		l.timeouts.Add(t.lctx, l.now())
	}
	return s, limitError(err)
}

// maxBackoff caps the intervals handed to backoff/v4, which spreads an
// interval to up to 1.5× in floating point and converts it back unchecked:
// past about MaxInt64/1.5 the wait would overflow into a negative one, a
// retry at once. Half of MaxInt64 (146 years) is as good as forever.
const maxBackoff = time.Duration(math.MaxInt64 / 2)

// callOnce makes one downstream call through the breaker, counting it in
// t.calls and Stats.DownstreamCalls (and in Stats.Retries past the first)
// unless the breaker refuses it; final reports that its error is not to be retried (classify). A panic
// in the LoadFunc, or in a method of its error, becomes a *PanicError; a
// runtime.Goexit is reported to the breaker as a failure on its way out
// (the load goroutine's deferred complete gives the waiters ErrGoexit).
func callOnce[T any, K comparable, V any](l *Loader[K, V], ctx context.Context, call func() (T, error), reload bool, t *tally) (v T, final bool, err error) {
	done, err := l.callee.allow()
	if err != nil {
		l.stats.breakerRejected.Add(1)
		l.obs.attempted(ctx, AttemptEvent[K]{Attempt: int(t.calls) + 1, Err: err, Rejected: true})
		return v, true, err
	}
	l.stats.downstreamCalls.Add(1)
	if t.calls = min(t.calls, math.MaxInt32-1) + 1; t.calls > 1 {
		l.stats.retries.Add(1)
	}
	outcome := OutcomeFailure // a panic or a Goexit
	called := false           // the call returned or panicked: not a Goexit
	begun := l.lim.Begin()
	defer func() {
		if !called {
			l.callee.keepCause(ErrGoexit)
		}
		l.user.guard(func() { done(outcome) }, nil)
		if l.lim != nil { // the attempt's latency and outcome, for an adaptive bound
			l.lim.Sample(begun, limitSample(outcome, timedOut(ctx) || t.overdue(l.now())))
		}
	}()
	perr := l.user.guard(func() { v, err = call() }, nil)
	called = true
	if perr != nil {
		var zero T
		l.callee.keepCause(perr)
		return zero, true, perr
	}
	if err == nil {
		outcome = OutcomeSuccess
		return v, false, nil
	}
	var ok bool
	if outcome, final, ok = l.callee.classify(ctx, &err, reload); !ok {
		var zero T
		l.callee.keepCause(err)
		return zero, true, err // the *PanicError: a failure, as a panic of the LoadFunc
	}
	return v, final, err
}

// run is the body of one load goroutine: fetch the value, then deliver it.
// complete runs deferred, so the waiters get ErrGoexit when the LoadFunc
// (or a Remote, or a custom breaker) ends the goroutine.
func (l *Loader[K, V]) run(c *call[K, V]) {
	start := l.now()
	c.buildContext(start)
	r := loaded[V]{err: ErrGoexit, down: tally{lctx: &c.lctx, background: c.background}} // err stays if fetch ends the goroutine
	defer l.complete(c, &r)
	l.takeLabels(c.vals.caller)
	old := c.from // the value a Reload revalidates
	if l.opts.Reload == nil {
		old = nil
	}
	var ctx context.Context = &c.lctx
	if l.obs != nil {
		ctx = l.obs.observeStart(&c.lctx, c.vals.caller, &c.octx, LoadStartEvent[K]{Key: c.key, Keys: 1, Background: c.background, Reload: old != nil})
	}
	l.fetch(ctx, c.key, old, start, &r)
}

// A load runs under a context of its own, a loadctx.Context that lives
// inside its call (so a load allocates no context of its own). What ties
// it to the call is here: its values (loadValues), its start
// (buildContext), its cancellation (cancelLocked, endContext), and its
// deadline, LoadTimeout after it started, kept by the Loader's timeouts
// (a loadctx.Timeouts). It ends with a cause that context.Cause reports:
// ErrLoadTimeout (and context.DeadlineExceeded as ctx.Err()), ErrClosed
// (Close), errAbandoned (CancelAtZero, last waiter gone), or
// context.Canceled once the load is over. Close reaches every running
// load through the in-flight map (cancelAll), not through a parent
// context.

// loadValues is what a load's context answers Value with:
//
//   - the values of the Get that started the load (trace IDs, auth), never
//     its cancellation;
//   - the marker that recognises a Get made from inside the load.
type loadValues struct {
	caller context.Context // values only
	marker loadMarker
}

// Value answers a load's context's Value calls (loadctx.Values).
func (v *loadValues) Value(key any) any {
	switch key {
	case loadKey{}:
		return &v.marker
	case revalidateKey{}:
		return nil // it applies to the Get it was passed to, not to the Gets a load makes
	}
	return v.caller.Value(key)
}

// newTimeouts returns the timeouts of a Loader: they end its loads at
// LoadTimeout with ErrLoadTimeout. They are allocated apart from it, and
// refer to nothing of it.
func newTimeouts(timeout time.Duration, epoch time.Time) *loadctx.Timeouts {
	return loadctx.NewTimeouts(timeout, epoch, ErrLoadTimeout)
}

// buildContext readies c's context on the load goroutine, before any user
// code runs, outside every shard lock: it starts the deadline from start,
// the load's start (the Loader's clock, read once for this and for the
// load's duration). A cancellation asked for before (leave, Close) is
// applied at once.
func (c *call[K, V]) buildContext(start time.Duration) {
	c.l.timeouts.Add(&c.lctx, start)
	if cause := c.l.flights.markReady(c); cause != nil {
		c.lctx.Cancel(cause)
	}
}

// cancelLocked returns the function that cancels c with cause, or records
// cause for buildContext if c's context is not ready. The caller holds c's
// shard lock and calls the function after unlocking.
func (c *call[K, V]) cancelLocked(cause error) func(error) {
	if !c.ready {
		if c.cause == nil {
			c.cause = cause
		}
		return nil
	}
	return c.lctx.Cancel
}

// endContext ends the load's context; the load is over.
func (c *call[K, V]) endContext() {
	c.l.timeouts.Remove(&c.lctx)
	c.lctx.Cancel(context.Canceled)
}

// launch starts c's load goroutine, counting it in on s, the stripe of the
// operation that starts it, which is still inside: the goroutine is counted
// in before that operation is counted out, on one stripe, so Close (which
// reads a stripe's outs before its ins) cannot see both out at once.
func (l *Loader[K, V]) launch(c *call[K, V], s *life.Stripe) {
	c.stripe = s
	l.spawn(c, s)
}

// spawn runs a load (a call's, or a batch's), counted in on s, on a load
// goroutine of the pool.
func (l *Loader[K, V]) spawn(j life.Job, s *life.Stripe) {
	s.Enter()
	l.stats.inFlight.Add(1)
	l.pool.Go(j)
}

// Run runs c's load, on a goroutine of the pool.
func (c *call[K, V]) Run() {
	defer c.l.gate.ExitChild(c.stripe)
	c.l.run(c)
}

// takeLabels gives the load goroutine the profiler labels of ctx, the
// context of the Get that started the load, as a goroutine started for it
// would have had them. Reading them calls ctx.Value, which is user code: a
// panic there is counted (Stats.Panics) and leaves the goroutine without
// labels, and the load goes on. Callers run it after deferring the load's
// delivery, so a Goexit there reaches the waiters as ErrGoexit.
func (l *Loader[K, V]) takeLabels(ctx context.Context) {
	if l.user.guard(func() { pprof.SetGoroutineLabels(ctx) }, nil) != nil {
		pprof.SetGoroutineLabels(context.Background())
	}
}

// Run runs b's load, on a goroutine of the pool.
func (b *batch[K, V]) Run() {
	defer b.l.gate.ExitChild(b.stripe)
	if b.gather != nil && !b.l.gathers.hold(b) {
		return // every caller of the gather left: no call
	}
	b.run()
}

// refreshPermits is the MaxRefreshes bound on background loads: a
// background load takes a permit when it is published (route: a
// background batch takes one for all its calls) and gives it back when it
// ends (loadEnded), and nowhere else.
type refreshPermits struct {
	max  int64
	used atomic.Int64
}

// take takes a permit, or counts the load in dropped when all are used.
func (s *refreshPermits) take(dropped *atomic.Uint64) bool {
	if s.used.Add(1) > s.max {
		s.used.Add(-1)
		dropped.Add(1)
		return false
	}
	return true
}

// give gives a permit back.
func (s *refreshPermits) give() { s.used.Add(-1) }

// takeBackground takes what a background load holds while it runs, when
// it is published (route): a MaxRefreshes permit and, with a Limit,
// a downstream slot, which a refresh never queues for (TryBackground). ok
// false drops the refresh (counted in RefreshesDropped or
// RefreshesLimited); the stale value keeps serving.
func (l *Loader[K, V]) takeBackground() (s limit.Slot, ok bool) {
	if !l.refreshPermits.take(&l.stats.refreshesDropped) {
		return limit.Slot{}, false
	}
	if s, ok = l.lim.TryBackground(); !ok {
		l.refreshPermits.give()
	}
	return s, ok
}

// loadEnded counts a load (a single key's, or a batch's LoadMany call) as
// ended, before any of its waiters wakes, so that Stats read after a Get
// returns include the load that answered it; a background load gives back
// what takeBackground took, s its Limit slot. Whether its error is a
// not-found is counted apart, once judged (deliver, batch.complete).
func (l *Loader[K, V]) loadEnded(err error, background bool, s limit.Slot) {
	l.stats.inFlight.Add(-1)
	l.stats.loads.Add(1)
	if err != nil {
		l.stats.loadErrors.Add(1)
	}
	if background {
		l.refreshPermits.give()
		s.Release()
	}
}

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
	if c.batch == nil { // a batch counts itself once (batch.complete)
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
		// The batch's goroutine reports the batch once (batch.complete).
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
// last of all (a batch's, once the batch is: batch.complete).
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

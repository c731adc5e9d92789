package flightredis

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// Batches. LoadMany runs the lease protocol of lease.go for every key of a
// GetMany's batch at once: each step is one pipelined round trip for all
// the keys that are at that step, and every script still touches only its
// own key's hash-tagged keys (so a Cluster client splits the pipeline by
// node and each script runs where its key lives).
//
//	read     HMGET of every key's entry; a usable one answers its key,
//	         exactly as in Load.
//	acquire  the acquire script for every other key (EVALSHA; EVAL, in a
//	         second round trip, for those the server did not know yet):
//	         "entry" is judged again and, if still of no use, acquired
//	         again at once; "won" or "stolen" leases the key; "held" makes
//	         it wait; "failed" (only for a key that waited) hands it the
//	         holder's failure.
//	load     one call of load for every key leased by acquire, together
//	         with every key whose round trip failed (served locally, as
//	         Load serves a key after a Redis failure); one goroutine beats
//	         all the leases while it runs.
//	store    one round trip: write each value; store a not-found marker
//	         for each key not found when the Loader caches not-founds,
//	         else release it with a failure marker (so that its waiters
//	         elsewhere share the not-found); release with a failure
//	         marker each key failed; plain release otherwise.
//	wait     the keys held elsewhere wait together: a wake-up for any of
//	         them, the earliest of their poll timers, or the end of the
//	         context; then acquire for all of them, with the tokens they
//	         wait on, and so on until every key has its result. Before a
//	         key's first wait the batch subscribes to its wake-up channel
//	         (wakeups.go) and, once Redis has confirmed it, acquires again
//	         at once instead of waiting.
//
// Load and store always end before a wait starts, so a batch never waits
// while it holds a lease: two batches that hold leases on each other's
// keys both finish their loads, then find each other's entries.
//
// load is called on LoadMany's goroutine only. Its first call holds every
// key nobody else was loading; a later call holds only keys another process
// was loading when the batch looked and that were left to this one (the
// holder died and its lease was taken over, or it gave up without a result
// to share), which is when Load too would load after waiting.

// slot is the state of one key of a batch.
type slot[K comparable] struct {
	key     K
	name    string // Options.Key(key)
	ks      keys
	e       entry  // the entry last seen
	perr    error  // e did not parse
	waited  string // the token of the lease this key waits on, "" if none yet
	tok     string // the token of the last acquire
	stolen  bool   // the lease was taken over from a dead holder
	ahead   bool   // this process may be ahead of the key's shared entry (ahead.go): it takes nothing from Redis
	aside   bool   // loaded without the lease, another process holding it, as ahead
	attempt int    // waits so far, for the poll backoff
	delay   time.Duration
	watched bool   // the batch is subscribed to the key's wake-ups
	tk      ticket // the key's Load's (takeoffAll)
}

// batchRun is one LoadMany call.
type batchRun[K comparable, V any] struct {
	t     *Tier[K, V]
	ctx   context.Context
	load  func(context.Context, []K) (map[K]V, error)
	w     chan struct{} // the wake-ups of the keys that wait (watched)
	out   map[K]remote.Result[V]
	gen   int64  // the generation the keys not answered yet are named in
	moves int    // how many times they were named again in a newer one
	since uint64 // the last mark of ahead when the batch began: a fill stored clears those up to it
}

// LoadMany implements [remote.Many]: it answers each of keys as
// [Tier.Load] would ([ErrNotAttached] for each before the tier is
// attached; otherwise a usable shared entry, the value of the process that
// was loading it, or a load under the key's lease), with one Redis round
// trip per step for the whole batch rather than per key, and one call of
// load for all the keys it leases. A batch of N keys nobody has costs 3
// round trips (read, acquire, write), a batch of N keys Redis has 1. The
// keys another process is loading wait together, after the batch's own
// load and writes (a batch never waits while it holds leases): each look
// at them is one round trip.
//
// A key load does not return is not found, as when Load's load returns a
// not-found (by the Loader's rule, [flightcache.Options.NotFound]): with
// the Loader's NotFoundTTL > 0 its entry becomes a not-found marker for
// NotFoundTTL, which every process reads as [ErrSharedNotFound]; otherwise
// its entry is deleted (the deleted key's value is held no longer, by the
// fleet as by the Loader) and its lease released with a not-found that the
// processes waiting on it share (ErrPeerFailed matching
// [flightcache.ErrNotFound]), and a later miss anywhere loads it again. A
// load that fails as a whole with a not-found makes every key it was called
// for not found in the same way. When load fails otherwise, every key it was
// called for gets its error, with the key's older shared entry when it may
// cover it (as Load). When Redis fails or is slow, the keys concerned are
// loaded locally in the same call of load and counted in [Stats]
// (LocalLoads, one per key); the tier steps aside, and a LoadMany in that
// time calls load for every key without Redis.
//
// load runs on LoadMany's goroutine, never concurrently with itself. Its
// first call holds every key nobody else was loading; a key another process
// was loading is loaded by a later call only if it is left to this process
// (its holder died and the batch took its lease over, or the holder gave up
// without a value or a failure to share), when Load too would load it.
// When Options.Freshness or the Codec's Marshal fails or panics for a
// key's value, the key gets its value all the same and it is not shared,
// as with Load. If load panics, or it or that user code calls
// runtime.Goexit, the leases are released on the way out and the panic
// goes on.
func (t *Tier[K, V]) LoadMany(ctx context.Context, keys []K, load func(context.Context, []K) (map[K]V, error)) map[K]remote.Result[V] {
	if t.attached() == nil {
		out := make(map[K]remote.Result[V], len(keys))
		for _, k := range keys {
			out[k] = remote.Result[V]{Err: ErrNotAttached}
		}
		return out
	}
	t.stats.batches.Add(1)
	t.used.Store(true)
	b := &batchRun[K, V]{t: t, ctx: ctx, load: load, out: make(map[K]remote.Result[V], len(keys))}
	slots := make([]*slot[K], len(keys))
	for i, k := range keys {
		slots[i] = &slot[K]{key: k}
	}
	if len(slots) == 0 {
		return b.out
	}
	if t.closed.Load() || t.down() || !t.ready(ctx) {
		t.listening()
		for _, s := range slots {
			s.name = t.key(s.key)
			t.handed(s.name, s.key)
		}
		b.loadAndStore(nil, slots)
		return b.out
	}
	t.awaitStartup(ctx)
	t.listening()
	b.gen = t.gen.Load()
	b.since = t.ahead.now()
	for _, s := range slots {
		s.name = t.key(s.key)
		t.handed(s.name, s.key)
		s.ks = keysAt(t.opts.Prefix, s.name, b.gen)
		s.ahead, _ = t.ahead.state(s.name)
	}
	b.w = make(chan struct{}, 1)
	defer func() { b.unwatch(slots) }()
	defer t.takeoffAll(slots)()

	open, local := b.read(slots)
	var leased, waiting []*slot[K]
	for {
		for len(open) > 0 {
			if t.gen.Load() != b.gen {
				// A newer generation: every key not answered yet (nor
				// leased) is read again under it.
				var more []*slot[K]
				open, more = b.read(append(open, waiting...))
				local, waiting = append(local, more...), nil
				continue
			}
			open, leased, local, waiting = b.acquire(open, leased, local, waiting)
		}
		if len(leased)+len(local) > 0 {
			b.loadAndStore(leased, local)
			leased, local = nil, nil
		}
		if len(waiting) == 0 {
			return b.out
		}
		if !b.sleep(waiting) {
			err := ctxError(ctx)
			for _, s := range waiting {
				b.answer(s, remote.Result[V]{Err: err})
			}
			return b.out
		}
		open, waiting = waiting, nil
	}
}

// unwatch drops the batch's subscriptions to the wake-ups of the keys of
// slots.
func (b *batchRun[K, V]) unwatch(slots []*slot[K]) {
	var bases []string
	for _, s := range slots {
		if s.watched {
			s.watched = false
			bases = append(bases, s.ks.base)
		}
	}
	if len(bases) > 0 {
		b.t.wake.unwatch(b.w, bases...)
	}
}

// watch subscribes the batch to the wake-ups of the keys of waiting it does
// not hear yet, and waits (at most Options.Timeout) for Redis to confirm
// it. It reports whether there were any: those must be looked at once
// more before the batch waits, as a wake-up published before the
// subscription is not heard.
func (b *batchRun[K, V]) watch(waiting []*slot[K]) bool {
	var bases []string
	for _, s := range waiting {
		if !s.watched {
			s.watched = true
			s.attempt-- // the look after subscribing is not a wait
			bases = append(bases, s.ks.base)
		}
	}
	if len(bases) == 0 {
		return false
	}
	b.t.wake.await(b.ctx, b.t.wake.watch(b.w, bases...))
	return true
}

// regen names the keys of slots in generation gen (the batch's from now),
// forgetting what was seen of them in the older one.
func (b *batchRun[K, V]) regen(slots []*slot[K], gen int64) {
	b.unwatch(slots)
	b.gen = gen
	b.moves++
	for _, s := range slots {
		*s = slot[K]{key: s.key, name: s.name, ks: keysAt(b.t.opts.Prefix, s.name, gen), ahead: s.ahead}
	}
}

// answer records s's result; s no longer needs wake-ups.
func (b *batchRun[K, V]) answer(s *slot[K], r remote.Result[V]) {
	b.out[s.key] = r
	if s.watched {
		s.watched = false
		b.t.wake.unwatch(b.w, s.ks.base)
	}
}

// read is the read step: it answers the keys whose entry is usable, and
// returns the others (open) and those whose read failed (local). The
// shared generation is read after the entries, in the same round trip:
// when it is newer than the batch's, the keys are named in it and read
// again (at most maxGenTries times in all, then loaded locally), and when
// the tier knows a newer one first, they are too.
func (b *batchRun[K, V]) read(slots []*slot[K]) (open, local []*slot[K]) {
	t := b.t
	for {
		if t.gen.Load() != b.gen {
			if b.moves+1 >= maxGenTries {
				return nil, slots // the generation keeps moving: without Redis
			}
			b.regen(slots, t.gen.Load())
		}
		cmds, err := b.readAt(slots)
		switch {
		case errors.Is(err, errNotRestored) && b.ctx.Err() == nil:
			return nil, slots // recorded by restore: loaded locally
		case err != nil: // as a failed read
			return nil, b.broken(slots)
		case t.gen.Load() == b.gen:
			return b.judge(slots, cmds)
		}
	}
}

// readAt reads the entries of slots and the shared generation, in one
// round trip. It fails if the generation could not be read or, found
// lost, set back (errNotRestored).
func (b *batchRun[K, V]) readAt(slots []*slot[K]) ([]*redis.SliceCmd, error) {
	cmds, gcmd := b.t.readMany(b.ctx, slots)
	g, err := genOf(gcmd)
	if err != nil {
		return cmds, err
	}
	if _, ok := b.t.seen(b.ctx, g, b.gen); !ok {
		return cmds, errNotRestored
	}
	return cmds, nil
}

// judge answers the keys of slots whose entry, read by cmds, is usable.
func (b *batchRun[K, V]) judge(slots []*slot[K], cmds []*redis.SliceCmd) (open, local []*slot[K]) {
	var failed []*slot[K]
	for i, s := range slots {
		vals, err := cmds[i].Result()
		if err != nil {
			failed = append(failed, s)
			continue
		}
		s.e, s.perr = parseEntry(vals)
		if !b.offer(s) {
			open = append(open, s)
		}
	}
	return open, b.broken(failed)
}

// offer answers s with its entry if the entry is usable and decodes, as
// Load does; it reports whether it did.
func (b *batchRun[K, V]) offer(s *slot[K]) bool {
	t := b.t
	if t.dead(s.ks) || s.ahead { // nothing of an older generation, nor what may be older than a value served
		return false
	}
	if s.perr != nil {
		t.stats.decodeErrors.Add(1)
		return false
	}
	if t.sharedNotFound(s.e) {
		t.stats.notFoundHits.Add(1)
		b.answer(s, remote.Result[V]{Err: ErrSharedNotFound})
		return true
	}
	if !s.e.ok || !t.usable(b.ctx, s.ks, s.e) {
		return false
	}
	v, err := t.decode(s.e.val)
	if err != nil {
		t.stats.decodeErrors.Add(1)
		return false
	}
	b.answer(s, remote.Result[V]{RemoteValue: t.hand(s.ks, s.tk, s.e, v, s.waited != "")})
	return true
}

// broken handles the keys whose round trip failed, as Load's fallback
// does: if the load's context ended they get its error; otherwise Redis
// failed (counted once for the round trip, and the tier steps aside) and
// they are returned, to be loaded locally.
func (b *batchRun[K, V]) broken(failed []*slot[K]) []*slot[K] {
	if len(failed) == 0 {
		return nil
	}
	if b.ctx.Err() != nil {
		err := ctxError(b.ctx)
		for _, s := range failed {
			b.answer(s, remote.Result[V]{Err: err})
		}
		return nil
	}
	b.t.failed()
	return failed
}

// acquire is the acquire step for open: it runs the acquire script for
// each of them and sorts them by outcome, appending to leased, local and
// waiting; again holds the keys whose entry changed and is still of no use
// (they are acquired again at once).
func (b *batchRun[K, V]) acquire(open, leased, local, waiting []*slot[K]) (again, leased2, local2, waiting2 []*slot[K]) {
	t := b.t
	calls := make([]evalCall, len(open))
	for i, s := range open {
		s.tok = token(16)
		calls[i] = evalCall{acquireScript, []string{s.ks.entry, s.ks.lease, s.ks.alive, s.ks.fail},
			[]any{s.e.id, s.tok, t.attached().leaseMS, t.aliveMS, s.waited}}
	}
	cmds := t.evalAll(b.ctx, calls, &t.stats.batchRoundTrips)
	if t.gen.Load() != b.gen {
		// A newer generation: nothing of this one is handed over, and the
		// leases just taken are given back; the caller reads every key
		// again under the newer one.
		var won []*slot[K]
		for i, s := range open {
			if res, err := cmds[i].Slice(); err == nil && len(res) > 0 && (res[0] == "won" || res[0] == "stolen") {
				won = append(won, s)
			}
		}
		t.releaseAll(context.WithoutCancel(b.ctx), won)
		return open, leased, local, waiting
	}
	var failed []*slot[K]
	for i, s := range open {
		res, err := cmds[i].Slice()
		if err == nil && len(res) == 0 {
			err = errors.New("flightredis: empty reply from the acquire script")
		}
		if err != nil {
			failed = append(failed, s)
			continue
		}
		kind, _ := res[0].(string)
		switch kind {
		case "entry":
			var fields []any
			if len(res) > 1 {
				fields, _ = res[1].([]any)
			}
			s.e, s.perr = parseEntry(fields)
			if !b.offer(s) {
				again = append(again, s)
			}
		case "failed":
			// The entry is still s.e (acquire compared the ids): it may
			// cover the failure.
			t.stats.peerErrors.Add(1)
			var fail any
			if len(res) > 1 {
				fail = res[1]
			}
			rv, perr := t.cover(s.e, peerError(fail))
			b.answer(s, remote.Result[V]{RemoteValue: rv, Err: perr})
		case "won", "stolen":
			s.stolen = kind == "stolen"
			leased = append(leased, s)
		default: // "held"
			if s.ahead { // the holder may have read before the value served: load without the lease, as Load
				s.aside = true
				local = append(local, s)
				continue
			}
			if s.waited == "" {
				t.stats.waits.Add(1)
			}
			if len(res) > 1 {
				s.waited, _ = res[1].(string)
			}
			s.delay = min(t.opts.PollInterval, t.opts.PollInterval/8<<min(s.attempt, 3))
			s.attempt++
			if len(res) > 2 {
				if ttl, ok := res[2].(int64); ok && ttl >= 0 {
					s.delay = min(s.delay, remote.Add(fromMS(ttl), time.Millisecond))
				}
			}
			waiting = append(waiting, s)
		}
	}
	return again, leased, append(local, b.broken(failed)...), waiting
}

// sleep is the wait step: it waits, for the keys of waiting, for a
// wake-up of any of them, the earliest of their poll timers, or the end of
// the load's context (then it returns false). When some of them were not
// subscribed to yet, it subscribes instead, and returns at once for them
// to be looked at again.
func (b *batchRun[K, V]) sleep(waiting []*slot[K]) bool {
	if b.watch(waiting) {
		return b.ctx.Err() == nil
	}
	d := waiting[0].delay
	for _, s := range waiting[1:] {
		d = min(d, s.delay)
	}
	timer := time.NewTimer(jitter(d))
	defer timer.Stop()
	select {
	case <-b.w:
		b.t.stats.wakeups.Add(1)
	case <-timer.C:
		b.t.stats.polls.Add(1)
	case <-b.ctx.Done():
		return false
	}
	return true
}

// loadAndStore is the load and store steps: one call of load for the keys
// of leased (under their leases) and of local (without Redis), then the
// leases' writes and releases in one round trip. If load panics, or load
// or user code after it (Options.Freshness, the Codec) ends the goroutine,
// every lease is released on the way out, and the panic goes on.
func (b *batchRun[K, V]) loadAndStore(leased, local []*slot[K]) {
	t := b.t
	keys := make([]K, 0, len(leased)+len(local))
	for _, s := range leased {
		keys = append(keys, s.key)
		if s.stolen {
			t.stats.takeovers.Add(1)
		}
	}
	aside, ahead := 0, 0 // of local, of local and leased
	for _, s := range local {
		keys = append(keys, s.key)
		if s.aside {
			aside++
		}
	}
	for _, s := range leased {
		if s.ahead {
			ahead++
		}
	}
	t.stats.leases.Add(uint64(len(leased)))
	t.stats.aheadLoads.Add(uint64(aside + ahead))
	t.localLoads(len(local) - aside)
	bg := context.WithoutCancel(b.ctx) // the leases must be released even if ctx ended
	stop := t.beatMany(leased)
	done := false
	defer func() {
		if !done {
			stop()
			t.releaseAll(bg, leased)
		}
	}()
	start := time.Now()
	m, lerr := b.load(b.ctx, keys) // a *ManyError: each of its keys failed alone (errOf)
	end := time.Now()
	loaded := func(v V) remote.Value[V] {
		return remote.Value[V]{Value: v, LoadedAt: end, Took: end.Sub(start), Loaded: true}
	}
	for _, s := range local {
		err := errOf(lerr, s.key)
		v, ok := m[s.key]
		switch {
		case err != nil:
			b.answer(s, remote.Result[V]{Err: err})
		case ok:
			b.answer(s, remote.Result[V]{RemoteValue: loaded(v)})
		default:
			b.answer(s, remote.Result[V]{Err: flightcache.ErrNotFound})
		}
		if !s.aside && (err == nil || t.notFound(err)) { // loaded without Redis: maybe newer than its entry
			t.ahead.mark(s.name)
		}
	}
	if len(leased) == 0 {
		done = true
		stop()
		return
	}

	// What to do with each lease, and with the script's reply. This calls
	// user code (Freshness, the Codec): encode recovers its panics, and the
	// deferred release covers a Goexit here.
	calls := make([]evalCall, len(leased))
	then := make([]func(*redis.Cmd) bool, len(leased)) // false: Redis failed
	for i, s := range leased {
		dead := t.dead(s.ks) // an InvalidateAll ended the lease's generation: nothing is stored
		err := errOf(lerr, s.key)
		release := func(fail string, want bool) {
			calls[i] = evalCall{releaseScript, releaseKeys(s.ks), t.releaseArgs(s.ks, s.tok, fail, want)}
		}
		switch v, ok := m[s.key]; {
		case err != nil && !t.sharesNotFound(err):
			want := false
			fail := ""
			if !errors.Is(err, flightcache.ErrNotModified) { // a batch revalidates nothing: nothing to share
				fail = t.failure(b.ctx, s.tok, err)
				want = t.mayCover(err) && !s.ahead // the entry may be older than a value served
			}
			release(fail, want)
			then[i] = func(cmd *redis.Cmd) bool {
				res, rerr := cmd.Slice()
				var e entry
				if rerr == nil && !dead && want {
					e, _ = parseEntry(res) // an entry that does not parse covers nothing
				}
				rv, cerr := t.cover(e, err)
				b.answer(s, remote.Result[V]{RemoteValue: rv, Err: cerr})
				return rerr == nil
			}
		case err == nil && ok:
			rv := loaded(v)
			enc, share := t.encode(s.key, rv, rand.Float64())
			if share && dead {
				t.stats.writesLost.Add(1)
				share = false
			}
			var id string
			if share {
				var args []any
				id, args = t.writeArgs(s.ks, enc)
				t.filling(s.ks.entry)
				calls[i] = evalCall{writeScript, writeKeys(s.ks), append([]any{s.tok}, args...)}
			} else {
				release("", false)
			}
			then[i] = func(cmd *redis.Cmd) bool {
				b.answer(s, remote.Result[V]{RemoteValue: rv})
				if !share {
					return cmd.Err() == nil
				}
				n, held, werr := writeAnswer(cmd)
				if werr != nil {
					return false
				}
				if t.stored(n) {
					t.handOver(s.ks, s.tk, id)
					if s.ahead {
						t.ahead.clear(s.name, b.since)
					}
				} else if n == writeOutdated {
					t.outdatedFill(s.ks, s.key, held)
				}
				return true
			}
		default:
			// Not found (a key load did not return, or load failing as a
			// whole with ErrNotFound): stored as a not-found marker for
			// the fleet when the Loader caches not-founds, else shared
			// with the processes waiting on this lease; as Load does with
			// its load's ErrNotFound.
			nf := flightcache.ErrNotFound
			if err != nil {
				nf = err
			}
			marker := t.sharesNotFound(nf)
			if marker && dead {
				t.stats.writesLost.Add(1)
				marker = false
			}
			if marker {
				calls[i] = t.notFoundCall(s.ks, s.tok)
			} else {
				release(t.failure(b.ctx, s.tok, nf), false)
			}
			then[i] = func(cmd *redis.Cmd) bool {
				b.answer(s, remote.Result[V]{Err: nf})
				if !marker {
					return cmd.Err() == nil
				}
				n, werr := cmd.Int()
				if werr != nil {
					return false
				}
				if t.stored(n) {
					t.served.drop(s.ks.base)
					if s.ahead {
						t.ahead.clear(s.name, b.since)
					}
				}
				return true
			}
		}
	}
	done = true
	stop()
	// The batch's own wake-ups must not wake its wait for other keys.
	b.unwatch(leased)
	cmds := t.evalAll(bg, calls, &t.stats.batchRoundTrips)
	ok := true
	for i := range leased {
		ok = then[i](cmds[i]) && ok
	}
	if !ok {
		t.failed()
	}
}

// errOf is key's error in err, what a batch's load returned for the keys
// it was given: err itself, or for a *flightcache.ManyError (the Loader's
// LoadMany failed some keys alone) key's own error, nil if key is not in
// it (its value, or its absence, is in the map).
func errOf[K comparable](err error, key K) error {
	if me, ok := err.(*flightcache.ManyError[K]); ok { // a type assertion runs no user code
		if me == nil {
			return nil
		}
		return me.Errs[key]
	}
	return err
}

// releaseAll releases the leases of ss, sharing nothing, in one round trip.
func (t *Tier[K, V]) releaseAll(ctx context.Context, ss []*slot[K]) {
	if len(ss) == 0 {
		return
	}
	calls := make([]evalCall, len(ss))
	for i, s := range ss {
		calls[i] = evalCall{releaseScript, releaseKeys(s.ks), t.releaseArgs(s.ks, s.tok, "", false)}
	}
	for _, cmd := range t.evalAll(ctx, calls, &t.stats.batchRoundTrips) {
		if cmd.Err() != nil {
			t.failed()
			return
		}
	}
}

// beatMany extends the alive keys of the leases of ss every
// HolderTimeout/3, in one round trip for all of them, until stop. A lease
// found lost (Set, Invalidate, takeover) is not beaten any more.
func (t *Tier[K, V]) beatMany(ss []*slot[K]) (stop func()) {
	if len(ss) == 0 {
		return func() {}
	}
	live := slices.Clone(ss)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(t.opts.HolderTimeout / 3)
		defer tick.Stop()
		for len(live) > 0 {
			select {
			case <-quit:
				return
			case <-t.ctx.Done():
				return
			case <-tick.C:
			}
			calls := make([]evalCall, len(live))
			for i, s := range live {
				calls[i] = evalCall{beatScript, []string{s.ks.lease, s.ks.alive}, []any{s.tok, t.aliveMS}}
			}
			cmds := t.evalAll(t.ctx, calls, nil)
			kept := live[:0]
			for i, s := range live {
				if n, err := cmds[i].Int(); err != nil || n != 0 {
					kept = append(kept, s)
				}
			}
			live = kept
		}
	})
	return func() { close(quit); wg.Wait() }
}

// evalCall is one script call of a pipelined round trip.
type evalCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

// evalAll runs calls in one pipelined round trip with EVALSHA, then those
// whose script the server did not have (NOSCRIPT: it has no effect) in a
// second one with EVAL, which also loads the script for the next time.
// (Script.Run cannot do this in a pipeline: it reads the reply of EVALSHA
// before it decides.) Each Cmd holds its call's reply or error. trips, if
// not nil, counts the round trips.
func (t *Tier[K, V]) evalAll(ctx context.Context, calls []evalCall, trips *atomic.Uint64) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 0 {
		return cmds
	}
	t.pipelined(ctx, trips, func(c context.Context, p redis.Pipeliner) {
		for i, call := range calls {
			cmds[i] = call.script.EvalSha(c, p, call.keys, call.args...)
		}
	})
	var missing []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		t.pipelined(ctx, trips, func(c context.Context, p redis.Pipeliner) {
			for _, i := range missing {
				cmds[i] = calls[i].script.Eval(c, p, calls[i].keys, calls[i].args...)
			}
		})
	}
	return cmds
}

// pipelined sends the commands fill queues in one round trip, bounded by
// Options.Timeout; each command holds its own reply or error.
func (t *Tier[K, V]) pipelined(ctx context.Context, trips *atomic.Uint64, fill func(context.Context, redis.Pipeliner)) {
	if trips != nil {
		trips.Add(1)
	}
	c, cancel := t.op(ctx)
	defer cancel()
	_, _ = t.rdb.Pipelined(c, func(p redis.Pipeliner) error {
		fill(c, p)
		return nil
	})
}

package flightredis

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/handover"
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
//	         (package wake) and, once Redis has confirmed it, acquires again
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

// item is the state of one key of a batch.
type item[K comparable] struct {
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
	watched bool            // the batch is subscribed to the key's wake-ups
	tk      handover.Ticket // the key's Load's (takeoffAll)
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

	clock   int64 // the tag clock read before the batch's load under leases (tags.go)
	clockOK bool  // clock was read

	// The keys between two steps: leased by acquire, to load without
	// Redis (a round trip failed, or ahead of Redis while another process
	// holds the lease), and waiting on another process.
	leased, local, waiting []*item[K]
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
	items := make([]*item[K], len(keys))
	for i, k := range keys {
		items[i] = &item[K]{key: k}
	}
	if len(items) == 0 {
		return b.out
	}
	if t.closed.Load() || t.link.down() || !t.ready(ctx) {
		t.listening()
		b.name(items)
		b.loadAndStore(nil, items)
		return b.out
	}
	t.awaitStartup(ctx)
	t.listening()
	b.gen = t.gen.Load()
	b.since = t.ahead.Now()
	b.name(items)
	b.w = make(chan struct{}, 1)
	defer func() { b.unwatch(items) }()
	defer t.copies.takeoffAll(items)()
	b.run(items)
	return b.out
}

// name names the keys of items (Options.Key) in the batch's generation.
func (b *batchRun[K, V]) name(items []*item[K]) {
	t := b.t
	for _, s := range items {
		s.name = t.key(s.key)
		t.fleet.handed(s.name, s.key)
		s.ks = keysAt(t.opts.Prefix, s.name, b.gen)
		s.ahead, _ = t.ahead.State(s.name)
	}
}

// run takes the keys of items through the steps until each has its
// result: read, acquire, load and store, wait, and acquire again.
func (b *batchRun[K, V]) run(items []*item[K]) {
	open, local := b.read(items)
	b.local = local
	for {
		b.acquireAll(open)
		if len(b.leased)+len(b.local) > 0 {
			b.loadAndStore(b.leased, b.local)
			b.leased, b.local = nil, nil
		}
		if len(b.waiting) == 0 {
			return
		}
		if !b.sleep(b.waiting) {
			err := ctxError(b.ctx)
			for _, s := range b.waiting {
				b.answer(s, remote.Result[V]{Err: err})
			}
			return
		}
		open, b.waiting = b.waiting, nil
	}
}

// acquireAll runs the acquire step until no key of open is left to
// acquire again.
func (b *batchRun[K, V]) acquireAll(open []*item[K]) {
	for len(open) > 0 {
		if b.t.gen.Load() != b.gen {
			// A newer generation: every key not answered yet (nor
			// leased) is read again under it.
			var more []*item[K]
			open, more = b.read(append(open, b.waiting...))
			b.local, b.waiting = append(b.local, more...), nil
			continue
		}
		open = b.acquire(open)
	}
}

// unwatch drops the batch's subscriptions to the wake-ups of the keys of
// items.
func (b *batchRun[K, V]) unwatch(items []*item[K]) {
	var bases []string
	for _, s := range items {
		if s.watched {
			s.watched = false
			bases = append(bases, s.ks.base)
		}
	}
	if len(bases) > 0 {
		b.t.wake.Unwatch(b.w, bases...)
	}
}

// watch subscribes the batch to the wake-ups of the keys of waiting it does
// not hear yet, and waits (at most Options.Timeout) for Redis to confirm
// it. It reports whether there were any: those must be looked at once
// more before the batch waits, as a wake-up published before the
// subscription is not heard.
func (b *batchRun[K, V]) watch(waiting []*item[K]) bool {
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
	b.t.wake.Await(b.ctx, b.t.wake.Watch(b.w, bases...))
	return true
}

// regen names the keys of items in generation gen (the batch's from now),
// forgetting what was seen of them in the older one.
func (b *batchRun[K, V]) regen(items []*item[K], gen int64) {
	b.unwatch(items)
	b.gen = gen
	b.moves++
	for _, s := range items {
		*s = item[K]{key: s.key, name: s.name, ks: keysAt(b.t.opts.Prefix, s.name, gen), ahead: s.ahead}
	}
}

// answer records s's result; s no longer needs wake-ups.
func (b *batchRun[K, V]) answer(s *item[K], r remote.Result[V]) {
	b.out[s.key] = r
	if s.watched {
		s.watched = false
		b.t.wake.Unwatch(b.w, s.ks.base)
	}
}

// read is the read step: it answers the keys whose entry is usable, and
// returns the others (open) and those whose read failed (local). The
// shared generation is read after the entries, in the same round trip:
// when it is newer than the batch's, the keys are named in it and read
// again (at most maxGenTries times in all, then loaded locally), and when
// the tier knows a newer one first, they are too.
func (b *batchRun[K, V]) read(items []*item[K]) (open, local []*item[K]) {
	t := b.t
	for {
		if t.gen.Load() != b.gen {
			if b.moves+1 >= maxGenTries {
				return nil, items // the generation keeps moving: without Redis
			}
			b.regen(items, t.gen.Load())
		}
		cmds, err := b.readAt(items)
		switch {
		case errors.Is(err, errNotRestored) && b.ctx.Err() == nil:
			return nil, items // recorded by restore: loaded locally
		case err != nil: // as a failed read
			return nil, b.broken(items)
		case t.gen.Load() == b.gen:
			return b.judge(items, cmds)
		}
	}
}

// readAt reads the entries of items and the shared generation, in one
// round trip. It fails if the generation could not be read or, found
// lost, set back (errNotRestored).
func (b *batchRun[K, V]) readAt(items []*item[K]) ([]*redis.SliceCmd, error) {
	cmds, gcmd := b.t.copies.readMany(b.ctx, items)
	g, err := genOf(gcmd)
	if err != nil {
		return cmds, err
	}
	if _, ok := b.t.seen(b.ctx, g, b.gen); !ok {
		return cmds, errNotRestored
	}
	return cmds, nil
}

// judge answers the keys of items whose entry, read by cmds, is usable.
func (b *batchRun[K, V]) judge(items []*item[K], cmds []*redis.SliceCmd) (open, local []*item[K]) {
	var failed []*item[K]
	for i, s := range items {
		vals, err := cmds[i].Result()
		if err != nil {
			failed = append(failed, s)
			continue
		}
		s.e, s.perr = parseEntry(vals)
	}
	es := make([]*entry, 0, len(items))
	for i, s := range items {
		if cmds[i].Err() == nil {
			es = append(es, &s.e)
		}
	}
	b.t.tags.live(b.ctx, es...) // one round trip for the tagged entries' stamps
	for i, s := range items {
		if cmds[i].Err() == nil && !b.offer(s) {
			open = append(open, s)
		}
	}
	return open, b.broken(failed)
}

// offer answers s with its entry if the entry is usable and decodes, as
// Load does; it reports whether it did.
func (b *batchRun[K, V]) offer(s *item[K]) bool {
	t := b.t
	if t.dead(s.ks) || s.ahead { // nothing of an older generation, nor what may be older than a value served
		return false
	}
	if s.perr != nil {
		t.stats.decodeErrors.Add(1)
		return false
	}
	if t.attached().sharedNotFound(s.e) {
		t.stats.notFoundHits.Add(1)
		b.answer(s, remote.Result[V]{Err: ErrSharedNotFound})
		return true
	}
	if !s.e.ok || !t.usable(b.ctx, s.ks, s.e) {
		return false
	}
	v, err := decode(t.codec, s.e.val)
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
func (b *batchRun[K, V]) broken(failed []*item[K]) []*item[K] {
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
	b.t.link.failed()
	return failed
}

// acquire is the acquire step for open: it runs the acquire script for
// each of them and sorts them by outcome into the batch's leased, local
// and waiting keys; it returns the keys whose entry changed and is still
// of no use (they are acquired again at once).
func (b *batchRun[K, V]) acquire(open []*item[K]) (again []*item[K]) {
	t := b.t
	calls := make([]evalCall, len(open))
	for i, s := range open {
		s.tok = token(16)
		calls[i] = evalCall{acquireScript, []string{s.ks.entry, s.ks.lease, s.ks.alive, s.ks.fail},
			[]any{s.e.id, s.tok, t.attached().leaseMS, t.link.aliveMS, s.waited}}
	}
	cmds := t.link.evalAll(b.ctx, calls, &t.stats.batchRoundTrips)
	if t.gen.Load() != b.gen {
		b.giveBack(open, cmds)
		return open
	}
	var failed []*item[K]
	for i, s := range open {
		res, err := cmds[i].Slice()
		if err == nil && len(res) == 0 {
			err = errors.New("flightredis: empty reply from the acquire script")
		}
		if err != nil {
			failed = append(failed, s)
			continue
		}
		if !b.sort(s, res) {
			again = append(again, s)
		}
	}
	b.local = append(b.local, b.broken(failed)...)
	return again
}

// giveBack gives back the leases acquire just took (cmds: its replies for
// open): a newer generation came, nothing of this one is handed over, and
// the caller reads every key again under the newer one.
func (b *batchRun[K, V]) giveBack(open []*item[K], cmds []*redis.Cmd) {
	var won []*item[K]
	for i, s := range open {
		if res, err := cmds[i].Slice(); err == nil && len(res) > 0 && (res[0] == "won" || res[0] == "stolen") {
			won = append(won, s)
		}
	}
	b.t.link.releaseAll(context.WithoutCancel(b.ctx), leasesOf(won))
}

// sort handles s's acquire reply res; false when s is to be acquired
// again (its entry changed and is still of no use).
func (b *batchRun[K, V]) sort(s *item[K], res []any) bool {
	t := b.t
	switch kind, _ := res[0].(string); kind {
	case "entry":
		var fields []any
		if len(res) > 1 {
			fields, _ = res[1].([]any)
		}
		s.e, s.perr = parseEntry(fields)
		t.tags.live(b.ctx, &s.e)
		return b.offer(s)
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
		b.leased = append(b.leased, s)
	default: // "held"
		b.held(s, res)
	}
	return true
}

// held makes s wait for the process that holds its lease (res: the
// holder's token and its alive key's PTTL), or, ahead of Redis, load
// without the lease, as Load does.
func (b *batchRun[K, V]) held(s *item[K], res []any) {
	t := b.t
	if s.ahead { // the holder may have read before the value served
		s.aside = true
		b.local = append(b.local, s)
		return
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
	b.waiting = append(b.waiting, s)
}

// sleep is the wait step: it waits, for the keys of waiting, for a
// wake-up of any of them, the earliest of their poll timers, or the end of
// the load's context (then it returns false). When some of them were not
// subscribed to yet, it subscribes instead, and returns at once for them
// to be looked at again.
func (b *batchRun[K, V]) sleep(waiting []*item[K]) bool {
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
func (b *batchRun[K, V]) loadAndStore(leased, local []*item[K]) {
	t := b.t
	keys := b.count(leased, local)
	bg := context.WithoutCancel(b.ctx) // the leases must be released even if ctx ended
	stop := t.link.beatMany(leasesOf(leased))
	done := false
	defer func() {
		if !done {
			stop()
			t.link.releaseAll(bg, leasesOf(leased))
		}
	}()
	if len(leased) > 0 && t.attached().tagged() { // the stamp of the values' entries, read before the load starts (tags.go)
		b.clock, b.clockOK = t.tags.readClock(b.ctx)
	}
	start := time.Now()
	m, err := b.load(b.ctx, keys) // a *ManyError: each of its keys failed alone (errOf)
	got := batchLoad[K, V]{m: m, err: err, start: start, end: time.Now()}
	b.answerLocal(local, got)
	if len(leased) == 0 {
		done = true
		stop()
		return
	}
	calls, then := b.plan(leased, got)
	done = true
	stop()
	// The batch's own wake-ups must not wake its wait for other keys.
	b.unwatch(leased)
	b.store(bg, calls, then)
}

// batchLoad is what one call of a batch's load returned, and when.
type batchLoad[K comparable, V any] struct {
	m          map[K]V
	err        error
	start, end time.Time
}

// value is v, loaded by this call.
func (l batchLoad[K, V]) value(v V) remote.Value[V] { return loaded(v, l.start, l.end) }

// count counts the leases, the takeovers and the loads ahead of Redis or
// without it of a call of load for leased and local, and returns the keys
// to call it with.
func (b *batchRun[K, V]) count(leased, local []*item[K]) []K {
	t := b.t
	keys := make([]K, 0, len(leased)+len(local))
	aside, ahead := 0, 0 // of local, of leased
	for _, s := range leased {
		keys = append(keys, s.key)
		if s.stolen {
			t.stats.takeovers.Add(1)
		}
		if s.ahead {
			ahead++
		}
	}
	for _, s := range local {
		keys = append(keys, s.key)
		if s.aside {
			aside++
		}
	}
	t.stats.leases.Add(uint64(len(leased)))
	t.stats.aheadLoads.Add(uint64(aside + ahead))
	t.copies.localLoads(len(local) - aside)
	return keys
}

// answerLocal answers the keys of local, loaded without Redis.
func (b *batchRun[K, V]) answerLocal(local []*item[K], got batchLoad[K, V]) {
	for _, s := range local {
		err := errOf(got.err, s.key)
		v, ok := got.m[s.key]
		switch {
		case err != nil:
			b.answer(s, remote.Result[V]{Err: err})
		case ok:
			b.answer(s, remote.Result[V]{RemoteValue: got.value(v)})
		default:
			b.answer(s, remote.Result[V]{Err: flightcache.ErrNotFound})
		}
		if !s.aside && (err == nil || b.t.attached().notFound(err)) { // loaded without Redis: maybe newer than its entry
			b.t.ahead.Mark(s.name)
		}
	}
}

// settle is a lease's script call, and what to do with its reply: false
// when Redis failed.
type settle struct {
	call evalCall
	then func(*redis.Cmd) bool
}

// plan decides what to do with each lease of leased, and with the
// script's reply. This calls user code (Freshness, the Codec): encode
// recovers its panics, and loadAndStore's deferred release covers a
// Goexit here.
func (b *batchRun[K, V]) plan(leased []*item[K], got batchLoad[K, V]) ([]evalCall, []func(*redis.Cmd) bool) {
	calls := make([]evalCall, len(leased))
	then := make([]func(*redis.Cmd) bool, len(leased))
	for i, s := range leased {
		dead := b.t.dead(s.ks) // an InvalidateAll ended the lease's generation: nothing is stored
		err := errOf(got.err, s.key)
		var st settle
		switch v, ok := got.m[s.key]; {
		case err != nil && !b.t.attached().sharesNotFound(err):
			st = b.planFailure(s, err, dead)
		case err == nil && ok:
			st = b.planValue(s, got.value(v), dead)
		default:
			st = b.planNotFound(s, err, dead)
		}
		calls[i], then[i] = st.call, st.then
	}
	return calls, then
}

// planFailure releases s's lease after its load failed with err, leaving
// the failure for the waiters, and covers it with the entry if it may.
func (b *batchRun[K, V]) planFailure(s *item[K], err error, dead bool) settle {
	t := b.t
	want, fail := false, ""
	if !errors.Is(err, flightcache.ErrNotModified) { // a batch revalidates nothing: nothing to share
		fail = t.failure(b.ctx, s.tok, err)
		want = t.attached().mayCover(err) && !s.ahead // the entry may be older than a value served
	}
	return settle{t.link.releaseCall(s.ks, s.tok, fail, want), func(cmd *redis.Cmd) bool {
		res, rerr := cmd.Slice()
		var e entry
		if rerr == nil && !dead && want {
			e, _ = parseEntry(res) // an entry that does not parse covers nothing
			t.tags.live(context.WithoutCancel(b.ctx), &e)
		}
		rv, cerr := t.cover(e, err)
		b.answer(s, remote.Result[V]{RemoteValue: rv, Err: cerr})
		return rerr == nil
	}}
}

// planValue writes rv as s's entry under its lease, or releases the lease
// when rv is not to share.
func (b *batchRun[K, V]) planValue(s *item[K], rv remote.Value[V], dead bool) settle {
	t := b.t
	enc, share := t.encode(s.key, rv, rand.Float64())
	if share && dead {
		t.stats.writesLost.Add(1)
		share = false
	}
	if share && len(enc.tags) > 0 {
		share = b.clockOK && t.tags.fillLive(context.WithoutCancel(b.ctx), enc.tags, b.clock)
		enc.tg = tagText(b.clock, enc.tags)
	}
	if !share {
		return settle{t.link.releaseCall(s.ks, s.tok, "", false), func(cmd *redis.Cmd) bool {
			b.answer(s, remote.Result[V]{RemoteValue: rv})
			return cmd.Err() == nil
		}}
	}
	id, args := t.link.writeArgs(s.ks, enc)
	t.copies.filling(s.ks.entry)
	return settle{evalCall{writeScript, writeKeys(s.ks), append([]any{s.tok}, args...)}, func(cmd *redis.Cmd) bool {
		b.answer(s, remote.Result[V]{RemoteValue: rv})
		n, held, werr := writeAnswer(cmd)
		if werr != nil {
			return false
		}
		if t.stats.stored(n) {
			t.copies.handOver(s.ks, s.tk, id)
			b.caughtUp(s)
		} else if n == writeOutdated {
			t.outdatedFill(s.ks, s.key, held)
		}
		return true
	}}
}

// planNotFound settles s's lease after a not-found (a key load did not
// return, or load failing as a whole with err matching ErrNotFound):
// stored as a not-found marker for the fleet when the Loader caches
// not-founds, else shared with the processes waiting on this lease; as
// Load does with its load's ErrNotFound.
func (b *batchRun[K, V]) planNotFound(s *item[K], err error, dead bool) settle {
	t := b.t
	nf := flightcache.ErrNotFound
	if err != nil {
		nf = err
	}
	marker := t.attached().sharesNotFound(nf)
	if marker && dead {
		t.stats.writesLost.Add(1)
		marker = false
	}
	if !marker {
		return settle{t.link.releaseCall(s.ks, s.tok, t.failure(b.ctx, s.tok, nf), false), func(cmd *redis.Cmd) bool {
			b.answer(s, remote.Result[V]{Err: nf})
			return cmd.Err() == nil
		}}
	}
	return settle{t.link.notFoundCall(s.ks, s.tok, t.attached().rules.NotFoundTTL), func(cmd *redis.Cmd) bool {
		b.answer(s, remote.Result[V]{Err: nf})
		n, werr := cmd.Int()
		if werr != nil {
			return false
		}
		if t.stats.stored(n) {
			t.copies.served.Drop(s.ks.base)
			b.caughtUp(s)
		}
		return true
	}}
}

// caughtUp notes that s's entry now holds what this process loaded: it is
// no longer ahead of Redis on the key (ahead.go).
func (b *batchRun[K, V]) caughtUp(s *item[K]) {
	if s.ahead {
		b.t.ahead.Clear(s.name, b.since)
	}
}

// store runs calls in one round trip and hands each reply to its then;
// Redis failing any of them steps the tier aside.
func (b *batchRun[K, V]) store(ctx context.Context, calls []evalCall, then []func(*redis.Cmd) bool) {
	t := b.t
	cmds := t.link.evalAll(ctx, calls, &t.stats.batchRoundTrips)
	ok := true
	for i := range calls {
		ok = then[i](cmds[i]) && ok
	}
	if !ok {
		t.link.failed()
	}
}

// leasesOf are the leases of items.
func leasesOf[K comparable](items []*item[K]) []lease {
	ls := make([]lease, len(items))
	for i, s := range items {
		ls[i] = lease{s.ks, s.tok}
	}
	return ls
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

// evalCall is one script call of a pipelined round trip.
type evalCall struct {
	script *redis.Script
	keys   []string
	args   []any
}

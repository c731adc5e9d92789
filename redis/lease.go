package flightredis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/handover"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// The lease protocol, per key (every script touches only keys that share
// the key's hash tag, so it also runs on Redis Cluster):
//
//	acquire  the entry changed since the caller looked → return it;
//	         the load the caller waited on failed      → return its error;
//	         a lease is held and its holder is alive   → "held";
//	         a lease is held, its holder is not        → take it over;
//	         no lease                                  → take it.
//	beat     the holder, every HolderTimeout/3: still mine → extend "alive".
//	write    still mine → replace the entry, drop the lease, wake.
//	release  still mine → drop the lease, note a shareable failure, wake;
//	         after a failed load → also return the entry, to cover it.
//	notfound still mine → replace the entry with a not-found marker that
//	         expires after NotFoundTTL, drop the lease, wake (a load's
//	         not-found, by the Loader's rule, when its NotFoundTTL > 0).
//
// "Wake" publishes an empty message on the key's own wake-up channel,
// keys.wake (package wake), with the command the caller passes beside it:
// SPUBLISH on a Cluster (the channel is of the script's own hash slot), PUBLISH
// on a single node. Only the processes that wait on the key subscribe to
// it. A wake-up Redis refuses does not fail its script, whose writes are
// made by then: the scripts publish with redis.pcall, and a waiter that
// hears nothing polls, as it does after any lost wake-up. The invalidation
// publishes (writeScript's ARGV[14] and [15], invalidateScript's ARGV[3]
// and [4]) go to <Prefix>invalidated, as ever.
//
// No script touches a key after deleting it. While a Cluster hash slot
// migrates, its source master counts a key it lacks as the target's, and
// a script that touches one fails midway, its earlier writes made
// ("Script attempted to access a non local key"): a fill that deleted the
// entry before writing it again lost the entry and stepped the tier
// aside. So an entry is replaced in place (HSET, then HDEL of the fields
// the new one lacks).
//
// A lease is "SET NX PX LeaseTTL" with a random token; "alive" is a second
// key with the same token and a PX of HolderTimeout, set with the lease and
// extended by the holder's beats. A holder that dies stops beating, so a
// waiter takes its lease over within HolderTimeout, long before LeaseTTL.

var acquireScript = redis.NewScript(`
local id = redis.call('HGET', KEYS[1], 'id') or ''
if id ~= ARGV[1] then
  return {'entry', redis.call('HMGET', KEYS[1], 'id', 'v', 'at', 'took', 'fresh', 'stale', 'until', 'nf', 'tg')}
end
if ARGV[5] ~= '' then
  local f = redis.call('GET', KEYS[4])
  if f and string.sub(f, 1, string.len(ARGV[5]) + 1) == ARGV[5] .. '\n' then
    return {'failed', f}
  end
end
local cur = redis.call('GET', KEYS[2])
if cur and redis.call('GET', KEYS[3]) == cur then
  return {'held', cur, redis.call('PTTL', KEYS[3])}
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[4])
if cur then
  return {'stolen', cur}
end
return {'won'}
`)

var beatScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
`)

// writeScript stores an entry. With a token (ARGV[1]) it writes only while
// that lease is still held (else it answers writeLost); without one (Set)
// it always writes. Either way it drops the lease, so a load in flight
// elsewhere will not overwrite it. It wakes the key's waiters with
// ARGV[9] (PUBLISH or SPUBLISH) on ARGV[10] (keys.wake). With a version
// (ARGV[12], see version.go) it writes only over an entry whose "ver" is
// not higher; else it answers {writeOutdated, the entry's id} and changes
// no entry: a fill still drops its lease and wakes the waiters, a Set
// changes nothing (see writeAnswer). ARGV[13] is the value's tags and
// stamp (the "tg" field, tags.go), "" for none.
var writeScript = redis.NewScript(`
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if ARGV[12] ~= '' then
  local held = redis.call('HGET', KEYS[1], 'ver')
  if held then
    local hh, hl = tonumber(string.sub(held, 1, 10)), tonumber(string.sub(held, 11))
    local wh, wl = tonumber(string.sub(ARGV[12], 1, 10)), tonumber(string.sub(ARGV[12], 11))
    if hh > wh or (hh == wh and hl > wl) then
      if ARGV[1] ~= '' then
        redis.call('DEL', KEYS[2], KEYS[3])
        redis.pcall(ARGV[9], ARGV[10], '')
      end
      return {2, redis.call('HGET', KEYS[1], 'id') or ''}
    end
  end
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'id', ARGV[2], 'v', ARGV[3], 'at', ARGV[4], 'took', ARGV[5], 'fresh', ARGV[6], 'stale', ARGV[7], 'until', ARGV[11])
if ARGV[12] ~= '' then
  redis.call('HSET', KEYS[1], 'ver', ARGV[12])
  redis.call('HDEL', KEYS[1], 'nf')
else
  redis.call('HDEL', KEYS[1], 'nf', 'ver')
end
if ARGV[13] ~= '' then
  redis.call('HSET', KEYS[1], 'tg', ARGV[13])
else
  redis.call('HDEL', KEYS[1], 'tg')
end
redis.call('PEXPIRE', KEYS[1], ARGV[8])
redis.pcall(ARGV[9], ARGV[10], '')
if ARGV[15] then redis.call('PUBLISH', ARGV[14], ARGV[15]) end
return 1
`)

// releaseScript drops the lease if it is still the caller's, and wakes the
// key's waiters with ARGV[4] (PUBLISH or SPUBLISH) on ARGV[5]. With ARGV[7]
// set (the load found the key gone, and not-founds are not shared as
// markers) it deletes the entry too: the downstream's not-found drops the
// fleet's value, as it drops the Loader's. With ARGV[6] set it also
// returns the entry as it is now, whoever holds the lease: the older value
// a failed load may be covered with, read in the same step, so an
// Invalidate that ran during the load leaves nothing to cover it.
var releaseScript = redis.NewScript(`
local gone = false
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  if ARGV[7] == '1' then
    redis.call('DEL', KEYS[4])
    gone = true
  end
  if ARGV[2] ~= '' then redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3]) end
  redis.pcall(ARGV[4], ARGV[5], '')
end
if ARGV[6] ~= '' and not gone then
  return redis.call('HMGET', KEYS[4], 'id', 'v', 'at', 'took', 'fresh', 'stale', 'until', 'nf', 'tg')
end
return {}
`)

// notFoundScript stores a not-found marker as the entry (see entryFields),
// if the lease ARGV[1] is still held: it replaces the entry, drops the
// lease, expires the marker after NotFoundTTL (ARGV[5], ms) and wakes the
// key's waiters (ARGV[6] on ARGV[7]).
var notFoundScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'id', ARGV[2], 'nf', '1', 'at', ARGV[3], 'fresh', ARGV[4])
redis.call('HDEL', KEYS[1], 'v', 'took', 'stale', 'until', 'ver', 'tg')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.pcall(ARGV[6], ARGV[7], '')
return 1
`)

// invalidateScript deletes the entry and the lease, wakes the key's
// waiters (ARGV[1] on ARGV[2]) and publishes the invalidation ARGV[4], if
// any, on ARGV[3].
var invalidateScript = redis.NewScript(`
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.pcall(ARGV[1], ARGV[2], '')
if ARGV[4] then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
return 1
`)

// ErrSharedNotFound is the error of a Load (or of a key of LoadMany) that
// found a shared not-found marker for its key: another process's load
// (or an earlier one here) reported the key not found less than the
// Loader's NotFoundTTL ago. It matches [flightcache.ErrNotFound] with
// [errors.Is], so the Loader caches it as a not-found for its own
// NotFoundTTL. The marker keeps no error: unlike the not-found of the
// process whose LoadFunc returned it, ErrSharedNotFound does not match that
// LoadFunc's own error (sql.ErrNoRows). [Tier.Set] replaces the marker;
// [Tier.Invalidate] deletes it.
var ErrSharedNotFound = fmt.Errorf("flightredis: not found (shared by the fleet): %w", flightcache.ErrNotFound)

// ErrPeerFailed matches (with [errors.Is]) the error of a Load that waited
// for another process's load of the same key when that load failed: the
// failure is shared, as it is between the callers of one process, so an
// outage costs one downstream call per burst, not one per process. The
// error's text carries the other process's error, but not its Go value
// (errors.Is and errors.As cannot find a sql.ErrNoRows of that process);
// a not-found there also matches [flightcache.ErrNotFound] here.
var ErrPeerFailed = errors.New("flightredis: the load failed in another process")

// Load implements [remote.Remote]: before the tier is attached to a
// Loader it returns [ErrNotAttached], without loading. Then it returns key's shared entry when
// it is usable under the Loader's freshness rules and the caller's
// [remote.MaxStale], waits for the process that is loading key, or
// takes the lease and calls load itself. When Redis fails or is slow, it
// calls load (local-only service) and counts it in [Stats]; its error is
// then always load's.
//
// When the load it ran or waited for fails and the shared entry of key is
// still inside the Loader's StaleIfError window, Load returns that entry
// with the error, for the Loader to serve as stale-on-error (a not-found is
// never covered).
//
// A not-found drops the shared entry of key, whatever NotFoundTTL: the
// downstream says the key is gone, so no process is handed its old value
// again, not even to cover a failure (docs/design.md rule 26).
//
// With the Loader's NotFoundTTL > 0, a not-found is shared: when the load
// it ran returns a not-found by the Loader's rule
// ([flightcache.Options.NotFound]: [flightcache.ErrNotFound], or an error
// the Loader's IsNotFound accepts), Load stores a not-found marker as key's
// entry for NotFoundTTL, and a Load that finds a live marker returns
// [ErrSharedNotFound] without calling load.
//
// A key this process may have served a newer value of than its shared
// entry (it loaded the key without Redis, or its Set or Invalidate of the
// key is kept for replay) is loaded from the downstream, not read from
// Redis: under the lease if it is free, else without it (ahead.go,
// Stats.AheadLoads). So a process never serves a value older than one it
// served.
//
// With the Loader's Options.Version, the value Load's own load returned
// does not replace a shared entry of a higher version (docs/design.md
// rule 30, see version.go): Load returns it all the same, for the Loader
// to judge against its own copy, and the lease is released, which wakes
// the processes waiting on it (Stats.WritesOutdated).
//
// When the user code Load runs on the value its load returned,
// Options.Freshness (through the Loader's Rules.WindowsOf), Options.Version
// and the Codec's Marshal, fails or panics, Load returns the value all the same and shares nothing
// (Stats.EncodeErrors): it releases the lease, so the processes waiting on
// it load for themselves at once. The Loader then applies its own rule to
// the value (a Freshness that panics: served, not cached). Whatever ends
// Load's goroutine once it holds the lease, the lease is released.
func (t *Tier[K, V]) Load(ctx context.Context, key K, load func(context.Context) (V, error)) (remote.Value[V], error) {
	if t.attached() == nil {
		return remote.Value[V]{}, ErrNotAttached
	}
	t.used.Store(true)
	if t.closed.Load() || t.link.down() || !t.ready(ctx) {
		t.listening()
		name := t.key(key)
		t.fleet.handed(name, key)
		return t.local(ctx, name, load)
	}
	t.awaitStartup(ctx)
	t.listening()
	name := t.key(key)
	t.fleet.handed(name, key)
	for try := 1; ; try++ {
		rv, err, again := t.loadAt(ctx, key, name, t.gen.Load(), load)
		if !again {
			return rv, err
		}
		if try == maxGenTries { // the generation keeps moving: without Redis
			return t.local(ctx, name, load)
		}
	}
}

// loadAt is Load under generation gen. It returns again, having handed
// nothing over, when it learns of a newer generation before it holds the
// lease: Load then starts again under that one. For a key this process may
// be ahead of Redis on (ahead.go), it takes nothing from Redis: it loads
// under the lease, or without it while another process holds it.
func (t *Tier[K, V]) loadAt(ctx context.Context, key K, name string, gen int64, load func(context.Context) (V, error)) (remote.Value[V], error, bool) {
	r := &loadRun[K, V]{t: t, ctx: ctx, key: key, name: name, gen: gen, load: load, ks: keysAt(t.opts.Prefix, name, gen)}
	defer r.unwatch()
	var landed func()
	r.tk, landed = t.copies.takeoff(key, r.ks)
	defer landed()
	r.ahead, r.since = t.ahead.State(name)
	out := r.run()
	return out.rv, out.err, out.again
}

// loadRun is one Load of a key under one generation (loadAt): the lease
// protocol's steps, read, judge, acquire, wait, and hold for the lease
// this Load takes.
type loadRun[K comparable, V any] struct {
	t       *Tier[K, V]
	ctx     context.Context
	key     K
	name    string // Options.Key(key)
	gen     int64
	load    func(context.Context) (V, error)
	ks      keys
	tk      handover.Ticket // the Load's (takeoff)
	ahead   bool            // this process may be ahead of the entry (ahead.go): it takes nothing from Redis
	since   uint64          // the mark of ahead when the Load began
	e       entry           // the entry last seen
	perr    error           // e did not parse
	waited  string          // the token of the lease this Load waits on, "" if none yet
	w       chan struct{}   // the key's wake-ups, once the Load waits
	attempt int             // waits so far, for the poll backoff
	clock   int64           // the tag clock read before the load under the lease (tags.go)
	clockOK bool            // clock was read
}

// loadResult is how a Load ends: again when a newer generation came first.
type loadResult[V any] struct {
	rv    remote.Value[V]
	err   error
	again bool
}

// run reads the entry, then judges it, acquires and waits until the Load
// has its result.
func (r *loadRun[K, V]) run() loadResult[V] {
	if out, done := r.read(); done {
		return out
	}
	for ; ; r.attempt++ {
		if r.t.gen.Load() != r.gen { // nothing of an older generation is handed over
			return loadResult[V]{again: true}
		}
		if out, done := r.offer(); done {
			return out
		}
		if out, done := r.acquire(); done {
			return out
		}
	}
}

// read is the read step: the entry, and the shared generation beside it.
// done when the Load ends there: Redis failed, or a newer generation.
func (r *loadRun[K, V]) read() (out loadResult[V], done bool) {
	t := r.t
	vals, g, err := t.readEntry(r.ctx, r.ks)
	if err != nil {
		rv, err := t.fallback(r.ctx, r.name, r.load)
		return loadResult[V]{rv: rv, err: err}, true
	}
	if cur, ok := t.seen(r.ctx, g, r.gen); !ok {
		rv, err := t.localUnlessDone(r.ctx, r.name, r.load)
		return loadResult[V]{rv: rv, err: err}, true
	} else if cur != r.gen {
		return loadResult[V]{again: true}, true
	}
	r.e, r.perr = parseEntry(vals)
	t.tags.live(r.ctx, &r.e)
	return loadResult[V]{}, false
}

// offer answers the Load with the entry last seen if it is of use: a live
// not-found marker, or a usable entry that decodes.
func (r *loadRun[K, V]) offer() (out loadResult[V], done bool) {
	t := r.t
	switch {
	case r.ahead: // the entry may be older than what this process served
	case r.perr == nil && t.attached().sharedNotFound(r.e):
		t.stats.notFoundHits.Add(1)
		return loadResult[V]{err: ErrSharedNotFound}, true
	case r.perr == nil && r.e.ok && t.usable(r.ctx, r.ks, r.e):
		if v, err := decode(t.codec, r.e.val); err == nil {
			return loadResult[V]{rv: t.hand(r.ks, r.tk, r.e, v, r.waited != "")}, true
		}
		t.stats.decodeErrors.Add(1)
	case r.perr != nil:
		t.stats.decodeErrors.Add(1)
	}
	return loadResult[V]{}, false
}

// acquire is the acquire step, and what its answer leads to: a newer
// entry to judge (not done), the holder's failure, the lease (hold), or a
// wait.
func (r *loadRun[K, V]) acquire() (out loadResult[V], done bool) {
	t := r.t
	tok := token(16)
	c, cancel := t.link.op(r.ctx)
	res, err := acquireScript.Run(c, t.link.scripts, []string{r.ks.entry, r.ks.lease, r.ks.alive, r.ks.fail},
		r.e.id, tok, t.attached().leaseMS, t.link.aliveMS, r.waited).Slice()
	cancel()
	if err != nil {
		rv, err := t.fallback(r.ctx, r.name, r.load)
		return loadResult[V]{rv: rv, err: err}, true
	}
	kind, _ := res[0].(string)
	if t.gen.Load() != r.gen {
		if kind == "won" || kind == "stolen" {
			t.link.release(context.WithoutCancel(r.ctx), r.ks, tok, "", false)
		}
		return loadResult[V]{again: true}, true
	}
	switch kind {
	case "entry":
		fields, _ := res[1].([]any)
		r.e, r.perr = parseEntry(fields)
		t.tags.live(r.ctx, &r.e)
		return loadResult[V]{}, false
	case "failed":
		// The entry is still e (acquire compared the ids): it may
		// cover the failure.
		t.stats.peerErrors.Add(1)
		rv, err := t.cover(r.e, peerError(res[1]))
		return loadResult[V]{rv: rv, err: err}, true
	case "won", "stolen":
		if kind == "stolen" {
			t.stats.takeovers.Add(1)
		}
		return r.leased(tok), true
	}
	return r.held(res)
}

// leased runs the load under the lease tok this Load took.
func (r *loadRun[K, V]) leased(tok string) loadResult[V] {
	if r.ahead {
		r.t.stats.aheadLoads.Add(1)
		rv, err, stored := r.hold(r.ctx, tok, nil, false)
		if stored {
			r.t.ahead.Clear(r.name, r.since)
		}
		return loadResult[V]{rv: rv, err: err}
	}
	fctx, fleet := r.fleetValue()
	rv, err, _ := r.hold(fctx, tok, fleet, true)
	return loadResult[V]{rv: rv, err: err}
}

// held handles a lease another process holds (res: acquire's answer):
// wait for the holder's wake-up, a poll, or the holder's alive key to
// lapse, whichever comes first. done when the Load ends instead.
func (r *loadRun[K, V]) held(res []any) (out loadResult[V], done bool) {
	t := r.t
	if r.ahead {
		// The holder may have read the downstream before the value
		// this process served: load without the lease. The read above
		// was tracked, so a later write of the key comes back.
		t.stats.aheadLoads.Add(1)
		rv, err := aside(r.ctx, r.load)
		return loadResult[V]{rv: rv, err: err}, true
	}
	if r.waited == "" {
		t.stats.waits.Add(1)
	}
	r.waited, _ = res[1].(string)
	if r.w == nil {
		// The first wait: subscribe to the key's wake-ups, and once
		// Redis has confirmed it (a wake-up published before is not
		// heard), look once more before waiting.
		r.w = make(chan struct{}, 1)
		t.wake.Await(r.ctx, t.wake.Watch(r.w, r.ks.base))
		if r.ctx.Err() != nil {
			return loadResult[V]{err: ctxError(r.ctx)}, true
		}
		r.attempt-- // that look is not a wait: the backoff starts after it
		return loadResult[V]{}, false
	}
	d := min(t.opts.PollInterval, t.opts.PollInterval/8<<min(r.attempt, 3))
	if ttl, ok := res[2].(int64); ok && ttl >= 0 {
		d = min(d, remote.Add(fromMS(ttl), time.Millisecond))
	}
	if !r.sleep(d) {
		return loadResult[V]{err: ctxError(r.ctx)}, true
	}
	return loadResult[V]{}, false
}

// sleep waits (jittered) d, or until a wake-up of the key; false when the
// Load's context ended first.
func (r *loadRun[K, V]) sleep(d time.Duration) bool {
	timer := time.NewTimer(jitter(d))
	defer timer.Stop()
	select {
	case <-r.w:
		r.t.stats.wakeups.Add(1)
	case <-timer.C:
		r.t.stats.polls.Add(1)
	case <-r.ctx.Done():
		return false
	}
	return true
}

// unwatch drops the Load's subscription to the key's wake-ups, if any.
func (r *loadRun[K, V]) unwatch() {
	if r.w != nil {
		r.t.wake.Unwatch(r.w, r.ks.base)
	}
}

// fleetValue passes the shared entry last seen, if it is still of use
// (within its StaleIfError window) and decodes, to the load about to run,
// so that a Loader with Options.Reload revalidates the fleet's value
// rather than its own (remote.WithReloadValue). It returns that value
// too, or nil.
func (r *loadRun[K, V]) fleetValue() (context.Context, *V) {
	e := r.e
	if !e.ok || e.nf || r.t.attached().phase(e, now()) == remote.PhaseExpired {
		return r.ctx, nil
	}
	v, err := decode(r.t.codec, e.val)
	if err != nil {
		return r.ctx, nil
	}
	return remote.WithReloadValue(r.ctx, v), &v
}

// hand returns a decoded entry to the Loader and remembers it was served,
// to a Load with ticket tk (handOver).
func (t *Tier[K, V]) hand(ks keys, tk handover.Ticket, e entry, v V, waited bool) remote.Value[V] {
	t.copies.handOver(ks, tk, e.id)
	switch {
	case waited:
		t.stats.shared.Add(1)
	case t.attached().phase(e, now()) == remote.PhaseFresh:
		t.stats.hits.Add(1)
	default:
		t.stats.staleHits.Add(1)
	}
	return remote.Value[V]{
		Value:    v,
		LoadedAt: fromMicros(e.at),
		Took:     fromUS(e.took),
	}
}

// hold runs the Load's load, with ctx, under the lease tok, then writes
// the entry (success) or releases the lease (failure). Whatever happens
// after the lease was taken (load, or user code after it, panics or ends
// its goroutine with runtime.Goexit), its deferred release drops the
// lease if nothing else did, which wakes the processes waiting on it.
// fleet is the shared value the load revalidates, if any: when the load
// answers ErrNotModified it is stored again, renewed, for every process. A
// failed load is covered by the shared entry only if covers. stored
// reports whether the value (or a not-found marker) became the shared
// entry.
func (r *loadRun[K, V]) hold(ctx context.Context, tok string, fleet *V, covers bool) (rv remote.Value[V], err error, stored bool) {
	t := r.t
	t.stats.leases.Add(1)
	stop := t.link.beat(r.ks, tok)
	bg := context.WithoutCancel(ctx) // the lease must be released even if ctx ended
	settled := false                 // the lease was written or released
	defer func() {
		stop()
		if !settled {
			t.link.release(bg, r.ks, tok, "", false)
		}
	}()
	if t.attached().tagged() { // the stamp of the value's entry, read before the load starts (tags.go)
		r.clock, r.clockOK = t.tags.readClock(ctx)
	}
	start := time.Now()
	v, err := r.load(ctx)
	end := time.Now()
	stop()
	switch {
	case errors.Is(err, flightcache.ErrNotModified) && fleet == nil:
		// Not a failure, but the Loader's own value, which the tier does
		// not have.
		t.link.release(bg, r.ks, tok, "", false)
		settled = true
		return remote.Value[V]{}, err, false
	case errors.Is(err, flightcache.ErrNotModified):
		// Not a failure: the fleet's value revalidated is still current.
		rv = loaded(*fleet, start, end)
	case err != nil:
		rv, err, stored = r.failed(ctx, tok, err, covers)
		settled = true
		return rv, err, stored
	default:
		rv = loaded(v, start, end)
	}
	stored = r.write(bg, tok, rv)
	settled = true
	return rv, err, stored
}

// failed settles the lease tok after the load failed with err: a
// not-found shared as a marker, else a release that leaves the failure
// for the waiters and returns the entry that may cover it (if covers).
func (r *loadRun[K, V]) failed(ctx context.Context, tok string, err error, covers bool) (remote.Value[V], error, bool) {
	t := r.t
	bg := context.WithoutCancel(ctx)
	fail := t.failure(ctx, tok, err)
	if fail != "" && t.attached().sharesNotFound(err) {
		return remote.Value[V]{}, err, r.writeNotFound(bg, tok)
	}
	e := t.link.release(bg, r.ks, tok, fail, covers && t.attached().mayCover(err))
	if t.dead(r.ks) || !covers { // an InvalidateAll ended the entry's generation: it covers nothing
		e = entry{}
	}
	t.tags.live(bg, &e) // nor does an entry whose tag was invalidated
	rv, err := t.cover(e, err)
	return rv, err, false
}

// loaded is the value a load returned, loaded between start and end.
func loaded[V any](v V, start, end time.Time) remote.Value[V] {
	return remote.Value[V]{Value: v, LoadedAt: end, Took: end.Sub(start), Loaded: true}
}

// writeNotFound stores a not-found marker as the Load's entry if the lease
// tok is still held, drops the lease and wakes its waiters, so every process (the
// ones waiting on this lease included) gets the not-found from the tier.
func (r *loadRun[K, V]) writeNotFound(ctx context.Context, tok string) (stored bool) {
	t, ks := r.t, r.ks
	if t.dead(ks) { // of a generation an InvalidateAll ended: not stored
		t.stats.writesLost.Add(1)
		t.link.release(ctx, ks, tok, "", false)
		return false
	}
	call := t.link.notFoundCall(ks, tok, t.attached().rules.NotFoundTTL)
	c, cancel := t.link.op(ctx)
	n, err := call.script.Run(c, t.link.scripts, call.keys, call.args...).Int()
	cancel()
	switch {
	case err != nil:
		t.link.failed()
	case t.stats.stored(n):
		t.copies.served.Drop(ks.base)
		return true
	}
	return false
}

// stored reports whether a write (or a not-found marker) made under a
// lease took effect: n is the script's answer, writeLost when the lease
// was gone, which Stats.WritesLost counts, or writeOutdated when the entry
// holds a higher version, which Stats.WritesOutdated counts.
func (c *counters) stored(n int) bool {
	switch n {
	case writeLost:
		c.writesLost.Add(1)
		return false
	case writeOutdated:
		c.writesOutdated.Add(1)
		return false
	}
	return true
}

// write stores rv as the Load's entry, with the windows the Loader's options
// give this value (Rules.WindowsOf: per-value Freshness included), if the
// lease tok is still held. A value not to share (see encode) is not
// stored: the lease is released instead, which wakes the processes waiting
// on it, so they load for themselves at once. Nor is a value loaded under
// the lease of a generation that has ended (an InvalidateAll during the
// load): it is counted in WritesLost. Nor is a value of a lower version
// than the entry's (version.go): the script drops the lease and wakes the
// waiters all the same, and it is counted in WritesOutdated. The entry
// written is recorded as the Loader's copy for the Load (handOver). It reports whether rv became the shared entry.
func (r *loadRun[K, V]) write(ctx context.Context, tok string, rv remote.Value[V]) (stored bool) {
	t, ks, key := r.t, r.ks, r.key
	enc, ok := t.encode(key, rv, rand.Float64())
	if ok && t.dead(ks) {
		t.stats.writesLost.Add(1)
		ok = false
	}
	if ok && len(enc.tags) > 0 {
		ok = r.clockOK && t.tags.fillLive(ctx, enc.tags, r.clock)
		enc.tg = tagText(r.clock, enc.tags)
	}
	if !ok {
		t.link.release(ctx, ks, tok, "", false)
		return false
	}
	id, args := t.link.writeArgs(ks, enc)
	t.copies.filling(ks.entry)
	c, cancel := t.link.op(ctx)
	n, held, err := writeAnswer(writeScript.Run(c, t.link.scripts, writeKeys(ks), append([]any{tok}, args...)...))
	cancel()
	switch {
	case err != nil:
		t.link.failed()
	case t.stats.stored(n):
		t.copies.handOver(ks, r.tk, id)
		return true
	case n == writeOutdated:
		t.outdatedFill(ks, key, held)
	}
	return false
}

// encoded is a value ready to be written as a key's entry: its encoding
// and its times (Unix µs), and its Redis lifetime.
type encoded struct {
	data                          []byte
	at, took, fresh, stale, until int64
	life                          time.Duration
	ver                           string   // the value's version (versionText); "" without Version
	tags                          []string // the value's tags (Rules.Tags); none without
	tg                            string   // the "tg" field: tags and stamp (tags.go), set by the writer
}

// encode prepares the write of rv as the entry of key, its windows'
// bounds by the Loader's rule (remote.Windows.Bounds), its freshness
// the one drawn at u (remote.Windows.Draw, u uniform in [0, 1)): the
// entry is one cached value, and draws its freshness once, as the
// Loader's entries do. ok is false
// for a value not to share: one the Loader would not cache, any value
// before the tier is attached, or one the tier cannot write, counted in
// EncodeErrors (the Codec failed or panicked, or
// Options.Freshness panicked). It calls user code (Options.Freshness, the
// Codec) on the caller's goroutine, and recovers their panics: the value
// still reaches the Loader, which asks Freshness again, recovers that
// panic too and serves the value uncached, as it does without the tier.
func (t *Tier[K, V]) encode(key K, rv remote.Value[V], u float64) (enc encoded, ok bool) {
	if t.attached() == nil { // no rules to write it by: not shared
		return encoded{}, false
	}
	w, data, ver, tags, ok := t.prepare(key, rv.Value)
	if !ok {
		return encoded{}, false
	}
	at := fromMicros(micros(rv.LoadedAt))
	w.Fresh = w.Draw(u)
	b := stored(w).Bounds(at)
	// Redis frees the entry when no process can use it: past its own
	// freshness and windows. "Never" (a TTL of math.MaxInt64) stays about
	// 292 years.
	life := b.UsableUntil.Sub(at)
	return encoded{data: data, at: micros(at), took: rv.Took.Microseconds(),
		fresh: micros(b.FreshUntil), stale: micros(b.StaleUntil), until: micros(b.UsableUntil), life: life, ver: ver, tags: tags}, true
}

// prepare runs the user code of encode: the windows of v (Rules.WindowsOf,
// which calls Options.Freshness), its version (Rules.Version, see
// version.go), its tags (Rules.Tags: more than MaxTags, not shared) and
// its encoding. ok is false when v is not to be shared; a
// failure or a panic of any of them is counted in EncodeErrors, and a
// panic does not go on.
func (t *Tier[K, V]) prepare(key K, v V) (w remote.Windows, data []byte, ver string, tags []string, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			t.stats.encodeErrors.Add(1)
			w, data, ver, tags, ok = remote.Windows{}, nil, "", nil, false
		}
	}()
	w, keep := t.attached().windowsOf(key, v)
	if !keep {
		return w, nil, "", nil, false
	}
	ver = t.attached().versionText(v)
	if tf := t.attached().rules.Tags; tf != nil {
		if tags = tf(key, v); tooManyTags(tags) { // the Loader does not cache it (ErrTooManyTags)
			return w, nil, "", nil, false
		}
	}
	data, err := t.codec.Marshal(v)
	if err != nil {
		t.stats.encodeErrors.Add(1)
		return w, nil, "", nil, false
	}
	return w, data, ver, tags, true
}

// decode has codec decode an entry's value. A panic of Unmarshal is
// returned as an error: an entry the Codec panics on is one that does not
// decode (counted in DecodeErrors where decode failures are, reloaded under
// the lease and overwritten), and the panic cannot leave a lease taken
// before it behind.
func decode[V any](codec Codec[V], data []byte) (v V, err error) {
	defer func() {
		if r := recover(); r != nil {
			var zero V
			v, err = zero, fmt.Errorf("flightredis: Codec.Unmarshal panicked: %v", r)
		}
	}()
	return codec.Unmarshal(data)
}

// writeKeys are writeScript's KEYS for ks.
func writeKeys(ks keys) []string { return []string{ks.entry, ks.lease, ks.alive} }

// failure is what a failed load leaves for the processes that waited on it:
// "" when the failure says nothing about the downstream (the load was
// cancelled here, or the breaker or the Loader's Limit refused it: the
// other processes have items and breakers of their own), so a waiter
// loads instead. A
// not-found by the Loader's rule is marked so: the waiters' error matches
// flightcache.ErrNotFound.
func (t *Tier[K, V]) failure(ctx context.Context, tok string, err error) string {
	switch {
	case errors.Is(err, flightcache.ErrBreakerOpen),
		errors.Is(err, flightcache.ErrLimited),
		errors.Is(err, context.Canceled),
		errors.Is(err, flightcache.ErrClosed),
		ctx.Err() != nil && !errors.Is(context.Cause(ctx), flightcache.ErrLoadTimeout):
		return ""
	}
	kind := "err"
	if t.attached().notFound(err) {
		kind = "nf"
	}
	msg := err.Error()
	if len(msg) > 512 {
		msg = msg[:512]
	}
	return tok + "\n" + kind + "\n" + msg
}

// peerError turns a failure left by another process into this Load's error.
func peerError(v any) error {
	s, _ := v.(string)
	parts := strings.SplitN(s, "\n", 3)
	if len(parts) < 3 {
		return ErrPeerFailed
	}
	if parts[1] == "nf" {
		return fmt.Errorf("%w: %w: %s", ErrPeerFailed, flightcache.ErrNotFound, parts[2])
	}
	return fmt.Errorf("%w: %s", ErrPeerFailed, parts[2])
}

// ctxError is the error of a Load whose context ended while it waited.
func ctxError(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause != nil && cause != err {
		return fmt.Errorf("flightredis: waiting for another process's load: %w: %w", cause, err)
	}
	return fmt.Errorf("flightredis: waiting for another process's load: %w", err)
}

// fallback serves a Load locally after a Redis failure: unless the Load's
// own context ended (then there is nothing to do), it counts the failure,
// steps the tier aside and calls load.
func (t *Tier[K, V]) fallback(ctx context.Context, name string, load func(context.Context) (V, error)) (remote.Value[V], error) {
	if ctx.Err() != nil {
		return remote.Value[V]{}, ctxError(ctx)
	}
	// The cause is in Redis; the caller gets load's result instead.
	t.link.failed()
	return t.local(ctx, name, load)
}

// localUnlessDone serves a Load locally after a failure already recorded,
// unless the Load's own context ended.
func (t *Tier[K, V]) localUnlessDone(ctx context.Context, name string, load func(context.Context) (V, error)) (remote.Value[V], error) {
	if ctx.Err() != nil {
		return remote.Value[V]{}, ctxError(ctx)
	}
	return t.local(ctx, name, load)
}

// local calls load without the tier, for the key named name: what it
// returns may be newer than the key's shared entry (ahead.go).
func (t *Tier[K, V]) local(ctx context.Context, name string, load func(context.Context) (V, error)) (remote.Value[V], error) {
	t.stats.localLoads.Add(1)
	t.copies.untracked()
	rv, err := aside(ctx, load)
	if err == nil || t.attached().notFound(err) {
		t.ahead.Mark(name)
	}
	return rv, err
}

// aside calls load, without the lease.
func aside[V any](ctx context.Context, load func(context.Context) (V, error)) (remote.Value[V], error) {
	start := time.Now()
	v, err := load(ctx)
	end := time.Now()
	if err != nil {
		return remote.Value[V]{}, err
	}
	return loaded(v, start, end), nil
}

// Set implements [remote.Remote]: it stores v as key's shared entry
// (in the current generation, see [Tier.InvalidateAll]), drops any lease
// on key, so a load in flight in another process does not overwrite it,
// and has every other process of the fleet drop its local copy of key
// (invalidate.go). A value the Loader would not cache (or the
// tier cannot write: the Codec fails or panics, or Options.Freshness
// panics; or any value, before the tier is attached to a Loader, when it
// has no windows to write it with) is not shared: key's shared entry is
// deleted instead. A Set that cannot reach Redis is replayed as an
// invalidation once it can.
//
// With the Loader's Options.Version, a Set does not replace a shared entry
// of a higher version (docs/design.md rule 30, see version.go): it then
// changes nothing in Redis and tells no process, counts in
// Stats.WritesOutdated, and has this process's Loader drop its copy of
// key, so that its next Get reads the fleet's newer value.
func (t *Tier[K, V]) Set(ctx context.Context, key K, v remote.Value[V]) {
	t.used.Store(true)
	name := t.key(key)
	t.fleet.handed(name, key)
	t.copies.running.Cut(keysAt(t.opts.Prefix, name, t.gen.Load()).base) // the Loader holds v now
	if t.closed.Load() || t.link.down() || !t.ready(ctx) {
		t.skip(name, key)
		return
	}
	since := t.ahead.Now()
	enc, ok := t.encode(key, v, rand.Float64())
	ok = ok && t.tags.stampSet(ctx, &enc) // stamped with the tag clock now (tags.go)
	if !ok {
		if !t.invalidate(ctx, name, key) {
			t.keep(name, key)
		}
		return
	}
	quiet := t.quiet() // tracking or channels: no message on the classic channel
	var id string
	var ks keys // of the write under the current generation
	echo := false
	cmd, ok := t.atGen(ctx, func(gen int64) evalCall {
		ks = keysAt(t.opts.Prefix, name, gen)
		var args []any
		id, args = t.link.writeArgs(ks, enc)
		args = append([]any{""}, args...)
		if !quiet {
			args = append(args, t.invChannel, t.invalidation(name, key))
		}
		echo = t.copies.writing(ks.entry)
		return evalCall{writeScript, writeKeys(ks), args}
	})
	outdated := ok && writeOutdated == first(writeAnswer(cmd))
	ok = ok && !outdated && t.published(ctx, name, key)
	t.copies.wrote(key, ks.entry, echo, ok)
	switch {
	case outdated:
		t.outdatedSet(key)
	case !ok:
		t.keep(name, key)
	default:
		t.reached(name)
		t.ahead.Clear(name, since) // the fleet's later values are newer than this one
		t.copies.served.Note(ks.base, id)
		t.copies.trackWritten(ctx, key, ks, id)
	}
}

// Invalidate implements [remote.Remote]: it deletes key's shared entry
// and drops any lease on key, so a load in flight elsewhere does not store
// its result (the next miss anywhere loads afresh), and has every other
// process of the fleet drop its local copy of key (invalidate.go). An
// Invalidate that cannot reach Redis is replayed once it can.
func (t *Tier[K, V]) Invalidate(ctx context.Context, key K) {
	t.used.Store(true)
	name := t.key(key)
	t.copies.running.Cut(keysAt(t.opts.Prefix, name, t.gen.Load()).base) // the Loader holds nothing now
	if t.closed.Load() || t.link.down() || !t.ready(ctx) {
		t.skip(name, key)
		return
	}
	if !t.invalidate(ctx, name, key) {
		t.keep(name, key)
	}
}

// skip counts a Set or Invalidate not passed on to Redis, and keeps it for
// replay; after Close it is lost.
func (t *Tier[K, V]) skip(name string, key K) {
	t.stats.skipped.Add(1)
	if t.closed.Load() {
		t.stats.invalidationsLost.Add(1)
		return
	}
	t.keep(name, key)
}

package flightredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// This file is fleet-wide InvalidateAll: one command drops every shared
// entry of the tier, whatever their number, and has every process drop its
// local copies.
//
//   - The names of a key's state carry the generation they belong to
//     (keysAt). The current generation is a counter in Redis,
//     "<prefix>generation" (0 while it does not exist). InvalidateAll
//     moves it on, in a script that also publishes the new generation on
//     the invalidated channel. Entries, leases and not-found markers of
//     older generations are never read again; they expire by their own
//     lifetimes.
//   - Every round trip that reads or writes a key's state reads the
//     counter too, after it, in the same pipeline (on a Cluster the two
//     commands go to their nodes at once: the counter has a hash slot of its
//     own, and no script may touch both). The tier names the state with
//     the newest generation it knows; when the counter says a newer one,
//     what the round trip read is not used, and it goes again under the
//     newer generation. So a Load, Set or Invalidate that starts after an
//     InvalidateAll returned, in any process, works in the new generation
//     whether or not its process has heard the message yet.
//   - The tier never hands its Loader anything of a generation older than
//     the newest it knows: a Load that learns of a newer one while it
//     waits starts again under it, and a load that ran under an older
//     generation's lease writes nothing (Stats.WritesLost).
//   - A tier has its Loader drop every local copy
//     (remote.LocalCache.DropAll) when it first learns of a newer
//     generation that it did not make: from the message, from the counter
//     read with a round trip, or from the counter read each time the
//     subscription is confirmed (a message sent while it was down was not
//     heard). Before the Loader's first call, it only takes note.
//   - An InvalidateAll that cannot reach Redis is kept. Until a generation
//     move covers it (the next Load, Set or Invalidate sends it first; so
//     does the replay of invalidate.go), the tier uses nothing from Redis.
//   - A counter below the newest generation the tier knows was lost (a
//     Redis restart without persistence, a failover before the move was
//     replicated, a DEL): the tier sets it back to that generation.

// errNotRestored is the failure of a round trip that found the shared
// generation lost and could not set it back (restore recorded it).
var errNotRestored = errors.New("flightredis: the shared generation could not be set back")

// maxGenTries bounds how many times one operation goes again under a newer
// generation; then it is done without Redis (a Load loads locally, a Set or
// Invalidate is kept for replay).
const maxGenTries = 4

// invalidateAllScript moves the generation KEYS[1] on and publishes the
// new one on the invalidated channel ARGV[1], after ARGV[2] (the origin
// and the mark of an InvalidateAll). The new generation is always past
// ARGV[3], the newest the caller knows, even if the counter was lost.
var invalidateAllScript = redis.NewScript(`
local g = redis.call('INCR', KEYS[1])
local known = tonumber(ARGV[3])
if g <= known then
  g = known + 1
  redis.call('SET', KEYS[1], g)
end
redis.call('PUBLISH', ARGV[1], ARGV[2] .. g)
return g
`)

// restoreScript sets the generation KEYS[1] back to ARGV[1] if it is
// below: {generation, 1 if it was set}.
var restoreScript = redis.NewScript(`
local g = tonumber(redis.call('GET', KEYS[1]) or '0')
if g < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return {tonumber(ARGV[1]), 1}
end
return {g, 0}
`)

var _ remote.AllInvalidator = (*Tier[string, int])(nil)

// InvalidateAll implements [remote.AllInvalidator], for
// [flightcache.Loader.InvalidateAll]: it moves the shared tier on to a new
// generation, in one Redis command whatever the tier holds, and publishes
// it to the fleet. Every entry, lease and not-found marker written before
// is then absent for every process: when InvalidateAll returns, a Load,
// Set or Invalidate that starts in any process, whether or not it has
// heard of the call, works in the new generation, because each of them
// reads the generation with the key. A load in flight under an older
// generation answers its own callers but writes nothing. Each other
// process drops its local copies when it hears the message (or learns of
// the new generation from Redis first), as for [Tier.Invalidate]; the
// calling process's Loader drops its own.
//
// The old generations' keys are not deleted (that would take a SCAN of
// Redis): they stay until their own expiry, and
// docs/distributed-invalidation.md says what that means for values that
// never expire.
//
// An InvalidateAll that cannot reach Redis (the tier is stepping aside,
// or the round trip fails) is not lost: it is kept, the tier steps aside
// for RetryAfter, and until a generation move has covered it this tier
// hands its Loader nothing from Redis (the next Load, Set or Invalidate
// makes the move first, or loads locally). The calls that wait for that
// move wait at most Timeout: after a move that failed they go on without
// Redis, rather than each try again in turn. Stats counts InvalidateAll
// calls (InvalidateAllsSent, Replayed, Lost, Heard). After Close it is
// lost.
func (t *Tier[K, V]) InvalidateAll(ctx context.Context) {
	t.used.Store(true)
	if t.closed.Load() {
		t.stats.invalidateAllsLost.Add(1)
		return
	}
	if t.link.down() {
		t.allRetry.Add(1) // first: see moveGen
		t.allKept.Add(1)
		t.stats.skipped.Add(1)
		return
	}
	t.allKept.Add(1) // from here a Load waits for the move, or loads locally
	t.moveGen(ctx, true)
}

// moveGen moves the generation on for the InvalidateAll calls kept (own:
// for the caller's own call, which is among them), if any are. It reports
// whether none is left. One move at a time: a Load that finds calls kept
// waits here for the move in progress (at most Timeout) rather than read
// what the move drops. A call that waited does not try a move of its own
// if the one it waited for failed, the tier is stepping aside, or its ctx
// is done: it goes on without Redis (a Load loads locally), so no caller
// waits for more than one move, however many queue up while Redis does
// not answer.
func (t *Tier[K, V]) moveGen(ctx context.Context, own bool) bool {
	failures := t.allFailed.Load()
	t.allMu.Lock()
	defer t.allMu.Unlock()
	kept := t.allKept.Load()
	if kept == 0 {
		return true // another call's move covered them
	}
	if t.allFailed.Load() != failures || t.link.down() || ctx.Err() != nil {
		if own { // kept, as when the tier steps aside (InvalidateAll)
			t.allRetry.Add(1)
			t.stats.skipped.Add(1)
		}
		return false
	}
	retried := t.allRetry.Load()
	if own {
		// A reply that shows this move before its own reply arrives must
		// not drop the Loader's copies: the Loader does it after the call.
		t.ownAll.Add(1)
		defer t.ownAll.Add(-1)
	}
	sent := t.gen.Load()
	c, cancel := t.link.op(ctx)
	g, err := invalidateAllScript.Run(c, t.link.scripts, []string{t.genKey}, t.invChannel, t.origin+"\n*", sent).Int64()
	cancel()
	if err != nil {
		if own {
			t.allRetry.Add(1)
		}
		if ctx.Err() == nil {
			// Step aside whatever the failure (a refused command too): the
			// move is tried again once per RetryAfter, not by every Load,
			// nor by the calls that waited for this one.
			t.allFailed.Add(1)
			t.link.failed()
		}
		return false
	}
	// A replay drops nothing here: since the call, the tier handed its
	// Loader nothing from Redis. Unless other processes moved the
	// generation meanwhile, unheard: then their moves drop the copies.
	t.advance(g, own || g == sent+1)
	t.allKept.Add(-kept)
	t.allRetry.Add(-retried)
	t.stats.invalidateAllsSent.Add(1)
	t.stats.invalidateAllsReplayed.Add(uint64(retried))
	return true
}

// ready reports whether the tier may use Redis: an InvalidateAll of this
// process that has not reached Redis yet goes first, or the tier would hand
// its Loader entries from before it.
func (t *Tier[K, V]) ready(ctx context.Context) bool {
	return t.allKept.Load() == 0 || t.moveGen(ctx, false)
}

// advance makes g the newest generation the tier knows, if it is newer. A
// move the tier did not make itself (own false) has its Loader drop every
// local copy, unless an InvalidateAll of this process is in progress (its
// Loader drops them after it), or the Loader has not called the tier yet
// (the generation a tier reads when it starts: its Loader holds nothing
// from before). It reports whether g was newer.
func (t *Tier[K, V]) advance(g int64, own bool) bool {
	for {
		cur := t.gen.Load()
		if g <= cur {
			return false
		}
		if t.gen.CompareAndSwap(cur, g) {
			break
		}
	}
	// The Loader drops every copy (DropAll, or its own InvalidateAll),
	// which detaches the Loads running then, of this generation too.
	t.copies.running.CutAll()
	t.copies.served.Reset() // the versions handed over were of older generations
	if own || t.ownAll.Load() > 0 || !t.used.Load() {
		return true
	}
	t.stats.invalidateAllsHeard.Add(1)
	t.fleet.each(func(l remote.LocalCache[K]) { l.DropAll() })
	return true
}

// seen takes note of g, the shared generation read in the reply to a round
// trip made under generation sent (the newest the tier knew when it sent
// it). It returns the newest generation the tier knows now: what the round
// trip read or wrote stands only if that is still sent. A counter below
// sent was lost and is set back; ok is false if that failed.
func (t *Tier[K, V]) seen(ctx context.Context, g, sent int64) (cur int64, ok bool) {
	if g < sent && !t.restore(ctx, sent) {
		return sent, false
	}
	t.advance(g, false)
	return t.gen.Load(), true
}

// restore sets the shared generation back to want if it is below it.
func (t *Tier[K, V]) restore(ctx context.Context, want int64) bool {
	c, cancel := t.link.op(ctx)
	res, err := restoreScript.Run(c, t.link.scripts, []string{t.genKey}, want).Int64Slice()
	cancel()
	if err == nil && len(res) != 2 {
		err = errors.New("flightredis: unexpected reply from the restore script")
	}
	if err != nil {
		t.writeFailed(ctx, err)
		return false
	}
	if res[1] == 1 {
		t.stats.generationRestores.Add(1)
	}
	t.advance(res[0], false)
	return true
}

// refreshGen reads the shared generation: each time the subscription is
// confirmed, since a move published while it was down was not heard. A
// failure is left to the next round trip, which reads it too.
func (t *Tier[K, V]) refreshGen() {
	sent := t.gen.Load()
	c, cancel := t.link.op(t.ctx)
	g, err := genOf(t.rdb.Get(c, t.genKey))
	cancel()
	if err == nil {
		t.seen(t.ctx, g, sent)
	}
}

// genOf reads the reply of a GET of the generation: 0 when it is missing.
func genOf(cmd *redis.StringCmd) (int64, error) {
	s, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, err
	}
	g, err := strconv.ParseInt(s, 10, 64)
	if err != nil || g < 0 {
		return 0, fmt.Errorf("flightredis: the generation key holds %q", s)
	}
	return g, nil
}

// dead reports whether ks is of a generation older than the newest the
// tier knows: nothing is written to it.
func (t *Tier[K, V]) dead(ks keys) bool { return ks.gen < t.gen.Load() }

// readEntry reads the entry of ks, then the shared generation, in one
// round trip.
func (t *Tier[K, V]) readEntry(ctx context.Context, ks keys) (vals []any, gen int64, err error) {
	cmds, g := t.copies.readEntries(ctx, nil, ks.entry) // tracked too (copies.go)
	hm := cmds[0]
	if err := hm.Err(); err != nil {
		return nil, 0, err
	}
	gen, err = genOf(g)
	return hm.Val(), gen, err
}

// evalAtGen runs call, then reads the shared generation, in one round trip
// (two when Redis lacks the script: EVALSHA, then EVAL).
func (t *Tier[K, V]) evalAtGen(ctx context.Context, call evalCall) (*redis.Cmd, int64, error) {
	run := func(sha bool) (cmd *redis.Cmd, g *redis.StringCmd) {
		t.link.pipelined(ctx, nil, func(c context.Context, p redis.Pipeliner) {
			if sha {
				cmd = call.script.EvalSha(c, p, call.keys, call.args...)
			} else {
				cmd = call.script.Eval(c, p, call.keys, call.args...)
			}
			g = p.Get(c, t.genKey)
		})
		return cmd, g
	}
	cmd, g := run(true)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, g = run(false)
	}
	if err := cmd.Err(); err != nil {
		return cmd, 0, err
	}
	gen, err := genOf(g)
	return cmd, gen, err
}

// atGen runs the script call that build makes for a generation: under the
// newest generation the tier knows, and again under a newer one if the
// generation read with it says so, at most maxGenTries times. It reports
// whether the call ran under the current generation, and returns that
// call's reply; a Redis failure is recorded as for a Set (writeFailed).
func (t *Tier[K, V]) atGen(ctx context.Context, build func(gen int64) evalCall) (*redis.Cmd, bool) {
	gen := t.gen.Load()
	for try := 1; ; try++ {
		cmd, g, err := t.evalAtGen(ctx, build(gen))
		if err != nil {
			t.writeFailed(ctx, err)
			return nil, false
		}
		cur, ok := t.seen(ctx, g, gen)
		switch {
		case !ok:
			return nil, false
		case cur == gen:
			return cmd, true
		case try == maxGenTries:
			return nil, false // kept for replay, as a write that missed Redis
		}
		gen = cur
	}
}

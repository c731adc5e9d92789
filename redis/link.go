package flightredis

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// link is the tier's side of its round trips to Redis: each bounded by
// Options.Timeout, the scripts of the lease protocol run patiently with a
// moving hash slot, and the step aside after a failure (Options.RetryAfter).
type link struct {
	rdb           redis.UniversalClient
	scripts       patient // rdb, for the scripts: patient with a moving hash slot
	timeout       time.Duration
	retryAfter    time.Duration
	holderTimeout time.Duration
	downUntil     atomic.Int64    // UnixNano until which Redis is skipped; 0 = up
	aliveMS       int64           // PX of a lease's alive key
	failMS        int64           // PX of a failure left for the waiters
	wakeCmd       string          // PUBLISH, or SPUBLISH on a Cluster: how the scripts publish a key's wake-up (package wake)
	ctx           context.Context // the tier's: cancelled by Close
	stats         *counters
}

// lease is a lease this process holds: its key's Redis names and token.
type lease struct {
	ks  keys
	tok string
}

// down reports whether the tier is stepping aside after a Redis failure.
func (l *link) down() bool {
	u := l.downUntil.Load()
	return u != 0 && time.Now().UnixNano() < u
}

// failed records a Redis failure and steps aside for RetryAfter.
func (l *link) failed() {
	l.stats.redisErrors.Add(1)
	l.downUntil.Store(unixNanoAfter(time.Now(), l.retryAfter))
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		// A master that stopped answering may have been replaced: have
		// go-redis read the hash slot map again (in the background, at most
		// every 200ms), rather than wait for its periodic reload.
		cc.ReloadState(l.ctx)
	}
}

// op returns the context of one Redis round trip.
func (l *link) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.timeout)
}

// pipelined sends the commands fill queues in one round trip, bounded by
// Options.Timeout; each command holds its own reply or error.
func (l *link) pipelined(ctx context.Context, trips *atomic.Uint64, fill func(context.Context, redis.Pipeliner)) {
	if trips != nil {
		trips.Add(1)
	}
	c, cancel := l.op(ctx)
	defer cancel()
	_, _ = l.rdb.Pipelined(c, func(p redis.Pipeliner) error {
		fill(c, p)
		return nil
	})
}

// evalAll runs calls in one pipelined round trip with EVALSHA, then those
// whose script the server did not have (NOSCRIPT: it has no effect) in a
// second one with EVAL, which also loads the script for the next time.
// (Script.Run cannot do this in a pipeline: it reads the reply of EVALSHA
// before it decides.) Each Cmd holds its call's reply or error. trips, if
// not nil, counts the round trips.
func (l *link) evalAll(ctx context.Context, calls []evalCall, trips *atomic.Uint64) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 0 {
		return cmds
	}
	l.pipelined(ctx, trips, func(c context.Context, p redis.Pipeliner) {
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
		l.pipelined(ctx, trips, func(c context.Context, p redis.Pipeliner) {
			for _, i := range missing {
				cmds[i] = calls[i].script.Eval(c, p, calls[i].keys, calls[i].args...)
			}
		})
	}
	return cmds
}

// beat extends the holder's alive key every HolderTimeout/3 until stop,
// which may be called more than once.
func (l *link) beat(ks keys, tok string) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(l.holderTimeout / 3)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-l.ctx.Done():
				return
			case <-tick.C:
			}
			c, cancel := l.op(l.ctx)
			n, err := beatScript.Run(c, l.scripts, []string{ks.lease, ks.alive}, tok, l.aliveMS).Int()
			cancel()
			if err == nil && n == 0 {
				return // lost the lease (Set, Invalidate, takeover): stop beating
			}
		}
	})
	return sync.OnceFunc(func() { close(quit); wg.Wait() })
}

// beatMany extends the alive keys of the leases of ss every
// HolderTimeout/3, in one round trip for all of them, until stop. A lease
// found lost (Set, Invalidate, takeover) is not beaten any more.
func (l *link) beatMany(ss []lease) (stop func()) {
	if len(ss) == 0 {
		return func() {}
	}
	live := slices.Clone(ss)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(l.holderTimeout / 3)
		defer tick.Stop()
		for len(live) > 0 {
			select {
			case <-quit:
				return
			case <-l.ctx.Done():
				return
			case <-tick.C:
			}
			calls := make([]evalCall, len(live))
			for i, s := range live {
				calls[i] = evalCall{beatScript, []string{s.ks.lease, s.ks.alive}, []any{s.tok, l.aliveMS}}
			}
			cmds := l.evalAll(l.ctx, calls, nil)
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

// release drops the lease tok and wakes the key's waiters, so they look again. A
// non-empty fail is left for the waiters of this lease to share. With want,
// it returns the key's entry as it is after the release (ok false if there
// is none, or Redis failed): what may cover the failed load.
func (l *link) release(ctx context.Context, ks keys, tok, fail string, want bool) entry {
	c, cancel := l.op(ctx)
	call := l.releaseCall(ks, tok, fail, want)
	res, err := call.script.Run(c, l.scripts, call.keys, call.args...).Slice()
	cancel()
	if err != nil {
		l.failed()
		return entry{}
	}
	e, _ := parseEntry(res) // an entry that does not parse covers nothing
	return e
}

// releaseCall is the releaseScript call of release.
func (l *link) releaseCall(ks keys, tok, fail string, want bool) evalCall {
	flag, drop := "", ""
	if want {
		flag = "1"
	}
	if strings.HasPrefix(fail, tok+"\nnf\n") { // a not-found (failure): the entry goes
		drop = "1"
	}
	return evalCall{releaseScript, []string{ks.lease, ks.alive, ks.fail, ks.entry},
		[]any{tok, fail, l.failMS, l.wakeCmd, ks.wake, flag, drop}}
}

// releaseAll releases the leases of ss, sharing nothing, in one round trip.
func (l *link) releaseAll(ctx context.Context, ss []lease) {
	if len(ss) == 0 {
		return
	}
	calls := make([]evalCall, len(ss))
	for i, s := range ss {
		calls[i] = l.releaseCall(s.ks, s.tok, "", false)
	}
	for _, cmd := range l.evalAll(ctx, calls, &l.stats.batchRoundTrips) {
		if cmd.Err() != nil {
			l.failed()
			return
		}
	}
}

// writeArgs are writeScript's arguments after the token, to write enc as
// the entry of ks, and the entry's new version id.
func (l *link) writeArgs(ks keys, enc encoded) (id string, args []any) {
	id = token(8)
	return id, []any{id, enc.data, enc.at, enc.took, enc.fresh, enc.stale, px(enc.life),
		l.wakeCmd, ks.wake, enc.until, enc.ver, enc.tg}
}

// notFoundCall is the notFoundScript call that stores a not-found marker as
// the entry of ks, under the lease tok, for ttl, the Loader's NotFoundTTL.
func (l *link) notFoundCall(ks keys, tok string, ttl time.Duration) evalCall {
	at := now()
	// A not-found is fresh for NotFoundTTL and has no stale windows, as
	// the Loader caches it.
	b := remote.Windows{Fresh: ttl.Truncate(time.Microsecond)}.Bounds(at)
	return evalCall{notFoundScript, writeKeys(ks), []any{tok, token(8), micros(at), micros(b.FreshUntil),
		px(ttl), l.wakeCmd, ks.wake}}
}

package flightredis

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/flightcache/flightcache"
)

// This file is fleet-wide invalidation: a Set or Invalidate in one process
// drops the key's local copy in every other process of the fleet.
//
//   - The write's script (writeScript for Set, invalidateScript) publishes,
//     in the same step as it changes the shared entry, a message on the
//     "invalidated" channel: the writing tier's origin, the key's name and
//     the key itself, JSON-encoded.
//   - Every other tier that hears it drops the key from its Loader
//     (flightcache.Local.Drop): the next Get there reads the shared entry
//     the write left. The key's JSON must decode to a key whose name is
//     the one published; if it does not, the tier cannot tell which key to
//     drop, and distrusts every copy instead.
//   - Pub/sub delivers at most once. When the subscription is found lost,
//     the tier distrusts every copy its Loader holds (flightcache.Local.
//     Distrust: each is read again before it is served); when it is
//     confirmed again, it distrusts again every copy the tier handed over
//     while it was not listening.
//   - A Set or Invalidate that cannot reach Redis (the tier is stepping
//     aside, or the round trip failed) is kept, and replayed as an
//     invalidation (the shared entry deleted, the message published) once
//     the subscription is confirmed again; at most maxServed keys are
//     kept, and Stats.InvalidationsLost counts the rest.

// Watch implements [flightcache.RemoteWatcher]: [flightcache.New] calls it
// with the Loader's local cache, which the tier then keeps in step with the
// fleet's Sets and Invalidates.
func (t *Tier[K, V]) Watch(local flightcache.Local[K]) {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	t.fleet.locals = append(t.fleet.locals, local)
}

// fleetState is the tier's side of fleet-wide invalidation.
type fleetState[K comparable] struct {
	mu      sync.Mutex
	locals  []flightcache.Local[K] // the Loaders watching; guarded by mu
	pending map[string]K           // names whose write did not reach Redis → key; guarded by mu

	missed atomic.Bool // a value was handed to the Loader while the subscription was not up
}

// each calls f for every watching Loader, outside the lock.
func (f *fleetState[K]) each(fn func(flightcache.Local[K])) {
	f.mu.Lock()
	locals := f.locals
	f.mu.Unlock()
	for _, l := range locals {
		fn(l)
	}
}

// invalidation is the message of a Set or Invalidate of key named name.
func (t *Tier[K, V]) invalidation(name string, key K) string {
	k, err := json.Marshal(key)
	if err != nil {
		k = nil // receivers cannot decode it: they distrust everything
	}
	return t.origin + "\n" + name + "\n" + string(k)
}

// onInvalidated handles a message of the invalidated channel.
func (t *Tier[K, V]) onInvalidated(payload string) {
	origin, rest, ok := strings.Cut(payload, "\n")
	if ok && origin == t.origin {
		return // this process's own write: its Loader dropped the key already
	}
	t.stats.invalidationsHeard.Add(1)
	name, raw, _ := strings.Cut(rest, "\n")
	var key K
	if !ok || json.Unmarshal([]byte(raw), &key) != nil || t.key(key) != name {
		t.stats.undecodedInvalidations.Add(1)
		t.distrust()
		return
	}
	t.served.drop(keysFor(t.opts.Prefix, name).base)
	t.fleet.each(func(l flightcache.Local[K]) { l.Drop(key) })
}

// onDown runs when the subscription is found lost: invalidations may be
// missed from now on, and may have been since the connection died.
func (t *Tier[K, V]) onDown() {
	t.stats.subscriptionLosses.Add(1)
	t.fleet.missed.Store(true)
	t.distrust()
}

// onUp runs each time the subscription is confirmed: what was handed to
// the Loader while it was not is distrusted, and the writes that did not
// reach Redis are replayed (and again on every tick of the subscription's
// health check while some are left).
func (t *Tier[K, V]) onUp() {
	if t.fleet.missed.Swap(false) {
		t.distrust()
	}
	t.replay()
}

// listening notes, at the start of a Load, whether the subscription is up:
// a value the tier hands over while it is not may have missed a write.
func (t *Tier[K, V]) listening() {
	if !t.events.up.Load() {
		t.fleet.missed.Store(true)
	}
}

// distrust has every copy the Loaders hold read again before it is served.
func (t *Tier[K, V]) distrust() {
	t.stats.distrusts.Add(1)
	t.served.reset() // what was handed over is read again, not reloaded
	t.fleet.each(func(l flightcache.Local[K]) { l.Distrust() })
}

// keep records a Set or Invalidate of key that did not reach Redis, to be
// replayed as an invalidation.
func (t *Tier[K, V]) keep(name string, key K) {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	if t.fleet.pending == nil {
		t.fleet.pending = make(map[string]K)
	}
	if _, ok := t.fleet.pending[name]; !ok && len(t.fleet.pending) >= maxServed {
		t.stats.invalidationsLost.Add(1)
		return
	}
	t.fleet.pending[name] = key
}

// replay sends the invalidations kept while Redis could not be reached.
// One that fails again is kept for the next time.
func (t *Tier[K, V]) replay() {
	t.fleet.mu.Lock()
	pending := t.fleet.pending
	t.fleet.pending = nil
	t.fleet.mu.Unlock()
	failed := false
	for name, key := range pending {
		if failed = failed || t.closed.Load() || t.down() || !t.invalidate(t.ctx, name, key); failed {
			t.keep(name, key) // Redis failed: the rest waits for the next time
			continue
		}
		t.stats.invalidationsReplayed.Add(1)
	}
}

// pendingWrites reports whether writes wait to be replayed.
func (t *Tier[K, V]) pendingWrites() bool {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	return len(t.fleet.pending) > 0
}

// invalidate deletes the shared entry of key (named name) and publishes
// the invalidation, in one step. It reports whether Redis did it.
func (t *Tier[K, V]) invalidate(ctx context.Context, name string, key K) bool {
	ks := keysFor(t.opts.Prefix, name)
	t.served.drop(ks.base)
	c, cancel := t.op(ctx)
	err := invalidateScript.Run(c, t.rdb, []string{ks.entry, ks.lease, ks.alive},
		t.channel, ks.base, t.invChannel, t.invalidation(name, key)).Err()
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			t.failed()
		}
		return false
	}
	t.stats.invalidationsSent.Add(1)
	return true
}

package flightredis

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// This file is fleet-wide invalidation: a Set or Invalidate in one process
// drops the key's local copy in every process of the fleet.
//
//   - The write's script (writeScript for Set, invalidateScript) publishes,
//     in the same step as it changes the shared entry, a message on the
//     "invalidated" channel: the writing tier's origin, the key as JSON,
//     and the key's name.
//   - Every tier that hears it drops the key from its Loader
//     (flightcache.LocalCache.Drop), the writer's own included: a Get
//     that raced the write may have read the old shared entry back into
//     the writer's cache. The next Get reads the shared entry the write
//     left. The key is the JSON one if it decodes to a key with the
//     published name and the key type survives JSON (no interface or
//     pointer in it); otherwise the one this tier handed over under that
//     name, if it remembers it; otherwise the tier cannot tell which copy
//     to drop, and distrusts every copy instead.
//   - Pub/sub delivers at most once. When the subscription is found lost,
//     the tier distrusts every copy its Loader holds
//     (flightcache.LocalCache.Distrust: each is read again before it is
//     served). Until it is confirmed again, it distrusts again, at each
//     failed attempt (about once a second), whatever it handed over since
//     the last time, and once more when the subscription is back.
//   - A Set or Invalidate that cannot reach Redis (the tier is stepping
//     aside, or the round trip failed) is kept, and replayed as an
//     invalidation (the shared entry deleted, the message published) once
//     the subscription is confirmed again, and then at each health check
//     while some are left, on a goroutine of its own; at most maxPending
//     keys are kept, and Stats.InvalidationsLost counts the rest.
//   - An InvalidateAll publishes, on the same channel, the writing tier's
//     origin and "*" with the new generation (two lines, which no Set or
//     Invalidate message is: a tier of an earlier version takes it for a
//     message it cannot read, and distrusts every copy). See generation.go.

// maxPending bounds the writes kept for replay.
const maxPending = 1 << 16

// Watch implements [flightcache.RemoteWatcher]: [flightcache.New] calls it
// with the Loader's local cache, which the tier then keeps in step with the
// fleet's Sets and Invalidates. A Tier serves one Loader; the Loader must
// be closed before the Tier.
func (t *Tier[K, V]) Watch(local flightcache.LocalCache[K]) {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	t.fleet.locals = append(t.fleet.locals, local)
}

// fleetState is the tier's side of fleet-wide invalidation.
type fleetState[K comparable] struct {
	mu      sync.Mutex
	locals  []flightcache.LocalCache[K] // the Loaders watching; guarded by mu
	pending map[string]K                // names whose write did not reach Redis → key; guarded by mu
	names   map[string]K                // name → key handed over, for key types JSON does not carry; guarded by mu

	jsonKeys  bool        // K survives a JSON round trip
	missed    atomic.Bool // a value was handed to the Loader while the subscription was not up
	replaying atomic.Bool // a replay goroutine runs
	replays   sync.WaitGroup
}

// each calls fn for every watching Loader, outside the lock.
func (f *fleetState[K]) each(fn func(flightcache.LocalCache[K])) {
	f.mu.Lock()
	locals := f.locals
	f.mu.Unlock()
	for _, l := range locals {
		fn(l)
	}
}

// jsonSafe reports whether every value of t comes back from JSON as the
// same comparable value: no interface (a number would come back a
// float64), no pointer (a new one), no unexported struct field (dropped).
func jsonSafe(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Interface, reflect.Pointer, reflect.UnsafePointer, reflect.Chan, reflect.Func, reflect.Map, reflect.Slice:
		return false
	case reflect.Array:
		return jsonSafe(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); !f.IsExported() || name == "-" || !jsonSafe(f.Type) {
				return false
			}
		}
	}
	return true
}

// handed remembers, for a key type JSON does not carry, the key this tier
// handed over (or wrote) under name, so an invalidation can name it.
func (t *Tier[K, V]) handed(name string, key K) {
	if t.fleet.jsonKeys {
		return
	}
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	if t.fleet.names == nil {
		t.fleet.names = make(map[string]K)
	}
	if _, ok := t.fleet.names[name]; !ok && len(t.fleet.names) >= maxServed {
		for k := range t.fleet.names { // forget one: a message for it distrusts everything
			delete(t.fleet.names, k)
			break
		}
	}
	t.fleet.names[name] = key
}

// invalidation is the message of a Set or Invalidate of key named name:
// origin, the key as JSON (never a newline in it), then the name (which
// may hold anything).
func (t *Tier[K, V]) invalidation(name string, key K) string {
	k, err := json.Marshal(key)
	if err != nil {
		k = []byte("null") // receivers look the name up, or distrust everything
	}
	return t.origin + "\n" + string(k) + "\n" + name
}

// onInvalidated handles a message of the invalidated channel. It runs user
// code (the key's UnmarshalJSON, Options.Key): a panic there distrusts
// every copy.
func (t *Tier[K, V]) onInvalidated(payload string) {
	parts := strings.SplitN(payload, "\n", 3)
	if len(parts) == 2 && strings.HasPrefix(parts[1], "*") {
		t.onInvalidatedAll(parts[0], parts[1][1:])
		return
	}
	if len(parts) == 3 && parts[0] != t.origin {
		t.stats.invalidationsHeard.Add(1)
	}
	key, ok := t.keyOf(parts)
	if !ok {
		t.stats.undecodedInvalidations.Add(1)
		t.distrust()
		return
	}
	t.served.drop(keysAt(t.opts.Prefix, parts[2], t.gen.Load()).base)
	t.fleet.each(func(l flightcache.LocalCache[K]) { l.Drop(key) })
}

// onInvalidatedAll handles the message of an InvalidateAll that moved the
// shared tier to generation gen: the Loader drops every copy, unless the
// tier knew of that generation already (and had it drop them then), or
// the message is this tier's own (its Loader drops them itself).
func (t *Tier[K, V]) onInvalidatedAll(origin, gen string) {
	g, err := strconv.ParseInt(gen, 10, 64)
	if err != nil || g < 0 {
		t.stats.undecodedInvalidations.Add(1)
		t.distrust()
		return
	}
	if origin == t.origin {
		return
	}
	t.advance(g, false)
}

// keyOf finds the key an invalidation's parts (origin, JSON, name) name.
func (t *Tier[K, V]) keyOf(parts []string) (key K, ok bool) {
	if len(parts) != 3 {
		return key, false
	}
	name := parts[2]
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	if t.fleet.jsonKeys {
		return key, json.Unmarshal([]byte(parts[1]), &key) == nil && t.key(key) == name
	}
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	key, ok = t.fleet.names[name]
	return key, ok
}

// onDown runs when the subscription is found lost: invalidations may be
// missed from now on, and may have been since the connection died.
func (t *Tier[K, V]) onDown() {
	t.stats.subscriptionLosses.Add(1)
	t.distrust()
}

// onRetry runs after each attempt to subscribe that failed: what the tier
// handed over since the last distrust may have missed a write.
func (t *Tier[K, V]) onRetry() {
	if t.fleet.missed.Swap(false) {
		t.distrust()
	}
}

// onUp runs each time the subscription is confirmed: what was handed to
// the Loader while it was not is distrusted, the shared generation is read
// (an InvalidateAll made while it was not is acted on now), and the writes
// that did not reach Redis are replayed.
func (t *Tier[K, V]) onUp() {
	t.onRetry()
	t.refreshGen()
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
	t.fleet.each(func(l flightcache.LocalCache[K]) { l.Distrust() })
	t.served.reset() // what was handed over is read again, not reloaded
}

// keep records a Set or Invalidate of key that did not reach Redis, to be
// replayed as an invalidation.
func (t *Tier[K, V]) keep(name string, key K) {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	if t.fleet.pending == nil {
		t.fleet.pending = make(map[string]K)
	}
	if _, ok := t.fleet.pending[name]; !ok && len(t.fleet.pending) >= maxPending {
		t.stats.invalidationsLost.Add(1)
		return
	}
	t.fleet.pending[name] = key
}

// reached notes that a write of name reached Redis: an older one kept for
// replay has nothing left to do.
func (t *Tier[K, V]) reached(name string) {
	t.stats.invalidationsSent.Add(1)
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	delete(t.fleet.pending, name)
}

// replay sends, on a goroutine of its own (one at a time), the
// InvalidateAll calls, then the invalidations, kept while Redis could not
// be reached. It stops at the first failure; the rest wait for the next
// time.
func (t *Tier[K, V]) replay() {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	if (len(t.fleet.pending) == 0 && t.allKept.Load() == 0) || t.closed.Load() || !t.fleet.replaying.CompareAndSwap(false, true) {
		return
	}
	t.fleet.replays.Add(1)
	go func() {
		defer t.fleet.replays.Done()
		defer t.fleet.replaying.Store(false)
		if t.closed.Load() || t.down() || !t.ready(t.ctx) {
			return
		}
		for !t.closed.Load() && !t.down() {
			name, key, ok := t.nextPending()
			if !ok || !t.invalidate(t.ctx, name, key) {
				return
			}
			t.stats.invalidationsReplayed.Add(1)
		}
	}()
}

// nextPending returns a write kept for replay (it stays kept until it
// reaches Redis).
func (t *Tier[K, V]) nextPending() (name string, key K, ok bool) {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	for name, key := range t.fleet.pending {
		return name, key, true
	}
	return "", key, false
}

// dropPending counts the writes and InvalidateAll calls still kept when
// the tier closes as lost.
func (t *Tier[K, V]) dropPending() {
	t.fleet.replays.Wait()
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	t.stats.invalidationsLost.Add(uint64(len(t.fleet.pending)))
	t.fleet.pending = nil
	t.allMu.Lock()
	defer t.allMu.Unlock()
	t.stats.invalidateAllsLost.Add(uint64(t.allKept.Swap(0)))
	t.allRetry.Store(0)
}

// invalidate deletes the shared entry of key (named name), in the current
// generation, and publishes the invalidation, in one step. It reports
// whether Redis did it.
func (t *Tier[K, V]) invalidate(ctx context.Context, name string, key K) bool {
	msg := t.invalidation(name, key)
	_, ok := t.atGen(ctx, func(gen int64) evalCall {
		ks := keysAt(t.opts.Prefix, name, gen)
		t.served.drop(ks.base)
		return evalCall{invalidateScript, []string{ks.entry, ks.lease, ks.alive},
			[]any{t.wakeCmd, ks.wake, t.invChannel, msg}}
	})
	if !ok {
		return false
	}
	t.reached(name)
	return true
}

// writeFailed records a Set or Invalidate that did not reach Redis. A
// connection failure or timeout steps the tier aside, as for a Load; an
// error Redis answered (a refused command, a Cluster slot in migration)
// does not: Redis is there, and the write is replayed later.
func (t *Tier[K, V]) writeFailed(ctx context.Context, err error) {
	var reply redis.Error
	switch {
	case ctx.Err() != nil: // the Loader closed: not Redis's doing
	case errors.As(err, &reply):
		t.stats.redisErrors.Add(1)
	default:
		t.failed()
	}
}

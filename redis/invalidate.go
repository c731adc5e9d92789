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

	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// This file is fleet-wide invalidation: a Set or Invalidate in one process
// drops the key's local copy in the processes that hold it.
//
//   - Tracking (package track, tracked.go, copies.go): the tier reads a key's shared
//     entry tracked (CLIENT CACHING yes, then HMGET of the entry alone, on
//     its master's tracked connection, which redirects to the tier's
//     invalidation connection there; alongside the usual read on the
//     tier's client, whose id it must match), so Redis itself sends the
//     entry's name to this process, and to no other, the next time the
//     entry changes: another process's write, and also its expiry, its
//     eviction, and this process's own later write. Only the holders of a
//     key hear of it. The scripts of Set and Invalidate then publish
//     nothing (their Go callers pass no invalidation message); a lease
//     holder's fill never did, but a holder hears of it now.
//   - A Load reads the entry tracked before it reads anything else of the
//     key, and the copy it hands over comes from that read or a later one:
//     any change after the tracked read comes back as an invalidation, so
//     no copy is kept untracked. A value handed over without a tracked
//     read (a local load, a master not armed yet, a hash slot that moved) has
//     the next health check distrust every copy.
//   - On an invalidation the tier drops the key's copy, unless it can show
//     the copy is still the entry's current version: a tracked read of the
//     entry's id (off the listener's goroutine) that finds the version it
//     handed over keeps it, tracked again. This process's own fill, and a
//     value it waited for, come back that way once. While a Load of the key
//     runs here, the check waits for its end. A name the tier cannot map
//     back to a key (for a key type other than a string named by default,
//     it remembers the last 65,536 names it handed over) distrusts every
//     copy; a null (FLUSHALL, FLUSHDB) too.
//   - The writer's own Set or Invalidate drops its own copy once, as
//     before: by the invalidation Redis sends back when this process
//     tracked the entry, else at once.
//   - Where Redis refuses CLIENT TRACKING (an ACL, a proxy), the tier falls
//     back to a fixed number of sharded invalidation channels (package shard):
//     every process hears every Set and Invalidate, which the writer
//     publishes right after its write. Before the tier knows which (its
//     first Timeout), and with a client it cannot track per master (a
//     Ring), a write publishes on the classic "invalidated" channel, which
//     every process still hears, as older versions do.
//   - A Set or Invalidate message on a channel carries the writing tier's
//     origin, the key as JSON, and the key's name. The key is the JSON one
//     if it decodes to a key with the published name and the key type
//     survives JSON (no interface or pointer in it); otherwise the one this
//     tier handed over under that name, if it remembers it; otherwise the
//     tier cannot tell which copy to drop, and distrusts every copy
//     instead.
//   - Invalidations are delivered at most once. When the classic
//     subscription, a master's invalidation connection (or its tracked
//     connection's redirect, checked with CLIENT TRACKINGINFO at every
//     health check), or an invalidation channel is found lost, the tier
//     distrusts every copy its Loader holds (remote.LocalCache.Distrust:
//     each is read again before it is served) and makes it again (tracking
//     re-armed on the new connection). Until it is confirmed again, it
//     distrusts again, at each failed attempt (about once a second),
//     whatever it handed over since the last time, and once more when it is
//     back.
//   - A Set or Invalidate that cannot reach Redis (the tier is stepping
//     aside, or the round trip failed) is kept, and replayed as an
//     invalidation (the shared entry deleted, and with channels the message
//     published) once the subscription is confirmed again, and then at each
//     health check while some are left, on a goroutine of its own; at most
//     maxPending keys are kept, and Stats.InvalidationsLost counts the rest.
//   - An InvalidateAll stays a classic broadcast, rare as it is: it
//     publishes, on the "invalidated" channel, the writing tier's origin
//     and "*" with the new generation (two lines, which no Set or
//     Invalidate message is: a tier of an earlier version takes it for a
//     message it cannot read, and distrusts every copy). See generation.go.

// maxPending bounds the writes kept for replay.
const maxPending = 1 << 16

// Watch implements [remote.Watcher]: [flightcache.New] calls it
// with the Loader's local cache, which the tier then keeps in step with the
// fleet's Sets and Invalidates. A Tier serves one Loader; the Loader must
// be closed before the Tier.
func (t *Tier[K, V]) Watch(local remote.LocalCache[K]) {
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	t.fleet.locals = append(t.fleet.locals, local)
}

// maxNames bounds fleetState.names: when full, an arbitrary name is
// forgotten, and a message for it distrusts every copy.
const maxNames = 1 << 16

// fleetState is the tier's side of fleet-wide invalidation.
type fleetState[K comparable] struct {
	mu      sync.Mutex
	locals  []remote.LocalCache[K] // the Loaders watching; guarded by mu
	pending map[string]K           // names whose write did not reach Redis → key; guarded by mu
	names   map[string]K           // name → key handed over, for key types JSON does not carry; guarded by mu

	jsonKeys     bool           // K survives a JSON round trip
	defaultNames bool           // K is a string named by default (Options.Key nil): its name is itself
	track        *track.Tracker // the tier's: how it hears the fleet's writes
	missed       atomic.Bool    // a value was handed to the Loader while the subscription was not up
	replaying    atomic.Bool    // a replay goroutine runs
	replays      sync.WaitGroup
}

// each calls fn for every watching Loader, outside the lock.
func (f *fleetState[K]) each(fn func(remote.LocalCache[K])) {
	f.mu.Lock()
	locals := f.locals
	f.mu.Unlock()
	for _, l := range locals {
		fn(l)
	}
}

// keyNamed returns the key named name: the name itself for string keys
// named by default, else the key this tier handed over (or wrote) under
// that name, if it remembers it.
func (f *fleetState[K]) keyNamed(name string) (key K, ok bool) {
	if f.defaultNames {
		return any(name).(K), true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	key, ok = f.names[name]
	return key, ok
}

// remembersNames reports whether handed must remember the key of a name:
// the key type does not survive JSON (classic and channel messages carry
// JSON), or tracking names only the Redis key and the key is not a string
// named by default.
func (f *fleetState[K]) remembersNames() bool {
	if !f.jsonKeys {
		return true
	}
	if f.track.Mode() == track.Channels || f.track.Mode() == track.Classic {
		return false
	}
	return !f.defaultNames
}

// handed remembers, for a key type JSON does not carry, the key this tier
// handed over (or wrote) under name, so an invalidation can name it.
func (f *fleetState[K]) handed(name string, key K) {
	if !f.remembersNames() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.names == nil {
		f.names = make(map[string]K)
	}
	if _, ok := f.names[name]; !ok && len(f.names) >= maxNames {
		for k := range f.names { // forget one: a message for it distrusts everything
			delete(f.names, k)
			break
		}
	}
	f.names[name] = key
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
	if len(parts) == 2 && strings.HasPrefix(parts[1], "#") {
		t.tags.heard(parts[0], parts[1][1:])
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
	base := keysAt(t.opts.Prefix, parts[2], t.gen.Load()).base
	t.copies.running.Cut(base)
	t.copies.served.Drop(base)
	t.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
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
	if !t.hearing() {
		t.fleet.missed.Store(true)
	}
}

// distrust has every copy the Loaders hold read again before it is served.
func (t *Tier[K, V]) distrust() {
	t.stats.distrusts.Add(1)
	t.copies.running.CutAll() // a Get detaches its key's Load running now
	t.track.Echoes.Reset()    // an echo expected may never come
	t.fleet.each(func(l remote.LocalCache[K]) { l.Distrust() })
	t.copies.served.Reset() // what was handed over is read again, not reloaded
}

// keep records a Set or Invalidate of key that did not reach Redis, to be
// replayed as an invalidation.
func (t *Tier[K, V]) keep(name string, key K) {
	t.copies.epoch.Add(1) // the Loader holds a copy the tier did not hand over
	t.ahead.Mark(name)    // and Redis holds an older one (ahead.go)
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
	t.tags.replay()
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	if (len(t.fleet.pending) == 0 && t.allKept.Load() == 0) || t.closed.Load() || !t.fleet.replaying.CompareAndSwap(false, true) {
		return
	}
	t.fleet.replays.Add(1)
	go func() {
		defer t.fleet.replays.Done()
		defer t.fleet.replaying.Store(false)
		if t.closed.Load() || t.link.down() || !t.ready(t.ctx) {
			return
		}
		for !t.closed.Load() && !t.link.down() {
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
	since := t.ahead.Now()
	quiet := t.quiet() // tracking or channels: no message on the classic channel
	var entry string
	echo := false
	_, ok := t.atGen(ctx, func(gen int64) evalCall {
		ks := keysAt(t.opts.Prefix, name, gen)
		entry = ks.entry
		echo = t.copies.writing(entry)
		t.copies.served.Drop(ks.base)
		args := []any{t.link.wakeCmd, ks.wake}
		if !quiet {
			args = append(args, t.invChannel, t.invalidation(name, key))
		}
		return evalCall{invalidateScript, []string{ks.entry, ks.lease, ks.alive}, args}
	})
	ok = ok && t.published(ctx, name, key)
	t.copies.wrote(key, entry, echo, ok)
	if !ok {
		return false
	}
	t.reached(name)
	t.ahead.Clear(name, since) // whatever the fleet writes from now on was loaded after it
	return true
}

// published sends, in channels mode, the invalidation of a write of key
// (named name) that reached Redis on its channel (package shard). It reports
// false when that failed: the write is kept, and replayed as an
// invalidation.
func (t *Tier[K, V]) published(ctx context.Context, name string, key K) bool {
	if t.track.Mode() != track.Channels {
		return true
	}
	err := t.shards.Publish(ctx, name, t.invalidation(name, key))
	if err == nil {
		return true
	}
	t.writeFailed(ctx, err) // a refusal (an ACL) does not step the tier aside
	return false
}

// writeFailed records a Set or Invalidate that did not reach Redis. A
// connection failure or timeout steps the tier aside, as for a Load; an
// error Redis answered (a refused command, a Cluster hash slot in migration)
// does not: Redis is there, and the write is replayed later.
func (t *Tier[K, V]) writeFailed(ctx context.Context, err error) {
	var reply redis.Error
	switch {
	case ctx.Err() != nil: // the Loader closed: not Redis's doing
	case errors.As(err, &reply):
		t.stats.redisErrors.Add(1)
	default:
		t.link.failed()
	}
}

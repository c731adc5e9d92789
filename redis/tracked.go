package flightredis

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/redis/go-redis/v9"
)

// This file is the tier's side of tracking (package track; copies.go keeps
// the record of the Loader's copies): the listener's handlers, the
// invalidations Redis sends, and the Loads running.

// startTracking starts the listener that decides how the tier hears the
// fleet's writes: tracking, or, where Redis refuses it, sharded channels.
func (t *Tier[K, V]) startTracking() {
	interval := max(t.opts.Timeout*4, 500*time.Millisecond) // as the subscription's health check
	t.track.Start(t.ctx, t.rdb, track.Handlers{
		OnKeys: t.onTracked, OnFlush: t.onFlush,
		OnUp: t.onNodeUp, OnDown: t.onDown, OnRetry: t.onRetry,
		OnRefused: func() { t.shards.Start(t.ctx) }, OnConnLost: t.onConnLost,
		Timeout: t.opts.Timeout, Interval: interval,
	})
	t.copies.checks = make(chan check[K], 4096)
	t.track.Go(t.copies.checker)
}

// quiet reports whether this tier's Sets and Invalidates publish nothing
// on the classic channel: tracking, or channels (which publish on their
// own channel after the write).
func (t *Tier[K, V]) quiet() bool {
	m := t.track.Mode()
	return m == track.Tracking || m == track.Channels
}

// hearing reports whether the tier hears every write of the fleet that it
// must: the classic subscription (wake-ups, InvalidateAll) and, by the
// mode, every node's tracking or every sharded channel.
func (t *Tier[K, V]) hearing() bool {
	if !t.events.Up() {
		return false
	}
	switch t.track.Mode() {
	case track.Tracking:
		return t.track.AllUp()
	case track.Channels:
		return t.shards.AllUp()
	case track.Classic:
		return true
	}
	return false
}

// awaitStartup waits, at most until ctx ends, for the subscription and
// the listener to be confirmed for the first time (or a Timeout).
func (t *Tier[K, V]) awaitStartup(ctx context.Context) {
	t.events.AwaitStartup(ctx)
	t.track.AwaitStartup(ctx)
}

// onTick runs at every health check of the subscription: the writes kept
// are replayed, and values handed over untracked are distrusted once the
// tier hears again.
func (t *Tier[K, V]) onTick() {
	if t.hearing() && !t.link.down() && t.fleet.missed.Swap(false) {
		t.distrust()
	}
	t.replay()
}

// onNodeUp runs when a node is armed: what was handed over while it was
// not is distrusted, and the writes kept are replayed.
func (t *Tier[K, V]) onNodeUp() {
	t.onRetry()
	t.replay()
}

// onConnLost runs when a tracked connection closed after it carried
// tracked reads: Redis forgot the keys it tracked, and will send no
// invalidation of them. Every copy is distrusted.
func (t *Tier[K, V]) onConnLost() {
	t.stats.trackedConnsLost.Add(1)
	t.distrust()
}

// onFlush runs when Redis says every tracked key changed (FLUSHALL,
// FLUSHDB): every copy is distrusted.
func (t *Tier[K, V]) onFlush() {
	t.stats.undecodedInvalidations.Add(1)
	t.distrust()
}

// onTracked handles an invalidation of tracked keys: each entry key names
// a key whose copy is dropped. A name the tier cannot map back to a key
// distrusts every copy instead, once for the message. The echo of this
// process's own Set or Invalidate is not counted as heard.
func (t *Tier[K, V]) onTracked(names []string) {
	lost := false
	for _, s := range names {
		name, gen, ok := parseEntryName(t.opts.Prefix, s)
		if !ok {
			continue // not an entry of this tier
		}
		own := t.track.Echoes.Heard(s)
		if own == track.EchoNone {
			t.stats.invalidationsHeard.Add(1)
		}
		key, ok := t.fleet.keyNamed(name)
		switch {
		case !ok:
			t.stats.undecodedInvalidations.Add(1)
			lost = true
		case own == track.EchoWrite: // this process's own Set or Invalidate: dropped, as everywhere
			t.copies.dropKey(key, keysAt(t.opts.Prefix, name, gen))
		default:
			t.copies.invalidated(key, keysAt(t.opts.Prefix, name, gen))
		}
	}
	if lost {
		t.distrust()
	}
}

// check is a copy to check against its entry (verify).
type check[K comparable] struct {
	key K
	ks  keys
}

// idField is the field a check reads.
var idField = []string{"id"}

// parseEntryName reads the Redis name of an entry,
// "<prefix>{<tag>}[:g<gen>]:v" (keysAt): the key's name and the
// generation. ok is false for any other name.
func parseEntryName(prefix, s string) (name string, gen int64, ok bool) {
	rest, ok := strings.CutPrefix(s, prefix+"{")
	if !ok {
		return "", 0, false
	}
	tag, rest, ok := strings.Cut(rest, "}")
	if !ok {
		return "", 0, false
	}
	rest, ok = strings.CutSuffix(rest, ":v")
	if !ok {
		return "", 0, false
	}
	if rest != "" {
		g, err := strconv.ParseInt(strings.TrimPrefix(rest, ":g"), 10, 64)
		if err != nil || !strings.HasPrefix(rest, ":g") {
			return "", 0, false
		}
		gen = g
	}
	if tag != "%" {
		name = keyUnescaper.Replace(tag)
	}
	return name, gen, keysAt(prefix, name, gen).entry == s
}

// covered reports whether an entry read untracked (vals: HMGET
// entryFields, the id first) is the one its tracked id read (ids) saw.
func covered(ids *redis.SliceCmd, vals []any) bool {
	if ids.Err() != nil || len(ids.Val()) != 1 || len(vals) == 0 {
		return false
	}
	return ids.Val()[0] == vals[0]
}

// first is the first of a writeAnswer.
func first(n int, _ string, _ error) int { return n }

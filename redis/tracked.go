package flightredis

import (
	"context"
	"strconv"
	"strings"
	"sync"
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

// runningLoads are the keys (keys.base) a Load or LoadMany of this tier reads
// now, whether an invalidation of theirs came meanwhile, and whether the
// Loader's copy of them was cut (see cut) since each Load began.
type runningLoads struct {
	mu   sync.Mutex
	m    map[string]*keyLoads // guarded by mu
	cuts uint64               // cuts of every key (cutAll); guarded by mu
}

// keyLoads are the Loads of one key running now.
type keyLoads struct {
	n      int    // Loads of the key running
	pushed bool   // an invalidation came while they ran
	cuts   uint64 // cuts of the key while they ran
}

// ticket is what the cuts of a Load's key stood at when it began.
type ticket struct{ key, all uint64 }

// begin notes that a Load of base starts, and returns its ticket.
func (f *runningLoads) begin(base string) ticket {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]*keyLoads)
	}
	fl := f.m[base]
	if fl != nil {
		fl.n++
	} else {
		fl = &keyLoads{n: 1}
		f.m[base] = fl
	}
	return ticket{fl.cuts, f.cuts}
}

// cut notes that the Loader's copy of base is dropped or replaced by
// other means than a Load of this tier (a drop, this process's Set or
// Invalidate): the Loader detaches a Load of the key running then, and
// keeps nothing of it. Call it before the drop and before recording what
// the Loader holds instead.
func (f *runningLoads) cut(base string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil {
		fl.cuts++
	}
}

// cutAll is cut for every key (a distrust: a Get detaches the Loads of
// its key running then; a move to a new generation).
func (f *runningLoads) cutAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cuts++
}

// record runs note, the record of a copy a Load with ticket tk hands the
// Loader, unless the Loader's copy of base was cut since that Load began:
// the Loader keeps nothing of it then, and what it holds instead (the copy
// of a Load that began after the cut, or of a Set) is what served must
// name, else an invalidation of that copy is checked against the wrong
// version and lost. Under mu: a cut comes before the record, or finds it
// made and overrides it.
func (f *runningLoads) record(base string, tk ticket, note func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil && fl.cuts == tk.key && f.cuts == tk.all {
		note()
	}
}

// end notes that a Load of base ends; it reports whether an invalidation
// came while it ran (the last of them to end checks it).
func (f *runningLoads) end(base string) (pushed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := f.m[base]
	if fl == nil {
		return false
	}
	if fl.n--; fl.n > 0 {
		return false
	}
	delete(f.m, base)
	return fl.pushed
}

// pushed notes an invalidation of base; it reports whether a Load of it
// runs, which will have it checked when it ends.
func (f *runningLoads) pushed(base string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil {
		fl.pushed = true
		return true
	}
	return false
}

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
		name = strings.NewReplacer("%7D", "}", "%25", "%").Replace(tag)
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

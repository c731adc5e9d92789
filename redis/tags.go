package flightredis

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// This file is fleet-wide InvalidateTag (the Loader's Options.Tags,
// docs/design.md rule 42): one call drops, for every process, every shared
// entry that carries the tag, in two Redis commands whatever the tier
// holds, and has every other process drop its local copies that carry it.
//
//   - A tag clock, "<prefix>tagclock", counts the fleet's InvalidateTag
//     calls. Each tag ever invalidated has a stamp, "<prefix>tag{<tag>}"
//     (the tag escaped as a key's hash tag is, so tags spread over the
//     Cluster's slots): the clock value of its last invalidation.
//     InvalidateTag moves the clock on (INCR: n), then raises the tag's
//     stamp to n and publishes the tag on the invalidated channel, in one
//     script on the tag's slot. Neither visits an entry.
//   - A shared entry carries its tags and a stamp ("tg"): the clock as it
//     was read before the load that made it started (a Set: as it was when
//     the Set ran). It is absent, for every process, once any of its tags
//     has a stamp above its own: every read of a tagged entry reads its
//     tags' stamps after it, in one more round trip (tagged entries only),
//     so the check is exact whether or not the process has heard.
//   - A holder whose Loader has Tags reads the clock before its load
//     starts; once its value's tags are known, it reads their stamps, and
//     if one moved past the clock it read, the tag was invalidated during
//     the load: the fill is refused (the lease released, the value not
//     shared: Stats.TagFillsRefused), and the holder's own Loader drops the
//     tag (its callers still get the value; its cache keeps none of it).
//     A stamp raised after that read leaves an entry stored with the older
//     clock: absent by the rule above.
//   - The other processes drop their local copies when they hear the
//     message (remote.TagDropper); a process that may have missed it (its
//     subscription lost) distrusts every copy, as for a Set or Invalidate
//     (invalidate.go): each is read again, and the read checks the stamps.
//   - An InvalidateTag that cannot reach Redis is kept, and sent again at
//     the next health check (and when the subscription is back); until
//     then this tier takes no entry carrying the tag from Redis, nor shares
//     a value carrying it. The other processes cannot know of it until
//     then.
//   - The stamps and the clock never expire: a stamp must outlive every
//     entry stored before it. One small key per tag ever invalidated.

// tagField is the entry's hash field of its tags: "<stamp>\n<tags as a
// JSON array>"; absent for an untagged value.
const tagField = "tg"

// tagKey names tag's stamp: "<prefix>tag{<tag escaped>}" (never a key's
// name, which starts "<prefix>{").
func tagKey(prefix, tag string) string { return prefix + "tag" + keysFor("", tag).base }

// tagText is the "tg" field of tags stamped at stamp; "" for no tags.
func tagText(stamp int64, tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	b, _ := json.Marshal(tags) // strings: never fails
	return strconv.FormatInt(stamp, 10) + "\n" + string(b)
}

// parseTags reads a "tg" field: ok false if it does not parse.
func parseTags(s string) (stamp int64, tags []string, ok bool) {
	st, js, found := strings.Cut(s, "\n")
	if !found {
		return 0, nil, false
	}
	n, err := strconv.ParseInt(st, 10, 64)
	if err != nil || json.Unmarshal([]byte(js), &tags) != nil {
		return 0, nil, false
	}
	return n, tags, true
}

// tagger is the tier's side of tags: the stamps it reads and the
// InvalidateTag calls that did not reach Redis yet.
type tagger[K comparable] struct {
	rdb      redis.UniversalClient
	link     *link
	stats    *counters
	fleet    *fleetState[K]
	prefix   string          // Options.Prefix
	clock    string          // the fleet's tag clock in Redis
	origin   string          // the tier's, in its messages
	channel  string          // the invalidated channel
	ctx      context.Context // the tier's: replays run under it
	closed   *atomic.Bool    // the tier's
	distrust func()          // the tier's distrust

	mu        sync.Mutex
	kept      map[string]struct{} // tags whose InvalidateTag is to be sent again; guarded by mu
	replaying bool                // a goroutine sends them; guarded by mu
}

// maxKeptTags bounds the InvalidateTag calls kept for replay; beyond it
// they are lost (Stats.TagInvalidationsLost).
const maxKeptTags = 1 << 12

// invalidateTagScript raises the stamp KEYS[1] to ARGV[1] (the clock's
// new value) and publishes ARGV[3] on ARGV[2]: the tag's invalidation.
var invalidateTagScript = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
`)

var _ remote.TagInvalidator = (*Tier[string, int])(nil)

// InvalidateTag implements [remote.TagInvalidator], for
// [flightcache.Loader.InvalidateTag]: it moves the fleet's tag clock on
// and raises tag's stamp to it, in two Redis commands whatever the tier
// holds (no entry is visited), and publishes the tag to the fleet. When it
// returns, every shared entry that carries tag and was stored before the
// call is absent for every process, whether or not it has heard (a read
// of a tagged entry reads its tags' stamps), and a load that started
// before the call and whose value carries the tag does not store it. Each
// other process drops its local copies that carry the tag when it hears
// the message (or distrusts every copy if it may have missed it); the
// calling process's Loader drops its own.
//
// An InvalidateTag that cannot reach Redis (the tier is stepping aside,
// or the round trip fails) is kept and sent again at the next health
// check; until then this tier takes no entry with the tag from Redis and
// shares no value with it (Stats.TagInvalidationsReplayed, Lost). After
// Close it is lost.
func (t *Tier[K, V]) InvalidateTag(ctx context.Context, tag string) {
	t.used.Store(true)
	if t.closed.Load() {
		t.stats.tagInvalidationsLost.Add(1)
		return
	}
	if t.link.down() || !t.tags.send(ctx, tag) {
		t.tags.keep(tag)
	}
}

// sendTag makes tag's invalidation in Redis: the clock, then the stamp and
// the message. It reports whether both were made.
func (t *tagger[K]) send(ctx context.Context, tag string) bool {
	c, cancel := t.link.op(ctx)
	defer cancel()
	n, err := t.rdb.Incr(c, t.clock).Result()
	if err == nil {
		msg := t.origin + "\n#" + tagJSON(tag)
		err = invalidateTagScript.Run(c, t.link.scripts, []string{tagKey(t.prefix, tag)}, n, t.channel, msg).Err()
	}
	if err != nil {
		if ctx.Err() == nil {
			t.link.failed()
		}
		return false
	}
	t.stats.tagInvalidations.Add(1)
	return true
}

// tagJSON is tag as a JSON string: one line, whatever it holds.
func tagJSON(tag string) string {
	b, _ := json.Marshal(tag)
	return string(b)
}

// keepTag keeps tag's invalidation for replay.
func (t *tagger[K]) keep(tag string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.kept == nil {
		t.kept = make(map[string]struct{})
	}
	if _, ok := t.kept[tag]; !ok && len(t.kept) >= maxKeptTags {
		t.stats.tagInvalidationsLost.Add(1)
		return
	}
	t.kept[tag] = struct{}{}
}

// keptTag reports whether one of tags has an InvalidateTag kept here.
func (t *tagger[K]) keptAny(tags []string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tag := range tags {
		if _, ok := t.kept[tag]; ok {
			return true
		}
	}
	return false
}

// replayTags sends the InvalidateTag calls kept, on a goroutine of its own
// (Close waits for it), until one fails.
func (t *tagger[K]) replay() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.kept) == 0 || t.replaying || t.closed.Load() || t.link.down() {
		return
	}
	t.replaying = true
	t.fleet.replays.Add(1)
	go func() {
		defer t.fleet.replays.Done()
		defer func() {
			t.mu.Lock()
			t.replaying = false
			t.mu.Unlock()
		}()
		for !t.closed.Load() && !t.link.down() {
			t.mu.Lock()
			tag, ok := "", false
			for tag = range t.kept {
				ok = true
				break
			}
			t.mu.Unlock()
			if !ok || !t.send(t.ctx, tag) {
				return
			}
			t.mu.Lock()
			delete(t.kept, tag)
			t.mu.Unlock()
			t.stats.tagInvalidationsReplayed.Add(1)
		}
	}()
}

// dropKeptTags counts the InvalidateTag calls still kept at Close as lost.
func (t *tagger[K]) dropKept() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stats.tagInvalidationsLost.Add(uint64(len(t.kept)))
	t.kept = nil
}

// onTagInvalidated handles the message of another process's InvalidateTag:
// its Loader drops the copies that carry the tag. A message that does not
// parse distrusts every copy.
func (t *tagger[K]) heard(origin, text string) {
	var tag string
	if json.Unmarshal([]byte(text), &tag) != nil {
		t.stats.undecodedInvalidations.Add(1)
		t.distrust()
		return
	}
	if origin == t.origin { // this process's own: its Loader dropped the tag itself
		return
	}
	t.stats.tagInvalidationsHeard.Add(1)
	t.fleet.each(func(l remote.LocalCache[K]) {
		if d, ok := l.(remote.TagDropper); ok {
			d.DropTag(tag)
		} else {
			l.Distrust()
		}
	})
}

// tagged reports whether the Loader has Options.Tags.
func (a *attachment[K, V]) tagged() bool { return a != nil && a.rules.Tags != nil }

// stampSet stamps enc, a Set's value, with the tag clock now, if it has
// tags; false when it may not be shared (the clock could not be read, or
// one of its tags has an InvalidateTag kept here).
func (t *tagger[K]) stampSet(ctx context.Context, enc *encoded) bool {
	if len(enc.tags) == 0 {
		return true
	}
	clock, ok := t.readClock(ctx)
	enc.tg = tagText(clock, enc.tags)
	return ok && !t.keptAny(enc.tags)
}

// readTagClock reads the tag clock, before a load under the lease starts
// (for a Loader with Tags): the stamp its value's entry is stored with.
func (t *tagger[K]) readClock(ctx context.Context) (int64, bool) {
	c, cancel := t.link.op(ctx)
	defer cancel()
	n, err := t.rdb.Get(c, t.clock).Int64()
	switch {
	case err == redis.Nil:
		return 0, true
	case err != nil:
		if ctx.Err() == nil {
			t.link.failed()
		}
		return 0, false
	}
	return n, true
}

// stamps reads the stamps of tags, in one round trip (tags absent: 0).
func (t *tagger[K]) stamps(ctx context.Context, tags []string) (map[string]int64, bool) {
	cmds := make([]*redis.StringCmd, len(tags))
	t.link.pipelined(ctx, nil, func(c context.Context, p redis.Pipeliner) {
		for i, tag := range tags {
			cmds[i] = p.Get(c, tagKey(t.prefix, tag))
		}
	})
	out := make(map[string]int64, len(tags))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		switch {
		case err == redis.Nil:
		case err != nil:
			if ctx.Err() == nil {
				t.link.failed()
			}
			return nil, false
		default:
			out[tags[i]] = n
		}
	}
	return out, true
}

// live reports, for each of es, whether it is of use as far as tags go:
// untagged, or none of its tags invalidated after its stamp (and none
// with an InvalidateTag kept here). The stamps of every tagged entry are
// read in one round trip; if that fails, the tagged entries are not.
// Each entry that is not is replaced by one that is absent (its id kept,
// as for an entry that does not parse: the Load replaces it under the
// lease), counted in Stats.TagMisses.
func (t *tagger[K]) live(ctx context.Context, es ...*entry) {
	var tags []string
	seen := map[string]bool{}
	for _, e := range es {
		if e.ok && len(e.tags) > 0 {
			for _, tag := range e.tags {
				if !seen[tag] {
					seen[tag] = true
					tags = append(tags, tag)
				}
			}
		}
	}
	if len(tags) == 0 {
		return
	}
	st, ok := t.stamps(ctx, tags)
	for _, e := range es {
		if !e.ok || len(e.tags) == 0 {
			continue
		}
		dead := !ok || t.keptAny(e.tags)
		for _, tag := range e.tags {
			dead = dead || st[tag] > e.tagStamp
		}
		if dead {
			t.stats.tagMisses.Add(1)
			*e = entry{id: e.id}
		}
	}
}

// fillLive reports whether a value with tags, loaded after the tag clock
// read clock, may be shared: none of its tags was invalidated since (nor
// has an InvalidateTag kept here). A tag that was has the Loader drop it,
// so that this process keeps no copy of the value either (a load in
// flight fills nothing: rule 37): Stats.TagFillsRefused. If the stamps
// cannot be read, the value is not shared.
func (t *tagger[K]) fillLive(ctx context.Context, tags []string, clock int64) bool {
	if len(tags) == 0 {
		return true
	}
	if t.keptAny(tags) {
		t.stats.tagFillsRefused.Add(1)
		return false
	}
	st, ok := t.stamps(ctx, tags)
	if !ok {
		return false
	}
	var moved []string
	for _, tag := range tags {
		if st[tag] > clock {
			moved = append(moved, tag)
		}
	}
	if len(moved) == 0 {
		return true
	}
	t.stats.tagFillsRefused.Add(1)
	t.fleet.each(func(l remote.LocalCache[K]) {
		if d, ok := l.(remote.TagDropper); ok {
			for _, tag := range moved {
				d.DropTag(tag)
			}
		}
	})
	return false
}

// tooManyTags reports whether tags exceed what the Loader caches.
func tooManyTags(tags []string) bool { return len(tags) > flightcache.MaxTags }

package flightcache

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/limit"
	"github.com/flightcache/flightcache/internal/timing"
	"github.com/flightcache/flightcache/remote"
)

// entry is one cached value (or cached not-found error) with its timing.
// Times are offsets from the Loader's epoch. An entry is immutable once
// published, but for its atomics.
type entry[K comparable, V any] struct {
	key          K
	val          V
	extra        *extra[K, V] // nil for a value with the Options' windows (8 bytes on every entry, not 32)
	loadedAt     time.Duration
	freshUntil   time.Duration
	refreshAfter atomic.Int64 // no background refresh before this offset; max while one runs
	// early is how long before freshUntil a Get starts an early refresh,
	// in microseconds (rounded up; at most about 71 minutes, a longer lead
	// starts the refresh later); 0 when off. Four bytes, not a
	// time.Duration: with mark, it keeps an entry of a one-word key and a
	// string value in 64 bytes, one cache line.
	early uint32
	// mark: bit 0, gone (replaced or invalidated: a Get treats it as
	// absent, write.go); bits 1-4, the consecutive failed background
	// refreshes (saturating at 15); above, the fleet generation (remote.go).
	mark atomic.Uint32
}

const (
	goneBit         = 1
	failsUnit       = 1 << 1
	maxRefreshFails = 15 // the failed-refresh count saturates here
	failsMask       = maxRefreshFails * failsUnit
	genUnit         = 1 << 5 // the fleet generation's step: it wraps after 2^27 Distrusts
)

// refreshAt is when a Get starts refreshing e early (freshUntil when off).
func (e *entry[K, V]) refreshAt() time.Duration {
	return e.freshUntil - time.Duration(e.early)*time.Microsecond
}

// isGone reports whether e was replaced or invalidated.
func (e *entry[K, V]) isGone() bool { return e.mark.Load()&goneBit != 0 }

// setGone marks e replaced or invalidated.
func (e *entry[K, V]) setGone() { e.mark.Or(goneBit) }

// markGone marks e gone and returns e if this call did (nil if it was
// gone already): the one that marks it reports it to an EvictionObserver,
// once, whichever way it left.
func (e *entry[K, V]) markGone() *entry[K, V] {
	if e.mark.Or(goneBit)&goneBit != 0 {
		return nil
	}
	return e
}

// failedRefresh counts one more failed background refresh of e and
// returns the count (at most 15, where the backoff is long reached its
// limit).
func (e *entry[K, V]) failedRefresh() int {
	for {
		m := e.mark.Load()
		n := min(m&failsMask+failsUnit, failsMask)
		if e.mark.CompareAndSwap(m, m&^failsMask|n) {
			return int(n / failsUnit)
		}
	}
}

// extra is what few entries need: a cached not-found's error, or a value's
// own stale windows ([Options.Freshness]), or its version
// ([Options.Version]).
type extra[K comparable, V any] struct {
	notFound  error         // a cached not-found error; nil for a value
	swr, sie  time.Duration // the entry's stale windows (windows); none for a not-found
	ver       uint64        // the value's version, if versioned
	versioned bool          // the value has a version: every value of a Loader with Version (version.go)

	tags *tagList // the value's tags (Options.Tags, tags.go); nil: none
}

// windows are the entry's stale windows, kept as two durations: a
// remote.Windows would add 40 bytes to every entry of a Loader with
// Version.
func (x *extra[K, V]) windows() remote.Windows {
	return remote.Windows{StaleWhileRevalidate: x.swr, StaleIfError: x.sie}
}

// error returns the cached not-found error, or nil for a value.
func (e *entry[K, V]) error() error {
	if e.extra == nil {
		return nil
	}
	return e.extra.notFound
}

// isNotFound reports whether e is a cached not-found.
func (e *entry[K, V]) isNotFound() bool { return e.extra != nil && e.extra.notFound != nil }

const refreshing = int64(^uint64(0) >> 1)

// phase places e at now by the phase rule (remote.Windows.PhaseAt), with
// its own stale windows or the Loader's.
func (kr *keyRules[K, V]) phase(e *entry[K, V], now time.Duration) remote.Phase {
	if e.extra != nil {
		return e.extra.windows().PhaseAt(now, e.freshUntil) // a cached not-found has no windows: never stale
	}
	return kr.win.PhaseAt(now, e.freshUntil)
}

// born is when and how a value came to be: loaded (or Set) at, in the
// fleet generation gen, by a load that took took (0 for Set), which places
// its early refresh.
type born struct {
	at, took time.Duration
	gen      uint32
}

// newEntry builds the entry of a value born at b.at, fresh for a jittered
// life.ttl, with life's windows.
func (l *Loader[K, V]) newEntry(key K, v V, life lifetime, b born) *entry[K, V] {
	now, took := b.at, b.took
	fresh := timing.Jitter(life.ttl, l.opts.Jitter, rand.Float64())
	until := timing.Add(now, fresh)
	e := &entry[K, V]{key: key, val: v, loadedAt: now, freshUntil: until}
	e.mark.Store(b.gen)
	if life.own || life.versioned || life.tags != nil {
		e.extra = &extra[K, V]{swr: life.win.StaleWhileRevalidate, sie: life.win.StaleIfError, ver: life.ver, versioned: life.versioned, tags: life.tags}
	}
	if l.opts.EarlyRefresh > 0 {
		// Rounded up to the microsecond: a lead of a fast load (under a
		// millisecond) must not vanish. It is at most half the life.
		lead := until - timing.EarlyRefreshAt(now, fresh, took, l.opts.EarlyRefresh, 1-rand.Float64())
		e.early = uint32(min(max(timing.Add(lead, time.Microsecond-1)/time.Microsecond, 0), math.MaxUint32))
	}
	return e
}

// lifetime is how long one value lives: its TTL and, when own is set,
// stale windows of its own rather than the Options'; and, when versioned
// is set, its version (version.go).
type lifetime struct {
	ttl       time.Duration
	win       remote.Windows
	own       bool
	ver       uint64
	versioned bool
	tags      *tagList // its tags (tags.go)
}

// lifeOf asks Options.Freshness (user code, through the guard) how long v
// lives; keep is false for a value not to be cached (a negative TTL, or a
// Freshness that panicked). Without Freshness every value gets the
// Options' TTL and windows.
func (l *Loader[K, V]) lifeOf(key K, v V, onGoexit func()) (life lifetime, keep bool) {
	life = lifetime{ttl: l.opts.TTL, win: l.win}
	if l.opts.Freshness == nil {
		return life, true
	}
	var f Freshness
	if l.user.guard(func() { f = l.opts.Freshness(key, v) }, onGoexit) != nil {
		return life, false
	}
	if f.TTL < 0 {
		return life, false
	}
	if f.TTL > 0 {
		life.ttl = f.TTL
	}
	life.win = remote.Windows{
		StaleWhileRevalidate: pick(f.StaleWhileRevalidate, l.win.StaleWhileRevalidate),
		StaleIfError:         pick(f.StaleIfError, l.win.StaleIfError),
	}
	life.own = life.win != l.win
	return life, true
}

// costOf calls the user's Cost through the guard: a panic gives ok ==
// false, a Goexit runs onGoexit on its way out.
func (l *Loader[K, V]) costOf(v V, onGoexit func()) (cost int64, ok bool) {
	if l.opts.Cost == nil {
		return 1, true
	}
	if err := l.user.guard(func() { cost = l.opts.Cost(v) }, onGoexit); err != nil {
		return 0, false
	}
	return max(cost, 1), true
}

// tooBig reports (and counts in Stats.SetsRejected, as ristretto would)
// a value that costs more than the whole cache: it is never cached, so it
// must not wait in a pending write either.
func (l *Loader[K, V]) tooBig(cost int64) bool {
	if cost > l.opts.MaxCost {
		l.stats.setsRejected.Add(1)
		return true
	}
	return false
}

// keyRules are how a key's entries and loads are judged: what a Get is
// answered with (judge), what is absent (live, below the floor), what a
// Reload is handed (held), whether a load may still fill (mayFill), and
// whether a write is outdated (outranks). The Loader embeds them, and the
// in-flight map is handed them in its port (docs/design.md, "The
// in-flight map's port"): a new rule about keys is a field and a method
// here, not an edit of the map. Set in New, read-only after but for the
// generation and the floor (remote.go).
type keyRules[K comparable, V any] struct {
	win        remote.Windows
	epoch      time.Time      // every time offset in entries is measured from here
	generation atomic.Uint32  // the fleet generation, in steps of genUnit (remote.go)
	floor      atomic.Uint32  // the generation of the last InvalidateAll: older entries are absent (remote.go)
	lim        *limit.Limiter // Options.Limit's slots for downstream calls; nil: no limit (set after init)
	shut       *life.Gate     // the Loader's gate: nothing fills once it is closed
	reloads    bool           // Options.Reload is set: a load of a value held revalidates it (held)
	versioned  bool           // Options.Version is set: writes are compared (outranks)
	policy     Policy         // Options.Policy: what the last waiter leaving does (flights.leave)
	tags       *tagTable      // Options.Tags' states (tags.go); nil without
}

func (kr *keyRules[K, V]) init(opts *Options[K, V], shut *life.Gate) {
	kr.win = remote.Windows{StaleWhileRevalidate: opts.StaleWhileRevalidate, StaleIfError: opts.StaleIfError}
	kr.epoch = time.Now()
	kr.shut = shut
	kr.reloads, kr.versioned, kr.policy = opts.Reload != nil, opts.Version != nil, opts.Policy
	kr.tags = newTagTable(opts.Tags != nil)
}

// stamp is what a load records of the rules when it starts: the
// generation then, which its entry carries and its finish is judged by
// (mayFill), and the tag clock then, its value's tag stamp (tags.go).
type stamp struct {
	gen uint32
	tag uint64
}

// stampNow is the stamp of a load that starts now.
func (kr *keyRules[K, V]) stampNow() stamp {
	return stamp{gen: kr.generation.Load(), tag: kr.tags.now()}
}

// mayFill reports whether a load that started at s may still leave e
// (nil: a drop of the value held) as its key's value, once it owns its
// key: not after Close, not from before an InvalidateAll (rule 20), not a
// value with a tag invalidated since s (rule 37: checked again here, under
// the key's lock, for an InvalidateTag after entryOf's check).
func (kr *keyRules[K, V]) mayFill(s stamp, e *entry[K, V]) bool {
	return !kr.shut.Closed() && !kr.belowFloor(s.gen) && (e == nil || !kr.tagDropped(e))
}

// distrustedLoad reports whether a load that started at s started before
// the last Distrust or InvalidateAll (rules 18 and 27): a caller that
// starts now does not take its result.
func (kr *keyRules[K, V]) distrustedLoad(s stamp) bool { return s.gen != kr.generation.Load() }

// distrusted reports whether e was loaded (or Set) before the last
// Distrust: a Get must not serve it as it stands.
func (kr *keyRules[K, V]) distrusted(e *entry[K, V]) bool {
	return e.mark.Load()&^(goneBit|failsMask) != kr.generation.Load()
}

// cleared reports whether e was loaded (or Set) before the last
// InvalidateAll, or carries a tag invalidated since (tags.go): it is
// absent, not even a stale fallback or a value for a Reload. The
// generations compare by their difference, so the order holds across the
// counter's wrap for entries less than 2^26 moves old.
func (kr *keyRules[K, V]) cleared(e *entry[K, V]) bool {
	return kr.belowFloor(e.mark.Load()&^(goneBit|failsMask)) || kr.tagDropped(e)
}

// tagDropped reports whether e carries a tag invalidated since it was
// stored (rule 36). A Loader without Tags has no tag table and no tagged
// value: it asks nothing of e, whose extra (every value of a Loader with
// Version has one) a hit need not reach.
func (kr *keyRules[K, V]) tagDropped(e *entry[K, V]) bool {
	return kr.tags != nil && e.tagDropped()
}

// belowFloor reports whether generation gen is older than the last
// InvalidateAll's (the floor).
func (kr *keyRules[K, V]) belowFloor(gen uint32) bool {
	return int32(kr.floor.Load()-gen) > 0
}

// live returns e, or nil if e is cleared (or nil).
func (kr *keyRules[K, V]) live(e *entry[K, V]) *entry[K, V] {
	if e == nil || kr.cleared(e) {
		return nil
	}
	return e
}

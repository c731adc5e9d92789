package remote

import (
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// Windows is how a Loader judges a value's age, in a form a [Remote] can
// use to judge a value it shares with other processes exactly as the
// Loader will: the same freshness, the same stale windows, the same load
// timeout. flightcache.New gives them to an [Attacher], in [Rules].
type Windows struct {
	// Fresh is the shortest time any value stays fresh: TTL·(1−Jitter),
	// never 0. Each cached value draws its own freshness from [Fresh, TTL]
	// ([Windows.Draw]); a value judged by Fresh is never served fresh past
	// any process's draw.
	Fresh time.Duration
	// TTL is the longest time a value stays fresh, the TTL its freshness
	// is drawn from: the Options' TTL, or the one Options.Freshness gives
	// the value. 0 in Windows made by hand: every draw is then Fresh.
	TTL time.Duration
	// Jitter is the Options' Jitter: how far below TTL a draw may go.
	Jitter float64
	// StaleWhileRevalidate and StaleIfError are the Options' windows.
	StaleWhileRevalidate time.Duration
	StaleIfError         time.Duration
	// EarlyRefresh is true when fresh values are refreshed before they
	// expire (the Options' EarlyRefresh > 0).
	EarlyRefresh bool
	// LoadTimeout bounds one load, its default applied.
	LoadTimeout time.Duration
}

// Draw returns the freshness of one value, drawn as the Loader draws the
// freshness of each value it caches: TTL·(1−Jitter·u), for u drawn
// uniformly from [0, 1) by the caller, so within [Fresh, TTL] (u = 0
// gives TTL), never 0. A Remote that stores a value for several
// processes draws it once for the value, as one cache entry would: its
// bounds are then those of w with Fresh the draw ([Windows.Bounds]).
// Without a TTL (Windows made by hand) it returns Fresh.
func (w Windows) Draw(u float64) time.Duration {
	if w.TTL <= 0 {
		return w.Fresh
	}
	return timing.Jitter(w.TTL, w.Jitter, u)
}

// Phase is where a value is in its life at a given moment, by the
// Loader's rule: fresh, then stale (served at once while a background
// refresh runs), then stale-if-error (a caller loads; the value covers a
// failure), then expired. [Windows.PhaseAt] is the rule; [Bounds.PhaseAt]
// places it on times.
type Phase uint8

// The phases of a value, in the order it goes through them. They are the
// phases the Loader serves its own entries by: its rule is
// [Windows.PhaseAt].
const (
	// PhaseFresh: before FreshUntil, served as a hit.
	PhaseFresh Phase = iota
	// PhaseStale: in [Windows.StaleWhileRevalidate], served at once, and
	// refreshed in the background.
	PhaseStale
	// PhaseStaleIfError: in [Windows.StaleIfError]: a caller waits for a
	// load, and the value is served only if that load fails with an error
	// it may cover ([StaleMayCover]).
	PhaseStaleIfError
	// PhaseExpired: of no use left; a miss.
	PhaseExpired
)

// String returns "fresh", "stale", "stale-if-error" or "expired".
func (p Phase) String() string {
	switch p {
	case PhaseFresh:
		return "fresh"
	case PhaseStale:
		return "stale"
	case PhaseStaleIfError:
		return "stale-if-error"
	default:
		return "expired"
	}
}

// PhaseAt is the phase rule, the one the Loader serves its own entries
// by: it places now against a value fresh until freshUntil (both offsets
// from one epoch; the value's own draw of freshness, not w.Fresh, placed
// freshUntil), followed by w's stale windows. A cached not-found has no
// stale windows: its rule is the zero Windows'. The sums saturate: a
// window of math.MaxInt64 is "never".
func (w Windows) PhaseAt(now, freshUntil time.Duration) Phase {
	staleUntil := timing.Add(freshUntil, w.StaleWhileRevalidate)
	switch {
	case now < freshUntil:
		return PhaseFresh
	case now < staleUntil:
		return PhaseStale
	case now < timing.Add(staleUntil, w.StaleIfError):
		return PhaseStaleIfError
	default:
		return PhaseExpired
	}
}

// Bounds are the ends of one value's windows, as times: what a [Remote]
// stores with a value it shares, so that every process places it in the
// same [Phase] at the same moment. Get them from [Windows.Bounds]; a
// Remote that reads them back (from another process, say) judges the
// value with [Bounds.PhaseAt]. The zero Bounds are of a value expired
// long ago.
type Bounds struct {
	// RefreshFrom is the earliest moment at which a Loader may refresh the
	// value early (the Options' EarlyRefresh), before FreshUntil: halfway
	// through its freshness. It is FreshUntil without EarlyRefresh.
	RefreshFrom time.Time
	// FreshUntil ends [PhaseFresh], StaleUntil [PhaseStale] and UsableUntil
	// [PhaseStaleIfError]; from UsableUntil on the value is expired.
	FreshUntil, StaleUntil, UsableUntil time.Time
}

// Bounds returns the ends of the windows of a value loaded at loadedAt:
// fresh for w.Fresh, then stale for w.StaleWhileRevalidate, then usable
// to cover an error for w.StaleIfError (a negative window counts as
// none). The sums saturate at the latest time a time.Time holds, so a
// window of math.MaxInt64 ("never") gives a bound far in the future,
// never one that wrapped into the past; short of that limit, which no
// clock comes near, they are exact. A cached not-found has no stale
// windows: its bounds are those of Windows{Fresh: its time to live}.
func (w Windows) Bounds(loadedAt time.Time) Bounds {
	fresh := timing.Later(loadedAt, w.Fresh)
	stale := timing.Later(fresh, w.StaleWhileRevalidate)
	b := Bounds{RefreshFrom: fresh, FreshUntil: fresh, StaleUntil: stale, UsableUntil: timing.Later(stale, w.StaleIfError)}
	if w.EarlyRefresh {
		// The earliest early refresh of a value fresh for w.Fresh: the
		// Loader's own rule, with the longest lead it allows.
		b.RefreshFrom = timing.Later(loadedAt, timing.EarlyRefreshAt(0, w.Fresh, 1, 1, 0))
	}
	return b
}

// PhaseAt returns the phase at now of the value whose windows end at b:
// fresh before FreshUntil, stale before StaleUntil, stale-if-error before
// UsableUntil, expired from then on. It is [Windows.PhaseAt] placed on
// times: a value of windows w loaded at t is, at t.Add(age), in
// w.Bounds(t).PhaseAt(t.Add(age)), the phase w.PhaseAt(age, w.Fresh)
// gives it (for every age short of the largest Duration, where the sums
// of windows saturate).
func (b Bounds) PhaseAt(now time.Time) Phase {
	// The rule works on offsets from an epoch: now is the epoch here. Each
	// bound's offset is clamped to ±2⁶¹ns (about 73 years), which keeps
	// its sign and the order of the three, so the rule's sums of them are
	// exact whatever the bounds (even centuries apart).
	fresh, stale, usable := timing.Offset(b.FreshUntil, now), timing.Offset(b.StaleUntil, now), timing.Offset(b.UsableUntil, now)
	return Windows{StaleWhileRevalidate: stale - fresh, StaleIfError: usable - stale}.PhaseAt(0, fresh)
}

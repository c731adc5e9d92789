package flightredis

import (
	"context"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// This file holds what the tier decides about a shared entry's age: whether
// a Load may hand it to the Loader (the Loader's windows, the caller's
// max-stale, what this process already holds), and whether it may cover a
// failed load (StaleIfError). The rules are the Loader's own: an entry's
// bounds are placed with remote.Bounds.PhaseAt, and what a stale
// value may cover is remote.StaleMayCover.

// now is the moment against which the tier judges entries: the wall clock
// (entries hold the times of other processes' clocks), in whole
// microseconds, as entries hold them.
func now() time.Time { return fromMicros(micros(time.Now())) }

// bounds returns the ends of e's windows, as its writer stored them
// (RefreshFrom is not stored: see usable). A not-found marker has no
// stale windows. An entry written by an older version has no "until": its
// StaleIfError window is the Loader's, after its stale one.
func (a *attachment[K, V]) bounds(e entry) remote.Bounds {
	b := remote.Bounds{FreshUntil: fromMicros(e.fresh), StaleUntil: fromMicros(e.stale), UsableUntil: fromMicros(e.until)}
	switch {
	case e.nf:
		b.StaleUntil, b.UsableUntil = b.FreshUntil, b.FreshUntil
	case e.until < 0:
		b.UsableUntil = remote.Windows{StaleIfError: a.win.StaleIfError}.Bounds(b.StaleUntil).UsableUntil
	}
	return b
}

// phase places entry e at now by the Loader's rule.
func (a *attachment[K, V]) phase(e entry, now time.Time) remote.Phase {
	return a.bounds(e).PhaseAt(now)
}

// usable reports whether entry e may be handed to the Loader now, for a
// load whose context is ctx.
func (t *Tier[K, V]) usable(ctx context.Context, ks keys, e entry) bool {
	if e.nf { // a not-found marker is never a value
		return false
	}
	a, now := t.attached(), now()
	held := t.copies.served.Get(ks.base) == e.id
	switch b := a.bounds(e); b.PhaseAt(now) {
	case remote.PhaseFresh:
		// The Loader asks again for a fresh entry it already holds either
		// to refresh it early (possible only from RefreshFrom on, by the
		// Loader's windows) or because it evicted it.
		return !held || !a.win.EarlyRefresh || now.Before(a.win.Bounds(fromMicros(e.at)).RefreshFrom)
	case remote.PhaseStale:
		// A stale entry once; then a refresh reloads it. The Loader hands
		// a load's value to its callers as loaded, without judging its
		// age: a stale entry the caller's max-stale refuses is reloaded.
		return !held && remote.AcceptsStale(ctx, now.Sub(b.FreshUntil))
	}
	return false
}

// cover returns err with, when it may cover the failure, the older value
// of entry e (see [remote.Remote]): e must be inside its StaleIfError
// window (its own, with per-value Freshness) and decode, and err must be
// one a stale value may cover by the Loader's rule (not a not-found, nor
// the Loader closing). Whether the value is served is the Loader's call:
// its window and each caller's max-stale.
func (t *Tier[K, V]) cover(e entry, err error) (remote.Value[V], error) {
	switch {
	case !t.attached().coverable(err), !e.ok, e.nf, t.attached().phase(e, now()) == remote.PhaseExpired:
		return remote.Value[V]{}, err
	}
	v, derr := decode(t.codec, e.val)
	if derr != nil {
		t.stats.decodeErrors.Add(1)
		return remote.Value[V]{}, err
	}
	t.stats.staleOffers.Add(1)
	return remote.Value[V]{
		Value:    v,
		LoadedAt: fromMicros(e.at),
		Took:     fromUS(e.took),
	}, err
}

package flightredis

import (
	"context"
	"errors"
	"time"

	"github.com/flightcache/flightcache"
)

// This file holds what the tier decides about a shared entry's age: whether
// a Load may hand it to the Loader (the Loader's windows, the caller's
// max-stale, what this process already holds), and whether it may cover a
// failed load (StaleIfError).

// usable reports whether entry e may be handed to the Loader now, for a
// load whose context is ctx.
func (t *Tier[K, V]) usable(ctx context.Context, ks keys, e entry) bool {
	if e.nf { // a not-found marker is never a value
		return false
	}
	now := micros(time.Now())
	held := t.served.get(ks.base) == e.id
	switch {
	case now < e.fresh:
		// The Loader asks again for a fresh entry it already holds either
		// to refresh it early (possible only in the second half of its
		// life) or because it evicted it.
		return !held || !t.early || now < addSat(e.at, t.fresh.Microseconds()/2)
	case now < e.stale:
		// A stale entry once; then a refresh reloads it. The Loader hands
		// a load's value to its callers as loaded, without judging its
		// age: a stale entry the caller's max-stale refuses is reloaded.
		return !held && flightcache.AcceptsStale(ctx, fromUS(subSat(now, e.fresh)))
	}
	return false
}

// cover returns err with, when it may cover the failure, the older value
// of entry e (see [flightcache.Remote]): e must be inside its StaleIfError
// window (its own, with per-value Freshness) and decode, and err must not be a not-found (the
// Loader never covers one) nor mean the Loader closed. Whether the value is
// served is the Loader's call: its window and each caller's max-stale.
func (t *Tier[K, V]) cover(e entry, err error) (flightcache.RemoteValue[V], error) {
	until := e.until
	if until < 0 { // written by an older version: the Options' window
		until = addSat(e.stale, t.sie.Microseconds())
	}
	switch {
	case !t.coverable(err), !e.ok, e.nf, micros(time.Now()) >= until:
		return flightcache.RemoteValue[V]{}, err
	}
	v, derr := t.decode(e.val)
	if derr != nil {
		t.stats.decodeErrors.Add(1)
		return flightcache.RemoteValue[V]{}, err
	}
	t.stats.staleOffers.Add(1)
	return flightcache.RemoteValue[V]{
		Value:    v,
		LoadedAt: fromMicros(e.at),
		Took:     fromUS(e.took),
	}, err
}

// coverable reports whether a failed load's error may be covered with an
// older value: the Loader serves none for a not-found (by its rule:
// notFound) or after Close.
func (t *Tier[K, V]) coverable(err error) bool {
	return !t.notFound(err) && !errors.Is(err, flightcache.ErrClosed)
}

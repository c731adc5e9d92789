package flightredis

import (
	"errors"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/remote"
)

// This file holds what the tier knows of the Loader it serves: the
// Loader's rules, given by flightcache.New through Attach, and what the
// tier derives from them.

var _ remote.Attacher[string, int] = (*Tier[string, int])(nil)

// ErrNotAttached is the error of a Load (and of every key of a LoadMany)
// made before the tier was attached to a Loader: a Tier made by [NewTier]
// learns the Loader's rules when [flightcache.New] attaches it
// ([Tier.Attach]), and until then it has no way to judge a shared entry.
// Set it as the Remote of the Loader, and let the Loader call it.
var ErrNotAttached = errors.New("flightredis: the tier is not attached to a Loader yet (set it as flightcache.Options.Remote and make the Loader with flightcache.New)")

// ErrAttached is the error of an Attach to a tier already attached to a
// Loader: a Tier serves one Loader ([flightcache.New] returns this error
// for the second). Make a Tier per Loader.
var ErrAttached = errors.New("flightredis: the tier is attached to another Loader already: a Tier serves one Loader")

// Attach implements [remote.Attacher]: [flightcache.New] calls
// it with the rules of the Loader the tier is the Remote of, which the
// tier then applies to every shared entry, and returns its error. The
// first Attach claims the tier; any later one returns [ErrAttached]. An
// Attach whose rules the tier cannot honour (Options.LeaseTTL not longer
// than their LoadTimeout) returns an error naming the option, and leaves
// the tier unclaimed.
func (t *Tier[K, V]) Attach(rules remote.Rules[K, V]) error {
	if !t.claimed.CompareAndSwap(false, true) {
		return ErrAttached
	}
	a, err := t.opts.attachment(rules)
	if err != nil {
		t.claimed.Store(false)
		return err
	}
	t.att.Store(a)
	return nil
}

// attachment is what a tier knows of its Loader. It is made once, before
// it is stored in Tier.att, and never changes.
type attachment[K comparable, V any] struct {
	rules remote.Rules[K, V] // the Loader's; NotFound never nil
	// win is rules.Windows as the tier stores an entry's windows: in
	// whole microseconds, as entries hold times (see stored).
	win      remote.Windows
	leaseTTL time.Duration // Options.LeaseTTL, its default applied
	leaseMS  int64         // its PX
}

// attachment validates o (defaults applied, but LeaseTTL's) against the
// Loader's rules r and returns what the tier derives from them.
func (o Options[K, V]) attachment(r remote.Rules[K, V]) (*attachment[K, V], error) {
	w := r.Windows
	if w.Fresh <= 0 || w.LoadTimeout <= 0 {
		return nil, errors.New("flightredis: Attach: the rules have no windows; use those of a Loader (flightcache.New attaches the tier)")
	}
	if err := o.validate(w.LoadTimeout, r.MaxWait); err != nil {
		return nil, err
	}
	if r.NotFound == nil {
		r.NotFound = flightcache.Options[K, V]{}.NotFound // ErrNotFound only
	}
	lease := o.leaseTTL(remote.Add(w.LoadTimeout, r.MaxWait))
	return &attachment[K, V]{rules: r, win: stored(w), leaseTTL: lease, leaseMS: px(lease)}, nil
}

// attached returns what the tier knows of its Loader: nil before it is
// attached. Load, LoadMany and encode look first; what they call may take
// it as set.
func (t *Tier[K, V]) attached() *attachment[K, V] { return t.att.Load() }

// windowsOf returns the windows of value v of key (the Loader's
// Rules.WindowsOf: Freshness included), or the Loader's windows when it
// has no per-value Freshness; cache is false for a value the Loader would
// not cache. It may call user code (Freshness), which may panic.
func (a *attachment[K, V]) windowsOf(key K, v V) (w remote.Windows, cache bool) {
	if a.rules.WindowsOf == nil {
		return a.rules.Windows, true
	}
	return a.rules.WindowsOf(key, v)
}

// perValue reports whether values have windows of their own (the Loader
// has Options.Freshness).
func (a *attachment[K, V]) perValue() bool { return a.rules.WindowsOf != nil }

// stored returns w as the tier writes a shared entry's windows: Fresh at
// least 1ms (Redis takes whole milliseconds), and every window in whole
// microseconds, so that the bounds the Loader's rule gives from an
// entry's loading time, itself in whole microseconds, are what the entry
// stores.
func stored(w remote.Windows) remote.Windows {
	w.Fresh = max(w.Fresh, time.Millisecond)
	w.Fresh = w.Fresh.Truncate(time.Microsecond)
	w.StaleWhileRevalidate = w.StaleWhileRevalidate.Truncate(time.Microsecond)
	w.StaleIfError = w.StaleIfError.Truncate(time.Microsecond)
	return w
}

// sharesNotFound reports whether a load's error err is a not-found to store
// for the fleet: the Loader caches not-founds (NotFoundTTL > 0).
func (a *attachment[K, V]) sharesNotFound(err error) bool {
	return a.rules.NotFoundTTL > 0 && a.notFound(err)
}

// notFound reports whether err is a not-found by the Loader's rule
// (remote.Rules.NotFound: ErrNotFound, or the Loader's IsNotFound,
// whose panic means no).
func (a *attachment[K, V]) notFound(err error) bool { return a.rules.NotFound(err) }

// sharedNotFound reports whether e is a not-found marker still inside its
// NotFoundTTL: a Load answers it with ErrSharedNotFound, without loading.
// An older marker (the writer's clock, or a shorter NotFoundTTL here) is
// replaced under the lease, as a stale entry is.
func (a *attachment[K, V]) sharedNotFound(e entry) bool {
	return e.ok && e.nf && a.phase(e, now()) == remote.PhaseFresh
}

// coverable reports whether a failed load's error may be covered with an
// older value, by the Loader's rule (remote.StaleMayCover, with its
// not-found rule).
func (a *attachment[K, V]) coverable(err error) bool {
	return remote.StaleMayCover(err, a.notFound(err))
}

// mayCover reports whether a failed load should ask Redis for the entry
// that may cover it: the Loader has a StaleIfError window (its own, or
// per-value ones) and err is one a stale value may cover.
func (a *attachment[K, V]) mayCover(err error) bool {
	return (a.rules.Windows.StaleIfError > 0 || a.perValue()) && a.coverable(err)
}

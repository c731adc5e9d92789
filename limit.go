package flightcache

import (
	"math"
	"time"

	"github.com/flightcache/flightcache/internal/limit"
)

// DefaultAdaptiveMaxLoads is the ceiling of an adaptive [Limit] whose
// MaxLoads is 0.
const DefaultAdaptiveMaxLoads = 200

// Limit bounds the downstream calls a [Loader] makes at once, for a storm
// of many distinct keys (a cold start, a mass expiry, [Loader.InvalidateAll])
// that single-flight cannot collapse. Its zero value bounds nothing.
//
// Each downstream call (a load, a reload, one LoadMany call) holds one slot
// while it runs, its retries included; a Get that joins a load takes none.
// A load that finds no slot free is answered at once by a value held within
// [Options.StaleIfError] ([SourceStaleLimited]), or waits its turn, first
// come first served, as long as MaxWait and its callers allow, or fails with
// [ErrLimited]: a Limit makes a storm slower and never fails a load its
// downstream would have answered. Background refreshes never queue.
// [Options.LoadTimeout] and [LoadEvent].Duration start at the slot.
// The bound is per Loader, not per fleet. The rules, sizing in front of a
// connection pool and the adaptive bound: docs/design.md rule 22 and
// docs/options.md ("A storm of many keys").
type Limit struct {
	// MaxLoads is the most downstream calls the Loader makes at once. 0
	// means no bound, unless Adaptive is set: then it is the ceiling of the
	// adaptive bound, and 0 means DefaultAdaptiveMaxLoads (200).
	MaxLoads int

	// Adaptive finds the bound from the downstream's latency, between
	// MinLoads and MaxLoads, instead of holding it at MaxLoads.
	Adaptive bool

	// MinLoads is the floor of the adaptive bound. 0 means 1. It needs
	// Adaptive, and must not exceed MaxLoads (or its default).
	MinLoads int

	// MaxQueue is how many loads may wait for a slot; a load beyond it
	// fails at once with [ErrLimited]. 0 means no bound (a queued load
	// costs about 11 KB). Set it to shed a storm rather than wait for it.
	MaxQueue int

	// MaxWait is how long a load may wait for a slot before it fails with
	// [ErrLimited]. 0 means [Options.LoadTimeout].
	MaxWait time.Duration
}

// enabled reports whether l bounds anything.
func (l Limit) enabled() bool { return l.MaxLoads > 0 || l.Adaptive }

// validate checks l, naming the field at fault.
func (l Limit) validate() error {
	ceiling := l.MaxLoads
	if l.Adaptive && ceiling == 0 {
		ceiling = DefaultAdaptiveMaxLoads
	}
	unbounded := "is set, but nothing is bounded: set Limit.MaxLoads or Limit.Adaptive too, or leave it 0"
	switch {
	case l.MaxLoads < 0:
		return optionError("Limit.MaxLoads", "must be >= 0, got %d", l.MaxLoads)
	case l.MinLoads < 0:
		return optionError("Limit.MinLoads", "must be >= 0, got %d", l.MinLoads)
	case l.MaxQueue < 0:
		return optionError("Limit.MaxQueue", "must be >= 0, got %d", l.MaxQueue)
	case l.MaxWait < 0:
		return optionError("Limit.MaxWait", "must be >= 0, got %v", l.MaxWait)
	case l.MinLoads > 0 && !l.Adaptive:
		return optionError("Limit.MinLoads", "is the floor of the adaptive bound: set Limit.Adaptive too, or leave it 0")
	case l.MinLoads > ceiling:
		return optionError("Limit.MinLoads", "must be <= Limit.MaxLoads (%d), got %d", ceiling, l.MinLoads)
	case !l.enabled() && l.MaxQueue != 0:
		return optionError("Limit.MaxQueue", "%s", unbounded)
	case !l.enabled() && l.MaxWait != 0:
		return optionError("Limit.MaxWait", "%s", unbounded)
	}
	return nil
}

// withDefaults returns l with its defaults set; loadTimeout is the
// Loader's. A Limit that bounds nothing is returned as it is.
func (l Limit) withDefaults(loadTimeout time.Duration) Limit {
	if !l.enabled() {
		return l
	}
	if l.Adaptive {
		if l.MaxLoads == 0 {
			l.MaxLoads = DefaultAdaptiveMaxLoads
		}
		if l.MinLoads == 0 {
			l.MinLoads = 1
		}
	}
	if l.MaxQueue == 0 {
		l.MaxQueue = math.MaxInt // no bound: MaxWait and the callers bound the wait
	}
	if l.MaxWait == 0 {
		l.MaxWait = loadTimeout
	}
	return l
}

// config is what the limiter of l bounds, with l's defaults set
// (withDefaults; loadTimeout is the Loader's). A Limit that bounds nothing
// gives a Config that bounds nothing: limit.New returns nil, no limit,
// which every limiter method takes (the hit path never touches it).
func (l Limit) config(loadTimeout time.Duration) limit.Config {
	l = l.withDefaults(loadTimeout)
	return limit.Config{MaxLoads: l.MaxLoads, Adaptive: l.Adaptive, MinLoads: l.MinLoads, MaxQueue: l.MaxQueue, MaxWait: l.MaxWait}
}

// limitError is the limiter's error as the Loader reports it: its
// sentinels become ErrLimited and ErrClosed; a context's error (with the
// cause the Loader gave it: ErrClosed, CancelAtZero's) stays as it is.
func limitError(err error) error {
	switch err {
	case limit.ErrLimited:
		return ErrLimited
	case limit.ErrClosed:
		return ErrClosed
	}
	return err
}

// limitSample is the sample of one attempt from the breaker's view of it:
// its Outcome, and whether the load's context ended with ErrLoadTimeout.
func limitSample(o Outcome, timedOut bool) limit.Sample {
	switch {
	case o == OutcomeFailure && timedOut:
		return limit.SampleTimeout
	case o == OutcomeFailure:
		return limit.SampleFailure
	case o == OutcomeIgnored:
		return limit.SampleIgnored
	}
	return limit.SampleOK
}

// fillLimit copies the limiter's counts c into s: LoadLimit (0 without a
// limit), QueuedLoads, Limited, StaleLimited and RefreshesLimited.
func (s *Stats) fillLimit(c limit.Counts) {
	s.LoadLimit, s.QueuedLoads = int64(c.Bound), int64(c.Waiting)
	s.Limited, s.StaleLimited, s.RefreshesLimited = c.Limited, c.StaleLimited, c.BackgroundRefused
}

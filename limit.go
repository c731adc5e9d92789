package flightcache

import (
	"math"
	"time"

	"github.com/flightcache/flightcache/internal/limit"
)

// DefaultAdaptiveMaxLoads is the ceiling of an adaptive [Limit] whose
// MaxLoads is 0.
const DefaultAdaptiveMaxLoads = 200

// Limit bounds the downstream calls a [Loader] makes at once. Single-flight
// collapses a storm on one key; Limit is for a storm on many (a cold start
// after a deploy, a mass expiry, [Loader.InvalidateAll], a crawler walking
// the catalogue), where every distinct key is a downstream call of its own
// and the circuit breaker only reacts once the downstream has already
// failed. Its zero value bounds nothing, as without it.
//
// # What takes a slot
//
// Each downstream call takes one slot for as long as it runs: a load, a
// reload, a LoadMany call (one slot for all its keys), foreground or
// background. The retries of a load keep its slot, so the downstream never
// sees more calls than the bound. A Get that joins a load in flight takes
// no slot and no place in the queue. With a [Remote], the slot is taken for
// the downstream call only: a hit in the tier, or a wait on another
// process's lease, takes none. In order: the Remote, then an open breaker
// fails the load at once (a load never queues for an open breaker), then
// the slot, then the retries, each through the breaker to the LoadFunc,
// then the slot is given back. [Options.LoadTimeout] starts when the slot
// is granted, and so does [LoadEvent].Duration (the early refresh's δ):
// the wait is LoadEvent.Queued.
//
// # When no slot is free
//
// A Get that holds a value within [Options.StaleIfError] is answered with
// it at once ([SourceStaleLimited]) and no load starts, unless it asked
// for [WithRevalidate] or WithMaxStale(ctx, 0), or the copy is distrusted.
// Otherwise the load waits for a slot in a queue, first come first served,
// for as long as MaxWait (by default LoadTimeout, the time the load would
// have had without a Limit) and its callers allow: a Limit makes a storm
// slower, and never fails a load its downstream would have answered. Its
// callers wait on their own contexts, and [Options.Policy] says what
// happens when they have all left: [CancelAtZero] takes the load out of
// the queue, [FinishAndFill] keeps it there, to warm the cache. A wait
// past MaxWait, or a queue full at an explicit MaxQueue, fails the load
// with [ErrLimited]: never cached, never retried, never counted by the
// breaker, and covered by a stale value within StaleIfError like any
// failure. [Loader.Close] fails the queued loads with [ErrClosed].
//
// By default the queue holds any storm: it has no bound but the loads
// callers wait on (and, with FinishAndFill, those left less than MaxWait
// ago). A queued load costs about 11 KB, its goroutine's 8 KB stack and
// 2.6 KB of heap: 0.5 KB more than the same load in flight without a
// Limit, so 10,000 queued loads hold about 110 MB. Set MaxQueue to shed
// the loads past it at once instead.
//
// In front of a client's pool of N connections, MaxLoads N keeps the
// waiting in the Limit, where it counts against MaxWait (set it to what a
// caller will wait), not against LoadTimeout or the breaker; without it
// the loads wait in the pool, on their LoadTimeout, and a storm's
// timeouts open the breaker. That is for a pool the Loader has to itself:
// when the service's writes (or other code) share it, MaxLoads is N minus
// the connections those may hold at once, or the loads wait in the pool
// whenever they are busy.
//
// Background refreshes never queue: one starts only while no foreground
// load is waiting and background work holds less than half the bound;
// otherwise it is dropped (Stats.RefreshesLimited) and the stale value
// goes on serving. A window of refreshes ([Options.BatchWindow]) asks as
// its call goes out, never while it waits, and is dropped the same way
// unless a Get already waits on one of its keys (it then queues as that
// Get's load). A slot given back goes to the oldest queued load.
//
// # Adaptive
//
// With Adaptive the bound is found from the downstream's latency, between
// MinLoads and MaxLoads, starting at 20 (within those two). After its first
// twenty round trips of calls, whose latency it only measures, it grows
// while the calls' mean latency, over about a round trip, stays within 2×
// the lowest mean seen over ten round trips, and shrinks as it rises past
// that, with √bound of headroom; a timeout or a failure the breaker counts
// cuts it at once. Means, not single calls: a steady share of fast answers
// (not-founds the downstream knows at once, hits in its own cache) is part
// of the downstream's latency, not a minimum its other calls fall short of,
// and does not hold the bound down. It neither grows nor is cut while less
// than half of it is in use, so a trickle of misses, or of failing keys,
// leaves it where it is. The lowest mean is measured again, over windows of
// 10s, when calls are slower at no more load than it was seen at: a
// downstream that has become slower for good is followed, a storm's own
// queueing is not. Stats.LoadLimit reports the bound.
//
// NOTE: the bound is per Loader: a fleet of n processes may make n times
// as many calls at once. An adaptive bound sees the others' calls only as
// the latency they cause.
//
// A Limit is part of [Options]; it is read once, by [New].
type Limit struct {
	// MaxLoads is the most downstream calls the Loader makes at once. 0
	// means no bound, unless Adaptive is set: then it is the ceiling of the
	// adaptive bound, and 0 means DefaultAdaptiveMaxLoads (200). Every
	// value up to math.MaxInt works, for MinLoads and MaxQueue too: the
	// bound saturates there, and Stats.LoadLimit reports it as it is.
	MaxLoads int

	// Adaptive finds the bound from the downstream's latency, between
	// MinLoads and MaxLoads, instead of holding it at MaxLoads.
	Adaptive bool

	// MinLoads is the floor of the adaptive bound. 0 means 1. It needs
	// Adaptive, and must not exceed MaxLoads (or its default).
	MinLoads int

	// MaxQueue is how many loads may wait for a slot; a load beyond it
	// fails at once with [ErrLimited]. 0 means no bound: a load waits as
	// long as MaxWait and its callers allow (see "When no slot is free"
	// for what a queued load costs). Set it to shed a storm at once
	// rather than wait for it.
	MaxQueue int

	// MaxWait is how long a load may wait for a slot before it fails with
	// [ErrLimited]. Its callers may leave earlier, by their own contexts.
	// 0 means [Options.LoadTimeout] (so DefaultLoadTimeout if that is 0
	// too).
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

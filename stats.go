package flightcache

import (
	"github.com/flightcache/flightcache/internal/life"

	"sync/atomic"
	"time"
)

// Source says where the value, or the error, of one Get came from: a
// failed Get says [SourceLoaded] or [SourceShared] (its load failed), or
// [SourceHit] for a cached not-found; count errors apart first.
type Source uint8

const (
	// SourceNone is the zero Source: the Get returned without a value from
	// the cache or a load (the Loader was closed, the caller's context
	// ended first, or the context was nil).
	SourceNone Source = iota
	// SourceHit: a fresh cached value (or a cached not-found error).
	SourceHit
	// SourceStale: a stale value inside the StaleWhileRevalidate window,
	// returned at once while a background refresh runs.
	SourceStale
	// SourceStaleOnError: the load this caller waited for failed, and a
	// stale value inside the StaleIfError window was returned instead.
	SourceStaleOnError
	// SourceLoaded: this caller started the load it waited for, whether
	// that load succeeded or failed.
	SourceLoaded
	// SourceShared: this caller waited for a load another caller (or a
	// background refresh) started, whether that load succeeded or failed
	// (Stats.SharedErrors counts the failures).
	SourceShared
	// SourceStaleLimited: a stale value inside the StaleIfError window,
	// returned at once, with no load, because no downstream slot was free
	// under [Options.Limit].
	SourceStaleLimited
)

// String returns "none", "hit", "stale", "stale-on-error", "loaded",
// "shared" or "stale-limited".
func (s Source) String() string {
	switch s {
	case SourceHit:
		return "hit"
	case SourceStale:
		return "stale"
	case SourceStaleOnError:
		return "stale-on-error"
	case SourceLoaded:
		return "loaded"
	case SourceShared:
		return "shared"
	case SourceStaleLimited:
		return "stale-limited"
	default:
		return "none"
	}
}

// Info says what one [Loader.GetInfo] did.
type Info struct {
	// Source is where the value came from.
	Source Source
	// Age is how long ago the returned value was loaded (or Set).
	Age time.Duration
	// Waited is how long the caller waited for a load, until the load
	// ended; 0 for a hit or a stale value served at once.
	Waited time.Duration
}

// LoadEvent describes one finished downstream load; see [Options.OnLoad].
type LoadEvent[K comparable] struct {
	// Key is the key that was loaded.
	Key K
	// Duration is how long the load took, retries and backoff included,
	// its wait for a [Limit] slot (Queued) not: the δ of EarlyRefresh.
	Duration time.Duration
	// Err is the load's error, nil on success.
	Err error
	// NotFound is true when Err is a not-found ([Options.IsNotFound]); for
	// a LoadMany call, when the call's Err is.
	NotFound bool
	// Attempts is the number of LoadFunc calls the load made (0 when the
	// breaker refused the first one).
	Attempts int
	// Background is true for a refresh nobody waited on when it started
	// (stale-while-revalidate or early refresh).
	Background bool
	// Callers is how many Get calls received this load's result, the
	// starter included: the blast radius of Err when it is not nil.
	Callers int
	// Abandoned is true when the load was cancelled because every waiter
	// left ([CancelAtZero]).
	Abandoned bool
	// Stored is true when the result was handed to the cache: not for
	// errors (a cached not-found aside), loads overtaken by a Set or an
	// Invalidate, or after Close. The cache may still refuse it
	// (Stats.SetsRejected).
	Stored bool
	// Remote is true when the value came from [Options.Remote], loaded by
	// another process: no downstream call was made here.
	Remote bool
	// Reload is true when the load called [Options.Reload] with the value
	// held for the key.
	Reload bool
	// NotModified is true when the Reload returned [ErrNotModified]: the
	// value held was kept, its freshness renewed; Err is nil.
	NotModified bool
	// Keys is the number of keys the load was for: 1, or the distinct
	// keys of one [Options.LoadMany] call (its Callers summed over them).
	Keys int
	// Queued is how long the load waited for a downstream slot under
	// [Options.Limit] (or until it failed with [ErrLimited]).
	Queued time.Duration
}

// Stats is a snapshot of a Loader's cumulative counters, from [Loader.Stats].
//
// Every Get (each distinct key of a GetMany) is counted once by how it was
// answered: Gets = Hits + StaleHits + Misses + Closed once no Get runs, and
// the Misses end as Loaded, Shared, StaleOnError or Canceled. Loads counts
// the Loader's work for a key (or one LoadMany call) however it ended;
// DownstreamCalls what the downstream saw. Stats marshals to JSON with the
// breaker's state by name.
type Stats struct {
	Gets      uint64 // Get and GetInfo calls, and the distinct keys of GetMany and GetManyInfo calls
	Hits      uint64 // answered from a fresh entry (cached not-found included)
	StaleHits uint64 // answered at once with a stale value: within StaleWhileRevalidate, or within StaleIfError while no downstream slot was free (StaleLimited)
	Misses    uint64 // waited for a load, started or joined (or tried to: Close came first)
	Closed    uint64 // refused with ErrClosed before reaching the cache

	StaleOnError uint64 // misses answered with a stale value because the load failed
	Loaded       uint64 // misses answered by the load they started, its error included (SourceLoaded): a stale value covering its failure is StaleOnError
	Shared       uint64 // misses served by a load they did not start, its error included
	SharedErrors uint64 // of Shared, those that received the load's error (a not-found included): the summed blast radius
	Canceled     uint64 // misses whose own context ended first, or that a panic cut short

	Loads             uint64 // loads ended, foreground and background: one per key loaded alone, one per LoadMany call (or RemoteMany call); those the breaker or Options.Limit refused, and those a Remote answered, included
	LoadErrors        uint64 // of Loads, those that ended in an error: a failure, a refusal (breaker, Limit), an abandoned load, a not-found (LoadNotFounds); a LoadMany call counts its own error only, not its keys missing from its map; one whose keys failed alone (a *ManyError, its LoadManyFunc's or its split's) counts once
	LoadNotFounds     uint64 // of LoadErrors, those whose error is a not-found (Options.IsNotFound): LoadErrors − LoadNotFounds are the loads that failed
	NotFounds         uint64 // keys a load answered not-found (Options.IsNotFound): a load's not-found, each key missing from a LoadMany call's map, each key of a LoadMany call whose error is a not-found; a Remote's answer included
	DownstreamCalls   uint64 // LoadFunc, LoadMany and Reload calls made, retries included: what the downstream saw; a call the breaker or Options.Limit refused is not one
	Retries           uint64 // of DownstreamCalls, those beyond the first of their load (the tries of a split batch included: Options.BatchWindow)
	MaxCallersPerLoad uint64 // the most Gets one load's result reached (a LoadMany call's: summed over its keys)
	Refreshes         uint64 // background loads started: refreshes, early refreshes and Refresh calls (a GetMany's refreshes batched in one LoadMany call, or a batch window's: one)
	RefreshesDropped  uint64 // background loads not started because MaxRefreshes were running
	Reloads           uint64 // of Loads, those of a key whose value was held, to be made with Options.Reload (whether or not the Reload was called: the breaker, Options.Limit or a Remote may answer first)
	NotModified       uint64 // of Reloads, those whose Reload returned ErrNotModified
	Revalidations     uint64 // Gets (and keys of GetMany) under WithRevalidate (each also counted in Misses)
	BatchLoads        uint64 // of Loads, those for the keys of one LoadMany (or RemoteMany) call, made or refused
	BatchKeys         uint64 // distinct keys asked of LoadMany (or RemoteMany) over all BatchLoads: a key a window holds twice counts once
	Peeks             uint64 // Peek calls, found or not (never counted in Gets)
	RemoteDrops       uint64 // LocalCache.Drop calls from a watching Remote (RemoteWatcher): keys written elsewhere, held here or not
	Distrusts         uint64 // LocalCache.Distrust calls: the Remote may have missed writes
	InvalidateAlls    uint64 // InvalidateAll calls, and LocalCache.DropAll calls from a watching Remote
	Rereads           uint64 // Gets (and keys of GetMany) that found a distrusted copy, or a load from before a Distrust, and waited for a new load (each also counted in Misses)
	Abandoned         uint64 // loads cancelled because every waiter left (CancelAtZero)
	BreakerRejected   uint64 // downstream calls the breaker refused (with Options.Limit, a load it refuses before it queues)
	Panics            uint64 // panics recovered in user code: LoadFunc, Cost, OnLoad, Hash, a Remote, a breaker, an Observer...
	InFlight          int64  // loads running now (a LoadMany call's: one)
	PendingWrites     int64  // fills, Sets and Invalidates not yet applied by the cache (Gets find them meanwhile); at most 2 × Options.MaxPendingWrites
	WriteWaits        uint64 // Sets, Invalidates and Drops that waited their turn because MaxPendingWrites of them were pending
	FillsDropped      uint64 // loaded values not cached because MaxPendingWrites fills were pending (their callers got them)
	WritesOutdated    uint64 // writes dropped because the value held had a higher version (Options.Version): Sets, and fills whose callers got them
	Waiting           int64  // Gets waiting on a load now, a GetMany once per key it waits for: the blast radius if they fail
	LoadLimit         int64  // the bound on downstream calls at once now (Options.Limit; the adaptive bound as it moves); 0 without a Limit
	QueuedLoads       int64  // loads waiting now for a downstream slot (Options.Limit)
	Limited           uint64 // loads failed with ErrLimited: they waited Limit.MaxWait, or the queue was full at an explicit Limit.MaxQueue
	StaleLimited      uint64 // Gets answered at once with a stale value within StaleIfError because no downstream slot was free, no load started (SourceStaleLimited; each also counted in StaleHits)
	RefreshesLimited  uint64 // background refreshes not started because loads were queued or background work held half the bound (Options.Limit)
	TagInvalidations  uint64 // InvalidateTag calls (Options.Tags)
	TagErrors         uint64 // values not cached because Options.Tags panicked or gave more than MaxTags tags (ErrTooManyTags); a load's callers got them
	InvalidKeys       uint64 // keys Options.ValidateKey rejected (at Get, GetInfo, each key of GetMany, Refresh, Set, Restore): no load, not counted in Gets; a load whose error matches ErrInvalidKey is counted as a load (LoadErrors) instead

	SetsDropped  uint64 // writes ristretto's set buffer refused for want of room; each is handed over again, never lost
	SetsRejected uint64 // values not cached: refused by ristretto's admission policy, or costing more than MaxCost
	Evicted      uint64 // entries ristretto evicted to make room

	Breaker BreakerState // the breaker's state now
}

// counters are all of a Loader's statistics.
type counters struct {
	staleOnErrors, shared, sharedErrors, canceled  atomic.Uint64
	loads, loadErrors, retries, maxCallers         atomic.Uint64
	loadNotFounds, notFounds, downstreamCalls      atomic.Uint64
	refreshes, abandoned, breakerRejected, panics  atomic.Uint64
	refreshesDropped, reloads, notModified         atomic.Uint64
	batchLoads, batchKeys, peeks                   atomic.Uint64
	revalidations, remoteDrops, distrusts, rereads atomic.Uint64
	setsDropped, setsRejected, evicted             atomic.Uint64
	invalidateAlls, fillsDropped                   atomic.Uint64
	writesOutdated, invalidKeys                    atomic.Uint64
	tagInvalidations, tagErrors                    atomic.Uint64
	inFlight, waiting                              atomic.Int64
	misses                                         atomic.Uint64 // Gets that waited for a load (or tried to)
	loaded                                         atomic.Uint64 // misses answered by the load they started
}

// noteCallers records how many Gets one load reached.
func (c *counters) noteCallers(n int) {
	v := uint64(n)
	for {
		cur := c.maxCallers.Load()
		if v <= cur || c.maxCallers.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (c *counters) snapshot(gate *life.Gate) Stats {
	var s Stats
	g := gate.Counts()
	s.Gets, s.Hits, s.StaleHits, s.Closed = g.Gets, g.Hits, g.Stale, g.Closed

	s.Misses = c.misses.Load()
	s.StaleOnError = c.staleOnErrors.Load()
	s.Loaded = c.loaded.Load()
	s.Shared = c.shared.Load()
	s.SharedErrors = c.sharedErrors.Load()
	s.Canceled = c.canceled.Load()
	s.Loads = c.loads.Load()
	// A load counts its error before its not-found: read in the other
	// order, LoadNotFounds never exceeds LoadErrors.
	s.LoadNotFounds = c.loadNotFounds.Load()
	s.LoadErrors = c.loadErrors.Load()
	s.NotFounds = c.notFounds.Load()
	s.DownstreamCalls = c.downstreamCalls.Load()
	s.Retries = c.retries.Load()
	s.MaxCallersPerLoad = c.maxCallers.Load()
	s.Refreshes = c.refreshes.Load()
	s.RefreshesDropped = c.refreshesDropped.Load()
	s.Reloads = c.reloads.Load()
	s.NotModified = c.notModified.Load()
	s.Revalidations = c.revalidations.Load()
	s.BatchLoads = c.batchLoads.Load()
	s.BatchKeys = c.batchKeys.Load()
	s.Peeks = c.peeks.Load()
	s.RemoteDrops = c.remoteDrops.Load()
	s.Distrusts = c.distrusts.Load()
	s.Rereads = c.rereads.Load()
	s.Abandoned = c.abandoned.Load()
	s.BreakerRejected = c.breakerRejected.Load()
	s.Panics = c.panics.Load()
	s.InFlight = c.inFlight.Load()
	s.Waiting = c.waiting.Load()
	s.SetsDropped = c.setsDropped.Load()
	s.SetsRejected = c.setsRejected.Load()
	s.Evicted = c.evicted.Load()
	s.InvalidateAlls = c.invalidateAlls.Load()
	s.TagInvalidations = c.tagInvalidations.Load()
	s.TagErrors = c.tagErrors.Load()
	s.FillsDropped = c.fillsDropped.Load()
	s.WritesOutdated = c.writesOutdated.Load()
	s.InvalidKeys = c.invalidKeys.Load()
	return s
}

package flightredis

import "sync/atomic"

// Stats are a [Tier]'s cumulative counters, from [Tier.Stats]. Every
// counter is per process.
type Stats struct {
	// Hits counts fresh shared entries handed to the Loader: local misses
	// that another process's load (or an earlier one here) answered.
	Hits uint64
	// StaleHits counts stale shared entries handed to the Loader (inside
	// StaleWhileRevalidate), which then refreshes them in the background.
	StaleHits uint64
	// Leases counts leases taken: loads this process ran for the fleet.
	Leases uint64
	// Takeovers counts, of Leases, those taken from a holder that had
	// stopped proving it was alive (it died, or lost Redis).
	Takeovers uint64
	// Waits counts Loads that waited for another process's load.
	Waits uint64
	// Shared counts, of Waits, those answered by the other process's value.
	Shared uint64
	// PeerErrors counts, of Waits, those answered by the other process's
	// failure ([ErrPeerFailed]).
	PeerErrors uint64
	// NotFoundHits counts Loads (and keys of LoadMany) answered by a shared
	// not-found marker ([ErrSharedNotFound]) without loading: a not-found
	// another process (or this one) stored, with the Loader's NotFoundTTL
	// > 0, less than NotFoundTTL ago. A Load that waited on the load that
	// stored the marker counts here, not in Shared or PeerErrors.
	NotFoundHits uint64
	// StaleOffers counts failed loads (run here, or by the process a Load
	// waited for) that Load returned with the key's older shared entry,
	// still inside StaleIfError, for the Loader to serve as stale-on-error
	// within its window and the caller's max-stale.
	StaleOffers uint64
	// Wakeups and Polls count how waits resumed: by a wake-up heard on the
	// key's channel, or by a poll timer. The keys of a batch that wait do
	// so together: one resume of the batch counts once.
	Wakeups, Polls uint64
	// WakeupSubscribes counts the subscriptions to a key's wake-up channel
	// this process made because a Load (or a key of a batch) waited on the
	// key and no other of its Loads was subscribed already: one per key
	// and wait, however many Loads of the process wait on it together.
	// Each is dropped when the last of them stops waiting.
	WakeupSubscribes uint64
	// WakeupsHeard counts the wake-ups this process heard: messages on the
	// wake-up channels it was subscribed to, each published when a load of
	// a key it waited on ended (or the key was Set or Invalidated). A
	// process that waits on no key hears none.
	WakeupsHeard uint64
	// WakeupSubscriptionsLost counts wake-up subscriptions lost while a
	// Load waited: the connection broke (go-redis makes it again), or
	// Redis dropped the subscription because the key's hash slot moved to
	// another master. A wake-up missed meanwhile costs its waiters a poll.
	WakeupSubscriptionsLost uint64
	// WritesLost counts values loaded here under a lease that was gone when
	// they were written (Set or Invalidate elsewhere, or a takeover after
	// this holder stopped beating), or of a generation an InvalidateAll had
	// ended: they reached this process's callers but not Redis. Not-founds
	// whose marker could not be stored for the same reasons count here
	// too.
	WritesLost uint64
	// WritesOutdated counts writes of this process that the shared entry
	// refused because it holds a value of a higher version (the Loader's
	// Options.Version, docs/design.md rule 30): a lease holder's fill,
	// which still dropped its lease and woke the processes waiting on it,
	// and Sets, which changed nothing in Redis and had this process's
	// Loader drop its copy. The value of a refused fill still reached this
	// process's callers. Always 0 for a Loader without Version.
	WritesOutdated uint64
	// RedisErrors counts Redis round trips that failed or timed out (the
	// Loader's own cancellations aside). Each one steps the tier aside for
	// Options.RetryAfter.
	RedisErrors uint64
	// LocalLoads counts loads that went straight to the downstream because
	// Redis had failed (or the tier was closed): local-only service.
	LocalLoads uint64
	// AheadLoads counts Loads (and keys of LoadMany) that went to the
	// downstream rather than take the key's shared entry, because this
	// process may have served a newer value than that entry: it loaded the
	// key without Redis, or its Set or Invalidate of the key has not
	// reached Redis yet. Each such key is loaded under the lease, which
	// writes the newer value for the fleet, or, when another process holds
	// the lease, without it (see docs/distributed-invalidation.md,
	// "Invalidation across the fleet").
	AheadLoads uint64
	// Skipped counts Set, Invalidate and InvalidateAll calls not passed on
	// to Redis because the tier was stepping aside (or, for Set and
	// Invalidate, because an InvalidateAll kept for replay could not be
	// sent first).
	Skipped uint64
	// DecodeErrors and EncodeErrors count entries the Codec could not read
	// (they are reloaded) or write (the value is served but not shared).
	// A panic of the Codec counts as its failure; EncodeErrors also counts
	// values not shared because Options.Freshness panicked.
	DecodeErrors, EncodeErrors uint64
	// Batches counts LoadMany calls (the batches of GetMany, see
	// [Tier.LoadMany]), local-only ones included. The counters above count
	// a batch's keys one by one, as Load would count them: a batch of 10
	// keys that finds 4 in Redis and leases 6 adds 4 Hits and 6 Leases;
	// 10 LocalLoads when Redis is down.
	Batches uint64
	// BatchRoundTrips counts the Redis round trips of those calls: each is
	// one pipeline for all the keys at that step (reads, acquires, writes
	// and releases; plus one when Redis must be sent a script it does not
	// have yet). The heartbeats of a batch's leases are not counted.
	BatchRoundTrips uint64

	// Listening is true while the tier's pub/sub subscription is confirmed
	// and healthy and, by Invalidations, every master's invalidation
	// connection is armed, or every invalidation channel subscribed: it
	// hears the fleet's invalidations. While it is false, what the tier
	// hands the Loader may miss one, and is read again after the next
	// attempt to subscribe, about a second later (see Distrusts).
	Listening bool
	// Invalidations is how the tier hears the fleet's Sets and
	// Invalidates: "tracking" (Redis tells each process of the keys it
	// read only, see docs/distributed-invalidation.md), "channels" (Redis
	// refused CLIENT TRACKING: every process hears every write, on sharded
	// channels), "classic" (a client the tier cannot track per master, a
	// Ring: every process hears every write, on one channel), or "" while
	// it is not known yet.
	Invalidations string
	// Rearms counts the times a master's tracking was made again on a new
	// invalidation connection, after the old one was lost (or found with
	// a broken redirect); each loss distrusted every local copy
	// (SubscriptionLosses counts it).
	Rearms uint64
	// TrackedReads counts the entries read tracked: Redis tells this
	// process of their next change.
	TrackedReads uint64
	// InvalidationsSent counts this process's Sets and Invalidates that
	// reached Redis, each published to the fleet with the write.
	InvalidationsSent uint64
	// InvalidationsHeard counts other processes' Sets and Invalidates
	// heard on the subscription; each asked the Loader to drop the key
	// (flightcache.Stats.RemoteDrops, which also counts this process's
	// own writes echoed back). With tracking, it counts the invalidations
	// of keys this process read, whatever changed them (another
	// process's write, an expiry, an eviction), but its own writes; a
	// copy still current (checked by a tracked read) is kept.
	InvalidationsHeard uint64
	// UndecodedInvalidations counts messages (heard, or this process's
	// own) whose key could not be found: its JSON did not decode to a key
	// with the published name, or, for a key type JSON does not carry
	// back, this tier had not handed that name over (with tracking: the
	// key's Redis name, for a key type other than a string named by
	// default); with tracking, also Redis's null invalidation of a
	// FLUSHALL or FLUSHDB, and, on a single node, each health check that
	// found a SWAPDB since the last one (Redis sends nothing for it). Each
	// distrusted every local copy instead.
	UndecodedInvalidations uint64
	// SubscriptionLosses counts the times the subscription was found lost
	// (an error, or no answer to a ping), and with tracking the times a
	// master's invalidation connection was (or its redirect was found
	// broken): each distrusted every local copy.
	SubscriptionLosses uint64
	// TrackedConnsLost counts, with tracking, the tracked connections that
	// closed after they carried a tracked read, whatever closed them
	// (CLIENT KILL, Redis's idle timeout or output buffer limit, a failed
	// or timed-out read, go-redis reaping it, a re-arm retiring it): Redis
	// forgot what each one tracked, so each distrusted every local copy.
	// One that Redis closed is found the next time go-redis takes it from
	// its pool, at the latest at the next health check.
	TrackedConnsLost uint64
	// Distrusts counts the times the tier had its Loader distrust every
	// local copy (remote.LocalCache.Distrust): at each subscription
	// loss; while the subscription is down, after each failed attempt to
	// make it again, and once more when it is back, if the tier handed
	// values over since the last one; for each undecoded invalidation; and
	// for each tracked connection lost (TrackedConnsLost).
	Distrusts uint64
	// InvalidationsReplayed counts Sets and Invalidates that could not
	// reach Redis (the tier stepping aside, counted in Skipped; a failed
	// round trip or a refused command, counted in RedisErrors) and were
	// later sent as invalidations.
	InvalidationsReplayed uint64
	// InvalidationsLost counts those that could not be kept for replay
	// (more than 65,536 keys waited at once), were still waiting when the
	// tier closed, or came after it closed.
	InvalidationsLost uint64

	// Generation is the newest generation of the shared tier this process
	// knows: the number of InvalidateAll moves the fleet made, unless the
	// counter was lost (see GenerationRestores).
	Generation int64
	// InvalidateAllsSent counts the generation moves this process made in
	// Redis ([Tier.InvalidateAll]): one per call that reached Redis at
	// once, one per replay however many calls it covered.
	InvalidateAllsSent uint64
	// InvalidateAllsHeard counts the times the tier had its Loader drop
	// every local copy (remote.LocalCache.DropAll, counted in the
	// Loader's InvalidateAlls) because another process moved the
	// generation: heard on the subscription, or read from Redis first.
	// Moves learned together count once.
	InvalidateAllsHeard uint64
	// InvalidateAllsReplayed counts InvalidateAll calls that could not
	// reach Redis at once (the tier stepping aside, counted in Skipped; a
	// failed round trip, counted in RedisErrors) and were covered by a
	// later move: their replay, or another call's move.
	InvalidateAllsReplayed uint64
	// InvalidateAllsLost counts InvalidateAll calls still waiting for
	// their replay when the tier closed, or made after it closed.
	InvalidateAllsLost uint64
	// GenerationRestores counts the times this process found the shared
	// generation below one it had seen (the counter was lost: a Redis
	// restart without persistence, a failover before the move reached the
	// replica, a deleted key) and set it back.
	GenerationRestores uint64

	// TagInvalidations counts this process's InvalidateTag calls
	// ([Tier.InvalidateTag], the Loader's Options.Tags) that reached
	// Redis: at once, or replayed (TagInvalidationsReplayed counts those
	// too).
	TagInvalidations uint64
	// TagInvalidationsHeard counts other processes' InvalidateTag calls
	// heard on the subscription; each had the Loader drop the copies that
	// carry the tag (remote.TagDropper, counted in the Loader's
	// TagInvalidations).
	TagInvalidationsHeard uint64
	// TagInvalidationsReplayed counts InvalidateTag calls that could not
	// reach Redis at once and were sent at a later health check;
	// TagInvalidationsLost those that could not be kept (more than 4,096
	// tags waited), were still kept when the tier closed, or came after.
	TagInvalidationsReplayed, TagInvalidationsLost uint64
	// TagMisses counts shared entries read (by a Load, a batch, or to
	// cover a failure) that were absent because one of their tags was
	// invalidated after they were stored (or its stamps could not be
	// read): each was loaded again under the lease.
	TagMisses uint64
	// TagFillsRefused counts values loaded here under a lease and not
	// shared because one of their tags was invalidated after the load
	// started: their callers got them, this process's Loader kept no copy.
	TagFillsRefused uint64
}

type counters struct {
	hits, staleHits, leases, takeovers, waits, shared, peerErrors atomic.Uint64
	wakeups, polls, writesLost, redisErrors, localLoads, skipped  atomic.Uint64
	writesOutdated                                                atomic.Uint64
	decodeErrors, encodeErrors, staleOffers, notFoundHits         atomic.Uint64
	batches, batchRoundTrips                                      atomic.Uint64
	invalidationsSent, invalidationsHeard, undecodedInvalidations atomic.Uint64
	subscriptionLosses, distrusts, trackedConnsLost               atomic.Uint64
	invalidationsReplayed, invalidationsLost                      atomic.Uint64
	invalidateAllsSent, invalidateAllsHeard                       atomic.Uint64
	invalidateAllsReplayed, invalidateAllsLost                    atomic.Uint64
	generationRestores, aheadLoads                                atomic.Uint64
	tagInvalidations, tagInvalidationsHeard, tagMisses            atomic.Uint64
	tagInvalidationsReplayed, tagInvalidationsLost                atomic.Uint64
	tagFillsRefused                                               atomic.Uint64
}

// Stats returns the tier's counters. It is safe to call at any time.
func (t *Tier[K, V]) Stats() Stats {
	c := &t.stats
	return Stats{
		Hits: c.hits.Load(), StaleHits: c.staleHits.Load(), Leases: c.leases.Load(),
		Takeovers: c.takeovers.Load(), Waits: c.waits.Load(), Shared: c.shared.Load(),
		PeerErrors: c.peerErrors.Load(), StaleOffers: c.staleOffers.Load(), NotFoundHits: c.notFoundHits.Load(), Wakeups: c.wakeups.Load(), Polls: c.polls.Load(),
		WritesLost: c.writesLost.Load(), WritesOutdated: c.writesOutdated.Load(), RedisErrors: c.redisErrors.Load(),
		LocalLoads: c.localLoads.Load(), AheadLoads: c.aheadLoads.Load(), Skipped: c.skipped.Load(),
		DecodeErrors: c.decodeErrors.Load(), EncodeErrors: c.encodeErrors.Load(),
		Batches: c.batches.Load(), BatchRoundTrips: c.batchRoundTrips.Load(),
		WakeupSubscribes: t.wake.Subscribes.Load(), WakeupsHeard: t.wake.Heard.Load(),
		WakeupSubscriptionsLost: t.wake.SubscriptionsLost.Load(),
		Listening:               t.hearing(), InvalidationsSent: c.invalidationsSent.Load(),
		InvalidationsHeard: c.invalidationsHeard.Load(), UndecodedInvalidations: c.undecodedInvalidations.Load(),
		SubscriptionLosses: c.subscriptionLosses.Load(), Distrusts: c.distrusts.Load(),
		TrackedConnsLost:      c.trackedConnsLost.Load(),
		InvalidationsReplayed: c.invalidationsReplayed.Load(), InvalidationsLost: c.invalidationsLost.Load(),
		Generation: t.gen.Load(), InvalidateAllsSent: c.invalidateAllsSent.Load(),
		InvalidateAllsHeard: c.invalidateAllsHeard.Load(), InvalidateAllsReplayed: c.invalidateAllsReplayed.Load(),
		InvalidateAllsLost: c.invalidateAllsLost.Load(), GenerationRestores: c.generationRestores.Load(),
		Invalidations: t.track.Mode().String(), Rearms: t.track.Rearms(), TrackedReads: t.track.Reads(),
		TagInvalidations: c.tagInvalidations.Load(), TagInvalidationsHeard: c.tagInvalidationsHeard.Load(),
		TagInvalidationsReplayed: c.tagInvalidationsReplayed.Load(), TagInvalidationsLost: c.tagInvalidationsLost.Load(),
		TagMisses: c.tagMisses.Load(), TagFillsRefused: c.tagFillsRefused.Load(),
	}
}

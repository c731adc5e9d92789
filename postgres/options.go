package flightpg

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Options configures a [Source]. Publication is required; the zero value
// of every other field is a sensible default, given in its comment.
type Options struct {
	// Publication names the PostgreSQL publication whose changes the
	// Source reads (CREATE PUBLICATION ... FOR TABLE ...). Required.
	Publication string

	// Slot names a permanent logical replication slot the Source reads
	// from: created when missing, reused when present, so that after a
	// restart or a lost connection the Source resumes at the last LSN it
	// confirmed and misses nothing. A permanent slot keeps WAL on the
	// server while no one reads it: bound that with the server's
	// max_slot_wal_keep_size, and see DropSlotOnClose. A slot name is 1 to
	// 63 lower-case letters, digits and underscores.
	//
	// Empty (the default): each connection creates a temporary slot of its
	// own (named flightpg_ and random hex), which PostgreSQL drops when the
	// connection ends. Nothing outlives the process, but what was committed
	// while a lost connection was down cannot be replayed: each reconnect
	// is a [Gap], and the Source distrusts every value (InvalidateAll).
	Slot string

	// DropSlotOnClose makes Close drop the permanent slot named by Slot.
	// Leave it false for a slot that should outlive this process (a restart
	// resumes from it); set it for one that should not. Temporary slots are
	// always dropped. With a Lease, Close drops the slot only when no
	// other Source of the fleet takes the lease within TTL/2 of its
	// release (Close waits that long): the last one of the fleet to close
	// drops it.
	DropSlotOnClose bool

	// Lease, when set, makes this Source one of a fleet that shares the
	// permanent slot named by Slot (required with it): only the Source
	// holding the lease reads the slot, and the others stand by, trying
	// for it every TTL/8; see [Lease], [RedisLease] and
	// docs/postgres.md, "A fleet". Give each process's Loader the Redis
	// tier (flightredis): the holder's invalidations go through its
	// Loader, and the tier drops the key in every process that holds it.
	// When the holder closes, loses the lease, or dies, another Source
	// takes it over and resumes from the slot's confirmed position:
	// nothing is skipped, and what was applied but not yet confirmed is
	// applied again. Nil (the default): this Source reads on its own.
	Lease Lease

	// OnLease, when set, is called when this Source starts or stops
	// consuming under [Options.Lease], and when, standing by, it sees
	// the lease held by another holder than before. It is called on the
	// Source's goroutine, which waits for it: it must not block. A panic
	// in it is recovered and reported to OnError.
	OnLease func(LeaseEvent)

	// Resume is the position a warm restart resumes from: the
	// [Source.Applied] of the Source of the process that saved the
	// snapshot of its Loader's entries (flightcache's Loader.Entries),
	// read after that Source was closed and before the entries were taken.
	// The Source then reads Slot from Resume on: every change committed
	// after it is applied, to the entries the Loader restored before New
	// (see docs/postgres.md, "Warm restarts", and [Source.CatchUp]). When
	// the slot cannot replay from Resume (it was created anew, or
	// confirmed past Resume: read by a Source after the snapshot), the
	// restored entries cannot be checked: New distrusts every value
	// (InvalidateAll), counts a gap ([Stats.Gaps], [Options.OnGap]) and
	// [Stats.Resumed] stays false. Needs Slot. Zero (the default): no
	// resume, the Source reads from where Slot was confirmed.
	Resume LSN

	// MaxPendingKeys bounds the keys and tags a transaction's changes (or
	// a group of transactions', docs/postgres.md) have named and the
	// Source holds before it invalidates them. A transaction
	// that names more is invalidated in parts as it streams (see
	// docs/postgres.md: it has committed before its first change arrives),
	// so a bulk UPDATE of any size holds at most this many. Default 10,000.
	MaxPendingKeys int

	// Reconnect paces the attempts to reconnect after the replication
	// connection is lost or cannot be made: exponential backoff with
	// jitter, from InitialInterval (default 100ms) to MaxInterval (default
	// 5s), forever until Close.
	Reconnect Reconnect

	// Version, when set, gives the version a change's rows have, which the
	// Source passes with each key the change names to the target's
	// InvalidateVersion ([VersionTarget]: flightcache's Loader with its
	// Options.Version): the key is left a tombstone, and no value of a lower
	// version is stored after the change, not even one a load that
	// started after it read from a replica that has not replayed it. Use
	// [CommitVersion] when values carry the WAL position they were read
	// at, [ColumnVersion] when the rows have a version column. A key
	// named by several changes of a transaction gets the highest; 0 means
	// none (a plain Invalidate). It is called on the Source's goroutine,
	// once per change that names keys; a panic in it is treated as the
	// Mapping's. New refuses it with a target lacking InvalidateVersion.
	Version func(Change) uint64

	// Observer, when set, sees what the Source does, for metrics: each
	// transaction applied, gap and reconnect, after the matching OnApplied,
	// OnGap and OnReconnect callback's turn; see [Observer].
	Observer Observer

	// OnError, when set, is called with each error the Source meets and
	// rides out: a lost or refused connection (before each reconnect), a
	// message it cannot decode, a Mapping that panicked (a
	// *flightcache.PanicError). It is called on the Source's goroutine,
	// which waits for it: it must not block. A panic in it is recovered.
	OnError func(error)

	// OnGap, when set, is called after the Source found changes it cannot
	// replay (its slot was dropped, or invalidated by
	// max_slot_wal_keep_size, or a temporary slot went with its
	// connection) and distrusted every value (InvalidateAll). It is called
	// on the Source's goroutine, which waits for it. A panic in it is
	// recovered.
	OnGap func(Gap)

	// OnApplied, when set, is called after each transaction is applied
	// (one that held a change of the publication), in commit order, with
	// what it did: its commit's position and time, its lag, its changes
	// and the invalidations they made. It feeds an observer (a histogram
	// of the lag, a counter of changes). It is called on the Source's
	// goroutine, which waits for it: it must not block. A panic in it is
	// recovered and reported to OnError (a *flightcache.PanicError).
	OnApplied func(Applied)

	// OnReconnect, when set, is called after each replication connection
	// made after a loss (counted in [Stats.Reconnects]), before the stream
	// resumes. A reconnect that finds changes lost is a [Gap] too
	// (OnGap, before OnReconnect). It is called on the Source's goroutine,
	// which waits for it. A panic in it is recovered and reported to
	// OnError.
	OnReconnect func(Reconnected)
}

// Applied is what one transaction applied did; see [Options.OnApplied].
type Applied struct {
	// LSN is its commit record's position; CommitTime when it committed
	// (the server's clock).
	LSN        LSN
	CommitTime time.Time
	// Lag is the time from its commit (the server's clock) to applied
	// (this process's clock), as [Stats.Lag] counts it.
	Lag time.Duration
	// Changes counts its row changes (one per table truncated).
	Changes int
	// Keys and Tags count the Invalidate and InvalidateTag calls it made
	// (each key and tag once per part, see Options.MaxPendingKeys; in a
	// group of transactions, by the first that names it).
	Keys, Tags int
	// All is true when it distrusted every value (InvalidateAll): a
	// Mapping or target that panicked, a change it could not decode, tags
	// a target cannot take, an unmapped TRUNCATE.
	All bool
}

// Reconnected says that the Source connected again after losing its
// replication connection; see [Options.OnReconnect].
type Reconnected struct {
	// Slot is the slot read from now.
	Slot string
	// Err is the error that lost the previous connection.
	Err error
	// Down is the time from the loss to the new connection.
	Down time.Duration
}

// Reconnect is the backoff between attempts to reconnect; see
// [Options.Reconnect].
type Reconnect struct {
	// InitialInterval is the wait before the first attempt after a loss.
	// Default 100ms.
	InitialInterval time.Duration
	// MaxInterval bounds the wait between two attempts. Default 5s.
	MaxInterval time.Duration
}

// Gap says that changes were lost to the Source: which slot, and why. See
// [Options.OnGap].
type Gap struct {
	// Slot is the slot the Source reads from after the gap.
	Slot string
	// Reason says what was lost, in words.
	Reason string
}

const (
	defaultMaxPendingKeys = 10000
	defaultInitialBackoff = 100 * time.Millisecond
	defaultMaxBackoff     = 5 * time.Second
)

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// validate checks o and fills in its defaults.
func (o *Options) validate() error {
	switch {
	case o.Publication == "":
		return optionError("Publication", "is required")
	case strings.ContainsRune(o.Publication, 0):
		return optionError("Publication", "must not contain a NUL byte")
	case o.Slot != "" && !slotName.MatchString(o.Slot):
		return optionError("Slot", "must be 1 to 63 lower-case letters, digits and underscores, got %q", o.Slot)
	case o.Slot == "" && o.DropSlotOnClose:
		return optionError("DropSlotOnClose", "needs Options.Slot (a temporary slot is always dropped)")
	case o.Lease != nil && o.Slot == "":
		return optionError("Lease", "needs Options.Slot (the fleet shares one permanent slot)")
	case o.Lease != nil && o.Resume != 0:
		return optionError("Resume", "cannot be used with Options.Lease (a fleet resumes from the slot's confirmed position)")
	case o.Lease != nil && o.Lease.TTL() <= 0:
		return optionError("Lease", "TTL() must be > 0, got %v", o.Lease.TTL())
	case o.Slot == "" && o.Resume != 0:
		return optionError("Resume", "needs Options.Slot (a temporary slot has nothing to replay)")
	case o.MaxPendingKeys < 0:
		return optionError("MaxPendingKeys", "must be >= 0, got %d", o.MaxPendingKeys)
	case o.Reconnect.InitialInterval < 0:
		return optionError("Reconnect.InitialInterval", "must be >= 0, got %v", o.Reconnect.InitialInterval)
	case o.Reconnect.MaxInterval < 0:
		return optionError("Reconnect.MaxInterval", "must be >= 0, got %v", o.Reconnect.MaxInterval)
	}
	if o.MaxPendingKeys == 0 {
		o.MaxPendingKeys = defaultMaxPendingKeys
	}
	if o.Reconnect.InitialInterval == 0 {
		o.Reconnect.InitialInterval = defaultInitialBackoff
	}
	if o.Reconnect.MaxInterval == 0 {
		o.Reconnect.MaxInterval = defaultMaxBackoff
	}
	if o.Reconnect.MaxInterval < o.Reconnect.InitialInterval {
		return optionError("Reconnect.MaxInterval", "must be >= Reconnect.InitialInterval (%v), got %v",
			o.Reconnect.InitialInterval, o.Reconnect.MaxInterval)
	}
	return nil
}

func optionError(field, format string, args ...any) error {
	return fmt.Errorf("flightpg: Options.%s %s", field, fmt.Sprintf(format, args...))
}

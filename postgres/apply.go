package flightpg

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/jackc/pglogrepl"
)

// Target is what a [Source] invalidates: a *flightcache.Loader satisfies
// it. A Target that also has InvalidateTag(string) (see [TagTarget]) gets
// the tags a Mapping names; one that lacks it cannot drop a tag's values
// alone, so a change that names tags makes the Source distrust every value
// instead (InvalidateAll, counted in [Stats.TagsWithoutTarget]).
type Target[K comparable] interface {
	Invalidate(key K)
	InvalidateAll()
}

// TagTarget is the method a [Target] has when it can drop every value
// carrying a tag.
type TagTarget interface {
	InvalidateTag(tag string)
}

// VersionTarget is the method a [Target] has when it can leave a key a
// tombstone (flightcache's Loader.InvalidateVersion): drop its value,
// and store no value of a lower version after. [Options.Version] needs it.
type VersionTarget[K comparable] interface {
	InvalidateVersion(key K, version uint64)
}

// applier turns transactions' changes into invalidations: it asks the
// Mapping as each change arrives and gathers the keys and tags named (each
// once). The stream applies what is gathered (flush) once the
// transactions are visible (visible.go): at once when no further message
// is waiting, so an idle stream applies each transaction alone; while
// more are waiting (a backlog), it goes on receiving and applies the
// transactions received whole as one group (at most maxGroup of them, or
// those received within groupWait), with one visibility check and their
// keys invalidated concurrently (fanout.go); and earlier when
// MaxPendingKeys keys and tags are pending, or a change distrusts every
// value. Only then are the group's commits reported applied, in commit
// order: a commit's position is reported once its invalidations and
// every earlier one's have returned.
//
// Invalidating before the commit message arrives is safe: pgoutput (at
// protocol version 1, without streaming) sends a transaction only once it
// has committed, so a load that starts after an invalidation (and after
// the visibility check) reads the committed rows.
//
// The applier runs on the Source's goroutine only (its fan-out waits for
// its own goroutines); it reads and writes nothing another goroutine
// does, except through stats.
type applier[K comparable] struct {
	target     Target[K]
	tags       TagTarget        // nil when target has no InvalidateTag
	tombstones VersionTarget[K] // nil without Options.Version
	version    func(Change) uint64
	mapping    Mapping[K]
	max        int
	report     func(error)
	stats      *counters
	// onApplied is Options.OnApplied (nil: none).
	onApplied func(Applied)

	// The group: what was received and is not applied yet.
	keys     map[K]uint64 // each with the highest version named for it (0: none)
	tagSet   map[string]struct{}
	distrust bool        // invalidate everything at the next flush
	xids     []uint32    // transactions with changes whose visibility is not checked yet
	done     []committed // transactions received whole, in commit order
	since    time.Time   // when done's first one was received
	batch    []K         // the keys of a flush (fanout.go), kept for reuse
	vers     []uint64    // their versions (0: none), beside batch

	// The transaction being received (between Begin and Commit).
	open       bool
	xid        uint32
	lsn        LSN       // its commit record's LSN (Begin's final LSN)
	commitTime time.Time // when it committed
	changes    int       // how many row changes it had so far
	dropped    bool      // everything was invalidated after the commit: later changes need nothing
	txKeys     int       // the keys it named first in its group
	txTags     int       // the tags it named first in its group
}

// committed is a transaction received whole and not applied yet.
type committed struct {
	lsn, end   LSN // its commit record's LSN, and the end of it
	commitTime time.Time
	changes    int
	keys, tags int
	all        bool
}

const (
	// maxGroup bounds the transactions applied as one group.
	maxGroup = 1024
	// groupWait is the most time a transaction received whole waits for
	// the messages after it to join its group.
	groupWait = time.Millisecond
)

func newApplier[K comparable](target Target[K], mapping Mapping[K], max int, report func(error), stats *counters) *applier[K] {
	a := &applier[K]{
		target:  target,
		mapping: mapping,
		max:     max,
		report:  report,
		stats:   stats,
		keys:    make(map[K]uint64),
		tagSet:  make(map[string]struct{}),
	}
	a.tags, _ = target.(TagTarget)
	return a
}

// begin starts a transaction.
func (a *applier[K]) begin(m *pglogrepl.BeginMessage) {
	a.open, a.changes, a.dropped = true, 0, false
	a.txKeys, a.txTags = 0, 0
	a.xid = m.Xid
	a.lsn = LSN(m.FinalLSN)
	a.commitTime = m.CommitTime
}

// reset forgets the transaction being received and the group: on a lost
// connection, neither was confirmed, and both are sent again.
func (a *applier[K]) reset() {
	a.open, a.changes, a.distrust, a.dropped = false, 0, false, false
	a.txKeys, a.txTags = 0, 0
	clear(a.keys)
	clear(a.tagSet)
	a.xids = a.xids[:0]
	a.done = a.done[:0]
}

// touch notes that the open transaction has a change: its visibility is
// checked before the group is applied.
func (a *applier[K]) touch() {
	if a.open && a.changes == 0 {
		a.xids = append(a.xids, a.xid)
	}
}

// add takes one change of the open transaction.
func (a *applier[K]) add(c Change) {
	a.touch()
	a.changes++
	a.stats.changes.Add(1)
	if a.dropped {
		return
	}
	c.LSN, c.CommitTime = a.lsn, a.commitTime
	var keys []K
	var tags []string
	if err := guard(func() { keys, tags = a.mapping(c) }); err != nil {
		a.stats.panics.Add(1)
		a.report(fmt.Errorf("flightpg: the Mapping panicked on a %v of %s.%s; every value is distrusted: %w",
			c.Op, c.Schema, c.Table, err))
		a.distrust = true
	}
	switch {
	case len(tags) > 0 && a.tags == nil:
		a.stats.tagsWithoutTarget.Add(1)
		a.distrust = true
	case c.Op == OpTruncate && len(keys) == 0 && len(tags) == 0:
		a.stats.truncatesUnmapped.Add(1)
		a.distrust = true
	}
	var ver uint64
	if a.version != nil && len(keys) > 0 && !a.distrust {
		if err := guard(func() { ver = a.version(c) }); err != nil {
			a.stats.panics.Add(1)
			a.report(fmt.Errorf("flightpg: Options.Version panicked on a %v of %s.%s; every value is distrusted: %w",
				c.Op, c.Schema, c.Table, err))
			a.distrust = true
		}
	}
	for _, k := range keys {
		held, ok := a.keys[k]
		if !ok || ver > held {
			a.keys[k] = ver
		}
		if !ok {
			a.txKeys++
		}
	}
	if a.tags != nil {
		for _, t := range tags {
			if _, ok := a.tagSet[t]; !ok {
				a.tagSet[t] = struct{}{}
				a.txTags++
			}
		}
	}
}

// unknown marks the open transaction (or the stream between two) as
// holding a change that could not be decoded: its keys are unknown, so
// everything is distrusted.
func (a *applier[K]) unknown(err error) {
	a.touch()
	a.stats.decodeErrors.Add(1)
	a.report(fmt.Errorf("%w; every value is distrusted", err))
	if !a.dropped {
		a.distrust = true
	}
}

// commit ends the open transaction: it waits in the group until flush.
func (a *applier[K]) commit(m *pglogrepl.CommitMessage, now time.Time) {
	if len(a.done) == 0 {
		a.since = now
	}
	a.done = append(a.done, committed{lsn: a.lsn, end: LSN(m.TransactionEndLSN), commitTime: m.CommitTime,
		changes: a.changes, keys: a.txKeys, tags: a.txTags, all: a.dropped})
	a.open, a.changes, a.dropped = false, 0, false
	a.txKeys, a.txTags = 0, 0
}

// waiting reports whether transactions received whole wait to be
// applied, between two transactions.
func (a *applier[K]) waiting() bool {
	return !a.open && len(a.done) > 0
}

// busy reports whether anything received is not applied yet.
func (a *applier[K]) busy() bool {
	return a.open || len(a.done) > 0 || a.distrust
}

// due reports whether the group is to be applied now, without waiting
// for the stream to fall idle.
func (a *applier[K]) due(now time.Time) bool {
	return a.distrust ||
		len(a.keys)+len(a.tagSet) >= a.max ||
		len(a.done) >= maxGroup ||
		len(a.done) > 0 && now.Sub(a.since) >= groupWait
}

// flush invalidates what the group named so far and reports its
// transactions received whole as applied, in commit order; it returns
// the end of the last of them (ok false: none). The caller has checked
// that the group's transactions are visible.
func (a *applier[K]) flush(now time.Time) (end LSN, ok bool) {
	failed := false // a panic in the target: every transaction of the group distrusted everything
	if len(a.keys) > 0 || len(a.tagSet) > 0 {
		// With distrust too: the group's other transactions keep their
		// own invalidations, and only the one that distrusted says All.
		n, t := len(a.keys), len(a.tagSet)
		err := a.invalidateKeys()
		a.stats.invalidations.Add(uint64(n))
		a.stats.tagInvalidations.Add(uint64(t))
		if err != nil {
			// Some keys may be left: drop everything rather than confirm them.
			a.stats.panics.Add(1)
			a.report(fmt.Errorf("flightpg: the target panicked; every value is distrusted: %w", err))
			a.distrust, failed = true, true
		}
	}
	if a.distrust {
		a.invalidateAll()
		if a.open && a.changes > 0 {
			// The rest of the open transaction needs nothing: it was
			// visible (touch) before everything was invalidated. One
			// with no change yet was not checked, and is applied as
			// it comes.
			a.dropped = true
		}
	}
	a.distrust = false
	clear(a.keys)
	clear(a.tagSet)
	for _, c := range a.done {
		c.all = c.all || failed
		a.applied(c, now)
		end, ok = c.end, true
	}
	a.done = a.done[:0]
	return end, ok
}

// applied counts a transaction applied and tells Options.OnApplied.
func (a *applier[K]) applied(c committed, now time.Time) {
	if c.changes == 0 {
		return
	}
	lag := now.Sub(c.commitTime)
	a.stats.transactions.Add(1)
	a.stats.lag.add(lag)
	a.stats.lagHist.add(lag)
	if a.onApplied != nil {
		done := Applied{LSN: c.lsn, CommitTime: c.commitTime, Lag: lag, Changes: c.changes,
			Keys: c.keys, Tags: c.tags, All: c.all}
		if err := guard(func() { a.onApplied(done) }); err != nil {
			a.report(fmt.Errorf("flightpg: Options.OnApplied panicked: %w", err))
		}
	}
}

// invalidateAll distrusts every value the target holds.
func (a *applier[K]) invalidateAll() {
	a.stats.invalidateAlls.Add(1)
	if err := guard(a.target.InvalidateAll); err != nil {
		a.stats.panics.Add(1)
		a.report(fmt.Errorf("flightpg: the target's InvalidateAll panicked: %w", err))
	}
}

// guard runs user code (the Mapping, the target, a callback) and turns a
// panic into a *flightcache.PanicError.
func guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil { // since Go 1.21, panic(nil) recovers a *runtime.PanicNilError
			stack := debug.Stack()
			if i := bytes.IndexByte(stack, '\n'); i >= 0 {
				stack = stack[i+1:]
			}
			err = &flightcache.PanicError{Value: r, Stack: stack}
		}
	}()
	f()
	return nil
}

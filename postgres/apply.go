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
// version floor (flightcache's Loader.InvalidateVersion): drop its value,
// and store no value of a lower version after. [Options.Version] needs it.
type VersionTarget[K comparable] interface {
	InvalidateVersion(key K, version uint64)
}

// applier turns one transaction's changes into invalidations: it asks the
// Mapping as each change arrives, gathers the keys and tags named (each
// once), and invalidates them at the commit, or earlier when more than
// max are pending.
//
// Invalidating before the commit message arrives is safe: pgoutput (at
// protocol version 1, without streaming) sends a transaction only once it
// has committed, so a load that starts after an invalidation reads the
// committed rows. Its order is what matters: each change's keys are
// invalidated before the commit's LSN is reported as applied.
//
// The applier runs on the Source's goroutine only; it reads and writes
// nothing another goroutine does, except through stats.
type applier[K comparable] struct {
	target  Target[K]
	tags    TagTarget        // nil when target has no InvalidateTag
	floors  VersionTarget[K] // nil without Options.Version
	version func(Change) uint64
	mapping Mapping[K]
	max     int
	report  func(error)
	stats   *counters
	// onApplied is Options.OnApplied (nil: none).
	onApplied func(Applied)

	// The transaction being received (between Begin and Commit).
	open       bool
	lsn        LSN          // its commit record's LSN (Begin's final LSN)
	commitTime time.Time    // when it committed
	changes    int          // how many row changes it had so far
	keys       map[K]uint64 // each with the highest version named for it (0: none)
	tagSet     map[string]struct{}
	distrust   bool // invalidate everything at the next flush
	dropped    bool // everything was invalidated after the commit: later changes need nothing
	txKeys     int  // the Invalidate calls it made so far
	txTags     int  // the InvalidateTag calls it made so far
}

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

// begin starts a transaction. A transaction left open by a lost
// connection is forgotten: it was not confirmed, and is sent again.
func (a *applier[K]) begin(m *pglogrepl.BeginMessage) {
	a.reset()
	a.open = true
	a.lsn = LSN(m.FinalLSN)
	a.commitTime = m.CommitTime
}

// reset forgets the transaction being received.
func (a *applier[K]) reset() {
	a.open, a.changes, a.distrust, a.dropped = false, 0, false, false
	a.txKeys, a.txTags = 0, 0
	clear(a.keys)
	clear(a.tagSet)
}

// add takes one change of the open transaction.
func (a *applier[K]) add(c Change) {
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
	var ver uint64
	if a.version != nil && len(keys) > 0 && !a.distrust {
		if err := guard(func() { ver = a.version(c) }); err != nil {
			a.stats.panics.Add(1)
			a.report(fmt.Errorf("flightpg: Options.Version panicked on a %v of %s.%s; every value is distrusted: %w",
				c.Op, c.Schema, c.Table, err))
			a.distrust = true
		}
	}
	switch {
	case len(tags) > 0 && a.tags == nil:
		a.stats.tagsWithoutTarget.Add(1)
		a.distrust = true
	case c.Op == OpTruncate && len(keys) == 0 && len(tags) == 0:
		a.stats.truncatesUnmapped.Add(1)
		a.distrust = true
	}
	for _, k := range keys {
		if held, ok := a.keys[k]; !ok || ver > held {
			a.keys[k] = ver
		}
	}
	if a.tags != nil {
		for _, t := range tags {
			a.tagSet[t] = struct{}{}
		}
	}
	if a.distrust || len(a.keys)+len(a.tagSet) >= a.max {
		a.flush()
	}
}

// unknown marks the open transaction as holding a change that could not be
// decoded: its keys are unknown, so everything is distrusted.
func (a *applier[K]) unknown(err error) {
	a.stats.decodeErrors.Add(1)
	a.report(fmt.Errorf("%w; every value is distrusted", err))
	a.distrust = true
	a.flush()
}

// flush invalidates what the open transaction named so far.
func (a *applier[K]) flush() {
	if a.dropped {
		return
	}
	if a.distrust {
		a.invalidateAll()
		a.dropped = true
		clear(a.keys)
		clear(a.tagSet)
		return
	}
	if len(a.keys) == 0 && len(a.tagSet) == 0 {
		return
	}
	var floors uint64
	err := guard(func() {
		for k, v := range a.keys {
			if v > 0 && a.floors != nil {
				a.floors.InvalidateVersion(k, v)
				floors++
			} else {
				a.target.Invalidate(k)
			}
		}
		for t := range a.tagSet {
			a.tags.InvalidateTag(t)
		}
	})
	a.stats.invalidations.Add(uint64(len(a.keys)))
	a.stats.versioned.Add(floors)
	a.stats.tagInvalidations.Add(uint64(len(a.tagSet)))
	a.txKeys += len(a.keys)
	a.txTags += len(a.tagSet)
	clear(a.keys)
	clear(a.tagSet)
	if err != nil {
		// Some keys may be left: drop everything rather than confirm them.
		a.stats.panics.Add(1)
		a.report(fmt.Errorf("flightpg: the target panicked; every value is distrusted: %w", err))
		a.invalidateAll()
		a.dropped = true
	}
}

// commit applies what is left of the transaction; the caller then
// reports its end LSN as applied.
func (a *applier[K]) commit(m *pglogrepl.CommitMessage, now time.Time) {
	a.flush()
	if a.changes > 0 {
		lag := now.Sub(m.CommitTime)
		a.stats.transactions.Add(1)
		a.stats.lag.add(lag)
		a.stats.lagHist.add(lag)
		if a.onApplied != nil {
			done := Applied{LSN: a.lsn, CommitTime: m.CommitTime, Lag: lag, Changes: a.changes,
				Keys: a.txKeys, Tags: a.txTags, All: a.dropped}
			if err := guard(func() { a.onApplied(done) }); err != nil {
				a.report(fmt.Errorf("flightpg: Options.OnApplied panicked: %w", err))
			}
		}
	}
	a.reset()
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

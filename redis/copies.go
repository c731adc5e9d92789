package flightredis

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/redis/internal/handover"
	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// copies is the tier's record of the Loader's copies of shared entries:
// which version of each it handed over (served), the Loads running
// (running), and the checks of a copy against its entry when Redis says
// the entry changed (checks, run by checker). With tracking it reads
// entries tracked, so that Redis tells it of their next change.
type copies[K comparable] struct {
	served  handover.Served
	running handover.Running // the keys Loads read now
	checks  chan check[K]    // copies to check against their entries
	epoch   atomic.Uint64    // of the dropped marks (droppedMark)
	fleet   *fleetState[K]   // the Loader's caches, and the keys' names
	track   *track.Tracker
	link    *link
	stats   *counters
	genKey  string
	timeout time.Duration   // Options.Timeout
	ctx     context.Context // the tier's: cancelled by Close
}

// tracking reports whether the tier hears the fleet's writes through
// tracking: a value it keeps must then have been read tracked.
func (c *copies[K]) tracking() bool { return c.track.Mode() == track.Tracking }

// untracked notes that a value was handed over that Redis does not track
// for this process (it was loaded without Redis, or read on a node the
// tier had not armed): with tracking, the next health check distrusts it.
func (c *copies[K]) untracked() {
	if c.tracking() {
		c.epoch.Add(1)
		c.fleet.missed.Store(true)
	}
}

// invalidated handles the invalidation of key's entry ks: Redis tracks it
// for this process no more. The Loader's copy is dropped unless it is
// still the entry's current version, which a tracked read checks (and
// tracks again) off the listener's goroutine: a process's own fill, a
// value it waited for, come back this way once. While a Load of the key
// runs here, the check waits for its end (its value is not known yet).
func (c *copies[K]) invalidated(key K, ks keys) {
	if c.running.Pushed(ks.base) {
		return
	}
	c.verify(key, ks)
}

// verify queues the check of the Loader's copy of key, or drops it now when
// the tier does not know which version it is, when it handed it over
// longer ago than an echo takes (see echoSpan), or the queue is full. A key
// dropped since the tier last handed it over is left alone: the Loader
// has no copy of it (a check that dropped it tracked it again, and the
// next write of the entry comes back).
func (c *copies[K]) verify(key K, ks keys) {
	switch id, at := c.served.Since(ks.base); {
	case id == c.droppedMark():
		return
	case id != "" && id[0] != '-' && time.Since(at) < c.echoSpan():
		select {
		case c.checks <- check[K]{key, ks}:
			return
		default:
		}
	}
	c.dropKey(key, ks)
}

// dropKey drops the Loader's copy of key, whose entry is ks, and marks it
// dropped (see verify).
func (c *copies[K]) dropKey(key K, ks keys) {
	c.running.Cut(ks.base)
	c.served.Note(ks.base, c.droppedMark())
	c.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
}

// droppedMark is what served holds for a key dropped by an invalidation:
// no entry id (those are hex). Marks of an earlier epoch mean nothing:
// the epoch moves whenever the Loader may have taken a copy the tier did
// not hand over (a local load, a write kept for replay).
func (c *copies[K]) droppedMark() string {
	return "-" + strconv.FormatUint(c.epoch.Load(), 10)
}

// echoSpan is how long after the tier hands a copy over an invalidation
// of its entry may be the echo of the write it came from (this process's
// fill, or the one it waited for, whose entry it had read missing, and so
// tracked): such an invalidation is checked before the copy is dropped.
// One that comes later drops the copy at once, without the check's round
// trip: the drop of a key held for a while is as quick as the message.
func (c *copies[K]) echoSpan() time.Duration {
	return max(remote.Mul(c.timeout, 4), time.Second)
}

// checker runs the checks verify queues, a batch at a time: one tracked
// read of the entries' ids per master, at once; a copy whose version is not
// the entry's, or that could not be checked, is dropped. A key dropped
// since its check was queued (a check queued before it, an invalidation
// of this process's own write) is left alone: the Loader holds no copy,
// and a second drop would count a write twice.
func (c *copies[K]) checker() {
	for {
		var batch []check[K]
		select {
		case <-c.ctx.Done():
			return
		case ck := <-c.checks:
			batch = append(batch, ck)
		}
		for len(batch) < 256 && len(c.checks) > 0 {
			batch = append(batch, <-c.checks)
		}
		entries := make([]string, len(batch))
		for i, ck := range batch {
			entries[i] = ck.ks.entry
		}
		cmds, ok := c.track.ReadMany(c.ctx, entries, idField)
		for i, ck := range batch {
			id := c.served.Get(ck.ks.base)
			if id == c.droppedMark() {
				continue // dropped since it was queued: the Loader has no copy to check
			}
			if !ok || cmds[i].Err() != nil || len(cmds[i].Val()) != 1 || cmds[i].Val()[0] != id {
				c.dropKey(ck.key, ck.ks)
			}
		}
	}
}

// takeoff begins a Load of key, whose entry is ks, and returns its ticket
// (for handOver) and what ends it (landed).
func (c *copies[K]) takeoff(key K, ks keys) (tk handover.Ticket, landed func()) {
	before := c.served.Get(ks.base)
	tk = c.running.Begin(ks.base)
	return tk, func() { c.landed(key, ks, before) }
}

// handOver records that a Load with ticket tk hands the Loader the entry
// of ks whose id is id (see runningLoads.record).
func (c *copies[K]) handOver(ks keys, tk handover.Ticket, id string) {
	c.running.Record(ks.base, tk, func() { c.served.Note(ks.base, id) })
}

// localLoads counts n keys of a batch loaded without Redis (untracked).
func (c *copies[K]) localLoads(n int) {
	c.stats.localLoads.Add(uint64(n))
	if n > 0 {
		c.untracked()
	}
}

// landed ends a Load of key, whose entry is ks (before: what served held
// for it when it began): the Loader may take a copy now (which the tier
// may not know the version of: a write lost, a local load), so a dropped
// mark from before the Load no longer holds (one made while it ran does:
// the Loader does not cache a load its key was dropped during); and an
// invalidation heard while it ran has that copy checked now.
func (c *copies[K]) landed(key K, ks keys, before string) {
	if id := c.served.Get(ks.base); id != "" && id[0] == '-' && id == before {
		c.served.Drop(ks.base) // first: an invalidation from now on waits for end
	}
	if c.running.End(ks.base) {
		c.verify(key, ks)
	}
}

// wrote notes, with tracking, that this process's Set or Invalidate of
// key reached Redis as the write of entry: if Redis tracks entry for this
// process, the write comes back as an invalidation, which drops the
// Loader's copy; if not, the copy is dropped now. Either way the writer
// drops its copy once, as every process does: a Get that raced the write
// may have read the old entry back.
//
// writing runs before the write is sent (its echo may come before its
// reply) and reports whether an echo is awaited; wrote runs after it, ok
// when it changed the entry.
func (c *copies[K]) writing(entry string) (echo bool) {
	return c.tracking() && c.track.Echoes.Wrote(entry, track.EchoWrite)
}

func (c *copies[K]) wrote(key K, entry string, echo, ok bool) {
	switch {
	case !c.tracking():
	case !ok:
		c.track.Echoes.Unmark(entry)
	case !echo:
		c.running.Cut(strings.TrimSuffix(entry, ":v"))
		c.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
	}
}

// filling notes, with tracking, that this process is about to write entry
// under its lease: the invalidation that comes back is not counted as
// heard (the copy is still checked, as any other).
func (c *copies[K]) filling(entry string) {
	if c.tracking() {
		_ = c.track.Echoes.Wrote(entry, track.EchoFill)
	}
}

// trackWritten tracks the entry this process just wrote for key (a Set):
// [CLIENT CACHING yes, HGET entry id] on its master's tracked client. If
// it cannot be tracked, or the id read back is not the one written (a
// later write went first), the Loader's copy is outdated already, or
// would not be told when it is: it is dropped.
func (c *copies[K]) trackWritten(ctx context.Context, key K, ks keys, id string) {
	if !c.tracking() {
		return
	}
	if got, ok := c.track.ReadID(ctx, ks.entry); !ok || got != id {
		c.running.Cut(ks.base)
		c.served.Drop(ks.base)
		c.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
	}
}

// readMany reads the entries of a batch's items and the shared generation
// (readEntries), in one round trip that batchRoundTrips counts.
func (c *copies[K]) readMany(ctx context.Context, items []*item[K]) ([]*redis.SliceCmd, *redis.StringCmd) {
	entries := make([]string, len(items))
	for i, s := range items {
		entries[i] = s.ks.entry
	}
	return c.readEntries(ctx, &c.stats.batchRoundTrips, entries...)
}

// readEntries reads entries (HMGET) and the shared generation in one
// pipelined round trip on the tier's client, as without tracking (its
// hooks see it), and, at the same time, their ids tracked (touch). An
// entry whose two reads agree is covered: any change after the tracked
// read comes back as an invalidation, and none came between the two (ids
// are random per write). One whose reads differ (a write raced them) is
// read again, tracked; if that fails too, it is handed over untracked.
func (c *copies[K]) readEntries(ctx context.Context, trips *atomic.Uint64, entries ...string) ([]*redis.SliceCmd, *redis.StringCmd) {
	wait := c.touch(ctx, entries)
	cmds := make([]*redis.SliceCmd, len(entries))
	var g *redis.StringCmd
	c.link.pipelined(ctx, trips, func(op context.Context, p redis.Pipeliner) {
		for i, e := range entries {
			cmds[i] = p.HMGet(op, e, entryFields...)
		}
		g = p.Get(op, c.genKey)
	})
	ids, ok := wait()
	if !ok {
		c.untracked()
		return cmds, g
	}
	var again []int
	for i, cmd := range cmds {
		if cmd.Err() == nil && !covered(ids[i], cmd.Val()) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return cmds, g
	}
	raced := make([]string, len(again))
	for j, i := range again {
		raced[j] = entries[i]
	}
	more, ok := c.track.ReadMany(ctx, raced, entryFields)
	if !ok {
		c.untracked()
		return cmds, g
	}
	for j, i := range again {
		cmds[i] = more[j]
	}
	return cmds, g
}

// touch starts reading the ids of entries tracked, at once; wait returns
// them (ok false without tracking, or when they could not be tracked).
func (c *copies[K]) touch(ctx context.Context, entries []string) (wait func() ([]*redis.SliceCmd, bool)) {
	if !c.tracking() {
		return func() ([]*redis.SliceCmd, bool) { return nil, false }
	}
	done := make(chan struct{})
	var cmds []*redis.SliceCmd
	var ok bool
	go func() {
		defer close(done)
		cmds, ok = c.track.ReadMany(ctx, entries, idField)
	}()
	return func() ([]*redis.SliceCmd, bool) {
		<-done
		return cmds, ok
	}
}

// takeoffAll begins the Loads of a LoadMany's items, and returns what ends
// them (see landed), for the entries the items name now.
func (c *copies[K]) takeoffAll(items []*item[K]) (landed func()) {
	kss := make([]keys, len(items))
	before := make([]string, len(items))
	for i, s := range items {
		kss[i], before[i] = s.ks, c.served.Get(s.ks.base)
		s.tk = c.running.Begin(s.ks.base)
	}
	return func() {
		for i, s := range items {
			c.landed(s.key, kss[i], before[i])
		}
	}
}

package flightredis

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// This file is the tier's side of tracking (tracking.go): tracked reads,
// the tracking of what this process writes, and the invalidations Redis
// sends for them.

// startTracking starts the listener that decides how the tier hears the
// fleet's writes: tracking, or, where Redis refuses it, sharded channels.
func (t *Tier[K, V]) startTracking() {
	interval := max(t.opts.Timeout*4, 500*time.Millisecond) // as the subscription's health check
	t.track.start(t.ctx, t.rdb, trackHandlers{
		onKeys: t.onTracked, onFlush: t.onFlush,
		onUp: t.onNodeUp, onDown: t.onDown, onRetry: t.onRetry,
		onRefused: t.startShards, onConnLost: t.onConnLost,
		timeout: t.opts.Timeout, interval: interval,
	})
	t.checks = make(chan check[K], 4096)
	t.track.wg.Go(t.checker)
}

// tracking reports whether the tier hears the fleet's writes through
// tracking: a value it keeps must then have been read tracked.
func (t *Tier[K, V]) tracking() bool { return t.track.mode.Load() == invTracking }

// quiet reports whether this tier's Sets and Invalidates publish nothing
// on the classic channel: tracking, or channels (which publish on their
// own channel after the write).
func (t *Tier[K, V]) quiet() bool {
	m := t.track.mode.Load()
	return m == invTracking || m == invChannels
}

// hearing reports whether the tier hears every write of the fleet that it
// must: the classic subscription (wake-ups, InvalidateAll) and, by the
// mode, every node's tracking or every sharded channel.
func (t *Tier[K, V]) hearing() bool {
	if !t.events.up.Load() {
		return false
	}
	switch t.track.mode.Load() {
	case invTracking:
		return t.track.allUp()
	case invChannels:
		return t.shards.allUp()
	case invClassic:
		return true
	}
	return false
}

// awaitStartup waits, at most until ctx ends, for the subscription and
// the listener to be confirmed for the first time (or a Timeout).
func (t *Tier[K, V]) awaitStartup(ctx context.Context) {
	t.events.awaitStartup(ctx)
	t.track.awaitStartup(ctx)
}

// untracked notes that a value was handed over that Redis does not track
// for this process (it was loaded without Redis, or read on a node the
// tier had not armed): with tracking, the next health check distrusts it.
func (t *Tier[K, V]) untracked() {
	if t.tracking() {
		t.track.epoch.Add(1)
		t.fleet.missed.Store(true)
	}
}

// onTick runs at every health check of the subscription: the writes kept
// are replayed, and values handed over untracked are distrusted once the
// tier hears again.
func (t *Tier[K, V]) onTick() {
	if t.hearing() && !t.down() && t.fleet.missed.Swap(false) {
		t.distrust()
	}
	t.replay()
}

// onNodeUp runs when a node is armed: what was handed over while it was
// not is distrusted, and the writes kept are replayed.
func (t *Tier[K, V]) onNodeUp() {
	t.onRetry()
	t.replay()
}

// onConnLost runs when a tracked connection closed after it carried
// tracked reads: Redis forgot the keys it tracked, and will send no
// invalidation of them. Every copy is distrusted.
func (t *Tier[K, V]) onConnLost() {
	t.stats.trackedConnsLost.Add(1)
	t.distrust()
}

// onFlush runs when Redis says every tracked key changed (FLUSHALL,
// FLUSHDB): every copy is distrusted.
func (t *Tier[K, V]) onFlush() {
	t.stats.undecodedInvalidations.Add(1)
	t.distrust()
}

// onTracked handles an invalidation of tracked keys: each entry key names
// a key whose copy is dropped. A name the tier cannot map back to a key
// distrusts every copy instead, once for the message. The echo of this
// process's own Set or Invalidate is not counted as heard.
func (t *Tier[K, V]) onTracked(names []string) {
	lost := false
	for _, s := range names {
		name, gen, ok := parseEntryName(t.opts.Prefix, s)
		if !ok {
			continue // not an entry of this tier
		}
		own := t.track.echoes.heard(s)
		if own == echoNone {
			t.stats.invalidationsHeard.Add(1)
		}
		key, ok := t.keyNamed(name)
		switch {
		case !ok:
			t.stats.undecodedInvalidations.Add(1)
			lost = true
		case own == echoWrite: // this process's own Set or Invalidate: dropped, as everywhere
			t.dropKey(key, keysAt(t.opts.Prefix, name, gen))
		default:
			t.invalidated(key, keysAt(t.opts.Prefix, name, gen))
		}
	}
	if lost {
		t.distrust()
	}
}

// invalidated handles the invalidation of key's entry ks: Redis tracks it
// for this process no more. The Loader's copy is dropped unless it is
// still the entry's current version, which a tracked read checks (and
// tracks again) off the listener's goroutine: a process's own fill, a
// value it waited for, come back this way once. While a Load of the key
// runs here, the check waits for its end (its value is not known yet).
func (t *Tier[K, V]) invalidated(key K, ks keys) {
	if t.flights.pushed(ks.base) {
		return
	}
	t.verify(key, ks)
}

// verify queues the check of the Loader's copy of key, or drops it now when
// the tier does not know which version it is, when it handed it over
// longer ago than an echo takes (see echoWindow), or the queue is full. A key
// dropped since the tier last handed it over is left alone: the Loader
// has no copy of it (a check that dropped it tracked it again, and the
// next write of the entry comes back).
func (t *Tier[K, V]) verify(key K, ks keys) {
	switch id, at := t.served.since(ks.base); {
	case id == t.droppedMark():
		return
	case id != "" && id[0] != '-' && time.Since(at) < t.echoWindow():
		select {
		case t.checks <- check[K]{key, ks}:
			return
		default:
		}
	}
	t.dropKey(key, ks)
}

// dropKey drops the Loader's copy of key, whose entry is ks, and marks it
// dropped (see verify).
func (t *Tier[K, V]) dropKey(key K, ks keys) {
	t.flights.cut(ks.base)
	t.served.put(ks.base, t.droppedMark())
	t.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
}

// droppedMark is what served holds for a key dropped by an invalidation:
// no entry id (those are hex). Marks of an earlier epoch mean nothing:
// the epoch moves whenever the Loader may have taken a copy the tier did
// not hand over (a local load, a write kept for replay).
func (t *Tier[K, V]) droppedMark() string {
	return "-" + strconv.FormatUint(t.track.epoch.Load(), 10)
}

// echoWindow is how long after the tier hands a copy over an invalidation
// of its entry may be the echo of the write it came from (this process's
// fill, or the one it waited for, whose entry it had read missing, and so
// tracked): such an invalidation is checked before the copy is dropped.
// One that comes later drops the copy at once, without the check's round
// trip: the drop of a key held for a while is as quick as the message.
func (t *Tier[K, V]) echoWindow() time.Duration {
	return max(remote.Mul(t.opts.Timeout, 4), time.Second)
}

// check is a copy to check against its entry (verify).
type check[K comparable] struct {
	key K
	ks  keys
}

// checker runs the checks verify queues, a batch at a time: one tracked
// read of the entries' ids per master, at once; a copy whose version is not
// the entry's, or that could not be checked, is dropped. A key dropped
// since its check was queued (a check queued before it, an invalidation
// of this process's own write) is left alone: the Loader holds no copy,
// and a second drop would count a write twice.
func (t *Tier[K, V]) checker() {
	for {
		var batch []check[K]
		select {
		case <-t.ctx.Done():
			return
		case c := <-t.checks:
			batch = append(batch, c)
		}
		for len(batch) < 256 && len(t.checks) > 0 {
			batch = append(batch, <-t.checks)
		}
		entries := make([]string, len(batch))
		for i, c := range batch {
			entries[i] = c.ks.entry
		}
		cmds, _, ok := t.readTrackedMany(t.ctx, entries, idField, false)
		for i, c := range batch {
			id := t.served.get(c.ks.base)
			if id == t.droppedMark() {
				continue // dropped since it was queued: the Loader has no copy to check
			}
			if !ok || cmds[i].Err() != nil || len(cmds[i].Val()) != 1 || cmds[i].Val()[0] != id {
				t.dropKey(c.key, c.ks)
			}
		}
	}
}

// idField is the field a check reads.
var idField = []string{"id"}

// flights are the keys (keys.base) a Load or LoadMany of this tier reads
// now, whether an invalidation of theirs came meanwhile, and whether the
// Loader's copy of them was cut (see cut) since each Load began.
type flights struct {
	mu   sync.Mutex
	m    map[string]*flight // guarded by mu
	cuts uint64             // cuts of every key (cutAll); guarded by mu
}

type flight struct {
	n      int    // Loads of the key running
	pushed bool   // an invalidation came while they ran
	cuts   uint64 // cuts of the key while they ran
}

// ticket is what the cuts of a Load's key stood at when it began.
type ticket struct{ key, all uint64 }

// begin notes that a Load of base starts, and returns its ticket.
func (f *flights) begin(base string) ticket {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]*flight)
	}
	fl := f.m[base]
	if fl != nil {
		fl.n++
	} else {
		fl = &flight{n: 1}
		f.m[base] = fl
	}
	return ticket{fl.cuts, f.cuts}
}

// cut notes that the Loader's copy of base is dropped or replaced by
// other means than a Load of this tier (a drop, this process's Set or
// Invalidate): the Loader detaches a Load of the key running then, and
// keeps nothing of it. Call it before the drop and before recording what
// the Loader holds instead.
func (f *flights) cut(base string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil {
		fl.cuts++
	}
}

// cutAll is cut for every key (a distrust: a Get detaches the Loads of
// its key running then; a move to a new generation).
func (f *flights) cutAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cuts++
}

// record runs put, the record of a copy a Load with ticket tk hands the
// Loader, unless the Loader's copy of base was cut since that Load began:
// the Loader keeps nothing of it then, and what it holds instead (the copy
// of a Load that began after the cut, or of a Set) is what served must
// name, else an invalidation of that copy is checked against the wrong
// version and lost. Under mu: a cut comes before the record, or finds it
// made and overrides it.
func (f *flights) record(base string, tk ticket, put func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil && fl.cuts == tk.key && f.cuts == tk.all {
		put()
	}
}

// end notes that a Load of base ends; it reports whether an invalidation
// came while it ran (the last of them to end checks it).
func (f *flights) end(base string) (pushed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := f.m[base]
	if fl == nil {
		return false
	}
	if fl.n--; fl.n > 0 {
		return false
	}
	delete(f.m, base)
	return fl.pushed
}

// pushed notes an invalidation of base; it reports whether a Load of it
// runs, which will have it checked when it ends.
func (f *flights) pushed(base string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil {
		fl.pushed = true
		return true
	}
	return false
}

// takeoff begins a Load of key, whose entry is ks, and returns its ticket
// (for handOver) and what ends it (landed).
func (t *Tier[K, V]) takeoff(key K, ks keys) (tk ticket, landed func()) {
	before := t.served.get(ks.base)
	tk = t.flights.begin(ks.base)
	return tk, func() { t.landed(key, ks, before) }
}

// handOver records that a Load with ticket tk hands the Loader the entry
// of ks whose id is id (see flights.record).
func (t *Tier[K, V]) handOver(ks keys, tk ticket, id string) {
	t.flights.record(ks.base, tk, func() { t.served.put(ks.base, id) })
}

// localLoads counts n keys of a batch loaded without Redis (untracked).
func (t *Tier[K, V]) localLoads(n int) {
	t.stats.localLoads.Add(uint64(n))
	if n > 0 {
		t.untracked()
	}
}

// landed ends a Load of key, whose entry is ks (before: what served held
// for it when it began): the Loader may take a copy now (which the tier
// may not know the version of: a write lost, a local load), so a dropped
// mark from before the Load no longer holds (one made while it ran does:
// the Loader does not cache a load its key was dropped during); and an
// invalidation heard while it ran has that copy checked now.
func (t *Tier[K, V]) landed(key K, ks keys, before string) {
	if id := t.served.get(ks.base); id != "" && id[0] == '-' && id == before {
		t.served.drop(ks.base) // first: an invalidation from now on waits for end
	}
	if t.flights.end(ks.base) {
		t.verify(key, ks)
	}
}

// keyNamed returns the key named name: the name itself for string keys
// named by default, else the key this tier handed over (or wrote) under
// that name, if it remembers it.
func (t *Tier[K, V]) keyNamed(name string) (key K, ok bool) {
	if _, str := any(key).(string); str && t.opts.Key == nil {
		return any(name).(K), true
	}
	t.fleet.mu.Lock()
	defer t.fleet.mu.Unlock()
	key, ok = t.fleet.names[name]
	return key, ok
}

// remembersNames reports whether handed must remember the key of a name:
// the key type does not survive JSON (classic and channel messages carry
// JSON), or tracking names only the Redis key and the key is not a string
// named by default.
func (t *Tier[K, V]) remembersNames() bool {
	if !t.fleet.jsonKeys {
		return true
	}
	if t.track.mode.Load() == invChannels || t.track.mode.Load() == invClassic {
		return false
	}
	_, str := any(*new(K)).(string)
	return !str || t.opts.Key != nil
}

// parseEntryName reads the Redis name of an entry,
// "<prefix>{<tag>}[:g<gen>]:v" (keysAt): the key's name and the
// generation. ok is false for any other name.
func parseEntryName(prefix, s string) (name string, gen int64, ok bool) {
	rest, ok := strings.CutPrefix(s, prefix+"{")
	if !ok {
		return "", 0, false
	}
	tag, rest, ok := strings.Cut(rest, "}")
	if !ok {
		return "", 0, false
	}
	rest, ok = strings.CutSuffix(rest, ":v")
	if !ok {
		return "", 0, false
	}
	if rest != "" {
		g, err := strconv.ParseInt(strings.TrimPrefix(rest, ":g"), 10, 64)
		if err != nil || !strings.HasPrefix(rest, ":g") {
			return "", 0, false
		}
		gen = g
	}
	if tag != "%" {
		name = strings.NewReplacer("%7D", "}", "%25", "%").Replace(tag)
	}
	return name, gen, keysAt(prefix, name, gen).entry == s
}

// readTrackedMany reads fields of entries tracked (CLIENT CACHING yes, then
// HMGET): one pipeline per master, at once, and with gen the shared
// generation. ok is false when one of them could not be tracked; the
// caller then reads them all untracked.
func (t *Tier[K, V]) readTrackedMany(ctx context.Context, entries, fields []string, gen bool) (cmds []*redis.SliceCmd, g *redis.StringCmd, ok bool) {
	byNode := make(map[*redis.Client][]int)
	for i, e := range entries {
		rc := t.track.reader(ctx, e)
		if rc == nil {
			return nil, nil, false
		}
		byNode[rc] = append(byNode[rc], i)
	}
	c, cancel := t.op(ctx)
	defer cancel()
	cmds = make([]*redis.SliceCmd, len(entries))
	caching := make([]*redis.Cmd, len(entries))
	var wg sync.WaitGroup
	if gen && t.track.single == nil {
		wg.Go(func() { g = t.rdb.Get(c, t.genKey) })
	}
	for rc, idx := range byNode {
		wg.Go(func() {
			_, _ = rc.Pipelined(c, func(p redis.Pipeliner) error {
				for _, i := range idx {
					caching[i] = p.Do(c, "CLIENT", "CACHING", "yes")
					cmds[i] = p.HMGet(c, entries[i], fields...)
				}
				if gen && t.track.single != nil {
					g = p.Get(c, t.genKey)
				}
				return nil
			})
		})
	}
	wg.Wait()
	for i, cmd := range cmds {
		if moved(cmd.Err()) && t.track.cluster != nil {
			t.track.cluster.ReloadState(t.ctx)
		}
		if moved(cmd.Err()) || (cmd.Err() == nil && caching[i].Err() != nil) {
			return nil, nil, false // read, but not tracked
		}
	}
	t.track.reads.Add(uint64(len(entries)))
	for _, e := range entries {
		t.track.echoes.tracked(e)
	}
	return cmds, g, true
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
func (t *Tier[K, V]) writing(entry string) (echo bool) {
	return t.tracking() && t.track.echoes.wrote(entry, echoWrite)
}

func (t *Tier[K, V]) wrote(key K, entry string, echo, ok bool) {
	switch {
	case !t.tracking():
	case !ok:
		t.track.echoes.unmark(entry)
	case !echo:
		t.flights.cut(strings.TrimSuffix(entry, ":v"))
		t.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
	}
}

// filling notes, with tracking, that this process is about to write entry
// under its lease: the invalidation that comes back is not counted as
// heard (the copy is still checked, as any other).
func (t *Tier[K, V]) filling(entry string) {
	if t.tracking() {
		_ = t.track.echoes.wrote(entry, echoFill)
	}
}

// What echoes knows of an entry.
const (
	echoNone  int8 = iota // tracked; no write of this process since
	echoWrite             // this process's Set or Invalidate since
	echoFill              // this process's fill since
)

// echoes remembers which entries Redis tracks for this process, and which
// of those this process wrote since: the invalidation that comes back is
// its own write's echo. Bounded: a name forgotten costs a count, never a
// drop. It is forgotten at each distrust: the echo of a connection lost
// never comes.
type echoes struct {
	mu sync.Mutex
	m  map[string]int8 // entry → echoNone, echoWrite or echoFill
}

// tracked notes a tracked read of entry.
func (e *echoes) tracked(entry string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = make(map[string]int8)
	}
	if _, ok := e.m[entry]; !ok {
		if len(e.m) >= maxServed {
			for k := range e.m {
				delete(e.m, k)
				break
			}
		}
		e.m[entry] = echoNone
	}
}

// wrote notes this process's write of entry, of kind echoWrite or
// echoFill, if Redis tracks entry for it: it reports whether an
// invalidation will come back.
func (e *echoes) wrote(entry string, kind int8) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.m[entry]; ok {
		e.m[entry] = kind
		return true
	}
	return false
}

// unmark undoes wrote, for a write that changed nothing.
func (e *echoes) unmark(entry string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if k, ok := e.m[entry]; ok && k != echoNone {
		e.m[entry] = echoNone
	}
}

// reset forgets everything.
func (e *echoes) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.m)
}

// heard notes an invalidation of entry (Redis tracks it no more); it
// returns what the tier knew: echoNone for another process's write.
func (e *echoes) heard(entry string) int8 {
	e.mu.Lock()
	defer e.mu.Unlock()
	own := e.m[entry]
	delete(e.m, entry)
	return own
}

// trackWritten tracks the entry this process just wrote for key (a Set):
// [CLIENT CACHING yes, HGET entry id] on its master's tracked client. If
// it cannot be tracked, or the id read back is not the one written (a
// later write went first), the Loader's copy is outdated already, or
// would not be told when it is: it is dropped.
func (t *Tier[K, V]) trackWritten(ctx context.Context, key K, ks keys, id string) {
	if !t.tracking() {
		return
	}
	var got *redis.StringCmd
	var caching *redis.Cmd
	if rc := t.track.reader(ctx, ks.entry); rc != nil {
		c, cancel := t.op(ctx)
		_, _ = rc.Pipelined(c, func(p redis.Pipeliner) error {
			caching = p.Do(c, "CLIENT", "CACHING", "yes")
			got = p.HGet(c, ks.entry, "id")
			return nil
		})
		cancel()
		t.track.reads.Add(1)
		t.track.echoes.tracked(ks.entry)
	}
	if got == nil || caching.Err() != nil || got.Val() != id {
		t.flights.cut(ks.base)
		t.served.drop(ks.base)
		t.fleet.each(func(l remote.LocalCache[K]) { l.Drop(key) })
	}
}

// readMany reads the entries of a batch's slots and the shared generation
// (readEntries), in one round trip that batchRoundTrips counts.
func (t *Tier[K, V]) readMany(ctx context.Context, slots []*slot[K]) ([]*redis.SliceCmd, *redis.StringCmd) {
	entries := make([]string, len(slots))
	for i, s := range slots {
		entries[i] = s.ks.entry
	}
	return t.readEntries(ctx, &t.stats.batchRoundTrips, entries...)
}

// readEntries reads entries (HMGET) and the shared generation in one
// pipelined round trip on the tier's client, as without tracking (its
// hooks see it), and, at the same time, their ids tracked (touch). An
// entry whose two reads agree is covered: any change after the tracked
// read comes back as an invalidation, and none came between the two (ids
// are random per write). One whose reads differ (a write raced them) is
// read again, tracked; if that fails too, it is handed over untracked.
func (t *Tier[K, V]) readEntries(ctx context.Context, trips *atomic.Uint64, entries ...string) ([]*redis.SliceCmd, *redis.StringCmd) {
	wait := t.touch(ctx, entries)
	cmds := make([]*redis.SliceCmd, len(entries))
	var g *redis.StringCmd
	t.pipelined(ctx, trips, func(c context.Context, p redis.Pipeliner) {
		for i, e := range entries {
			cmds[i] = p.HMGet(c, e, entryFields...)
		}
		g = p.Get(c, t.genKey)
	})
	ids, ok := wait()
	if !ok {
		t.untracked()
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
	more, _, ok := t.readTrackedMany(ctx, raced, entryFields, false)
	if !ok {
		t.untracked()
		return cmds, g
	}
	for j, i := range again {
		cmds[i] = more[j]
	}
	return cmds, g
}

// touch starts reading the ids of entries tracked, at once; wait returns
// them (ok false without tracking, or when they could not be tracked).
func (t *Tier[K, V]) touch(ctx context.Context, entries []string) (wait func() ([]*redis.SliceCmd, bool)) {
	if !t.tracking() {
		return func() ([]*redis.SliceCmd, bool) { return nil, false }
	}
	done := make(chan struct{})
	var cmds []*redis.SliceCmd
	var ok bool
	go func() {
		defer close(done)
		cmds, _, ok = t.readTrackedMany(ctx, entries, idField, false)
	}()
	return func() ([]*redis.SliceCmd, bool) {
		<-done
		return cmds, ok
	}
}

// covered reports whether an entry read untracked (vals: HMGET
// entryFields, the id first) is the one its tracked id read (ids) saw.
func covered(ids *redis.SliceCmd, vals []any) bool {
	if ids.Err() != nil || len(ids.Val()) != 1 || len(vals) == 0 {
		return false
	}
	return ids.Val()[0] == vals[0]
}

// takeoffAll begins the Loads of a LoadMany's slots, and returns what ends
// them (see landed), for the entries the slots name now.
func (t *Tier[K, V]) takeoffAll(slots []*slot[K]) (landed func()) {
	kss := make([]keys, len(slots))
	before := make([]string, len(slots))
	for i, s := range slots {
		kss[i], before[i] = s.ks, t.served.get(s.ks.base)
		s.tk = t.flights.begin(s.ks.base)
	}
	return func() {
		for i, s := range slots {
			t.landed(s.key, kss[i], before[i])
		}
	}
}

// first is the first of a writeAnswer.
func first(n int, _ string, _ error) int { return n }

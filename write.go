package flightcache

import (
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/queue"
	"github.com/flightcache/flightcache/remote"
)

// The write path (docs/internals.md, "The write path"). Fills, Set and
// Invalidate never write ristretto themselves: under the key's shard lock
// (flights.put) each marks the entry a Get could still find gone and
// records its value in the key's pending write, which a Get on the locked
// path finds. A newly opened write is handed to the writer, one goroutine
// per Loader, which issues each write's latest value to ristretto in
// batches, waits once per batch, and closes the writes whose value did not
// change meanwhile. Pending writes hold places of two shares, each bounded
// by MaxPendingWrites and MaxCost (rule 19): a fill never waits for one;
// Set, Invalidate and Drop wait their turn (takeWrite). The writer runs no
// user code in a round: what left the cache is reported after it
// (reportDepartures).

// maxWriterBatch bounds the writes the writer hands ristretto before it
// waits for them. Only the writer feeds ristretto's set buffer, and every
// Wait empties it, so a batch smaller than that buffer (32k items) is never
// refused for want of room.
const maxWriterBatch = 4096

// write is one key's value on its way into ristretto.
type write[K comparable, V any] struct {
	key K
	h   uint64

	// Guarded by the key's shard mu.
	entry  *entry[K, V] // the key's value now; nil: none (Invalidate)
	cost   int64
	place  place        // the place it holds among the pending writes: its last producer's
	issued *entry[K, V] // what ristretto holds of this write: nil before the first batch, after a Del and after a refused Set

	outdated bool // put refused it: the value held has a higher version (version.go)
}

// place is a write's share of the bound on pending writes (rule 19).
type place struct {
	kind placeKind
	cost int64 // at least the cost of the write's value
}

type placeKind uint8

const (
	noPlace    placeKind = iota // nothing to give back
	fillPlace                   // of the fills' share
	writePlace                  // of the share of Set, Invalidate and Drop
)

// writer is the state of the Loader's writer goroutine.
type writer[K comparable, V any] struct {
	mu      sync.Mutex
	queue   []*write[K, V] // guarded by mu; the writes from head on wait for the writer
	head    int            // guarded by mu
	wake    chan struct{}  // buffered(1): the queue is not empty, or a clear is asked for
	backlog atomic.Int64   // writes handed over and not yet closed

	// turns is the writes' share: the places of Set, Invalidate and Drop,
	// first come first served. Only the writer gives places back, and it
	// never waits for a producer: a waiting one is woken by its progress
	// or by Close.
	turns    queue.Queue
	fills    atomic.Int64 // the fills' share: places held
	fillCost atomic.Int64 // and their cost
	maxFills int64
	maxCost  int64
	clears   atomic.Uint64 // InvalidateAll calls; the writer clears ristretto when it moves
	cleared  uint64        // the clears the writer has acted on; guarded by rounds
	clearing atomic.Bool   // ristretto's Clear is under way: its evictions are not counted

	// rounds is held for each round, on the writer's goroutine or in a
	// write made there (workOff): one round at a time.
	rounds       sync.Mutex
	departuresMu sync.Mutex
	departures   []EvictionEvent[K] // guarded by departuresMu: what departed the cache in the rounds, to report after them

	// What the writer uses of its Loader (attach).
	cache       *ristretto.Cache[uint64, *entry[K, V]]
	flights     *flights[K, V]
	obs         *observing[K] // nil when nothing is observed
	stats       *counters
	costed      bool                    // Options.Cost is set
	invalidated func(*entry[K, V]) bool // from before the last InvalidateAll (Loader.cleared)
	expired     func(*entry[K, V]) bool // past its windows now
}

func (wr *writer[K, V]) init(places int, cost int64) {
	wr.wake = make(chan struct{}, 1)
	wr.turns.Init(places, cost, 0)
	wr.maxFills, wr.maxCost = int64(places), cost
}

// attach gives the writer what it uses of l. New calls it once l is
// complete, before the writer starts.
func (wr *writer[K, V]) attach(l *Loader[K, V]) {
	wr.cache, wr.flights, wr.obs, wr.stats = l.cache, &l.flights, l.obs, &l.stats
	wr.costed = l.opts.Cost != nil
	wr.invalidated = l.cleared
	wr.expired = func(e *entry[K, V]) bool { return l.phase(e, l.now()) == remote.PhaseExpired }
}

// takeFill takes a place of the fills' share, if one of cost is free; it
// never waits.
func (wr *writer[K, V]) takeFill(cost int64) bool {
	n, c := wr.fills.Add(1), wr.fillCost.Add(cost)
	if n > wr.maxFills || c > wr.maxCost {
		wr.fills.Add(-1)
		wr.fillCost.Add(-cost)
		return false
	}
	return true
}

// givePlaces gives places back: n of the fills' share with the given cost
// in all, m of the writes' share with theirs.
func (wr *writer[K, V]) givePlaces(n int, nCost int64, m int, mCost int64) {
	if n > 0 {
		wr.fills.Add(int64(-n))
		wr.fillCost.Add(-nCost)
	}
	wr.turns.Give(m, mCost)
}

// giveBack gives one place back (none for noPlace).
func (wr *writer[K, V]) giveBack(p place) {
	switch p.kind {
	case fillPlace:
		wr.givePlaces(1, p.cost, 0, 0)
	case writePlace:
		wr.givePlaces(0, 0, 1, p.cost)
	}
}

// put makes the entry mk builds (mk nil: none) key's value, once it has a
// place of the writes' share; the entry is built then, so that a write
// that waited is of the moment it takes effect. It returns the entry the
// new value replaced (nil: none), and false after Close or when the new
// value is older than the one held (Options.Version: nothing changed).
func (wr *writer[K, V]) put(key K, h uint64, mk func() *entry[K, V], cost int64) (*entry[K, V], bool) {
	p, ok := wr.takeWrite(cost)
	if !ok {
		return nil, false // closed while waiting
	}
	var e *entry[K, V]
	if mk != nil {
		e = mk()
	}
	w, back, gone, outdated := wr.flights.overwrite(key, h, e, cost, p)
	if w != nil {
		wr.hand(w)
	}
	wr.giveBack(back) // the open write's old place, or p if there was nothing to drop (or it was outdated)
	return gone, !outdated
}

// hand gives w to the writer.
func (wr *writer[K, V]) hand(w *write[K, V]) { wr.handAll([]*write[K, V]{w}) }

// handAll gives ws to the writer, in one critical section and one wakeup.
func (wr *writer[K, V]) handAll(ws []*write[K, V]) {
	if len(ws) == 0 {
		return
	}
	wr.backlog.Add(int64(len(ws)))
	wr.mu.Lock()
	wr.queue = append(wr.queue, ws...)
	wr.mu.Unlock()
	wr.signal()
}

// signal wakes the writer.
func (wr *writer[K, V]) signal() {
	select {
	case wr.wake <- struct{}{}:
	default: // already signalled
	}
}

// run is the writer goroutine, under life.RunWriter. After each round it
// reports what left the cache. Once idle is closed (the Loader has closed
// and gone idle), it calls teardown and returns.
func (wr *writer[K, V]) run(idle <-chan struct{}, teardown func()) {
	var ws, again []*write[K, V]
	for {
		select {
		case <-wr.wake:
		case <-idle:
			teardown()
			return
		}
		ws, again = wr.round(ws, again)
		wr.reportDepartures()
	}
}

// round takes writes from the queue, applies them, and puts back those
// that stay open, holding the rounds lock. It reuses the memory of ws and
// again, and returns them: the ws returned is as long as the one taken
// (its references dropped), empty if there was nothing to take.
func (wr *writer[K, V]) round(ws, again []*write[K, V]) ([]*write[K, V], []*write[K, V]) {
	wr.rounds.Lock()
	defer wr.rounds.Unlock()
	if hook := testHookWriter.Load(); hook != nil {
		(*hook)()
	}
	ws = wr.takeBatch(ws[:0])
	again = wr.apply(ws, again[:0])
	wr.requeue(len(ws), again)
	clear(ws) // drop the references to values
	return ws, again
}

// apply issues ws to ristretto (after the Clear an InvalidateAll asked
// for, if any), waits until ristretto has applied them, and settles each
// write, giving back the places of those it closes. It returns, appended
// to again, the writes that stay open: overwritten since they were taken,
// or kept for after the next Clear (docs/design.md).
func (wr *writer[K, V]) apply(ws, again []*write[K, V]) []*write[K, V] {
	if n := wr.clears.Load(); n != wr.cleared { // read after the batch is taken
		wr.cleared = n
		wr.clearing.Store(true) // ristretto reports every entry it drops as evicted
		wr.cache.Clear()
		wr.clearing.Store(false)
	}
	if hook := testHookIssue.Load(); hook != nil {
		(*hook)()
	}
	for _, w := range ws {
		wr.issue(w)
	}
	wr.cache.Wait() // everything issued above is applied (or refused) now
	// An InvalidateAll since the batch was taken: the next batch clears,
	// so a value of this one newer than it stays open, to be issued again.
	keepLive := wr.clears.Load() != wr.cleared
	var fills, writes int
	var fillCost, writeCost int64
	for _, w := range ws {
		p, closed := wr.flights.settle(w, keepLive)
		switch {
		case !closed:
			again = append(again, w)
		case p.kind == fillPlace:
			fills, fillCost = fills+1, fillCost+p.cost
		case p.kind == writePlace:
			writes, writeCost = writes+1, writeCost+p.cost
		}
	}
	wr.givePlaces(fills, fillCost, writes, writeCost)
	return again
}

// requeue puts the writes of a batch of n that stayed open back at the end
// of the queue, and wakes the writer again if the queue is not empty.
func (wr *writer[K, V]) requeue(n int, again []*write[K, V]) {
	wr.backlog.Add(int64(len(again) - n))
	wr.mu.Lock()
	wr.queue = append(wr.queue, again...)
	more := len(wr.queue) > wr.head
	wr.mu.Unlock()
	if more {
		wr.signal()
	}
}

// takeBatch moves up to maxWriterBatch writes from the queue into ws.
func (wr *writer[K, V]) takeBatch(ws []*write[K, V]) []*write[K, V] {
	wr.mu.Lock()
	defer wr.mu.Unlock()
	n := min(len(wr.queue)-wr.head, maxWriterBatch)
	ws = append(ws, wr.queue[wr.head:wr.head+n]...)
	clear(wr.queue[wr.head : wr.head+n])
	wr.head += n
	switch {
	case wr.head == len(wr.queue):
		wr.queue, wr.head = wr.queue[:0], 0
		if cap(wr.queue) > 4*maxWriterBatch {
			wr.queue = nil // a burst is over: do not keep its queue's memory
		}
	case wr.head*2 >= len(wr.queue):
		// Half of the queue is behind head: move the rest to the front
		// (each write is moved at most once per write taken, on
		// average), so that a queue fed as fast as it drains does not
		// grow.
		rest := copy(wr.queue, wr.queue[wr.head:])
		clear(wr.queue[rest:])
		wr.queue, wr.head = wr.queue[:rest], 0
	}
	return ws
}

// testHookIssue, when set by a test, runs after the writer has taken a
// batch (and cleared the cache, if asked to), before it issues it.
var testHookIssue atomic.Pointer[func()]

// testHookWriter, when set by a test, runs at the start of every batch of
// the writer: a test holds the writer there to show that nothing else
// waits for it.
var testHookWriter atomic.Pointer[func()]

// issue hands w's latest value to ristretto.
func (wr *writer[K, V]) issue(w *write[K, V]) {
	e, cost := wr.flights.markIssued(w)
	if e != nil && wr.invalidated(e) {
		wr.noteDeparture(e, EvictionInvalidated, cost)
		e = nil // written before an InvalidateAll: dead, only to be removed
	}
	if e == nil || wr.costed {
		// A delete; or a costed write, which ristretto would apply in place
		// without admission or eviction: delete first so it passes both.
		if cur, ok := wr.cache.Get(w.h); ok && cur.key == w.key {
			wr.cache.Del(w.h)
		}
	}
	if e != nil && !wr.cache.Set(w.h, e, cost) {
		// Refused for want of room in the set buffer (a full buffer refuses
		// only new keys, so ristretto holds nothing for this one): issue it
		// again in the next batch, never lose it.
		wr.stats.setsDropped.Add(1)
		wr.flights.unmarkIssued(w, e)
	}
}

// Set stores value for key as if it had just been loaded: a Get that starts
// after Set returns sees it (unless the cache evicts or refuses it), and a
// load of key in flight answers its own waiters but never overwrites it
// (docs/design.md rule 6). Set never waits for a load; it waits its turn
// only when [Options.MaxPendingWrites] writes are pending (rule 19). After
// Close, and for a key that cannot be cached or is invalid, it does nothing.
//
// NOTE: after a database write, call [Loader.Invalidate], not Set with the
// row the write returned, unless nothing else writes that row at the same
// time or the Loader has [Options.Version]: two racing Sets may reach the
// cache in the other order than the database, and the older row then
// serves until it expires; an Invalidate has no order to lose.
func (l *Loader[K, V]) Set(key K, value V) {
	if l.checkKey(key) != nil {
		return // no Get could read it (Options.ValidateKey)
	}
	h, err := l.hash(key)
	if err != nil || l.selfUnequal(key) {
		return
	}
	// User code first, before counting in.
	cost, ok := l.costOf(value, nil)
	life, keep := l.lifeOf(key, value, nil)
	keep = keep && l.versionOf(&life, value, nil)
	keep = keep && l.tagsOf(&life, key, value, l.tags.now(), nil)
	var mk func() *entry[K, V] // nil: cannot be costed, never fits, or not to be cached: drop the old one
	big := ok && keep && l.tooBig(cost)
	if big {
		l.obs.tooBigFor(key, cost) // refused at once, as Stats.SetsRejected counts it
	}
	if ok && keep && !big {
		mk = func() *entry[K, V] { return l.newEntry(key, value, life, born{at: l.now(), gen: l.generation.Load()}) }
	} else {
		cost = 0
	}
	if l.write(key, h, mk, cost, EvictionReplaced) {
		l.remoteSet(key, value)
	}
}

// Invalidate drops key's cached value: a load of key in flight answers its
// own waiters but writes nothing, and the next Get loads afresh
// (docs/design.md rule 6). Like [Loader.Set] it may wait its turn behind
// pending writes, never for a load, and is never lost. After Close it does
// nothing.
func (l *Loader[K, V]) Invalidate(key K) {
	if l.drop(key) {
		l.remoteInvalidate(key)
	}
}

// drop is Invalidate without the Remote. It reports false when it did
// nothing (a Hash that panicked, or the Loader closed).
func (l *Loader[K, V]) drop(key K) bool {
	h, err := l.hash(key)
	if err != nil {
		return false
	}
	return l.write(key, h, nil, 0, EvictionInvalidated)
}

// write makes the entry mk builds (mk nil: none) key's value for Set and
// Invalidate (writer.put). The value it drops leaves by cause
// (EvictionReplaced for Set, EvictionInvalidated for Invalidate), and is
// reported to an EvictionObserver once write is counted out: so Evicted,
// which may call Close, never runs while the call is inside. It reports
// false after Close, and for a value older than the one held
// (Options.Version): nothing changed.
func (l *Loader[K, V]) write(key K, h uint64, mk func() *entry[K, V], cost int64, cause EvictionCause) (ok bool) {
	s, open := l.gate.EnterOp()
	if !open {
		return false
	}
	var gone *entry[K, V]
	defer func() { l.writer.replaced(gone, cause) }() // after ExitOp, deferred below
	defer l.gate.ExitOp(s)
	gone, ok = l.writer.put(key, h, mk, cost)
	return ok
}

// InvalidateAll drops every key's value at once, in constant time: no Get
// that starts after it returns sees a value from before it, and every load
// in flight answers its own waiters but writes nothing (docs/design.md rule
// 20). With a Remote that takes part ([remote.AllInvalidator]) the shared
// tier is invalidated first. It counts in Stats.InvalidateAlls; after Close
// it does nothing.
func (l *Loader[K, V]) InvalidateAll() {
	if l.gate.Closed() {
		return
	}
	l.remoteInvalidateAll()
	l.dropAll()
}

// dropAll is InvalidateAll without the Remote. It reports false after
// Close.
func (l *Loader[K, V]) dropAll() bool {
	s, open := l.gate.EnterOp()
	if !open {
		return false
	}
	defer l.gate.ExitOp(s)
	l.writer.clears.Add(1) // before the floor moves (docs/design.md)
	l.raiseFloor()
	l.stats.invalidateAlls.Add(1)
	l.writer.signal()
	return true
}

// What left the cache, and the writes an EvictionObserver makes on the
// writer's goroutine (docs/internals.md, "The write path"). Whoever marks an
// entry gone reports it, once. ristretto's callbacks, the Clear and issue
// run in the writer's rounds, which call no user code and which the
// writer waits for: they only keep the event (noteDeparture), and the writer
// reports it after the round (reportDepartures), holding no lock and no place.
// A Set or Invalidate that Evicted makes there cannot wait for its own
// goroutine: it does the writer's rounds until its turn comes (takeWrite,
// workOff).

// reportDepartures reports, on the writer's goroutine, the events the last
// round kept (noteDeparture), and those of the rounds that Evicted's writes do
// meanwhile (workOff).
func (wr *writer[K, V]) reportDepartures() {
	if !wr.obs.observesEvictions() {
		return // nothing is kept (noteDeparture)
	}
	for {
		wr.departuresMu.Lock()
		evs := wr.departures
		wr.departures = nil // a Clear's are a cache's worth: not kept for the next round
		wr.departuresMu.Unlock()
		if len(evs) == 0 {
			return
		}
		for _, ev := range evs {
			wr.obs.evicted(ev)
		}
	}
}

// replaced reports e (nil: none), an entry put marked gone, as having
// left by cause: EvictionReplaced or EvictionInvalidated, refined by
// departureCause. The caller holds nothing: Evicted is user code.
func (wr *writer[K, V]) replaced(e *entry[K, V], cause EvictionCause) {
	if e != nil && wr.obs.observesEvictions() {
		wr.obs.evicted(EvictionEvent[K]{Key: e.key, Cause: wr.departureCause(e, cause), Cost: wr.unknownCost()})
	}
}

// unknownCost is the cost reported for an entry whose cost only the cache
// knew: every entry costs 1 without Options.Cost, and the Loader keeps no
// cost per entry (0, unknown, with it).
func (wr *writer[K, V]) unknownCost() int64 {
	if !wr.costed {
		return 1
	}
	return 0
}

// departureCause refines cause for an entry that leaves now: one from before an
// InvalidateAll left by it; one a newer value replaced or the policy
// evicted past its windows had expired.
func (wr *writer[K, V]) departureCause(e *entry[K, V], cause EvictionCause) EvictionCause {
	switch {
	case wr.invalidated(e):
		return EvictionInvalidated
	case (cause == EvictionReplaced || cause == EvictionPolicy) && wr.expired(e):
		return EvictionExpired
	}
	return cause
}

// noteEvicted takes note of an entry ristretto's OnEvict hands over, with
// its cost. While the writer clears the cache for an InvalidateAll
// (clearing, in a round, under ristretto's locks), the entries from before
// it are invalidated, and the others have not left: they are issued again.
func (wr *writer[K, V]) noteEvicted(e *entry[K, V], cost int64, clearing bool) {
	switch {
	case e == nil || !wr.obs.observesEvictions():
	case clearing:
		if wr.invalidated(e) {
			wr.noteDeparture(e, EvictionInvalidated, wr.unknownCost())
		}
	default:
		wr.noteDeparture(e, EvictionPolicy, cost)
	}
}

// refused takes note of an entry ristretto's admission policy refused.
func (wr *writer[K, V]) refused(e *entry[K, V], cost int64) {
	if e != nil {
		wr.noteDeparture(e, EvictionRejected, cost)
	}
}

// noteDeparture marks e gone and, if an EvictionObserver is set and e was not
// reported already, keeps its event, as having left by cause (departureCause),
// for reportDepartures. It calls no user code: it runs in the writer's rounds,
// on ristretto's goroutine too.
func (wr *writer[K, V]) noteDeparture(e *entry[K, V], cause EvictionCause, cost int64) {
	if !wr.obs.observesEvictions() || e.markGone() == nil {
		return
	}
	ev := EvictionEvent[K]{Key: e.key, Cause: wr.departureCause(e, cause), Cost: cost}
	wr.departuresMu.Lock()
	wr.departures = append(wr.departures, ev)
	wr.departuresMu.Unlock()
}

// takeWrite takes a place of the writes' share for a write of cost,
// waiting its turn if the share is full; false after Close. On the
// writer's goroutine (a write Evicted makes) it does the writer's rounds
// until its turn comes instead of waiting (docs/design.md).
func (wr *writer[K, V]) takeWrite(cost int64) (place, bool) {
	p := place{kind: writePlace, cost: cost}
	w, st := wr.turns.Ask(cost)
	switch {
	case w == nil:
		return p, st == queue.Taken
	case wr.obs.observesEvictions() && life.OnWriter():
		wr.workOff(w.Ready())
	default:
		<-w.Ready()
	}
	return p, w.Granted()
}

// workOff does the writer's rounds until ready closes: a write made on the
// writer's goroutine whose turn has not come (takeWrite). When a round
// finds nothing to take (a producer holds a place it has not handed over
// yet), it waits for a write to be handed over, then takes it. The events
// its rounds keep are reported by this writer after its next round, which
// workOff wakes: it may run on another Loader's writer.
func (wr *writer[K, V]) workOff(ready <-chan struct{}) {
	defer wr.signal()
	var ws, again []*write[K, V]
	for {
		ws, again = wr.round(ws, again)
		select {
		case <-ready:
			return
		default:
		}
		if len(ws) == 0 {
			select {
			case <-wr.wake: // the next round takes what it announced
			case <-ready:
				return
			}
		}
	}
}

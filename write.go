package flightcache

import (
	"sync"
	"sync/atomic"

	"github.com/flightcache/flightcache/internal/queue"
)

// The write path. ristretto applies a Set of a key it does not hold from a
// buffer, later, on its own goroutine; it refuses a second such Set of a key
// before it has applied the first; and it deletes whatever it holds when it
// reaches a Del. Fills, Set and Invalidate therefore never write ristretto
// themselves. Each one, under its key's shard lock (flights.put):
//
//  1. marks the key's entry a Get could still find (the cached one, or the
//     one an earlier pending write left) gone: a Get treats a gone entry as
//     absent and takes the locked path;
//  2. records the key's new value (nil for Invalidate) in the key's pending
//     write, opening one if there is none; the pending write is what a Get
//     on the locked path finds (join, latest).
//
// A newly opened write is handed to the writer, one goroutine per Loader,
// after unlocking (a batch's, together, once the batch has delivered all
// of its keys). The writer works in batches: it hands each write's
// latest value to ristretto (a Set, or a Del; a costed Set is preceded by a
// Del so that it passes admission again), waits once for ristretto to apply
// the batch, then closes every write whose value did not change meanwhile;
// one that changed, or that ristretto refused, goes into the next batch. So:
//
//   - a writer of key K never waits for ristretto, nor holds a lock while
//     ristretto works; a Get never waits for any write (rule 17);
//   - a Get that starts after a write returned finds its value: the old
//     entry is gone, and the new one is in the cache or in the pending write;
//   - ristretto sees at most one unapplied Set per key, and every Del and
//     Set of a key in the order the writes were made.
//
// Consider the following serialized event ordering, Set(K, v2) racing the
// fill of v1:
//
//  1. load of K finishes: put marks nothing (K not cached), opens write W
//     with v1, hands W to the writer; W's waiters get v1.
//  2. writer: issue W: ristretto.Set(K, v1) is buffered.
//  3. Set(K, v2): put finds W, marks v1 gone, W.entry = v2; Set returns.
//     A Get now misses the cache (v1 not applied, or applied and gone) and
//     finds v2 in W.
//  4. writer: ristretto.Wait; v1 is applied; W.entry (v2) is not what was
//     issued (v1), so W stays open for the next batch.
//  5. writer: issue W again: ristretto.Set(K, v2) replaces v1 in place (K
//     is held now, so this is not a second new item); Wait; W closes.

// How far the writer may fall behind (rule 19 in docs/design.md). Every
// write in the shard maps carries one place among the pending writes: a
// place of the fills' share (a load's write, a batch's included) or of the
// writes' share (Set, Invalidate, a Remote's Drop). Each share holds at
// most Options.MaxPendingWrites places whose costs add up to at most
// MaxCost, so pending writes never hold more than twice the cache. A
// producer takes a place (of its value's cost) before it writes; a write
// that replaces the value of one already open swaps places with it, so an
// open write's place is always its last producer's and at least its
// value's cost; the writer gives a place back when its write closes.
//
//   - A fill never waits: waking the load's waiters comes first (readers
//     first), and a load goroutine that waited after it would leave its
//     callers free to start the next miss, so goroutines would pile up
//     instead of writes. When its share is full, the value is not cached
//     (Stats.FillsDropped), as ristretto's admission may refuse one; the
//     key's older value is dropped all the same, so no Get serves a value
//     older than one a Get has been given.
//   - Set, Invalidate and a Remote's Drop wait their turn (writer.turns) when
//     their share is full, before they lock anything, so a storm of them
//     runs at the pace of the writer; no load is ever behind them. One
//     made by an EvictionObserver on the writer's own goroutine takes its
//     turn the same way but, as it cannot wait for itself, does the
//     writer's rounds until its turn comes (departures.go).
//
// Nothing else waits for the writer: a Get finds a pending write's value
// in its shard (join, latest), and in its rounds the writer waits only
// for ristretto and runs no user code (an EvictionObserver is called
// between rounds). So a Get whose load has returned has its answer once
// its own goroutine runs, whatever storm goes on.

// InvalidateAll moves the fleet generation on and raises the floor below
// which an entry counts as absent (fleet.go); the writer then clears
// ristretto to give the memory back. Consider the following serialized
// event ordering, InvalidateAll and then Set(K, v):
//
//  1. InvalidateAll: clears++ (a request to the writer), then the
//     generation and the floor move to G; it wakes the writer. Every entry
//     older than G, cached or pending, is absent to a Get from here on.
//  2. Set(K, v): v's entry is of generation G (it read the generation
//     after step 1); put opens write W and hands it over.
//  3. writer: takes a batch, then reads clears. A batch that holds W, or
//     any write of generation G, was taken after that write was queued,
//     so after step 1: it sees the request and runs ristretto.Clear before
//     it issues anything.
//  4. writer: issues the batch into the emptied cache; W closes with v in
//     it. A write whose entry is older than G is issued as a Del: its
//     value is dead.
//
// A write can also gain a value of generation G after the writer took it:
// Set(K, v) after step 1 folds v into a write W0 of K that sits in the
// batch the writer took before step 1 (it read no request). The writer
// then issues v with that batch, and a Clear at its next batch would drop
// v. So, after its Wait, the writer reads clears again: if a request came
// since the batch was taken, a write whose issued value is not older than
// the floor stays open and goes into the next batch, which clears first
// and issues it again; the others close (the Clear drops only dead values
// of theirs). A request that comes after that second read finds every
// write it could fold into applied and closed with an older value, or
// changed since it was issued, and so not closed (settle). Under a storm
// of InvalidateAll a value kept open this way is older than the floor by
// the next one, and then closes: the writer never stops closing writes.
//
// So the Clear never drops a value written after the InvalidateAll, and no
// value from before it is served, from the cache or from a pending write.

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
}

// place is a write's share of the bound on pending writes (see above).
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
	// handed out first come first served. Only the writer gives places
	// back, and it never waits for a producer, so a waiting producer is
	// always woken by the writer's progress or by Close. A producer that
	// runs on the writer's goroutine (an Evicted callback) cannot wait for
	// it: it asks without waiting and does the writer's work until it is
	// answered (takeWrite).
	turns    queue.Queue
	fills    atomic.Int64 // the fills' share: places held
	fillCost atomic.Int64 // and their cost
	maxFills int64
	maxCost  int64
	clears   atomic.Uint64 // InvalidateAll calls; the writer clears ristretto when it moves
	cleared  uint64        // the clears the writer has acted on; guarded by rounds

	// rounds is held for each round of the writer (round), by the writer
	// goroutine, or by the writer's own write that does a round itself
	// (departures.go): one round at a time.
	rounds sync.Mutex
	leftMu sync.Mutex
	left   []EvictionEvent[K] // guarded by leftMu: what left the cache in the rounds, to report after them (departures.go)
}

func (wr *writer[K, V]) init(places int, cost int64) {
	wr.wake = make(chan struct{}, 1)
	wr.turns.Init(places, cost, 0)
	wr.maxFills, wr.maxCost = int64(places), cost
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

// release gives places back: n of the fills' share with the given cost
// in all, m of the writes' share with theirs.
func (wr *writer[K, V]) release(n int, nCost int64, m int, mCost int64) {
	if n > 0 {
		wr.fills.Add(int64(-n))
		wr.fillCost.Add(-nCost)
	}
	wr.turns.Give(m, mCost)
}

// giveBack releases one place (none for noPlace).
func (wr *writer[K, V]) giveBack(p place) {
	switch p.kind {
	case fillPlace:
		wr.release(1, p.cost, 0, 0)
	case writePlace:
		wr.release(0, 0, 1, p.cost)
	}
}

// hand gives w to the writer.
func (l *Loader[K, V]) hand(w *write[K, V]) { l.handAll([]*write[K, V]{w}) }

// handAll gives ws to the writer, in one critical section and one wakeup.
func (l *Loader[K, V]) handAll(ws []*write[K, V]) {
	if len(ws) == 0 {
		return
	}
	wr := &l.writer
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

// runWriter is the writer goroutine, under life.RunWriter. After each
// round it reports what left the cache (departures.go). When the Loader
// has closed and gone idle, it tears the Loader down and returns
// (lifecycle.go).
func (l *Loader[K, V]) runWriter() {
	var batch, again []*write[K, V]
	for {
		select {
		case <-l.writer.wake:
		case <-l.gate.Idle():
			l.teardown()
			return
		}
		batch, again = l.round(batch, again)
		l.reportLeft()
	}
}

// round takes a batch from the queue, applies it, and puts back the
// writes that stay open, holding the writer's rounds lock. It reuses the
// memory of batch and again, and returns them: the batch returned is as
// long as the one taken (its references dropped), empty if there was
// nothing to take.
func (l *Loader[K, V]) round(batch, again []*write[K, V]) ([]*write[K, V], []*write[K, V]) {
	l.writer.rounds.Lock()
	defer l.writer.rounds.Unlock()
	if hook := testHookWriter.Load(); hook != nil {
		(*hook)()
	}
	batch = l.takeBatch(batch[:0])
	again = l.apply(batch, again[:0])
	l.requeue(len(batch), again)
	clear(batch) // drop the references to values
	return batch, again
}

// apply issues batch to ristretto (after the Clear an InvalidateAll asked
// for, if any), waits until ristretto has applied it, and settles each
// write, giving back the places of those it closes. It returns, appended
// to again, the writes that stay open: overwritten since they were taken,
// or kept for after the next Clear.
func (l *Loader[K, V]) apply(batch, again []*write[K, V]) []*write[K, V] {
	wr := &l.writer
	if n := wr.clears.Load(); n != wr.cleared { // after the batch is taken: see above
		wr.cleared = n
		l.clearing.Store(true) // ristretto reports every entry it drops as evicted
		l.cache.Clear()
		l.clearing.Store(false)
	}
	if hook := testHookIssue.Load(); hook != nil {
		(*hook)()
	}
	for _, w := range batch {
		l.issue(w)
	}
	l.cache.Wait() // everything issued above is applied (or refused) now
	// An InvalidateAll since the batch was taken: the next batch clears,
	// so a value of the batch newer than it stays open and is issued again
	// after the Clear (see above).
	keepLive := wr.clears.Load() != wr.cleared
	var fills, writes int
	var fillCost, writeCost int64
	for _, w := range batch {
		p, closed := l.flights.settle(w, keepLive)
		switch {
		case !closed:
			again = append(again, w)
		case p.kind == fillPlace:
			fills, fillCost = fills+1, fillCost+p.cost
		case p.kind == writePlace:
			writes, writeCost = writes+1, writeCost+p.cost
		}
	}
	wr.release(fills, fillCost, writes, writeCost)
	return again
}

// requeue puts the writes of a batch of n that stayed open back at the end
// of the queue, and wakes the writer again if the queue is not empty.
func (l *Loader[K, V]) requeue(n int, again []*write[K, V]) {
	wr := &l.writer
	wr.backlog.Add(int64(len(again) - n))
	wr.mu.Lock()
	wr.queue = append(wr.queue, again...)
	more := len(wr.queue) > wr.head
	wr.mu.Unlock()
	if more {
		wr.signal()
	}
}

// takeBatch moves up to maxWriterBatch writes from the queue into batch.
func (l *Loader[K, V]) takeBatch(batch []*write[K, V]) []*write[K, V] {
	wr := &l.writer
	wr.mu.Lock()
	defer wr.mu.Unlock()
	n := min(len(wr.queue)-wr.head, maxWriterBatch)
	batch = append(batch, wr.queue[wr.head:wr.head+n]...)
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
	return batch
}

// testHookIssue, when set by a test, runs after the writer has taken a
// batch (and cleared the cache, if asked to), before it issues it.
var testHookIssue atomic.Pointer[func()]

// testHookWriter, when set by a test, runs at the start of every batch of
// the writer: a test holds the writer there to show that nothing else
// waits for it.
var testHookWriter atomic.Pointer[func()]

// issue hands w's latest value to ristretto.
func (l *Loader[K, V]) issue(w *write[K, V]) {
	e, cost := l.flights.markIssued(w)
	if e != nil && l.cleared(e) {
		l.left(e, EvictionInvalidated, cost)
		e = nil // written before an InvalidateAll: dead, only to be removed
	}
	if e == nil || l.opts.Cost != nil {
		// A delete; or a costed write, which ristretto would apply in place
		// without admission or eviction: delete first so it passes both.
		if cur, ok := l.cache.Get(w.h); ok && cur.key == w.key {
			l.cache.Del(w.h)
		}
	}
	if e != nil && !l.cache.Set(w.h, e, cost) {
		// Refused for want of room in the set buffer (a full buffer refuses
		// only new keys, so ristretto holds nothing for this one): issue it
		// again in the next batch, never lose it.
		l.stats.setsDropped.Add(1)
		l.flights.unmarkIssued(w, e)
	}
}

// Set stores value for key as if it had just been loaded. A load of key in
// flight when Set is called still delivers its result to its own waiters,
// but never overwrites the value Set stored. A Get that starts after Set
// returns sees value, until the cache evicts it (ristretto's admission
// policy may also refuse it at once when the cache is full, which
// Stats.SetsRejected counts).
//
// Set does not wait for the cache to apply the value, unless
// [Options.MaxPendingWrites] writes of Set and Invalidate are waiting for
// it already: then Set waits its turn, first come first served, until the
// cache has caught up by one (Stats.WriteWaits counts the Sets and
// Invalidates that waited). It never waits for a load. So a storm of Sets
// runs at the pace the cache applies them, in bounded memory.
//
// NOTE: after a database write, call [Loader.Invalidate], not Set with the
// row the write returned, unless no one else writes that row at the same
// time. Two writers of one row that each Set their own result may reach
// the cache in the other order than they reached the database, and the
// older row then serves as a hit until it expires. Invalidate has no order
// to lose: whichever comes last, the next Get loads the row as the
// database has it then. Set is for a value nothing else writes
// concurrently (a row this process alone owns, a computed value).
//
// Set after Close does nothing; so does Set of a key whose Hash panics, and
// of a key not equal to itself (see [Options.Hash]).
func (l *Loader[K, V]) Set(key K, value V) {
	h, err := l.hash(key)
	if err != nil || l.selfUnequal(key) {
		return
	}
	// User code first, before counting in.
	cost, ok := l.costOf(value, nil)
	life, keep := l.lifeOf(key, value, nil)
	var mk func() *entry[K, V] // nil: cannot be costed, never fits, or not to be cached: drop the old one
	big := ok && keep && l.tooBig(cost)
	if big {
		l.tooBigFor(key, cost) // refused at once, as Stats.SetsRejected counts it
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

// Invalidate drops key's cached value. A load of key in flight delivers its
// result to its own waiters but does not write the cache; the next Get
// starts a fresh load. Like [Loader.Set] it may wait its turn behind
// [Options.MaxPendingWrites] other writes, never for a load, and it is
// never lost. It is what to call after a database write of key: unlike
// [Loader.Set] of the written row, it cannot leave an older row behind
// when two writers race. Invalidate after Close does nothing.
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
// Invalidate, once it has a place among the pending writes (write.go). The
// entry is built then, so that a Set that waited is as new, and of the
// generation, of the moment it takes effect. The value it drops leaves by
// cause (EvictionReplaced for Set, EvictionInvalidated for Invalidate),
// and is reported to an EvictionObserver once write is counted out: so
// Evicted, which may call Close, never runs while the call is inside. It
// reports false after Close.
func (l *Loader[K, V]) write(key K, h uint64, mk func() *entry[K, V], cost int64, cause EvictionCause) bool {
	gone, ok := l.writeIn(key, h, mk, cost)
	l.replaced(gone, cause)
	return ok
}

// writeIn is write's part that runs counted in: it returns the entry the
// new value replaced (nil: none), and false after Close.
func (l *Loader[K, V]) writeIn(key K, h uint64, mk func() *entry[K, V], cost int64) (*entry[K, V], bool) {
	s, open := l.gate.EnterOp()
	if !open {
		return nil, false
	}
	defer l.gate.ExitOp(s)
	p, ok := l.takeWrite(cost)
	if !ok {
		return nil, false // closed while waiting
	}
	var e *entry[K, V]
	if mk != nil {
		e = mk()
	}
	w, back, gone := l.flights.overwrite(key, h, e, cost, p)
	if w != nil {
		l.hand(w)
	}
	l.writer.giveBack(back) // the open write's old place, or p if there was nothing to drop
	return gone, true
}

// InvalidateAll drops every key's value at once, in constant time whatever
// the cache holds: every value cached or pending is gone, every load in
// flight delivers its result to its own waiters but writes nothing (as
// Invalidate does for one key), and a Get that starts after InvalidateAll
// returns never sees a value from before it: not as a hit, a stale value,
// a stale-on-error fallback, nor as the old value of a Reload. The cache's
// memory is given back by the writer shortly after. With a Remote that
// implements [RemoteInvalidateAll] the shared tier is invalidated first,
// then this Loader's copies, so that no load of this process can fill the
// cache with a shared entry from before the call. It counts in
// Stats.InvalidateAlls; after Close it does nothing.
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
	l.writer.clears.Add(1) // before the floor moves: see write.go
	l.raiseFloor()
	l.stats.invalidateAlls.Add(1)
	l.writer.signal()
	return true
}

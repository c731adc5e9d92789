package flightcache

import (
	"sync"
	"sync/atomic"
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

// maxBacklog is how many writes may wait for the writer before a finishing
// load waits for the writer to catch up before it wakes its waiters, so
// that a storm of misses slows down instead of piling values up. A batch
// hands its keys' writes over together once it has delivered them all
// (handAll), so the backlog may pass maxBacklog by up to MaxBatch per
// batch delivering at that moment: a bound all the same.
const maxBacklog = 64

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
	issued *entry[K, V] // what ristretto holds of this write: nil before the first batch, after a Del and after a refused Set
}

// writer is the state of the Loader's writer goroutine.
type writer[K comparable, V any] struct {
	mu       sync.Mutex
	queue    []*write[K, V] // guarded by mu; the writes from head on wait for the writer
	head     int            // guarded by mu
	progress chan struct{}  // guarded by mu; closed (and replaced) after every batch
	wake     chan struct{}  // buffered(1): the queue is not empty
	backlog  atomic.Int64   // writes handed over and not yet closed
}

func (wr *writer[K, V]) init() {
	wr.wake = make(chan struct{}, 1)
	wr.progress = make(chan struct{})
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
	select {
	case wr.wake <- struct{}{}:
	default: // already signalled
	}
}

// throttle waits, holding no lock, while the writer is maxBacklog writes
// behind.
func (l *Loader[K, V]) throttle() {
	wr := &l.writer
	for wr.backlog.Load() >= maxBacklog {
		wr.mu.Lock()
		ch := wr.progress
		wr.mu.Unlock()
		if wr.backlog.Load() < maxBacklog {
			return
		}
		<-ch // the writer runs until the Loader is idle, which this load prevents
	}
}

// runWriter is the writer goroutine. When the Loader has closed and gone
// idle, it tears the Loader down and returns (lifecycle.go).
func (l *Loader[K, V]) runWriter() {
	wr := &l.writer
	var batch, again []*write[K, V]
	for {
		select {
		case <-wr.wake:
		case <-l.idle:
			l.teardown()
			return
		}
		if hook := testHookWriter.Load(); hook != nil {
			(*hook)()
		}
		wr.mu.Lock()
		n := min(len(wr.queue)-wr.head, maxWriterBatch)
		batch = append(batch[:0], wr.queue[wr.head:wr.head+n]...)
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
		wr.mu.Unlock()
		for _, w := range batch {
			l.issue(w)
		}
		l.cache.Wait() // everything issued above is applied (or refused) now
		again = again[:0]
		for _, w := range batch {
			if !l.flights.settle(w) {
				again = append(again, w)
			}
		}
		wr.backlog.Add(int64(len(again) - len(batch)))
		wr.mu.Lock()
		wr.queue = append(wr.queue, again...)
		more := len(wr.queue) > wr.head
		close(wr.progress)
		wr.progress = make(chan struct{})
		wr.mu.Unlock()
		if more {
			select {
			case wr.wake <- struct{}{}:
			default:
			}
		}
		clear(batch) // drop the references to values
	}
}

// testHookWriter, when set by a test, runs at the start of every batch of
// the writer: a test holds the writer there to show that nothing else
// waits for it.
var testHookWriter atomic.Pointer[func()]

// issue hands w's latest value to ristretto.
func (l *Loader[K, V]) issue(w *write[K, V]) {
	sh := l.flights.shard(w.h)
	sh.mu.Lock()
	e, cost := w.entry, w.cost
	w.issued = e
	sh.mu.Unlock()
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
		sh.mu.Lock()
		if w.issued == e {
			w.issued = nil
		}
		sh.mu.Unlock()
	}
}

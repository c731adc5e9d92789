package flightcache

import (
	"sync"
	"sync/atomic"
)

// maxBacklog is how many finished loads may wait for ristretto to apply
// their writes before new ones apply theirs before waking their waiters.
const maxBacklog = 64

// ristretto applies writes from a buffer, on its own goroutine. A finished
// load whose value is still in that buffer stays in the in-flight map (as a
// finished call), so that a Get that misses the cache takes its result at
// once instead of loading again (rule 2). The applier takes those calls out
// of the map once ristretto has applied their writes.
//
// One applier goroutine serves the whole Loader and waits for ristretto
// once per batch: a load goroutine ends as soon as its waiters are woken,
// so a storm of misses cannot pile up goroutines (and the values they
// hold) behind ristretto's single writer.
type applier[K comparable, V any] struct {
	mu      sync.Mutex
	pending []pendingWrite[K, V] // guarded by mu
	backlog atomic.Int64         // writes handed over and not yet applied
	wake    chan struct{}        // buffered(1): there is something pending
	stop    chan struct{}        // closed when the Loader stops
	done    chan struct{}        // closed when the applier has returned
}

// pendingWrite is a finished call whose write ristretto may not have
// applied yet.
type pendingWrite[K comparable, V any] struct {
	c   *call[K, V]
	key K
	h   uint64
}

func (a *applier[K, V]) init() {
	a.wake = make(chan struct{}, 1)
	a.stop = make(chan struct{})
	a.done = make(chan struct{})
}

// backlogged reports whether enough writes wait for ristretto that a
// finished load should apply its own before waking its waiters.
func (a *applier[K, V]) backlogged() bool { return a.backlog.Load() >= maxBacklog }

// add hands a queued call to the applier.
func (a *applier[K, V]) add(p pendingWrite[K, V]) {
	a.backlog.Add(1)
	a.mu.Lock()
	a.pending = append(a.pending, p)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default: // already signalled
	}
}

// run is the applier's goroutine; it returns once stop is closed and
// everything pending has been applied.
func (l *Loader[K, V]) runApplier() {
	a := &l.applier
	defer close(a.done)
	var batch []pendingWrite[K, V]
	for {
		stopping := false
		select {
		case <-a.wake:
		case <-a.stop:
			stopping = true
		}
		a.mu.Lock()
		batch, a.pending = a.pending, batch[:0]
		a.mu.Unlock()
		if len(batch) > 0 {
			l.cache.Wait() // every write in the batch is applied after this
			for _, p := range batch {
				sh := l.flights.shard(p.h)
				sh.mu.Lock()
				if sh.m[p.key] == p.c {
					delete(sh.m, p.key)
				}
				sh.mu.Unlock()
			}
			a.backlog.Add(-int64(len(batch)))
			clear(batch) // drop the references to calls and their values
		}
		if stopping {
			return
		}
	}
}

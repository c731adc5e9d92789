package flightcache

import "sync"

// turns hands out places among a bounded number of pending writes, each
// with a cost, to producers that may wait for one: the places of the writes
// that Set, Invalidate and a Remote's drops open (write.go). Both the
// places and their total cost are bounded. A producer that finds too
// little free, or others already waiting, joins the back of the queue;
// what is given back goes to the oldest waiter first, and no later one is
// served before it. So a burst of one producer delays another by at most
// the places and waiters ahead of it when it came, never for as long as
// the burst lasts.
//
// Only the writer gives places back, and it never waits for a producer, so
// a waiting producer is always woken by the writer's progress or by Close.
// A producer that runs on the writer's goroutine (an Evicted callback)
// cannot wait for it: it asks without waiting and does the writer's work
// until it is answered (takeWrite).
type turns struct {
	mu      sync.Mutex
	free    int           // places free now
	room    int64         // cost free now
	waiters []*turnWaiter // oldest first, from head on
	head    int           // waiters[:head] have been answered
	closed  bool          // Close: every waiter, now and later, is refused
	waits   uint64        // producers that had to wait, ever (Stats.WriteWaits)
}

// turnWaiter is one producer waiting for a place.
type turnWaiter struct {
	cost  int64         // the cost it asks for
	ready chan struct{} // closed when granted or refused
	ok    bool          // granted; written before ready is closed
}

func (t *turns) init(places int, room int64) { t.free, t.room = places, room }

// take waits for a place of the given cost (at most the room init gave)
// and reports whether it got one; false after close.
func (t *turns) take(cost int64) bool {
	w, ok := t.ask(cost)
	if w == nil {
		return ok
	}
	<-w.ready
	return w.ok
}

// ask is take without the wait: it takes a place of cost if one is free
// and nobody waits (nil, true), refuses after close (nil, false), and
// otherwise joins the back of the queue and returns the waiter, whose
// ready closes when it is answered.
func (t *turns) ask(cost int64) (*turnWaiter, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, false
	case t.head == len(t.waiters) && t.fits(cost):
		t.free--
		t.room -= cost
		return nil, true
	}
	w := &turnWaiter{cost: cost, ready: make(chan struct{})}
	if t.head > 0 && t.head*2 >= len(t.waiters) {
		// Half of the queue has been answered: move the rest to the front,
		// so that a queue fed as fast as it drains does not grow.
		n := copy(t.waiters, t.waiters[t.head:])
		clear(t.waiters[n:])
		t.waiters, t.head = t.waiters[:n], 0
	}
	t.waiters = append(t.waiters, w)
	t.waits++
	return w, true
}

// fits reports whether a place of cost is free; the caller holds mu.
func (t *turns) fits(cost int64) bool { return t.free > 0 && t.room >= cost }

// give hands n places of the given total cost back, to the oldest waiters
// first.
func (t *turns) give(n int, cost int64) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	t.free += n
	t.room += cost
	for t.head < len(t.waiters) && t.fits(t.waiters[t.head].cost) {
		t.free--
		t.room -= t.waiters[t.head].cost
		t.wake(true)
	}
	t.mu.Unlock()
}

// close refuses every waiter, now and later.
func (t *turns) close() {
	t.mu.Lock()
	t.closed = true
	for t.head < len(t.waiters) {
		t.wake(false)
	}
	t.mu.Unlock()
}

// wake answers the oldest waiter; the caller holds mu. The queue's memory
// is dropped once it has emptied, so one burst does not keep it.
func (t *turns) wake(ok bool) {
	w := t.waiters[t.head]
	t.waiters[t.head] = nil
	t.head++
	w.ok = ok
	close(w.ready)
	if t.head == len(t.waiters) {
		if cap(t.waiters) > 1024 {
			t.waiters = nil
		} else {
			t.waiters = t.waiters[:0]
		}
		t.head = 0
	}
}

// waited returns how many producers have had to wait for a place.
func (t *turns) waited() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.waits
}

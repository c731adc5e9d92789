// Package queue hands out places, each of a cost, from a bounded stock,
// first come first served: a waiter that finds too little free, or others
// already waiting, joins the back of the queue, and what is given back goes
// to the oldest waiter first; no later waiter is served before an earlier
// one. So a burst of one producer delays another by at most the places and
// waiters ahead of it when it came, never for as long as the burst lasts.
//
// It knows nothing of what the places are for: a Loader's pending writes
// use it (places and their cost), and so does its limit on downstream
// calls (places are slots; a background refresh's slot costs 1 of a room
// of half the bound).
package queue

import (
	"sync"
	"sync/atomic"
)

// Queue is a stock of places, and the waiters for them, oldest first. Its
// zero value has no place and no room; Init sets them. It is safe for
// concurrent use, and must not be copied after first use.
//
// Both the places held and their total cost are bounded. A place of cost c
// fits while fewer places are held than the bound and c fits the room not
// spent; a place of cost 0 always fits the room, even after Resize has cut
// the room below what is spent. A waiter that leaves before its turn
// (Leave) stays in the slice marked gone, is skipped, and is compacted
// away.
type Queue struct {
	mu         sync.Mutex
	places     int       // places that may be held; Resize may cut it below held
	held       int       // places held
	room       int64     // cost that may be held; Resize may cut it below spent
	spent      int64     // cost held
	maxWaiting int       // most live waiters; 0: no bound
	waiters    []*Waiter // oldest first, from head on; gone ones skipped
	head       int       // waiters[:head] have been answered or skipped
	waiting    int       // waiters in waiters[head:] that are not gone
	closed     bool      // Close: every waiter, now and later, is refused
	waits      uint64    // Asks that had to wait, ever

	full atomic.Bool // a place of cost 0 would not be taken now: Full; written under mu
}

// Waiter is one Ask waiting for its place. Its fields are guarded by the
// queue's mu; once Ready is closed they no longer change.
type Waiter struct {
	cost     int64
	ready    chan struct{} // closed when answered
	answered bool          // granted or refused
	granted  bool
	gone     bool // left the queue unanswered
}

// Ready is closed once w is answered: granted its place, or refused by
// Close.
func (w *Waiter) Ready() <-chan struct{} { return w.ready }

// Granted reports whether w was granted its place; it is meaningful once
// Ready is closed.
func (w *Waiter) Granted() bool { return w.granted }

// Status is how an Ask, a TryTake or a Leave ended.
type Status uint8

const (
	// Taken: the place is held, and must be given back (Give).
	Taken Status = iota
	// Queued: the waiter waits its turn (Ask only).
	Queued
	// Closed: refused, the queue is closed.
	Closed
	// NoRoom: refused, as the queue has no room for it: Ask found
	// maxWaiting waiters already waiting; TryTake found no place free, or
	// waiters waiting.
	NoRoom
	// Left: the waiter left without a place (Leave only).
	Left
)

// Init sets the places and the room (their total cost) of a queue not yet
// used, and maxWaiting, the most waiters it holds (0: no bound).
func (q *Queue) Init(places int, room int64, maxWaiting int) {
	q.places, q.room, q.maxWaiting = places, room, maxWaiting
	q.update()
}

// Ask takes a place of cost if one fits and nobody waits (nil, Taken). It
// refuses after Close (nil, Closed) and when maxWaiting waiters wait (nil,
// NoRoom). Otherwise it joins the back of the queue and returns the waiter
// (w, Queued), whose Ready closes when it is answered; it must then wait
// for Ready, or Leave.
func (q *Queue) Ask(cost int64) (*Waiter, Status) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return nil, Closed
	case q.waiting == 0 && q.fits(cost):
		q.held++
		q.spent += cost
		q.update()
		return nil, Taken
	case q.maxWaiting > 0 && q.waiting >= q.maxWaiting:
		return nil, NoRoom
	}
	w := &Waiter{cost: cost, ready: make(chan struct{})}
	q.push(w)
	q.waits++
	q.update()
	return w, Queued
}

// Take waits for a place of cost and reports whether it got one: false
// after Close, or when maxWaiting waiters wait.
func (q *Queue) Take(cost int64) bool {
	w, st := q.Ask(cost)
	if st != Queued {
		return st == Taken
	}
	<-w.ready
	return w.granted
}

// TryTake takes a place of cost if one fits and nobody waits (Taken); it
// never waits. Otherwise it reports Closed or NoRoom.
func (q *Queue) TryTake(cost int64) Status {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return Closed
	case q.waiting > 0 || !q.fits(cost):
		return NoRoom
	}
	q.held++
	q.spent += cost
	q.update()
	return Taken
}

// Leave takes w, which stopped waiting, out of the queue. Unanswered, it
// leaves (Left). Refused by Close, it reports Closed. Granted meanwhile, it
// keeps its place if keep (Taken: the place must be given back), and
// otherwise gives it back to the next in line (Left).
func (q *Queue) Leave(w *Waiter, keep bool) Status {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case w.answered && !w.granted:
		return Closed
	case w.answered && keep:
		return Taken
	case w.answered:
		q.giveLocked(1, w.cost)
	default:
		w.gone = true
		if q.waiting--; q.waiting == 0 {
			q.reset()
		}
		q.update()
	}
	return Left
}

// Give gives n places of the given total cost back, and grants the oldest
// waiters what then fits.
func (q *Queue) Give(n int, cost int64) {
	if n == 0 {
		return
	}
	q.mu.Lock()
	q.giveLocked(n, cost)
	q.mu.Unlock()
}

// Resize sets the places and the room to what f returns; f is called with
// the places held now, under the queue's lock (so it must not call the
// queue). A rise grants the waiters what then fits; a cut below what is
// held grants nothing until enough is given back.
func (q *Queue) Resize(f func(held int) (places int, room int64)) {
	q.mu.Lock()
	q.places, q.room = f(q.held)
	q.grant()
	q.update()
	q.mu.Unlock()
}

// Close refuses every waiter, now and later. Places held are still given
// back as usual.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	for q.waiting > 0 {
		w := q.pop()
		w.answered = true
		close(w.ready)
	}
	q.update()
	q.mu.Unlock()
}

// Full reports, without a lock, whether a place of cost 0 asked for now
// would have to wait: no place is free, or others wait. It may be out of
// date by the time it returns.
func (q *Queue) Full() bool { return q.full.Load() }

// State is what a queue holds at one moment.
type State struct {
	Places, Held int   // places that may be held, and those held
	Room, Spent  int64 // cost that may be held, and the cost held
	Waiting      int   // waiters waiting
}

// State returns what q holds now.
func (q *Queue) State() State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return State{Places: q.places, Held: q.held, Room: q.room, Spent: q.spent, Waiting: q.waiting}
}

// Waits returns how many Asks have had to wait.
func (q *Queue) Waits() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waits
}

package queue_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/internal/queue"
)

// ready waits until w is answered, granted or refused, and fails the test
// after 10s: an answer that never comes fails fast, not at the package's
// timeout.
func ready(t *testing.T, what string, w *queue.Waiter) {
	t.Helper()
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10s for %s to be answered", what)
	}
}

// A queue serves waiters in order of arrival: a later, smaller request
// never passes an earlier one that does not fit yet.
func TestFirstComeFirstServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var q queue.Queue
		q.Init(4, 10, 0)
		if !q.Take(8) {
			t.Fatal("Take(8) of 10 refused")
		}
		var order []int64
		var mu sync.Mutex
		for _, c := range []int64{5, 1} {
			go func() {
				if q.Take(c) {
					mu.Lock()
					order = append(order, c)
					mu.Unlock()
				}
			}()
			synctest.Wait()
		}
		if len(order) != 0 {
			t.Fatalf("%v served while the first waiter (5) does not fit", order)
		}
		q.Give(1, 3) // room 5: the first waiter fits, and then the second does not
		synctest.Wait()
		if len(order) != 1 || order[0] != 5 {
			t.Fatalf("served %v; want [5]", order)
		}
		q.Give(1, 5)
		synctest.Wait()
		if len(order) != 2 || order[1] != 1 {
			t.Fatalf("served %v; want [5 1]", order)
		}
		q.Close()
		if q.Take(1) {
			t.Fatal("Take after Close granted")
		}
		if got := q.Waits(); got != 2 {
			t.Errorf("Waits() = %d; want 2", got)
		}
	})
}

// A place free is not taken while others wait: Ask queues behind them,
// TryTake refuses, and Full says so.
func TestNoOvertaking(t *testing.T) {
	var q queue.Queue
	q.Init(2, 100, 0)
	if _, st := q.Ask(0); st != queue.Taken || q.Full() {
		t.Fatalf("Ask of a free place = %v, Full %v; want Taken, false", st, q.Full())
	}
	if _, st := q.Ask(0); st != queue.Taken || !q.Full() {
		t.Fatalf("Ask of the last place = %v, Full %v; want Taken, true", st, q.Full())
	}
	w1, st := q.Ask(0)
	if st != queue.Queued {
		t.Fatalf("Ask with no place free = %v; want Queued", st)
	}
	q.Resize(func(held int) (int, int64) { return 3, 100 }) // w1 is granted the new place
	ready(t, "w1", w1)
	if !w1.Granted() {
		t.Fatal("the waiter was not granted the place Resize added")
	}
	q.Give(1, 0)
	w2, _ := q.Ask(0) // free now, nobody waits: taken at once
	if w2 != nil {
		t.Fatal("Ask of a free place with nobody waiting queued")
	}
	w3, st := q.Ask(0)
	if st != queue.Queued {
		t.Fatalf("Ask with no place free = %v; want Queued", st)
	}
	q.Resize(func(held int) (int, int64) { return 4, 100 })
	ready(t, "w3", w3)
	q.Resize(func(held int) (int, int64) { return held, 100 }) // nothing free
	w4, _ := q.Ask(0)
	if st := q.TryTake(0); st != queue.NoRoom {
		t.Errorf("TryTake with a waiter waiting = %v; want NoRoom", st)
	}
	q.Close()
	ready(t, "w4", w4)
	if w4.Granted() {
		t.Error("a waiter granted by Close")
	}
	if st := q.TryTake(0); st != queue.Closed {
		t.Errorf("TryTake after Close = %v; want Closed", st)
	}
}

// A waiter that leaves unanswered is skipped; one granted meanwhile keeps
// its place only if it asks to, and one refused learns it from Leave.
func TestLeave(t *testing.T) {
	var q queue.Queue
	q.Init(1, 10, 2)
	q.Ask(0)
	a, _ := q.Ask(0)
	b, _ := q.Ask(0)
	if _, st := q.Ask(0); st != queue.NoRoom {
		t.Fatalf("Ask past maxWaiting = %v; want NoRoom", st)
	}
	if st := q.Leave(a, false); st != queue.Left {
		t.Fatalf("Leave of an unanswered waiter = %v; want Left", st)
	}
	q.Give(1, 0) // to b: a is gone
	ready(t, "b", b)
	if st := q.Leave(b, true); st != queue.Taken {
		t.Fatalf("Leave(keep) of a granted waiter = %v; want Taken", st)
	}
	c, _ := q.Ask(0)
	d, _ := q.Ask(0)
	q.Give(1, 0) // to c
	ready(t, "c", c)
	if st := q.Leave(c, false); st != queue.Left { // c's place goes to d
		t.Fatalf("Leave of a granted waiter = %v; want Left", st)
	}
	ready(t, "d", d)
	e, _ := q.Ask(0)
	q.Close()
	if st := q.Leave(e, true); st != queue.Closed {
		t.Fatalf("Leave of a refused waiter = %v; want Closed", st)
	}
	if s := q.State(); s.Held != 1 || s.Waiting != 0 {
		t.Errorf("State() = %+v; want d's place held, nobody waiting", s)
	}
}

// A place of cost 0 fits the room even when Resize cut it below what is
// spent; a place of cost does not.
func TestCostlessFitsAnyRoom(t *testing.T) {
	var q queue.Queue
	q.Init(4, 2, 0)
	for range 2 {
		if st := q.TryTake(1); st != queue.Taken {
			t.Fatalf("TryTake(1) within the room = %v; want Taken", st)
		}
	}
	if st := q.TryTake(1); st != queue.NoRoom {
		t.Fatalf("TryTake(1) past the room = %v; want NoRoom", st)
	}
	q.Resize(func(held int) (int, int64) { return 4, 1 })
	if st := q.TryTake(0); st != queue.Taken {
		t.Fatalf("TryTake(0) with the room spent past its bound = %v; want Taken", st)
	}
	if s := q.State(); s.Places != 4 || s.Held != 3 || s.Room != 1 || s.Spent != 2 {
		t.Errorf("State() = %+v; want 4 places, 3 held, room 1, 2 spent", s)
	}
}

// A queue whose waiters keep leaving behind one that stays does not grow,
// and one emptied after a burst drops its memory.
func TestQueueDoesNotGrow(t *testing.T) {
	var q queue.Queue
	q.Init(1, 1, 0)
	q.Ask(0)
	stay, _ := q.Ask(0)
	for range 10000 {
		w, _ := q.Ask(0)
		q.Leave(w, false)
	}
	if s := q.State(); s.Waiting != 1 {
		t.Fatalf("State() = %+v; want one waiting", s)
	}
	q.Give(1, 0)
	ready(t, "the waiter that stayed", stay)
	if !stay.Granted() {
		t.Fatal("the waiter that stayed was not granted")
	}
	q.Give(1, 0)
	allocs := testing.AllocsPerRun(100, func() {
		if q.TryTake(0) == queue.Taken {
			q.Give(1, 0)
		}
	})
	if allocs != 0 {
		t.Errorf("TryTake and Give: %v allocations; want 0", allocs)
	}
}

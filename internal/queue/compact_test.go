package queue

import (
	"testing"
	"time"
)

// Many waiters that leave behind one that stays do not grow the queue:
// gone waiters are compacted away.
func TestQueueCompacts(t *testing.T) {
	var q Queue
	q.Init(1, 1, 10)
	q.Ask(0)
	stays, _ := q.Ask(0)
	for range 1000 {
		w, _ := q.Ask(0)
		q.Leave(w, false)
	}
	q.mu.Lock()
	n := len(q.waiters) - q.head
	q.mu.Unlock()
	if n > 64 {
		t.Errorf("%d entries in the queue for 1 waiter; want it compacted", n)
	}
	q.Give(1, 0)
	select {
	case <-stays.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("waited 10s for the waiter that stayed to be answered")
	}
	if !stays.Granted() {
		t.Error("the waiter that stayed was not granted")
	}
}

package loadctx

import (
	"context"
	"sync"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// Timeouts ends contexts at their deadline, the same timeout after each
// was added. Since every context has the same timeout, deadlines come
// nearly in the order contexts are added (Add makes it exact): one list,
// oldest first, and one timer armed for the oldest. A context costs two
// short critical sections here, and no timer of its own.
//
// Make one with [NewTimeouts]; its methods are safe for concurrent use.
// It refers to nothing but the contexts listed: the runtime may keep a
// stopped timer, and what its function refers to, until it next cleans
// its timer heap, and that must not keep its user from being collected.
type Timeouts struct {
	timeout    time.Duration
	epoch      time.Time // deadlines are offsets from it
	cause      error     // the cause a context ends with at its deadline
	mu         sync.Mutex
	head, tail *Context    // guarded by mu
	timer      *time.Timer // runs fire; armed while the list is not empty
}

// NewTimeouts returns a Timeouts whose contexts end timeout after they
// were added, with context.DeadlineExceeded and cause. Times are offsets
// from epoch. Stop it once no context is added any more.
func NewTimeouts(timeout time.Duration, epoch time.Time, cause error) *Timeouts {
	t := &Timeouts{timeout: timeout, epoch: epoch, cause: cause}
	t.timer = time.AfterFunc(timeout, t.fire)
	t.timer.Stop()
	return t
}

// Add sets c's deadline, the timeout after start (an offset from the
// epoch; saturating), and lists it. start is read before locking, so a
// context whose start was read earlier may be listed later: its deadline
// is then moved up to the tail's (by the time between the two listings,
// microseconds unless the goroutine was preempted), which keeps the list
// in deadline order. The timer, armed at listing for the timeout, may
// fire that long after an empty list's first deadline: fire ends every
// context due by then. c may be added again after Remove.
func (t *Timeouts) Add(c *Context, start time.Duration) {
	due := timing.Add(start, t.timeout)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tail != nil {
		due = max(due, time.Duration(t.tail.due.Load()))
	}
	c.tm = t
	c.due.Store(int64(due))
	c.listed = true
	if t.tail == nil {
		t.head, t.tail = c, c
		t.timer.Reset(t.timeout)
		return
	}
	c.prev, t.tail.next, t.tail = t.tail, c, c
}

// Remove takes c off the list, if it is still on it: c keeps its deadline
// but no longer ends at it. The timer may then fire for nothing, or early:
// fire re-arms it.
func (t *Timeouts) Remove(c *Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unlink(c)
}

// unlink takes c off the list; the caller holds mu.
func (t *Timeouts) unlink(c *Context) {
	if !c.listed {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		t.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		t.tail = c.prev
	}
	c.prev, c.next, c.listed = nil, nil, false
}

// fire ends every listed context past its deadline and re-arms the timer
// for the next one.
func (t *Timeouts) fire() {
	var due []*Context
	t.mu.Lock()
	now := time.Since(t.epoch)
	for t.head != nil && time.Duration(t.head.due.Load()) <= now {
		c := t.head
		t.unlink(c)
		due = append(due, c)
	}
	if t.head != nil {
		t.timer.Reset(time.Duration(t.head.due.Load()) - now)
	}
	t.mu.Unlock()
	for _, c := range due {
		c.end(context.DeadlineExceeded, t.cause)
	}
}

// Stop stops the timer for good: no listed context ends at its deadline
// any more.
func (t *Timeouts) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.timer.Stop()
}

package flightcache

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
)

// A load runs under a context of its own, loadCtx, which lives inside its
// call (so a load allocates no context of its own, where a stack of
// standard ones costs five or more). It carries:
//
//   - the values of the Get that started the load (trace IDs, auth), never
//     its cancellation;
//   - the marker that recognises a Get made from inside the load;
//   - the load's deadline, LoadTimeout after it started (or a little later:
//     timeouts.add);
//   - its end, with a cause that context.Cause reports: ErrLoadTimeout (and
//     context.DeadlineExceeded as ctx.Err()), ErrClosed (Close),
//     errAbandoned (CancelAtZero, last waiter gone), or context.Canceled
//     once the load is over.
//
// context.Cause only reads causes from the standard cancel contexts, so a
// loadCtx that ends with a cause of its own makes one then (causer), just to
// hold it; a load that simply finishes needs none. Contexts derived from a
// loadCtx register through its AfterFunc, as the context package does for
// any parent that has one, and get its error and cause when it ends. Close
// reaches every running load through the in-flight map (cancelAll), not
// through a parent context.

// loadCtx is the context of one load; see above.
type loadCtx struct {
	caller context.Context // values only
	marker loadMarker
	tm     *timeouts    // the Loader's: its epoch gives Deadline
	due    atomic.Int64 // the deadline, as an offset from tm.epoch; set by timeouts.add, before user code runs (and again when a queued load gets its slot)
	// Guarded by the Loader's timeouts.mu: the list of running loads.
	prev, next *loadCtx
	listed     bool
	causer     atomic.Pointer[context.Context] // holds the cause; made once, when the load ends with one of its own

	mu    sync.Mutex
	done  chan struct{} // guarded by mu; made on first use
	err   error         // guarded by mu; set once
	after []*afterFunc  // guarded by mu; run when the context ends
}

type afterFunc struct{ f func() }

// closedDone is the Done channel of a context that ended before anyone asked.
var closedDone = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (c *loadCtx) Deadline() (time.Time, bool) {
	if c.tm == nil { // not listed yet: no user code sees such a context
		return time.Time{}, false
	}
	return c.tm.epoch.Add(time.Duration(c.due.Load())), true
}

func (c *loadCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			c.done = closedDone
		}
	}
	return c.done
}

func (c *loadCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *loadCtx) Value(key any) any {
	switch key {
	case loadKey{}:
		return &c.marker
	case revalidateKey{}:
		return nil // it applies to the Get it was passed to, not to the Gets a load makes
	}
	if causer := c.causer.Load(); causer != nil {
		if v := (*causer).Value(key); v != nil { // context.Cause's own key
			return v
		}
	}
	return c.caller.Value(key)
}

func (c *loadCtx) String() string { return "flightcache.loadContext" }

// AfterFunc runs f on its own goroutine once c ends; the context package
// uses it for the contexts derived from c.
func (c *loadCtx) AfterFunc(f func()) (stop func() bool) {
	a := &afterFunc{f: f}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	c.after = append(c.after, a)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.after {
			if x == a {
				c.after = append(c.after[:i], c.after[i+1:]...)
				return true
			}
		}
		return false
	}
}

// end ends c with err (context.Canceled or DeadlineExceeded) and cause,
// unless it has ended already.
func (c *loadCtx) end(err, cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if !sameError(cause, context.Canceled) {
		// Before err is visible: a reader of Err, then Cause, sees both.
		// (Without a causer, Cause returns Err, which is what it should.)
		causer, setCause := context.WithCancelCause(context.Background())
		setCause(cause)
		c.causer.Store(&causer)
	}
	c.err = err
	if c.done == nil {
		c.done = closedDone
	} else {
		close(c.done)
	}
	after := c.after
	c.after = nil
	c.mu.Unlock()
	for _, a := range after {
		go a.f()
	}
}

// cancel ends c with cause; it is the load's cancel function.
func (c *loadCtx) cancel(cause error) { c.end(context.Canceled, cause) }

// buildContext readies c's context on the load goroutine, before any user
// code runs, outside every shard lock: it starts the deadline from start,
// the load's start (the Loader's clock, read once for this and for the
// load's duration). A cancellation asked for before (leave, Close) is
// applied at once.
func (c *call[K, V]) buildContext(start time.Duration) {
	c.l.timeouts.add(&c.lctx, start)
	sh := c.l.flights.shard(c.h)
	sh.mu.Lock()
	c.ready = true
	cause := c.cause
	sh.mu.Unlock()
	if cause != nil {
		c.lctx.cancel(cause)
	}
}

// cancelLocked returns the function that cancels c with cause, or records
// cause for buildContext if c's context is not ready. The caller holds c's
// shard lock and calls the function after unlocking.
func (c *call[K, V]) cancelLocked(cause error) func(error) {
	if !c.ready {
		if c.cause == nil {
			c.cause = cause
		}
		return nil
	}
	return c.lctx.cancel
}

// release ends the load's context; the load is over.
func (c *call[K, V]) release() {
	c.l.timeouts.remove(&c.lctx)
	c.lctx.cancel(context.Canceled)
}

// timeouts ends loads at LoadTimeout. Every load of a Loader has the same
// timeout, so deadlines come nearly in the order loads are listed (add
// makes it exact): one list, oldest first, and one timer armed for the
// oldest. A load costs two short critical sections here, and no timer of
// its own.
type timeouts struct {
	timeout    time.Duration
	epoch      time.Time // the Loader's: deadlines are offsets from it, as entries' times are
	mu         sync.Mutex
	head, tail *loadCtx    // guarded by mu
	timer      *time.Timer // runs fire; armed while the list is not empty
}

// newTimeouts returns the timeouts of a Loader. They are allocated apart
// from it, and refer to nothing of it: the runtime may keep a stopped
// timer, and what its function refers to, until it next cleans its timer
// heap, and that must not keep a closed Loader from being collected.
func newTimeouts(timeout time.Duration, epoch time.Time) *timeouts {
	t := &timeouts{timeout: timeout, epoch: epoch}
	t.timer = time.AfterFunc(timeout, t.fire)
	t.timer.Stop()
	return t
}

// add sets c's deadline, timeout after start, and lists it. The clock is
// read before locking, so a load that read it earlier may list itself
// later: its deadline is then moved up to the tail's (by the time between
// the two listings, microseconds unless the goroutine was preempted), which
// keeps the list in deadline order. The timer, armed at listing for
// timeout, may fire that long after an empty list's first deadline: fire
// ends every load due by then.
func (t *timeouts) add(c *loadCtx, start time.Duration) {
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

// remove takes c off the list, if it is still on it. The timer may then
// fire for nothing, or early: fire re-arms it.
func (t *timeouts) remove(c *loadCtx) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unlink(c)
}

// unlink takes c off the list; the caller holds mu.
func (t *timeouts) unlink(c *loadCtx) {
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

// fire ends every listed load past its deadline and re-arms the timer for
// the next one.
func (t *timeouts) fire() {
	var due []*loadCtx
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
		c.end(context.DeadlineExceeded, ErrLoadTimeout)
	}
}

// stop stops the timer for good; the Loader is torn down.
func (t *timeouts) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.timer.Stop()
}

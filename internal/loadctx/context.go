// Package loadctx is the context a load runs under, and the one timer that
// ends such contexts at their deadline.
//
// A [Context] lives inside whatever runs the load (a load allocates no
// context of its own, where a stack of standard ones costs five or more).
// It carries:
//
//   - the values its user hands it ([Context.Init]), never a cancellation;
//   - its deadline, the timeout of its [Timeouts] after it was added (or a
//     little later: [Timeouts.Add]);
//   - its end, with a cause that context.Cause reports: the cause of its
//     Timeouts (and context.DeadlineExceeded as Err) at its deadline, or
//     the one [Context.Cancel] was given (and context.Canceled as Err).
//
// context.Cause only reads causes from the standard cancel contexts, so a
// Context that ends with a cause other than context.Canceled makes one then
// (causer), just to hold it; one that is simply cancelled needs none.
// Contexts derived from a Context register through its AfterFunc, as the
// context package does for any parent that has one, and get its error and
// cause when it ends.
//
// The package knows nothing of what is loaded: values come from its user,
// and times are offsets from an epoch its user chose.
package loadctx

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Values answers the Value calls of a [Context] that context.Cause does
// not: the values of whoever started the load, and any of the user's own
// keys. It is user code to this package: it is never called under a lock.
type Values interface {
	Value(key any) any
}

// Context is the context of one load; see the package doc. Its zero value
// has no values, no deadline and has not ended; it must not be copied
// after first use. Its methods are safe for concurrent use, except Init.
type Context struct {
	values Values
	tm     *Timeouts    // the one it was added to: its epoch gives Deadline
	due    atomic.Int64 // the deadline, as an offset from tm.epoch; set by Timeouts.Add
	// Guarded by tm.mu: the list of running loads.
	prev, next *Context
	listed     bool
	causer     atomic.Pointer[context.Context] // holds the cause; made once, when c ends with one of its own

	mu    sync.Mutex
	done  chan struct{} // guarded by mu; made on first use
	err   error         // guarded by mu; set once
	after []*afterFunc  // guarded by mu; run when the context ends
}

type afterFunc struct{ f func() }

// closedDone is the Done channel of a context that ended before anyone asked.
var closedDone = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// Init sets where c's Value looks (nil: nowhere). Call it before c is
// shared.
func (c *Context) Init(values Values) { c.values = values }

// Deadline returns c's deadline; ok is false until c is added to a
// [Timeouts].
func (c *Context) Deadline() (deadline time.Time, ok bool) {
	if c.tm == nil { // not added yet
		return time.Time{}, false
	}
	return c.tm.epoch.Add(time.Duration(c.due.Load())), true
}

// Overdue reports whether c has a deadline (it was added to a
// [Timeouts]) and now, an offset from that Timeouts' epoch, is at or past
// it, whether or not c has ended yet: the timer that ends c fires a little
// after its deadline, and a deadline taken from c (Deadline) may fire
// first. It is safe to call from the goroutine that added c.
func (c *Context) Overdue(now time.Duration) bool {
	return c.tm != nil && time.Duration(c.due.Load()) <= now
}

// Done returns a channel closed when c ends.
func (c *Context) Done() <-chan struct{} {
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

// Err returns nil until c ends, then context.Canceled or
// context.DeadlineExceeded.
func (c *Context) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value returns the value for key: context.Cause's own key once c has
// ended with a cause of its own, else what c's Values answer.
func (c *Context) Value(key any) any {
	if causer := c.causer.Load(); causer != nil {
		if v := (*causer).Value(key); v != nil { // context.Cause's own key
			return v
		}
	}
	if c.values == nil {
		return nil
	}
	return c.values.Value(key)
}

// String names the context, as the standard contexts name themselves.
func (c *Context) String() string { return "flightcache.loadContext" }

// AfterFunc runs f on its own goroutine once c ends; the context package
// uses it for the contexts derived from c. stop unregisters f, and reports
// whether it did so before f was started.
func (c *Context) AfterFunc(f func()) (stop func() bool) {
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

// Cancel ends c with context.Canceled and cause (context.Canceled: none of
// its own), unless it has ended already.
func (c *Context) Cancel(cause error) { c.end(context.Canceled, cause) }

// end ends c with err (context.Canceled or DeadlineExceeded) and cause,
// unless it has ended already.
func (c *Context) end(err, cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	// context.Canceled is a pointer: == never panics on an error whose
	// type is not comparable.
	if cause != context.Canceled {
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

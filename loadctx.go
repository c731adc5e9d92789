package flightcache

import (
	"context"
	"time"
)

// A load runs under a context of its own, built from two pieces that live
// inside its call (so a load allocates one context, not five):
//
//   - loadValues, the parent: the values of the Get that started the load
//     (trace IDs, auth) but never its cancellation, the marker that
//     recognises a Get made from inside the load, and the load's deadline;
//   - a deadline at LoadTimeout, and a cancel over it, so that
//     context.Cause tells why a load ended: ErrLoadTimeout (with
//     context.DeadlineExceeded as ctx.Err()), ErrClosed (Close),
//     errAbandoned (CancelAtZero, last waiter gone), or context.Canceled
//     once the load is over.
//
// loadValues has no Done channel, so the deadline registers with no parent
// and starts no goroutine; Close reaches every running load through the
// in-flight map instead (cancelAll). The load goroutine builds the two
// contexts itself, outside every lock.

// loadKey is the context key under which a load's context carries its
// marker.
type loadKey struct{}

// loadMarker links a load to the loads it was started from, so that a Get
// made inside a LoadFunc can tell that it would wait on itself.
type loadMarker struct {
	call   any // the *call being loaded; compared by identity
	parent *loadMarker
}

// waitsOn reports whether m, or a load m was started from, is c.
func (m *loadMarker) waitsOn(c any) bool {
	for ; m != nil; m = m.parent {
		if m.call == c {
			return true
		}
	}
	return false
}

// markerOf returns the marker of the load ctx belongs to, if any.
func markerOf(ctx context.Context) *loadMarker {
	m, _ := ctx.Value(loadKey{}).(*loadMarker)
	return m
}

// loadValues is the parent of a load's context; see above.
type loadValues struct {
	caller   context.Context // values only
	marker   loadMarker
	deadline time.Time // set by the load goroutine before any user code runs
}

func (v *loadValues) Deadline() (time.Time, bool) { return v.deadline, true }
func (v *loadValues) Done() <-chan struct{}       { return nil }
func (v *loadValues) Err() error                  { return nil }
func (v *loadValues) String() string              { return "flightcache.loadContext" }

func (v *loadValues) Value(key any) any {
	if key == (loadKey{}) {
		return &v.marker
	}
	return v.caller.Value(key)
}

// buildContext gives c its context, on the load goroutine before any user
// code runs: a deadline at LoadTimeout (cause ErrLoadTimeout, and
// context.DeadlineExceeded as its error), under a cancel of its own. A
// cancellation asked for before (leave, Close) is applied at once.
func (c *call[K, V]) buildContext(timeout time.Duration) {
	c.values.deadline = time.Now().Add(timeout)
	timed, stopTimer := context.WithDeadlineCause(&c.values, c.values.deadline, ErrLoadTimeout)
	ctx, cancel := context.WithCancelCause(timed)
	c.ctx, c.stopTimer = ctx, stopTimer
	sh := c.l.flights.shard(c.h)
	sh.mu.Lock()
	c.cancel = cancel
	cause := c.cause
	sh.mu.Unlock()
	if cause != nil {
		cancel(cause)
	}
}

// cancelLocked returns the function that cancels c with cause, or records
// cause for buildContext if c has no context yet. The caller holds c's
// shard lock and calls the function after unlocking.
func (c *call[K, V]) cancelLocked(cause error) context.CancelCauseFunc {
	if c.cancel == nil {
		if c.cause == nil {
			c.cause = cause
		}
		return nil
	}
	return c.cancel
}

// release frees the context's timer; the load is over.
func (c *call[K, V]) release() {
	c.cancel(context.Canceled)
	c.stopTimer()
}

package flightcache

import (
	"context"
	"time"

	"github.com/flightcache/flightcache/internal/loadctx"
)

// A load runs under a context of its own, a loadctx.Context that lives
// inside its call (so a load allocates no context of its own). What ties
// it to the call is here: its values (loadValues), its start
// (buildContext), its cancellation (cancelLocked, release), and its
// deadline, LoadTimeout after it started, kept by the Loader's timeouts
// (a loadctx.Timeouts). It ends with a cause that context.Cause reports:
// ErrLoadTimeout (and context.DeadlineExceeded as ctx.Err()), ErrClosed
// (Close), errAbandoned (CancelAtZero, last waiter gone), or
// context.Canceled once the load is over. Close reaches every running
// load through the in-flight map (cancelAll), not through a parent
// context.

// loadValues is what a load's context answers Value with:
//
//   - the values of the Get that started the load (trace IDs, auth), never
//     its cancellation;
//   - the marker that recognises a Get made from inside the load.
type loadValues struct {
	caller context.Context // values only
	marker loadMarker
}

// Value answers a load's context's Value calls (loadctx.Values).
func (v *loadValues) Value(key any) any {
	switch key {
	case loadKey{}:
		return &v.marker
	case revalidateKey{}:
		return nil // it applies to the Get it was passed to, not to the Gets a load makes
	}
	return v.caller.Value(key)
}

// newTimeouts returns the timeouts of a Loader: they end its loads at
// LoadTimeout with ErrLoadTimeout. They are allocated apart from it, and
// refer to nothing of it.
func newTimeouts(timeout time.Duration, epoch time.Time) *loadctx.Timeouts {
	return loadctx.NewTimeouts(timeout, epoch, ErrLoadTimeout)
}

// buildContext readies c's context on the load goroutine, before any user
// code runs, outside every shard lock: it starts the deadline from start,
// the load's start (the Loader's clock, read once for this and for the
// load's duration). A cancellation asked for before (leave, Close) is
// applied at once.
func (c *call[K, V]) buildContext(start time.Duration) {
	c.l.timeouts.Add(&c.lctx, start)
	if cause := c.l.flights.markReady(c); cause != nil {
		c.lctx.Cancel(cause)
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
	return c.lctx.Cancel
}

// release ends the load's context; the load is over.
func (c *call[K, V]) release() {
	c.l.timeouts.Remove(&c.lctx)
	c.lctx.Cancel(context.Canceled)
}

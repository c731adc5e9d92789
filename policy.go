package flightcache

import (
	"context"
	"fmt"
	"time"
)

// Policy says what happens to a load when every caller waiting on it has
// left (their contexts ended). The zero value is [FinishAndFill].
type Policy uint8

const (
	// FinishAndFill lets an abandoned load run on, bounded by
	// [Options.LoadTimeout], and fill the cache: the next Get of the key is
	// a hit. Best for idempotent reads that will be asked for again.
	FinishAndFill Policy = iota
	// CancelAtZero cancels the load's context as soon as its last waiter
	// leaves, and removes the load from the in-flight map under the same
	// lock, so a later Get starts a fresh load and never inherits the
	// cancelled one. Best when abandoned work holds scarce resources.
	CancelAtZero
)

// String returns "finish-and-fill" or "cancel-at-zero".
func (p Policy) String() string {
	switch p {
	case FinishAndFill:
		return "finish-and-fill"
	case CancelAtZero:
		return "cancel-at-zero"
	default:
		return fmt.Sprintf("Policy(%d)", uint8(p))
	}
}

// errAbandoned is the cancellation cause of a load whose last waiter left
// under CancelAtZero.
var errAbandoned = fmt.Errorf("flightcache: load abandoned by every caller: %w", context.Canceled)

// loadKey is the context key under which a load's context carries its
// marker, so that a Get made from inside a LoadFunc can tell that it would
// wait on itself.
type loadKey struct{}

// loadMarker links a load to the loads it was started from.
type loadMarker struct {
	call   any // the *call being loaded; compared by identity
	parent *loadMarker
}

// loadContext builds the context one load runs under. parent is the marker
// of the load the caller runs in, if any (read by the caller, outside its
// locks). It keeps the values of
// the caller that started the load (trace IDs, auth) but never its
// cancellation: context.WithoutCancel drops it, so one caller leaving cannot
// fail the others. The load ends instead when
//   - the Loader closes (base is cancelled): cause ErrClosed;
//   - timeout passes: cause ErrLoadTimeout;
//   - cancel is called, which the flight does under CancelAtZero when the
//     last waiter leaves: cause errAbandoned.
//
// release frees the context's timer and its link to base; call it when the
// load is over.
func loadContext(caller context.Context, parent *loadMarker, base context.Context, timeout time.Duration, c any) (ctx context.Context, cancel context.CancelCauseFunc, release func()) {
	ctx = context.WithValue(context.WithoutCancel(caller), loadKey{}, &loadMarker{call: c, parent: parent})
	ctx, cancel = context.WithCancelCause(ctx)
	stop := context.AfterFunc(base, func() { cancel(ErrClosed) })
	ctx, cancelTimeout := context.WithTimeoutCause(ctx, timeout, ErrLoadTimeout)
	return ctx, cancel, func() {
		stop()
		cancelTimeout()
		cancel(context.Canceled)
	}
}

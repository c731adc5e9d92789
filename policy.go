package flightcache

import (
	"context"
	"fmt"
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

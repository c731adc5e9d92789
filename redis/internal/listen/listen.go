// Package listen holds what the tier's pub/sub listeners share: the
// jittered backoff between attempts at a subscription, the close of a
// subscription when its context ends, and the saturating arithmetic of
// their timeouts. It knows nothing of keys or values.
package listen

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Result is how one attempt at a subscription ended.
type Result int

const (
	Failed Result = iota // it never worked: the next attempt backs off further
	Worked               // it had worked, then was lost: the next comes back quickly
	Stop                 // nothing more to do: the loop returns
)

// First and Longest bound the pause between two attempts: it starts at
// First after an attempt that worked, and doubles up to Longest.
const (
	First   = 50 * time.Millisecond
	Longest = time.Second
)

// Loop runs attempt until ctx ends or it returns Stop, pausing (jittered)
// between two attempts; retry runs after an attempt that Failed while ctx
// is still alive.
func Loop(ctx context.Context, attempt func() Result, retry func()) {
	pause := First
	for ctx.Err() == nil {
		switch attempt() {
		case Stop:
			return
		case Worked:
			pause = First
		default:
			if ctx.Err() == nil {
				retry()
			}
		}
		Sleep(ctx, Jitter(pause))
		pause = min(2*pause, Longest)
	}
}

// Sleep waits for d or the end of ctx, whichever comes first.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Jitter spreads d uniformly over [d/2, 3d/2), saturated at the largest
// duration.
func Jitter(d time.Duration) time.Duration {
	switch p := float64(d) * (0.5 + rand.Float64()); {
	case p >= 1<<63:
		return math.MaxInt64
	case p <= -(1 << 63):
		return math.MinInt64
	default:
		return time.Duration(p)
	}
}

// Times is d·n for n >= 0, saturated at the largest duration.
func Times(d time.Duration, n int64) time.Duration {
	if d <= 0 || n <= 0 {
		return d * time.Duration(n)
	}
	if d > math.MaxInt64/time.Duration(n) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

// Check is the health check of a subscription whose round trips take at
// most timeout: four of them, at least half a second.
func Check(timeout time.Duration) time.Duration {
	return max(Times(timeout, 4), 500*time.Millisecond)
}

// CloseOnCancel closes ps as soon as ctx ends: go-redis ends a read in
// flight at its deadline (up to a health check, four Timeouts), not when
// its context ends, and the tier's Close waits for the reader. The func it
// returns closes ps, after that close if it began, so no goroutine of it
// outlives the caller.
func CloseOnCancel(ctx context.Context, ps *redis.PubSub) func() {
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = ps.Close()
		close(closed)
	})
	return func() {
		if !stop() {
			<-closed
		}
		_ = ps.Close()
	}
}

// Moved reports whether err says a key's hash slot is served by another
// node (MOVED, ASK): the node map is out of date.
func Moved(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// Receive reads ps's next message, waiting at most check. A read that
// times out, the first in a row, is answered by a ping bounded by timeout:
// a quiet subscription is not a lost one, and Receive returns (nil, nil)
// once the ping is answered. Any other error is returned as it is: the
// subscription failed (or ctx ended). pinged carries the quiet state from
// one call to the next.
func Receive(ctx context.Context, ps *redis.PubSub, check, timeout time.Duration, pinged *bool) (any, error) {
	msg, err := ps.ReceiveTimeout(ctx, check)
	var ne net.Error
	switch {
	case err == nil:
		*pinged = false
		return msg, nil
	case ctx.Err() != nil || *pinged || !errors.As(err, &ne) || !ne.Timeout():
		return nil, err
	}
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if perr := ps.Ping(c); perr != nil {
		return nil, err
	}
	*pinged = true
	return nil, nil
}

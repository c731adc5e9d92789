package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// service is the fake downstream every part talks to: each call takes
// between min and max, and with failEvery > 0 every failEvery-th call
// (counted over all keys) hangs until its context ends, like a query that
// times out. calls counts what the downstream itself saw, to reconcile
// with the Loader's Stats.Loads; the tables report the Loader's numbers.
type service struct {
	min, max  time.Duration
	failEvery int64
	calls     atomic.Int64
}

// load is a flightcache.LoadFunc.
func (s *service) load(ctx context.Context, key string) (string, error) {
	n := s.calls.Add(1)
	if s.failEvery > 0 && n%s.failEvery == 0 {
		<-ctx.Done() // hangs: the Loader's LoadTimeout ends it
		return "", fmt.Errorf("service: call %d for %q: %w", n, key, ctx.Err())
	}
	d := s.min
	if s.max > s.min {
		d += rand.N(s.max - s.min)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return fmt.Sprintf("%s@%d", key, n), nil
	case <-ctx.Done():
		return "", fmt.Errorf("service: call %d for %q: %w", n, key, ctx.Err())
	}
}

package flightcache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 22, the pool recipe: in front of a pool of N
// connections that the service's writes share, MaxLoads N minus the
// connections the writes may hold keeps every load's wait in the Limit:
// no load ever waits in the pool, on its LoadTimeout. MaxLoads N alone
// (the recipe for a pool the Loader has to itself) lets loads queue in
// the pool while writes hold connections.
func TestLimitSharedPoolRecipe(t *testing.T) {
	const poolSize, writeConns = 8, 3
	for _, tc := range []struct {
		maxLoads     int
		waitedInPool bool
	}{
		{poolSize - writeConns, false},
		{poolSize, true},
	} {
		t.Run(fmt.Sprintf("MaxLoads %d", tc.maxLoads), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pool := make(chan struct{}, poolSize) // a token per connection in use
				var waited, loads atomic.Int64
				load := func(ctx context.Context, key string) (string, error) {
					select {
					case pool <- struct{}{}:
					default:
						waited.Add(1) // no connection free: the load waits in the pool
						select {
						case pool <- struct{}{}:
						case <-ctx.Done():
							return "", ctx.Err()
						}
					}
					defer func() { <-pool }()
					loads.Add(1)
					time.Sleep(10 * time.Millisecond) // the query
					return "row " + key, nil
				}
				l, err := New(load, Options[string, string]{TTL: time.Minute, Limit: Limit{MaxLoads: tc.maxLoads}})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()

				// The writes hold their connections through the storm.
				for range writeConns {
					pool <- struct{}{}
				}
				var wg sync.WaitGroup
				for i := range 50 {
					wg.Go(func() {
						if _, err := l.Get(ctx, fmt.Sprint(i)); err != nil {
							t.Errorf("Get(%d) = %v", i, err)
						}
					})
				}
				wg.Wait()
				if got := waited.Load() > 0; got != tc.waitedInPool {
					t.Errorf("MaxLoads %d, pool %d, writes holding %d: %d loads waited in the pool; want waits: %v",
						tc.maxLoads, poolSize, writeConns, waited.Load(), tc.waitedInPool)
				}
				if loads.Load() != 50 {
					t.Errorf("%d loads; want 50", loads.Load())
				}
			})
		})
	}
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The fast path through a Loader: a fifth of the keys are not-founds the
// downstream answers at once, the others take 5ms whatever the load, and
// 75 goroutines Get fresh keys, the fifth drawn at random or every fifth
// key of each goroutine (so that all 75 start with a not-found, in step).
// Nothing is overloaded, so the adaptive bound grows to its ceiling (50)
// and stays there.
func TestLimitAdaptiveFastPathKeepsTheBound(t *testing.T) {
	for _, tt := range []struct {
		name string
		nf   func(rng *rand.Rand, i int) bool
	}{
		{"at random", func(rng *rand.Rand, _ int) bool { return rng.IntN(5) == 0 }},
		{"in step", func(_ *rand.Rand, i int) bool { return i%5 == 0 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lo, gets, failed := fastPathBound(t, tt.nf)
				t.Logf("%d Gets in 1.2s, bound %d at the lowest after 0.4s", gets, lo)
				if lo < 45 || failed != 0 {
					t.Errorf("a fifth of instant not-founds: bound fell to %d, %d Gets failed; want it held at 45 or more, none failed", lo, failed)
				}
			})
		})
	}
}

// fastPathBound runs the fast path of TestLimitAdaptiveFastPathKeepsTheBound
// for 1.2s, nf saying which Gets are of not-founds, and returns the lowest
// bound after 0.4s, the Gets made, and how many failed.
func fastPathBound(t *testing.T, nf func(rng *rand.Rand, i int) bool) (lo int, gets, failed int64) {
	load := func(ctx context.Context, key string) (string, error) {
		if strings.HasPrefix(key, "nf") {
			return "", ErrNotFound
		}
		select {
		case <-time.After(5 * time.Millisecond):
			return key, nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	l, err := New(load, Options[string, string]{TTL: time.Minute, MaxCost: 1000, Limit: Limit{Adaptive: true, MaxLoads: 50}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, stop := context.WithTimeout(t.Context(), 1200*time.Millisecond)
	defer stop()
	var n, bad atomic.Int64
	var wg sync.WaitGroup
	for w := range 75 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("%d-%d", w, i)
				if nf(rng, i) {
					key = "nf" + key
				}
				if _, err := l.Get(ctx, key); err != nil && !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
					bad.Add(1)
				}
				n.Add(1)
			}
		})
	}
	time.Sleep(400 * time.Millisecond)
	lo = math.MaxInt
	for range 80 {
		lo = min(lo, int(l.Stats().LoadLimit))
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	return lo, n.Load(), bad.Load()
}

package flightcache_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
)

// A LoadManyFunc that can tell which keys failed returns its map with a
// *ManyError: each key in it fails alone with its own error (a not-found
// is cached as one), and the others get their values, from one call.
func ExampleLoadManyFunc() {
	var calls atomic.Int32
	errRejected := errors.New("id rejected")
	l, _ := flightcache.New(nil, flightcache.Options[string, int]{
		TTL:         time.Minute,
		NotFoundTTL: time.Minute,
		LoadMany: func(ctx context.Context, ids []string) (map[string]int, error) {
			calls.Add(1)
			prices := map[string]int{}
			failed := map[string]error{}
			for _, id := range ids {
				switch id {
				case "p-bad":
					failed[id] = errRejected
				case "p-gone":
					failed[id] = flightcache.ErrNotFound
				default:
					prices[id] = 100
				}
			}
			return prices, &flightcache.ManyError[string]{Errs: failed}
		},
	})
	defer l.Close()

	ctx := context.Background()
	prices, err := l.GetMany(ctx, []string{"p-1", "p-2", "p-bad", "p-gone"})
	fmt.Println(len(prices), prices["p-1"], err)
	_, err = l.Get(ctx, "p-gone") // the not-found was cached: no call
	fmt.Println(errors.Is(err, flightcache.ErrNotFound), "LoadMany calls:", calls.Load())
	// Output:
	// 2 100 flightcache: 1 of the keys failed: id rejected
	// true LoadMany calls: 1
}

// With a BatchWindow the Loader chooses which keys share a call, so one
// key that fails every call it is in (here an id the database rejects the
// whole query for) must not fail the Gets beside it: a call that fails as
// a whole is split in halves, tried again, down to that key.
func ExampleOptions_batchWindowSplit() {
	var mu sync.Mutex
	var sizes []int
	l, _ := flightcache.New(nil, flightcache.Options[string, int]{
		TTL:         time.Minute,
		BatchWindow: time.Second,
		MaxBatch:    8,
		LoadMany: func(ctx context.Context, ids []string) (map[string]int, error) {
			mu.Lock()
			sizes = append(sizes, len(ids))
			mu.Unlock()
			if slices.Contains(ids, "p-\xff") {
				return nil, errors.New("Error 1271: Illegal mix of collations")
			}
			prices := map[string]int{}
			for _, id := range ids {
				prices[id] = 100
			}
			return prices, nil
		},
	})
	defer l.Close()

	ids := []string{"p-1", "p-2", "p-3", "p-4", "p-5", "p-6", "p-7", "p-\xff"}
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { _, errs[i] = l.Get(context.Background(), id) })
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("failed Gets:", failed, "LoadMany calls:", len(sizes), "first of", sizes[0], "keys")
	// Output:
	// failed Gets: 1 LoadMany calls: 7 first of 8 keys
}

package flightcache_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flightcache/flightcache"
)

// A Limit bounds the downstream calls a Loader makes at once, for a storm
// of many distinct cold keys (a deploy, a mass expiry, a crawler) that
// single-flight cannot collapse. Here the bound is found from the
// downstream's latency, up to 100 calls at once; the other loads wait for
// a slot, as long as MaxWait (LoadTimeout by default) and their callers
// allow, and a Get that holds a value within StaleIfError is answered with
// it at once instead of waiting. A load that can wait no longer fails with
// ErrLimited, which a caller sheds like an overload.
func ExampleLimit() {
	prices, err := flightcache.New(func(ctx context.Context, id string) (Product, error) {
		return Product{ID: id, Price: 1299}, nil // the expensive downstream call
	}, flightcache.Options[string, Product]{
		TTL:          time.Minute,
		StaleIfError: time.Hour,
		Limit: flightcache.Limit{
			Adaptive: true,
			MaxLoads: 100,
		},
	})
	if err != nil {
		panic(err)
	}
	defer prices.Close()

	p, err := prices.Get(context.Background(), "p-1")
	switch {
	case errors.Is(err, flightcache.ErrLimited):
		fmt.Println("shed: 503, Retry-After") // saturated, and nothing held for p-1
	case err != nil:
		fmt.Println("error:", err)
	default:
		fmt.Println(p.Price)
	}

	// A Limit that bounds nothing is refused, not ignored.
	_, err = flightcache.New(func(ctx context.Context, id string) (Product, error) {
		return Product{}, nil
	}, flightcache.Options[string, Product]{TTL: time.Minute, Limit: flightcache.Limit{MaxQueue: 10}})
	fmt.Println(err)
	// Output:
	// 1299
	// flightcache: Options.Limit.MaxQueue is set, but nothing is bounded: set Limit.MaxLoads or Limit.Adaptive too, or leave it 0
}

package flightredis_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/flightcache/flightcache"
	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/redis/go-redis/v9"
)

type Price struct {
	SKU   string
	Cents int64
}

func fetchPrice(ctx context.Context, sku string) (Price, error) {
	return Price{SKU: sku, Cents: 1999}, nil // the expensive downstream call
}

// Every process of the fleet runs this setup with the same Redis and
// Prefix: a key that all of them miss at once is loaded by one of them.
func Example() {
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 []string{os.Getenv("REDIS_ADDR")},
		ContextTimeoutEnabled: true, // required: Options.Timeout must bound every round trip
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
	})
	defer rdb.Close()

	tier, err := flightredis.NewTier(rdb, flightredis.Options[string, Price]{Prefix: "prices:"})
	if err != nil {
		log.Fatal(err)
	}
	defer tier.Close() // after the Loader (deferred calls run last first)

	// flightcache.New hands the tier the Loader's rules (Tier.Attach).
	loader, err := flightcache.New(fetchPrice, flightcache.Options[string, Price]{
		TTL:                  time.Minute,
		Jitter:               0.1,
		StaleWhileRevalidate: 30 * time.Second,
		EarlyRefresh:         1,
		LoadTimeout:          5 * time.Second,
		Remote:               tier,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer loader.Close()

	p, err := loader.Get(context.Background(), "sku-42")
	fmt.Println(p, err)
	fmt.Printf("%+v\n", tier.Stats())
}

// A breaker whose state the fleet shares: after 5 failures seen by any
// processes, every process stops calling the downstream for OpenTimeout.
func ExampleNewBreaker() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), ContextTimeoutEnabled: true})
	defer rdb.Close()

	br, err := flightredis.NewBreaker(rdb, flightredis.BreakerOptions{
		Name:         "prices",
		Breaker:      flightcache.Breaker{ConsecutiveFailures: 5, OpenTimeout: 10 * time.Second},
		ProbeTimeout: 5 * time.Second, // the Loader's LoadTimeout
	})
	if err != nil {
		log.Fatal(err)
	}
	defer br.Close()

	loader, err := flightcache.New(fetchPrice, flightcache.Options[string, Price]{
		TTL:         time.Minute,
		LoadTimeout: 5 * time.Second,
		Breaker:     flightcache.Breaker{Custom: br},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer loader.Close()
	_, err = loader.Get(context.Background(), "sku-42")
	fmt.Println(err, loader.Stats().Breaker)
}

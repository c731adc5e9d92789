package flightpg_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/flightcache/flightcache"
	flightpg "github.com/flightcache/flightcache/postgres"
	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/redis/go-redis/v9"
)

// A fleet: every process runs this, with the same Redis, slot and lease
// key. One Source reads the slot and invalidates through its Loader,
// whose Redis tier drops the key in every process holding it; the others
// stand by and take over, from the slot's confirmed position, when the
// holder closes or dies. The last process to close drops the slot.
//
// (This example has no output: it compiles, and runs only against a
// PostgreSQL and a Redis.)
func ExampleNewRedisLease() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), ContextTimeoutEnabled: true})
	defer rdb.Close()

	tier, err := flightredis.NewTier(rdb, flightredis.Options[int64, Product]{Prefix: "products:"})
	if err != nil {
		log.Fatal(err)
	}
	defer tier.Close()
	products, err := flightcache.New(loadProduct, flightcache.Options[int64, Product]{TTL: time.Hour, Remote: tier})
	if err != nil {
		log.Fatal(err)
	}
	defer products.Close()

	lease, err := flightpg.NewRedisLease(rdb, flightpg.RedisLeaseOptions{Key: "products:flightpg:lease"})
	if err != nil {
		log.Fatal(err)
	}
	src, err := flightpg.New(ctx, os.Getenv("PG_URL"), products, productKeys, flightpg.Options{
		Publication:     "products_pub",
		Slot:            "products_cache", // shared by the fleet; bound by max_slot_wal_keep_size
		DropSlotOnClose: true,             // by the last of the fleet to close
		Lease:           lease,
		OnLease: func(e flightpg.LeaseEvent) {
			log.Printf("lease %s: held here %v, holder %q", e.Reason, e.Held, e.Holder)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close() // before products: Close hands the stream over
	log.Printf("consuming here: %v", src.Lease().Held)
}

func loadProduct(ctx context.Context, id int64) (Product, error) { return Product{ID: id}, nil }

func productKeys(c flightpg.Change) (keys []int64, tags []string) {
	for _, row := range []map[string]any{c.Old, c.New} {
		if id, ok := row["id"].(int64); ok {
			keys = append(keys, id)
		}
	}
	return keys, nil
}

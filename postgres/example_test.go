package flightpg_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/flightcache/flightcache"
	flightpg "github.com/flightcache/flightcache/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Product struct {
	ID    int64
	Name  string
	Price int32
}

// A product service caches rows of products; an UPDATE typed in psql, a
// batch job or another service reaches the cache as soon as it commits.
// The server needs wal_level=logical, and once:
//
//	CREATE PUBLICATION products_pub FOR TABLE products;
//
// (This example has no output: it compiles, and runs only against a
// server.)
func ExampleNew() {
	ctx := context.Background()
	url := os.Getenv("PG_URL") // postgres://user@host/db; the user needs REPLICATION
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	products, err := flightcache.New(func(ctx context.Context, id int64) (Product, error) {
		p := Product{ID: id}
		err := pool.QueryRow(ctx, "SELECT name, price FROM products WHERE id = $1", id).Scan(&p.Name, &p.Price)
		return p, err
	}, flightcache.Options[int64, Product]{TTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	defer products.Close()

	// Each change of a products row invalidates that row's id: the old one
	// (a DELETE, an UPDATE of the key) and the new one.
	byID := func(c flightpg.Change) (keys []int64, tags []string) {
		for _, row := range []map[string]any{c.Old, c.New} {
			if id, ok := row["id"].(int64); ok {
				keys = append(keys, id)
			}
		}
		return keys, nil
	}
	src, err := flightpg.New(ctx, url, products, byID, flightpg.Options{
		Publication: "products_pub",
		OnGap:       func(g flightpg.Gap) { log.Printf("changes lost, every value distrusted: %s", g.Reason) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()

	p, err := products.Get(ctx, 42)
	log.Println(p, err, src.Stats().Lag.P99)
}

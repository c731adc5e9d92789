// Command products is a product service on PostgreSQL whose cache follows
// every committed change, whoever made it: an UPDATE typed in psql reaches
// the cache of every process running it within milliseconds.
//
//	export PG_URL=$(bash postgres/testdata/start-postgres.sh)
//	go run ./postgres/examples/products &
//	psql "$PG_URL" -c "UPDATE products SET price = 7.50 WHERE id = 1" && curl localhost:8080/products/1
//
// It creates the table products (id, name, price) with three rows and the
// publication products_pub if they are missing, serves GET /products/{id}
// from a flightcache Loader (a TTL of an hour: without the change stream,
// a row changed elsewhere would be served old for that long), and runs a
// flightpg Source on a temporary slot of its own that invalidates each
// changed row's id. Start more processes on other ports (-addr :8081):
// each has its own cache and its own Source. The connection's user needs
// the REPLICATION attribute (the script's "postgres" is a superuser).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/flightcache/flightcache"
	flightpg "github.com/flightcache/flightcache/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "the address to serve on")
	url := flag.String("url", os.Getenv("PG_URL"), "the PostgreSQL URL (default $PG_URL)")
	flag.Parse()
	if *url == "" {
		log.Fatal("products: no PostgreSQL URL: set PG_URL or -url")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, config{URL: *url, Table: "products", Publication: "products_pub"}, ln, log.Printf); err != nil {
		log.Fatal(err)
	}
}

// config says where the service's rows are.
type config struct {
	URL         string // the PostgreSQL URL
	Table       string // the products table, made with three rows when missing
	Publication string // a publication of Table, made when missing
}

// Product is one row of the table, as the service serves it.
type Product struct {
	ID    int64  `json:"id"`
	Name  string `json:"name"`
	Price string `json:"price"` // numeric(10,2), as PostgreSQL prints it
}

// run serves GET /products/{id} on ln until ctx ends, then shuts the
// server, the Source, the Loader and the pool down, in that order.
func run(ctx context.Context, cfg config, ln net.Listener, logf func(string, ...any)) error {
	defer ln.Close()
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setup(ctx, pool, cfg); err != nil {
		return err
	}

	products, err := flightcache.New(func(ctx context.Context, id int64) (Product, error) {
		p := Product{ID: id}
		err := pool.QueryRow(ctx, "SELECT name, price::text FROM "+pgx.Identifier{cfg.Table}.Sanitize()+" WHERE id = $1", id).
			Scan(&p.Name, &p.Price)
		if errors.Is(err, pgx.ErrNoRows) {
			return p, flightcache.ErrNotFound
		}
		return p, err
	}, flightcache.Options[int64, Product]{TTL: time.Hour, NotFoundTTL: time.Hour})
	if err != nil {
		return err
	}
	defer products.Close()

	// Each committed change of a row invalidates its id: the old one (a
	// DELETE, an UPDATE of the key) and the new one.
	byID := func(c flightpg.Change) (ids []int64, tags []string) {
		for _, row := range []map[string]any{c.Old, c.New} {
			if id, ok := row["id"].(int64); ok {
				ids = append(ids, id)
			}
		}
		return ids, nil
	}
	src, err := flightpg.New(ctx, cfg.URL, products, byID, flightpg.Options{
		Publication: cfg.Publication,
		OnError:     func(err error) { logf("products: change stream: %v", err) },
		OnGap:       func(g flightpg.Gap) { logf("products: changes lost, every value distrusted: %s", g.Reason) },
	})
	if err != nil {
		return err
	}
	defer src.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /products/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			http.Error(w, "the id must be an integer", http.StatusBadRequest)
			return
		}
		p, info, err := products.GetInfo(r.Context(), id)
		switch {
		case errors.Is(err, flightcache.ErrNotFound):
			http.Error(w, "no such product", http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Cache", info.Source.String())
		_ = json.NewEncoder(w).Encode(p)
	})
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- server.Serve(ln) }()
	logf("products: serving http://%s/products/{id}, invalidated from publication %s (slot %s)", ln.Addr(), cfg.Publication, src.Slot())

	select {
	case err = <-served:
	case <-ctx.Done():
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = server.Shutdown(shut)
		<-served
	}
	return err
}

// setup makes the table, with three rows, and its publication, when
// missing.
func setup(ctx context.Context, pool *pgxpool.Pool, cfg config) error {
	table := pgx.Identifier{cfg.Table}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+table+` (id int8 PRIMARY KEY, name text NOT NULL, price numeric(10,2) NOT NULL);
		INSERT INTO `+table+` VALUES (1, 'desk lamp', 24.90), (2, 'notebook', 3.50), (3, 'fountain pen', 18.00)
		ON CONFLICT (id) DO NOTHING`); err != nil {
		return fmt.Errorf("products: setup: %w", err)
	}
	var found bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)", cfg.Publication).Scan(&found); err != nil {
		return fmt.Errorf("products: setup: %w", err)
	}
	if !found {
		if _, err := pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{cfg.Publication}.Sanitize()+" FOR TABLE "+table); err != nil {
			return fmt.Errorf("products: setup: %w", err)
		}
	}
	return nil
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pgURL returns the test server's URL (PG_URL, from
// postgres/testdata/start-postgres.sh); without it the test is skipped,
// except under CI (CI=true), where it fails.
func pgURL(t *testing.T) string {
	t.Helper()
	url := os.Getenv("PG_URL")
	if url == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PG_URL is not set: CI must start a PostgreSQL (postgres/testdata/start-postgres.sh)")
		}
		t.Skip("PG_URL is not set: start one with postgres/testdata/start-postgres.sh to run this test")
	}
	return url
}

// service is one process of the example, run in the test.
type service struct {
	base string
	stop context.CancelFunc
	done chan error
}

func startService(t *testing.T, cfg config) *service {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &service{base: "http://" + ln.Addr().String(), stop: stop, done: make(chan error, 1)}
	go func() { s.done <- run(ctx, cfg, ln, t.Logf) }()
	t.Cleanup(func() {
		s.stop()
		select {
		case err := <-s.done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("run did not return within 30s of its context's end")
		}
	})
	return s
}

// get asks s for product id, once it serves (run starts serving after
// its setup and its Source), within the deadline.
func (s *service) get(t *testing.T, ctx context.Context, id int64) (Product, string) {
	t.Helper()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/products/%d", s.base, id), nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			defer resp.Body.Close()
			var p Product
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /products/%d: %s", id, resp.Status)
			}
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatal(err)
			}
			return p, resp.Header.Get("X-Cache")
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET /products/%d: %v (and %v)", id, err, ctx.Err())
		case <-time.After(20 * time.Millisecond): // the server is not listening yet: run's Source is starting
		}
	}
}

// The README's flow: two processes serve a product from their caches; an
// UPDATE made outside them (plain pgx, as psql would) reaches both, each
// within the deadline, without waiting for the TTL (an hour).
func TestUpdateOutsideReachesEveryProcess(t *testing.T) {
	url := pgURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := time.Now().UnixNano() % 1e9
	cfg := config{URL: url, Table: fmt.Sprintf("products_example_%d", n), Publication: fmt.Sprintf("products_example_pub_%d", n)}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+cfg.Publication)
		_, _ = conn.Exec(context.Background(), "DROP TABLE IF EXISTS "+cfg.Table)
	})

	a := startService(t, cfg)
	if p, _ := a.get(t, ctx, 1); p.Price != "24.90" {
		t.Fatalf("first GET: %+v, want price 24.90", p)
	}
	b := startService(t, cfg) // the table and publication exist now
	for _, s := range []*service{a, b} {
		if p, _ := s.get(t, ctx, 1); p.Price != "24.90" {
			t.Fatalf("GET: %+v, want price 24.90", p)
		}
		if p, cache := s.get(t, ctx, 1); p.Price != "24.90" || cache != "hit" {
			t.Fatalf("GET again: %+v, X-Cache %q; want price 24.90, a hit", p, cache)
		}
	}

	if _, err := conn.Exec(ctx, "UPDATE "+cfg.Table+" SET price = 7.50 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	const within = 5 * time.Second // the lag is milliseconds; a loaded machine under -race gets room
	for name, s := range map[string]*service{"a": a, "b": b} {
		wait, done := context.WithTimeout(ctx, within)
		for {
			p, _ := s.get(t, wait, 1)
			if p.Price == "7.50" {
				t.Logf("process %s served the new price %v after the commit", name, time.Since(committed).Round(time.Millisecond))
				break
			}
			if p.Price != "24.90" {
				t.Fatalf("process %s: %+v", name, p)
			}
			select {
			case <-wait.Done():
				t.Fatalf("process %s still served price %s %v after the UPDATE committed", name, p.Price, within)
			case <-time.After(time.Millisecond):
			}
		}
		done()
	}
}

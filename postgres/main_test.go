package flightpg

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pgURL returns the URL of the PostgreSQL the tests use (PG_URL, started by
// testdata/start-postgres.sh). Without it the test is skipped, except under
// CI (CI=true), where a missing PostgreSQL fails the run.
func pgURL(t testing.TB) string {
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

// deadline returns a context for one step of a test (a Get, a query), which
// a loaded 2-core machine under -race finishes well within.
func deadline(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect returns a plain connection to the test server, closed when the
// test ends.
func connect(t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(deadline(t), pgURL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The server start-postgres.sh starts decodes logical changes.
func TestServerDecodesLogicalChanges(t *testing.T) {
	conn := connect(t)
	var level string
	if err := conn.QueryRow(deadline(t), "show wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("wal_level = %q; want logical", level)
	}
}

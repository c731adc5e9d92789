package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs the test binary as a process of the fleet when it is
// started as one (the fleet re-executes its own binary: here, this one).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-child" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// servers returns the PostgreSQL and the Redis the test uses (PG_URL and
// REDIS_ADDR). Without them the test is skipped, except under CI
// (CI=true), where a missing server fails the run.
func servers(t *testing.T) (url, addr string) {
	t.Helper()
	url, addr = os.Getenv("PG_URL"), os.Getenv("REDIS_ADDR")
	if url == "" || addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PG_URL and REDIS_ADDR must be set under CI (postgres/testdata/start-postgres.sh, redis/testdata/start-redis.sh)")
		}
		t.Skip("PG_URL and REDIS_ADDR are not set")
	}
	return url, addr
}

// A short fleet run: every outside update reaches the consumer, each is
// timed to the last process's drop, and no process serves a row older
// than its last commit once the slowest update had reached every
// process.
func TestFleetFollowsAnOutsideWriter(t *testing.T) {
	url, addr := servers(t)
	cfg, err := parseFlags([]string{"-url", url, "-redis", addr, "-n", "300", "-rate", "300",
		"-rows", "100", "-procs", "2", "-readers", "4", "-reads", "100"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := measure(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case r.skipped != 0 || r.missing != 0:
		t.Errorf("updates the consumer never saw %d, never invalidated %d; want 0 and 0", r.skipped, r.missing)
	case len(r.lags) != cfg.n:
		t.Errorf("%d updates timed; want %d", len(r.lags), cfg.n)
	case r.reads == 0:
		t.Error("no read recorded")
	case r.staleAtMax != 0:
		t.Errorf("%d reads older than their row's last commit once the slowest update (%v) had reached every process; want 0",
			r.staleAtMax, r.lags[len(r.lags)-1])
	}
}

// The control: without the Source, no update reaches the fleet, and
// reads of old rows are counted.
func TestFleetWithoutSourceServesOld(t *testing.T) {
	url, addr := servers(t)
	cfg, err := parseFlags([]string{"-url", url, "-redis", addr, "-n", "200", "-rate", "400",
		"-rows", "100", "-procs", "2", "-readers", "4", "-reads", "100", "-control"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := measure(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.lags) != 0 || r.stale == 0 {
		t.Errorf("without the Source: %d updates timed, %d old reads; want 0 timed and some old", len(r.lags), r.stale)
	}
}

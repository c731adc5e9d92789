package flightpg

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/jackc/pgx/v5/pgxpool"
)

// An outside writer (plain pgx, not the cache) updates rows while readers
// Get them: once the Source has applied an update, no Get that starts
// afterwards returns the row from before it, whatever was cached or
// loading. Each row's price is its version; the writer waits for its
// commit to be applied (Source.Wait), then publishes the version as the
// least any later Get may return. (docs/design.md, rule 34: a change is
// applied once its commit is visible.)
func TestOutsideWriterIsNeverServedOld(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	const rows, updates, readers = 40, 600, 8
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, $1::int) g", rows)

	pool, err := pgxpool.New(deadline(t), pgURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	load := func(ctx context.Context, id int64) (int32, error) {
		var price int32
		err := pool.QueryRow(ctx, "SELECT price FROM "+tbl+" WHERE id = $1", id).Scan(&price)
		return price, err
	}
	l, err := flightcache.New(load, flightcache.Options[int64, int32]{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	src := start(t, l, byID, Options{Publication: pub})

	var applied [rows + 1]atomic.Int32 // per row, the version every later Get must reach
	var stale, gets atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			// Each reader Gets about once a millisecond: a busy service's
			// pace, which leaves the 2 cores to the writer and the Source.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				id := rand.Int64N(rows) + 1
				least := applied[id].Load()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				v, err := l.Get(ctx, id)
				cancel()
				gets.Add(1)
				if err != nil {
					t.Errorf("Get(%d): %v", id, err)
					return
				}
				if v < least {
					stale.Add(1)
				}
			}
		})
	}

	waits := make([]time.Duration, 0, updates)
	for i := range updates {
		id := int64(i%rows + 1)
		var version int32
		if err := conn.QueryRow(deadline(t), "UPDATE "+tbl+" SET price = price + 1 WHERE id = $1 RETURNING price", id).Scan(&version); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		if err := src.Wait(deadline(t), walNow(t, conn)); err != nil {
			t.Fatal(err)
		}
		waits = append(waits, time.Since(committed))
		applied[id].Store(version)
		if v, err := l.Get(deadline(t), id); err != nil || v < version {
			t.Errorf("the writer's own Get(%d) after its update %d was applied = %d, %v", id, version, v, err)
		}
	}
	close(stop)
	wg.Wait()

	if n := stale.Load(); n != 0 {
		t.Errorf("%d of %d Gets returned a row older than an update already applied; want 0", n, gets.Load())
	}
	slices.Sort(waits)
	st := src.Stats()
	t.Logf("%d updates, %d Gets by %d readers: %d old rows served; commit->Wait returned p50 %v p99 %v; "+
		"Source lag (commit->applied, last %d) p50 %v p99 %v max %v; %d transactions arrived before they were visible",
		updates, gets.Load(), readers, stale.Load(), waits[len(waits)/2], waits[len(waits)*99/100],
		st.Lag.Samples, st.Lag.P50, st.Lag.P99, st.Lag.Max, st.NotYetVisible)
}

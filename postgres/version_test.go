package flightpg

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/jackc/pgx/v5"
)

// priced is a row of the tests' table as a Loader holds it, with the WAL
// position it was read at as its version.
type priced struct {
	price int32
	lsn   uint64
}

// replicaLoader loads rows of a table from the primary, or, while lagging
// is set, from a "replica" that has not replayed anything committed after
// it was frozen: a REPEATABLE READ transaction whose snapshot was taken
// before. Each row's version is the WAL position read before it, in the
// same snapshot (a replica's pg_last_wal_replay_lsn()).
type replicaLoader struct {
	table   string
	mu      sync.Mutex // guards the connections and lagging
	primary *pgx.Conn
	replica pgx.Tx // the frozen snapshot
	at      uint64 // its position
	lagging bool
}

// freeze takes the replica's snapshot now.
func (r *replicaLoader) freeze(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	tx, err := conn.BeginTx(deadline(t), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var s string
	if err := tx.QueryRow(deadline(t), "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		t.Fatal(err)
	}
	at, err := ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.replica, r.at = tx, uint64(at)
	r.mu.Unlock()
}

func (r *replicaLoader) lag(on bool) {
	r.mu.Lock()
	r.lagging = on
	r.mu.Unlock()
}

func (r *replicaLoader) load(ctx context.Context, id int64) (priced, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var p priced
	if r.lagging {
		p.lsn = r.at
		err := r.replica.QueryRow(ctx, "SELECT price FROM "+r.table+" WHERE id = $1", id).Scan(&p.price)
		return p, err
	}
	// READ COMMITTED: the row's statement sees everything the position's did.
	var s string
	if err := r.primary.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return p, err
	}
	at, err := ParseLSN(s)
	if err != nil {
		return p, err
	}
	p.lsn = uint64(at)
	err = r.primary.QueryRow(ctx, "SELECT price FROM "+r.table+" WHERE id = $1", id).Scan(&p.price)
	return p, err
}

// An UPDATE is applied while a replica has not replayed it: a Get that
// starts after the invalidation and reads the replica gets the old row.
// With Options.Version (the commit position) the Source leaves the key a
// tombstone (Loader.InvalidateVersion, docs/design.md rule 41): the old row
// is not stored, and once the replica has caught up the next Get reads
// the new one. With Invalidate alone the old row stays until its TTL.
func TestLaggingReplicaNeverStoresTheRowBeforeTheChange(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'lamp', 10)")
	rl := &replicaLoader{table: tbl, primary: connect(t)}
	products, err := flightcache.New(rl.load, flightcache.Options[int64, priced]{
		TTL:     time.Hour,
		Version: func(p priced) uint64 { return p.lsn },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer products.Close()
	src := start(t, products, byID, Options{Publication: pub, Version: CommitVersion})
	get := func() (priced, flightcache.Source) {
		t.Helper()
		v, info, err := products.GetInfo(deadline(t), 1)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		return v, info.Source
	}
	if v, _ := get(); v.price != 10 {
		t.Fatalf("first Get: price %d, want 10", v.price)
	}

	rl.freeze(t, connect(t)) // the replica stops replaying here
	exec(t, conn, "UPDATE "+tbl+" SET price = 20 WHERE id = 1")
	caughtUp(t, src, conn)

	rl.lag(true)
	if v, _ := get(); v.price != 10 {
		t.Fatalf("Get from the lagging replica: price %d, want 10 (what it has)", v.price)
	}
	rl.lag(false) // the replica caught up
	if v, from := get(); v.price != 20 {
		t.Fatalf("Get after the replica caught up: price %d (%v), want 20: the replica's row from before the applied UPDATE was stored", v.price, from)
	}
	if got := products.Stats().WritesOutdated; got != 1 {
		t.Fatalf("WritesOutdated = %d, want 1 (the replica's row)", got)
	}
	if st := src.Stats(); st.Versioned != 1 {
		t.Fatalf("Stats.Versioned = %d, want 1", st.Versioned)
	}
}

// versionRecorder is a recorder that also takes versions.
type versionRecorder struct {
	recorder
	tombstones map[int64]uint64 // the last InvalidateVersion of each key
}

func (r *versionRecorder) InvalidateVersion(k int64, v uint64) {
	r.mu.Lock()
	if r.tombstones == nil {
		r.tombstones = make(map[int64]uint64)
	}
	r.tombstones[k] = v
	r.mu.Unlock()
}

// A key named by several changes of a transaction is invalidated once,
// with the highest version; a change with no version (a DELETE, for a
// version column) is a plain Invalidate.
func TestVersionColumnTakesTheHighestOfATransaction(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'a', 1), (2, 'b', 1)")
	target := &versionRecorder{}
	src := start(t, target, byID, Options{Publication: pub, Version: ColumnVersion("price")})
	exec(t, conn, "BEGIN; UPDATE "+tbl+" SET price = 5 WHERE id = 1; UPDATE "+tbl+" SET price = 9 WHERE id = 1; UPDATE "+
		tbl+" SET price = 7 WHERE id = 1; DELETE FROM "+tbl+" WHERE id = 2; COMMIT")
	caughtUp(t, src, conn)
	keys, _ := target.take()
	target.mu.Lock()
	tombstones := target.tombstones
	target.mu.Unlock()
	if len(keys) != 1 || keys[0] != 2 || len(tombstones) != 1 || tombstones[1] != 9 {
		t.Fatalf("Invalidate %v, InvalidateVersion %v; want Invalidate [2], InvalidateVersion map[1:9]", keys, tombstones)
	}
	if st := src.Stats(); st.Invalidations != 2 || st.Versioned != 1 {
		t.Fatalf("Invalidations %d, Versioned %d; want 2 and 1", st.Invalidations, st.Versioned)
	}
}

// Options.Version needs a target that can keep a tombstone.
func TestVersionNeedsAVersionTarget(t *testing.T) {
	_, err := New(deadline(t), pgURL(t), &recorder{}, byID, Options{Publication: "none", Version: CommitVersion})
	if err == nil || !strings.Contains(err.Error(), "Options.Version") {
		t.Fatalf("New: %v, want an error naming Options.Version", err)
	}
}

func TestColumnVersion(t *testing.T) {
	at := time.Unix(0, 42)
	for _, tc := range []struct {
		row  map[string]any
		want uint64
	}{
		{map[string]any{"v": int16(3)}, 3},
		{map[string]any{"v": int32(4)}, 4},
		{map[string]any{"v": int64(5)}, 5},
		{map[string]any{"v": at}, 42},
		{map[string]any{"v": int64(-1)}, 0},
		{map[string]any{"v": nil}, 0},
		{map[string]any{"v": "7"}, 0},
		{map[string]any{}, 0},
		{nil, 0},
	} {
		if got := ColumnVersion("v")(Change{New: tc.row}); got != tc.want {
			t.Errorf("ColumnVersion(%v) = %d, want %d", tc.row, got, tc.want)
		}
	}
	if got := CommitVersion(Change{LSN: 41}); got != 42 {
		t.Errorf("CommitVersion(LSN 41) = %d, want 42", got)
	}
}

package flightpg

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// restartRows is how many rows a warm restart test holds; the first
// restartChanged of them change while no process reads the slot.
const restartRows, restartChanged = 2000, 1000

// restartRig is a table of restartRows rows (price 0) and what the
// processes of a warm restart test share: the pool their loads read with,
// and a count of the loads.
type restartRig struct {
	t        *testing.T
	conn     *pgx.Conn
	tbl, pub string
	slot     string
	pool     *pgxpool.Pool
	loads    atomic.Int64
}

func newRestartRig(t *testing.T) *restartRig {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, $1::int) g", restartRows)
	pool, err := pgxpool.New(deadline(t), pgURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := &restartRig{t: t, conn: conn, tbl: tbl, pub: pub, slot: testSlot(), pool: pool}
	t.Cleanup(func() { // the slot outlives each Source by design: drop it with the test
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", r.slot)
	})
	return r
}

// loader is a process's Loader: TTL an hour, so nothing but an
// invalidation drops a value during the test.
func (r *restartRig) loader() *flightcache.Loader[int64, int32] {
	load := func(ctx context.Context, id int64) (int32, error) {
		r.loads.Add(1)
		var price int32
		err := r.pool.QueryRow(ctx, "SELECT price FROM "+r.tbl+" WHERE id = $1", id).Scan(&price)
		return price, err
	}
	l, err := flightcache.New(load, flightcache.Options[int64, int32]{TTL: time.Hour})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = l.Close() })
	return l
}

// source starts a process's Source on the rig's permanent slot, kept on
// Close.
func (r *restartRig) source(target Target[int64], resume LSN, log *errorLog) *Source[int64] {
	opts := Options{Publication: r.pub, Slot: r.slot, Resume: resume}
	if log != nil {
		opts.OnGap = log.onGap
	}
	src, err := New(deadline(r.t), pgURL(r.t), target, byID, opts)
	if err != nil {
		r.t.Fatalf("New: %v", err)
	}
	r.t.Cleanup(func() { _ = src.Close() })
	return src
}

// getAll Gets every row (a deadline on each) and returns how many were
// served a price older than the row's: once changed, rows
// 1..restartChanged are at 1, the others at 0.
func (r *restartRig) getAll(l *flightcache.Loader[int64, int32], changed bool) (old int) {
	r.t.Helper()
	for id := int64(1); id <= restartRows; id++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		price, err := l.Get(ctx, id)
		cancel()
		if err != nil {
			r.t.Fatalf("Get(%d): %v", id, err)
		}
		want := int32(0)
		if changed && id <= restartChanged {
			want = 1
		}
		if price < want {
			old++
		}
	}
	return old
}

// snapshot is what a process saves at shutdown: its Source's applied
// position and its Loader's entries, encoded as a file would hold them.
type snapshot struct {
	LSN     LSN
	Entries []flightcache.Entry[int64, int32]
}

func (r *restartRig) save(lsn LSN, l *flightcache.Loader[int64, int32]) []byte {
	snap := snapshot{LSN: lsn, Entries: slices.Collect(l.Entries())}
	b, err := json.Marshal(snap)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

func (r *restartRig) restore(b []byte, l *flightcache.Loader[int64, int32]) LSN {
	var snap snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		r.t.Fatal(err)
	}
	n, err := l.Restore(slices.Values(snap.Entries))
	if err != nil || n != restartRows {
		r.t.Fatalf("Restore: %d stored, %v; want %d", n, err, restartRows)
	}
	return snap.LSN
}

// firstProcess runs a process until its shutdown: it loads every row,
// closes its Source, then saves the Source's applied position and the
// Loader's entries, in that order.
func (r *restartRig) firstProcess() []byte {
	l := r.loader()
	src := r.source(l, 0, nil)
	if old := r.getAll(l, false); old != 0 {
		r.t.Fatalf("first process: %d old", old)
	}
	caughtUp(r.t, src, r.conn)
	if err := src.Close(); err != nil {
		r.t.Fatal(err)
	}
	b := r.save(src.Applied(), l)
	_ = l.Close()
	return b
}

// change updates rows 1..restartChanged (price 1), one transaction each,
// while no process reads the slot.
func (r *restartRig) change() {
	for id := 1; id <= restartChanged; id++ {
		exec(r.t, r.conn, "UPDATE "+r.tbl+" SET price = 1 WHERE id = $1", id)
	}
}

// A process snapshots and stops; 1,000 rows change; a new process
// restores the snapshot into its Loader, starts its Source from the
// snapshot's position on the same permanent slot (Options.Resume), and
// serves once CatchUp returns: none of the changed rows is served old,
// and every untouched row is a hit (only the changed rows load).
// (docs/design.md, rule 35.)
func TestWarmRestartCatchesUpBeforeServing(t *testing.T) {
	r := newRestartRig(t)
	saved := r.firstProcess()
	r.change()

	l := r.loader()
	lsn := r.restore(saved, l)
	var log errorLog
	src := r.source(l, lsn, &log)
	caught, err := src.CatchUp(deadline(t))
	if err != nil {
		t.Fatalf("CatchUp: %v", err)
	}
	st := src.Stats()
	_, gaps := log.snapshot()
	if !st.Resumed || st.Gaps != 0 || len(gaps) != 0 || st.InvalidateAlls != 0 {
		t.Fatalf("Stats %+v, gaps %v; want Resumed, no gap, no InvalidateAll", st, gaps)
	}
	loadsBefore := r.loads.Load()
	if old := r.getAll(l, true); old != 0 {
		t.Errorf("%d of the %d rows changed while down served old after CatchUp; want 0", old, restartChanged)
	}
	if loads := r.loads.Load() - loadsBefore; loads != restartChanged {
		t.Errorf("%d loads; want %d (the changed rows; every untouched row a hit)", loads, restartChanged)
	}
	t.Logf("resumed at %v, caught up to %v: %d changes, %d invalidations", lsn, caught, st.Changes, st.Invalidations)
}

// The twin without the catch-up: the same snapshot restored into a Loader
// that serves at once, no Source reading the slot, serves every changed
// row old (until its TTL).
func TestWarmRestartWithoutCatchUpServesOld(t *testing.T) {
	r := newRestartRig(t)
	saved := r.firstProcess()
	r.change()

	l := r.loader()
	r.restore(saved, l)
	if old := r.getAll(l, true); old != restartChanged {
		t.Errorf("%d served old without the catch-up; want all %d (what the catch-up prevents)", old, restartChanged)
	}
	if loads := r.loads.Load(); loads != restartRows {
		t.Errorf("%d loads in all; want %d (the first process's only)", loads, restartRows)
	}
}

// A snapshot whose position the slot was confirmed past (here taken while
// its Source ran on, and applied the 1,000 changes before it stopped)
// cannot be replayed from: the restarted Source says so (a gap, Resumed
// false) and distrusts the restored entries, so none is served old. Its
// twin without Options.Resume resumes where the slot was confirmed, after
// the changes, and serves every one of them old.
func TestWarmRestartFromAPositionTheSlotPassedIsAGap(t *testing.T) {
	for _, resume := range []bool{true, false} {
		name := map[bool]string{true: "Resume", false: "without Resume"}[resume]
		t.Run(name, func(t *testing.T) {
			r := newRestartRig(t)
			first := r.loader()
			src := r.source(first, 0, nil)
			if old := r.getAll(first, false); old != 0 {
				t.Fatalf("first process: %d old", old)
			}
			caughtUp(t, src, r.conn)
			saved := r.save(src.Applied(), first) // too early: the Source runs on
			r.change()
			caughtUp(t, src, r.conn)
			at := src.Applied()
			eventually(t, "the slot confirmed past the changes", func() bool { return src.Stats().ConfirmedLSN >= at })
			if err := src.Close(); err != nil {
				t.Fatal(err)
			}
			_ = first.Close()

			l := r.loader()
			lsn := r.restore(saved, l)
			var log errorLog
			if !resume {
				lsn = 0
			}
			again := r.source(l, lsn, &log)
			if _, err := again.CatchUp(deadline(t)); err != nil {
				t.Fatalf("CatchUp: %v", err)
			}
			st := again.Stats()
			_, gaps := log.snapshot()
			old := r.getAll(l, true)
			if !resume {
				if old != restartChanged || st.Gaps != 0 {
					t.Errorf("%d served old, %d gaps; want all %d old, no gap known (what Resume prevents)", old, st.Gaps, restartChanged)
				}
				return
			}
			if st.Resumed || st.Gaps != 1 || len(gaps) != 1 || st.InvalidateAlls != 1 {
				t.Errorf("Stats %+v, gaps %v; want not Resumed, 1 gap, 1 InvalidateAll", st, gaps)
			}
			if old != 0 {
				t.Errorf("%d of the %d rows changed served old after a gap; want 0", old, restartChanged)
			}
			if len(gaps) == 1 {
				t.Logf("gap: %s", gaps[0].Reason)
			}
		})
	}
}

// A snapshot restored where its slot is gone (dropped while the process
// was down) is a gap too: the slot is created anew, and nothing restored
// answers.
func TestWarmRestartOnAMissingSlotIsAGap(t *testing.T) {
	r := newRestartRig(t)
	saved := r.firstProcess()
	r.change()
	exec(t, r.conn, "SELECT pg_drop_replication_slot($1)", r.slot)

	l := r.loader()
	lsn := r.restore(saved, l)
	var log errorLog
	src := r.source(l, lsn, &log)
	st := src.Stats()
	if st.Resumed || st.Gaps != 1 || l.Len() != 0 {
		t.Errorf("Stats %+v, %d entries held; want not Resumed, 1 gap, nothing held", st, l.Len())
	}
	if old := r.getAll(l, true); old != 0 {
		t.Errorf("%d served old; want 0", old)
	}
}

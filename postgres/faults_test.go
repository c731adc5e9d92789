package flightpg

import (
	"fmt"
	osexec "os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// testSlot returns a permanent slot name unique to the test.
func testSlot() string { return fmt.Sprintf("flightpg_test_%d", time.Now().UnixNano()%1e12) }

// terminate ends the walsender reading slot and returns its pid (0 when
// none was reading).
func terminate(t testing.TB, conn *pgx.Conn, slot string) int {
	t.Helper()
	var pid *int
	err := conn.QueryRow(deadline(t), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
	if err != nil {
		t.Fatalf("look up slot %s: %v", slot, err)
	}
	if pid == nil {
		return 0
	}
	exec(t, conn, "SELECT pg_terminate_backend($1)", *pid)
	return *pid
}

// slotState returns whether slot exists, whether a connection reads it,
// and its confirmed_flush_lsn.
func slotState(t testing.TB, conn *pgx.Conn, slot string) (exists, active bool, confirmed LSN) {
	t.Helper()
	var lsn *string
	err := conn.QueryRow(deadline(t),
		`SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active, &lsn)
	if err == pgx.ErrNoRows {
		return false, false, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	if lsn != nil {
		if confirmed, err = ParseLSN(*lsn); err != nil {
			t.Fatal(err)
		}
	}
	return true, active, confirmed
}

// With a permanent slot, a replication connection ended by the server
// (pg_terminate_backend of its walsender) is made again and the stream
// resumes where it was applied: every change committed meanwhile is
// applied, none is skipped, and nothing is distrusted (docs/design.md,
// rule 34).
func TestReconnectResumesWithoutSkipping(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, 300) g")
	slot := testSlot()
	var log errorLog
	target := &recorder{}
	src := start(t, target, byID, Options{
		Publication: pub, Slot: slot, DropSlotOnClose: true,
		Reconnect: Reconnect{InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond},
		OnError:   log.onError, OnGap: log.onGap,
	})
	_, allsAtStart := target.take()

	const rounds, perRound = 3, 100
	for r := range rounds {
		// Half the round's updates before the walsender is cut, half while
		// the Source reconnects.
		for i := range perRound {
			if i == perRound/2 {
				if terminate(t, conn, slot) == 0 {
					t.Fatalf("round %d: no walsender reads slot %s", r, slot)
				}
			}
			exec(t, conn, "UPDATE "+tbl+" SET price = price + 1 WHERE id = $1", r*perRound+i+1)
		}
		eventually(t, fmt.Sprintf("reconnect %d", r+1), func() bool { return src.Stats().Reconnects >= uint64(r+1) })
	}
	caughtUp(t, src, conn)

	keys, alls := target.take()
	keys = slices.Compact(keys)
	if len(keys) != rounds*perRound || keys[0] != 1 || keys[len(keys)-1] != rounds*perRound {
		t.Errorf("invalidated %d distinct keys (%v...); want every one of 1..%d", len(keys), keys[:min(len(keys), 5)], rounds*perRound)
	}
	st := src.Stats()
	errs, gaps := log.snapshot()
	if alls != allsAtStart || st.Gaps != 0 || len(gaps) != 0 {
		t.Errorf("%d InvalidateAll, %d gaps %v; want %d (New's), none", alls, st.Gaps, gaps, allsAtStart)
	}
	if st.Reconnects < rounds || len(errs) < rounds {
		t.Errorf("Stats %+v, %d errors reported; want at least %d reconnects and as many errors", st, len(errs), rounds)
	}
	t.Logf("%d changes read for %d updates (replayed: %d); %d reconnects; lag p50 %v p99 %v",
		st.Changes, rounds*perRound, int(st.Changes)-rounds*perRound, st.Reconnects, st.Lag.P50, st.Lag.P99)
}

// PostgreSQL restarted (a fast shutdown, then a start on the same port)
// while a writer commits: the Source reconnects once the server is back
// and resumes on its permanent slot; no change is skipped and nothing is
// distrusted.
func TestServerRestartResumesWithoutSkipping(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	const rows = 100
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, $1::int) g", rows)
	slot := testSlot()
	var log errorLog
	target := &recorder{}
	src := start(t, target, byID, Options{
		Publication: pub, Slot: slot, DropSlotOnClose: true,
		Reconnect: Reconnect{InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond},
		OnError:   log.onError, OnGap: log.onGap,
	})
	_, allsAtStart := target.take()
	for id := 1; id <= rows/2; id++ {
		exec(t, conn, "UPDATE "+tbl+" SET price = price + 1 WHERE id = $1", id)
	}
	if out, err := osexec.Command("bash", "testdata/start-postgres.sh", "restart", pgURL(t)).CombinedOutput(); err != nil {
		t.Fatalf("restart the server: %v\n%s", err, out)
	}
	conn = connect(t) // the first one went with the server
	for id := rows/2 + 1; id <= rows; id++ {
		exec(t, conn, "UPDATE "+tbl+" SET price = price + 1 WHERE id = $1", id)
	}
	caughtUp(t, src, conn)

	keys, alls := target.take()
	keys = slices.Compact(keys)
	st := src.Stats()
	if len(keys) != rows || keys[0] != 1 || keys[len(keys)-1] != rows {
		t.Errorf("invalidated %d distinct keys; want every one of 1..%d", len(keys), rows)
	}
	if _, gaps := log.snapshot(); alls != allsAtStart || st.Gaps != 0 || len(gaps) != 0 || st.Reconnects < 1 {
		t.Errorf("after a server restart: %d InvalidateAll, Stats %+v, gaps %v; want %d (New's), 0 gaps, a reconnect",
			alls, st, gaps, allsAtStart)
	}
}

// A temporary slot goes with its connection: what was committed while
// the Source reconnected cannot be read, so the reconnect is a gap that
// distrusts every value and is reported.
func TestTemporarySlotReconnectIsAGap(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	var log errorLog
	target := &recorder{}
	src := start(t, target, byID, Options{Publication: pub,
		Reconnect: Reconnect{InitialInterval: 20 * time.Millisecond}, OnError: log.onError, OnGap: log.onGap})
	_, allsAtStart := target.take()
	first := src.Slot()
	terminate(t, conn, first)
	eventually(t, "a reconnect", func() bool { return src.Stats().Reconnects == 1 })

	st := src.Stats()
	_, alls := target.take()
	_, gaps := log.snapshot()
	if st.Gaps != 1 || alls != allsAtStart+1 || len(gaps) != 1 || gaps[0].Slot != src.Slot() ||
		!strings.Contains(gaps[0].Reason, "temporary") || src.Slot() == first {
		t.Errorf("after a reconnect on a temporary slot: Stats %+v, %d InvalidateAll, gaps %+v, slot %s (was %s); "+
			"want 1 gap on a new temporary slot, reported, and %d InvalidateAll", st, alls, gaps, src.Slot(), first, allsAtStart+1)
	}
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (7, 'after', 1)")
	caughtUp(t, src, conn)
	if keys, _ := target.take(); !slices.Equal(keys, []int64{7}) {
		t.Errorf("after the gap, an insert invalidated %v; want [7]", keys)
	}
}

// A permanent slot dropped while the Source was away (or invalidated by
// max_slot_wal_keep_size) cannot replay what it held: the Source makes it
// anew, distrusts every value and reports the gap.
func TestDroppedSlotIsAGap(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	role := fmt.Sprintf("flightpg_role_%d", time.Now().UnixNano()%1e9)
	exec(t, conn, "CREATE ROLE "+role+" LOGIN REPLICATION")
	t.Cleanup(func() { _, _ = conn.Exec(deadline(t), "DROP ROLE IF EXISTS "+role) })
	slot := testSlot()
	var log errorLog
	target := &recorder{}
	src, err := New(deadline(t), withUser(t, role), target, byID, Options{
		Publication: pub, Slot: slot, DropSlotOnClose: true,
		Reconnect: Reconnect{InitialInterval: 20 * time.Millisecond, MaxInterval: 100 * time.Millisecond},
		OnError:   log.onError, OnGap: log.onGap,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	_, allsAtStart := target.take()

	// Keep the Source out while its slot is dropped and a row changes.
	exec(t, conn, "ALTER ROLE "+role+" NOLOGIN")
	terminate(t, conn, slot)
	eventually(t, "the slot let go", func() bool { _, active, _ := slotState(t, conn, slot); return !active })
	exec(t, conn, "SELECT pg_drop_replication_slot($1)", slot)
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'unseen', 1)")
	exec(t, conn, "ALTER ROLE "+role+" LOGIN")
	eventually(t, "a reconnect", func() bool { return src.Stats().Reconnects == 1 })

	_, alls := target.take()
	_, gaps := log.snapshot()
	if st := src.Stats(); st.Gaps != 1 || alls != allsAtStart+1 || len(gaps) != 1 || !strings.Contains(gaps[0].Reason, "missing") {
		t.Errorf("after the slot was dropped: Stats %+v, %d InvalidateAll, gaps %+v; want 1 gap (slot missing), reported, %d InvalidateAll",
			st, alls, gaps, allsAtStart+1)
	}
	if exists, _, _ := slotState(t, conn, slot); !exists {
		t.Errorf("slot %s was not made anew", slot)
	}
}

// The position reported to the server is never past a change whose
// invalidations are not made: while the target is held inside Invalidate,
// the slot's confirmed_flush_lsn stays before the change's commit, through
// several report intervals; once released, it passes the commit.
func TestPositionIsConfirmedOnlyAfterApplied(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot := testSlot()
	target := &recorder{block: make(chan struct{})}
	src := start(t, target, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true})
	before := walNow(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'held', 1)")
	after := walNow(t, conn)

	// The real clock: the Source reports at most every statusInterval.
	end := time.Now().Add(3*statusInterval + 500*time.Millisecond)
	for time.Now().Before(end) {
		if _, _, confirmed := slotState(t, conn, slot); confirmed > before {
			t.Fatalf("confirmed_flush_lsn %v passed %v (before the insert) while its Invalidate was held", confirmed, before)
		}
		if st := src.Stats(); st.ConfirmedLSN > before || st.AppliedLSN > before {
			t.Fatalf("Stats %+v passed %v while the insert's Invalidate was held", st, before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(target.block)
	caughtUp(t, src, conn)
	eventually(t, "confirmed past the insert", func() bool {
		_, _, confirmed := slotState(t, conn, slot)
		return confirmed >= after
	})
	if keys, _ := target.take(); !slices.Equal(keys, []int64{1}) {
		t.Errorf("invalidated %v; want [1]", keys)
	}
}

// Close ends the connection and drops the slot: a temporary one with its
// connection, a permanent one when DropSlotOnClose says so; a permanent
// one is kept otherwise, and a Source started on it resumes.
func TestCloseDropsTheSlot(t *testing.T) {
	conn := connect(t)
	_, pub := table(t, conn)

	temp, err := New(deadline(t), pgURL(t), &recorder{}, byID, Options{Publication: pub})
	if err != nil {
		t.Fatal(err)
	}
	tempSlot := temp.Slot()
	if exists, active, _ := slotState(t, conn, tempSlot); !exists || !active {
		t.Fatalf("temporary slot %s: exists %v, active %v; want both", tempSlot, exists, active)
	}
	if err := temp.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the temporary slot dropped", func() bool { exists, _, _ := slotState(t, conn, tempSlot); return !exists })
	if err := temp.Wait(deadline(t), ^LSN(0)); err != ErrClosed {
		t.Errorf("Wait after Close = %v; want ErrClosed", err)
	}

	slot := testSlot()
	kept, err := New(deadline(t), pgURL(t), &recorder{}, byID, Options{Publication: pub, Slot: slot})
	if err != nil {
		t.Fatal(err)
	}
	if err := kept.Close(); err != nil {
		t.Fatal(err)
	}
	if exists, _, _ := slotState(t, conn, slot); !exists {
		t.Fatalf("slot %s is gone after Close without DropSlotOnClose", slot)
	}
	// The server lets go of the slot when the closed connection's
	// walsender has exited, in its own time.
	eventually(t, "the slot let go", func() bool { _, active, _ := slotState(t, conn, slot); return !active })
	target := &recorder{}
	again, err := New(deadline(t), pgURL(t), target, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, alls := target.take(); alls != 0 {
		t.Errorf("a Source resuming an existing slot made %d InvalidateAll; want 0", alls)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	if exists, _, _ := slotState(t, conn, slot); exists {
		t.Errorf("slot %s outlived Close with DropSlotOnClose", slot)
	}
}

package flightpg

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PostgreSQL makes a commit durable (it writes and flushes the commit
// record, which the walsender then decodes and sends) a moment before it
// makes it visible (it takes the transaction out of the list of those in
// progress, which new snapshots read). Consider the following serialized
// event ordering:
//
//  1. A writer's transaction T updates row r; its commit record is
//     flushed.
//  2. The walsender decodes T and sends it; the Source invalidates r's
//     key.
//  3. A Get of r misses; its load takes a snapshot, in which T is still in
//     progress, and reads the old row.
//  4. T becomes visible.
//  5. The load fills the cache with the old row: it started after the
//     invalidation, so rule 6 does not stop it, and nothing will
//     invalidate r again.
//
// The window between 1 and 4 is short, but not on a loaded machine: a
// descheduled backend keeps it open for milliseconds (22 of 158,964 Gets
// served an old row in a run of TestOutsideWriterIsNeverServedOld before
// this wait). So before it applies any change of a transaction, the
// Source waits, on a plain connection, until the transaction no longer
// holds the lock on its own id: a backend releases it after it has made
// the transaction visible (CommitTransaction: ProcArrayEndTransaction,
// then the locks), and PostgreSQL itself waits for a transaction's end so
// (XactLockTableWait). A snapshot's list of transactions in progress would
// not do: the newest transaction, still in progress, is past the
// snapshot's xmax and absent from its list.

// visiblePoll is the wait between two looks while a transaction is not
// visible yet.
const visiblePoll = time.Millisecond

// awaitVisible returns once the transactions xids are visible to new
// snapshots (their backends no longer hold the locks on their ids), or
// with the error of the connection or ctx: one query for a group, however
// many it has. notYet is how many were not visible at the first look.
func awaitVisible(ctx context.Context, conn *pgconn.PgConn, xids []uint32) (notYet int, err error) {
	var b strings.Builder
	b.WriteString("SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND granted AND transactionid = ANY('{")
	for i, x := range xids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(x), 10))
	}
	b.WriteString("}'::xid[])")
	q := b.String()
	for first := true; ; first = false {
		rs, err := conn.Exec(ctx, q).ReadAll()
		if err != nil {
			return notYet, fmt.Errorf("flightpg: are transactions %v visible: %w", xids, err)
		}
		if len(rs) != 1 || len(rs[0].Rows) != 1 {
			return notYet, fmt.Errorf("flightpg: are transactions %v visible: unexpected result %v", xids, rs)
		}
		n, err := strconv.Atoi(string(rs[0].Rows[0][0]))
		if err != nil {
			return notYet, fmt.Errorf("flightpg: are transactions %v visible: %w", xids, err)
		}
		if first {
			notYet = n
		}
		if n == 0 {
			return notYet, nil
		}
		t := time.NewTimer(visiblePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return notYet, ctx.Err()
		case <-t.C:
		}
	}
}

package flightpg

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var tableSeq atomic.Int64

// table creates a table of its own for the test, id int8 primary key,
// name text, price int4, and a publication of it; both are dropped when
// the test ends. It returns the table's and the publication's names.
func table(t testing.TB, conn *pgx.Conn) (name, pub string) {
	t.Helper()
	n := fmt.Sprintf("%d_%d", time.Now().UnixNano()%1e9, tableSeq.Add(1))
	name, pub = "products_"+n, "pub_"+n
	exec(t, conn, "CREATE TABLE "+name+" (id int8 PRIMARY KEY, name text, price int4)")
	exec(t, conn, "CREATE PUBLICATION "+pub+" FOR TABLE "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, pgURL(t))
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pub)
		_, _ = c.Exec(ctx, "DROP TABLE IF EXISTS "+name)
	})
	return name, pub
}

// exec runs SQL on conn or fails the test.
func exec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(deadline(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// walNow returns the server's current WAL position: every change
// committed before the call is at or before it.
func walNow(t testing.TB, conn *pgx.Conn) LSN {
	t.Helper()
	var s string
	if err := conn.QueryRow(deadline(t), "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		t.Fatal(err)
	}
	l, err := ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// caughtUp waits until src has applied every change committed so far.
func caughtUp[K comparable](t testing.TB, src *Source[K], conn *pgx.Conn) {
	t.Helper()
	if err := src.Wait(deadline(t), walNow(t, conn)); err != nil {
		t.Fatalf("Wait: %v (stats %+v)", err, src.Stats())
	}
}

// rowID returns a row's id column (int8: int64).
func rowID(row map[string]any) int64 {
	id, _ := row["id"].(int64)
	return id
}

// byID is the Mapping of the tests' tables: the row's id, old and new.
func byID(c Change) ([]int64, []string) {
	var keys []int64
	if c.Old != nil {
		keys = append(keys, rowID(c.Old))
	}
	if c.New != nil && (c.Old == nil || rowID(c.New) != rowID(c.Old)) {
		keys = append(keys, rowID(c.New))
	}
	return keys, nil
}

// recorder is a Target that records what it is told.
type recorder struct {
	mu    sync.Mutex
	keys  []int64 // every Invalidate, in order
	alls  int     // InvalidateAll calls
	block chan struct{}
}

func (r *recorder) Invalidate(k int64) {
	if r.block != nil {
		<-r.block
	}
	r.mu.Lock()
	r.keys = append(r.keys, k)
	r.mu.Unlock()
}

func (r *recorder) InvalidateAll() {
	r.mu.Lock()
	r.alls++
	r.mu.Unlock()
}

// take returns the keys invalidated since the last take, sorted, and the
// InvalidateAll calls so far.
func (r *recorder) take() ([]int64, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := slices.Clone(r.keys)
	r.keys = r.keys[:0]
	slices.Sort(keys)
	return keys, r.alls
}

// tagRecorder is a recorder that also takes tags.
type tagRecorder struct {
	recorder
	tags []string
}

func (r *tagRecorder) InvalidateTag(tag string) {
	r.mu.Lock()
	r.tags = append(r.tags, tag)
	r.mu.Unlock()
}

// start starts a Source on the test server, closed when the test ends.
func start[K comparable](t testing.TB, target Target[K], mapping Mapping[K], opts Options) *Source[K] {
	t.Helper()
	src, err := New(deadline(t), pgURL(t), target, mapping, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := src.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return src
}

// withUser returns the test server's URL with another user.
func withUser(t testing.TB, user string) string {
	t.Helper()
	u, err := url.Parse(pgURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

// errorLog collects the errors a Source reports.
type errorLog struct {
	mu   sync.Mutex
	errs []error
	gaps []Gap
}

func (l *errorLog) onError(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) onGap(g Gap) {
	l.mu.Lock()
	l.gaps = append(l.gaps, g)
	l.mu.Unlock()
}

func (l *errorLog) snapshot() ([]error, []Gap) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs), slices.Clone(l.gaps)
}

// eventually polls cond every 20ms until it holds or the test's deadline
// passes: for what the server does in its own time (a walsender exits, a
// slot is released), which no channel of ours tells.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx := deadline(t)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting: %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

package flightpg

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// slowTarget is a Target whose Invalidate takes delay, as one through the
// Redis tier takes a round trip under load. It checks, in every call,
// that the key's transaction is not reported applied while the call is
// in flight, and records each call's return.
type slowTarget struct {
	t       testing.TB
	delay   time.Duration
	src     atomic.Pointer[Source[int64]]
	panic   int64 // Invalidate of this key panics (0: none)
	block   int64 // Invalidate of this key waits for release (0: none)
	release chan struct{}

	mu       sync.Mutex
	lsnOf    map[int64]LSN // the commit LSN of each key's last change mapped
	returned map[int64]int // Invalidate calls returned, by key
	early    []string      // keys reported applied before their Invalidate returned
	alls     int
}

func newSlowTarget(t testing.TB, delay time.Duration) *slowTarget {
	return &slowTarget{t: t, delay: delay, lsnOf: map[int64]LSN{}, returned: map[int64]int{}}
}

// mapping is byID, noting each key's commit LSN.
func (s *slowTarget) mapping(c Change) ([]int64, []string) {
	keys, tags := byID(c)
	s.mu.Lock()
	for _, k := range keys {
		s.lsnOf[k] = c.LSN
	}
	s.mu.Unlock()
	return keys, tags
}

func (s *slowTarget) Invalidate(k int64) {
	s.check(k)
	if k == s.block {
		<-s.release
	}
	if k == s.panic {
		panic(fmt.Sprintf("target bug on key %d", k))
	}
	time.Sleep(s.delay) // the round trip this target stands for
	s.check(k)
	s.mu.Lock()
	s.returned[k]++
	s.mu.Unlock()
}

// check records k if the Source reports its transaction applied while
// its Invalidate has not returned: an applied position is the end of a
// transaction, past its commit LSN.
func (s *slowTarget) check(k int64) {
	src := s.src.Load()
	if src == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if at := src.Applied(); at > s.lsnOf[k] {
		s.early = append(s.early, fmt.Sprintf("key %d (commit %v) while applied was %v", k, s.lsnOf[k], at))
	}
}

func (s *slowTarget) InvalidateAll() {
	s.mu.Lock()
	s.alls++
	s.mu.Unlock()
}

// onApplied checks that every key of the transactions up to a.LSN has had
// its Invalidate return (or everything was distrusted).
func (s *slowTarget) onApplied(a Applied) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, lsn := range s.lsnOf {
		if lsn <= a.LSN && s.returned[k] == 0 && s.alls == 0 {
			s.early = append(s.early, fmt.Sprintf("key %d (commit %v) at OnApplied of %v", k, lsn, a.LSN))
		}
	}
}

// A Target whose Invalidate takes 3 ms, as the Redis tier's did under
// load: 1,000 single-row transactions committed at up to 1,000 a second
// are applied with a p99 commit -> applied lag under 1 s. One
// transaction at a time, the Invalidate calls alone take 3 s, so the
// transactions at the p99 wait about 2 s and more behind the earlier ones
// (the writer takes about 1 s; 3.6 s measured here with -race). A
// backlog is applied in groups, one visibility check per group and its
// keys invalidated 16 at a time (p99 0.2 s measured with -race, 15 ms
// without). Each transaction is reported applied only after its
// Invalidate and every earlier one returned, in commit order.
// (docs/design.md, rule 34.)
func TestBacklogIsAppliedInGroups(t *testing.T) {
	const rows, writers = 1000, 4
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, fmt.Sprintf("INSERT INTO %s SELECT g, 'p', 0 FROM generate_series(1, %d) g", tbl, rows))

	target := newSlowTarget(t, 3*time.Millisecond)
	var mu sync.Mutex
	var applied []Applied
	src := start(t, target, target.mapping, Options{Publication: pub, OnApplied: func(a Applied) {
		target.onApplied(a)
		mu.Lock()
		applied = append(applied, a)
		mu.Unlock()
	}})
	target.src.Store(src)

	// Each writer commits its share of single-row UPDATEs, together 1,000
	// a second at most.
	conns := make([]*pgx.Conn, writers)
	for w := range conns {
		conns[w] = connect(t)
	}
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(writers * time.Millisecond)
			defer tick.Stop()
			for id := w + 1; id <= rows; id += writers {
				<-tick.C
				if _, err := conns[w].Exec(deadline(t), "UPDATE "+tbl+" SET price = 1 WHERE id = $1", id); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wrote := time.Since(began)
	caughtUp(t, src, conn)

	mu.Lock()
	got := slices.Clone(applied)
	mu.Unlock()
	if len(got) != rows {
		t.Fatalf("OnApplied called %d times; want %d", len(got), rows)
	}
	lags := make([]time.Duration, len(got))
	for i, a := range got {
		lags[i] = a.Lag
		if i > 0 && a.LSN <= got[i-1].LSN {
			t.Fatalf("transaction %d applied at %v after %v: not in commit order", i, a.LSN, got[i-1].LSN)
		}
	}
	slices.Sort(lags)
	p50, p99 := lags[len(lags)/2], lags[len(lags)*99/100]
	t.Logf("%d transactions written in %v; commit -> applied p50 %v, p99 %v, max %v; stats %+v",
		rows, wrote.Round(time.Millisecond), p50, p99, lags[len(lags)-1], src.Stats())
	if p99 > time.Second {
		t.Errorf("commit -> applied p99 %v; want at most 1s", p99)
	}
	target.mu.Lock()
	defer target.mu.Unlock()
	if len(target.early) > 0 {
		t.Errorf("%d keys reported applied before their Invalidate returned, e.g. %s", len(target.early), target.early[0])
	}
	for id := int64(1); id <= rows; id++ {
		if target.returned[id] == 0 {
			t.Fatalf("key %d never invalidated", id)
		}
	}
}

// A panic in one key's Invalidate, in a group: the other keys' calls still
// run and return, every value is distrusted (InvalidateAll) before any
// transaction of the group is reported applied, the transactions reported
// with All are the group's, and the group's last position is confirmed:
// nothing of it is left to replay, as everything was dropped. (docs/design.md,
// rule 34.)
func TestPanicInAGroupDistrustsBeforeConfirming(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, 100) g")

	// Row 100's Invalidate waits: the five transactions after it are
	// received meanwhile, and applied as a group after it.
	target := newSlowTarget(t, 0)
	target.panic, target.block, target.release = 3, 100, make(chan struct{})
	var log errorLog
	var mu sync.Mutex
	var applied []Applied
	src := start(t, target, target.mapping, Options{Publication: pub, OnError: log.onError, OnApplied: func(a Applied) {
		target.onApplied(a)
		mu.Lock()
		applied = append(applied, a)
		mu.Unlock()
	}})
	target.src.Store(src)

	exec(t, conn, "UPDATE "+tbl+" SET price = 1 WHERE id = 100")
	for id := 1; id <= 5; id++ {
		exec(t, conn, fmt.Sprintf("UPDATE %s SET price = 1 WHERE id = %d", tbl, id))
	}
	last := walNow(t, conn)
	close(target.release)
	caughtUp(t, src, conn)

	eventually(t, "the group's last position confirmed", func() bool { return src.Stats().ConfirmedLSN >= last })
	st := src.Stats()
	if st.Transactions != 6 || st.Panics != 1 || st.InvalidateAlls < 1 {
		t.Errorf("stats %+v; want 6 transactions, 1 panic, an InvalidateAll", st)
	}
	mu.Lock()
	got := slices.Clone(applied)
	mu.Unlock()
	target.mu.Lock()
	defer target.mu.Unlock()
	if len(target.early) > 0 {
		t.Errorf("reported applied before invalidated: %v", target.early)
	}
	for _, id := range []int64{1, 2, 4, 5, 100} {
		if target.returned[id] != 1 {
			t.Errorf("key %d: %d Invalidate calls returned; want 1 (a panic in another key's stops none)", id, target.returned[id])
		}
	}
	if len(got) != 6 {
		t.Fatalf("OnApplied %d times: %+v; want 6", len(got), got)
	}
	alls := 0
	for _, a := range got {
		if a.All {
			alls++
		}
		if a.LSN == target.lsnOf[3] && !a.All {
			t.Errorf("the transaction whose Invalidate panicked: %+v; want All", a)
		}
	}
	t.Logf("%d of the 6 transactions reported with All (the group of the panic)", alls)
	errs, _ := log.snapshot()
	if len(errs) != 1 {
		t.Errorf("errors reported %v; want the target's panic, once", errs)
	}
}

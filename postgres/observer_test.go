package flightpg

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// watcher is an Observer (and a StatsObserver) that records what it sees;
// with panicFirst its first Applied panics.
type watcher struct {
	mu         sync.Mutex
	applied    []Applied
	gaps       []Gap
	reconnects []Reconnected
	stats      func() Stats
	panicFirst bool
}

func (w *watcher) Applied(a Applied) {
	w.mu.Lock()
	w.applied = append(w.applied, a)
	first := len(w.applied) == 1
	w.mu.Unlock()
	if first && w.panicFirst {
		panic("observer bug")
	}
}

func (w *watcher) Gap(g Gap) {
	w.mu.Lock()
	w.gaps = append(w.gaps, g)
	w.mu.Unlock()
}

func (w *watcher) Reconnected(r Reconnected) {
	w.mu.Lock()
	w.reconnects = append(w.reconnects, r)
	w.mu.Unlock()
}

func (w *watcher) ObserveStats(stats func() Stats) { w.stats = stats }

func (w *watcher) seen() (applied int, gaps []Gap, reconnects []Reconnected) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.applied), append([]Gap(nil), w.gaps...), append([]Reconnected(nil), w.reconnects...)
}

// The Observer sees every transaction applied, after OnApplied, every
// gap and reconnect; a panic in it is recovered, reported to OnError and
// counted, and skips nothing (OnApplied is called for every transaction,
// the Observer for the next). Its StatsObserver side reads Stats, whose
// LagHistogram counts every transaction applied.
func TestObserverSeesAppliedGapsAndReconnects(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, 5) g")
	w := &watcher{panicFirst: true}
	h := &hooks{}
	var log errorLog
	src := start(t, &recorder{}, byID, Options{
		Publication: pub, Observer: w, OnApplied: h.onApplied, OnError: log.onError, OnGap: log.onGap,
		Reconnect: Reconnect{InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond},
	})
	if w.stats == nil {
		t.Fatal("ObserveStats was not called")
	}
	for i := 1; i <= 5; i++ {
		exec(t, conn, "UPDATE "+tbl+" SET price = $1 WHERE id = $1", i)
	}
	caughtUp(t, src, conn)
	if n, _, _ := w.seen(); n != 5 {
		t.Fatalf("Observer.Applied called %d times, want 5", n)
	}
	if got, _ := h.snapshot(); len(got) != 5 {
		t.Fatalf("OnApplied called %d times, want 5: the Observer's panic must skip nothing", len(got))
	}
	errs, _ := log.snapshot()
	var pe *flightcache.PanicError
	if len(errs) != 1 || !errors.As(errs[0], &pe) {
		t.Fatalf("errors reported %v; want the Observer's panic, once, as a *flightcache.PanicError", errs)
	}
	st := w.stats()
	var inHist uint64
	for _, c := range st.LagHistogram.Counts {
		inHist += c
	}
	if st.ObserverPanics != 1 || st.Transactions != 5 || inHist != 5 || len(st.LagHistogram.Counts) != len(st.LagHistogram.Bounds)+1 {
		t.Fatalf("Stats: ObserverPanics %d, Transactions %d, LagHistogram %+v; want 1, 5, 5 counted",
			st.ObserverPanics, st.Transactions, st.LagHistogram)
	}

	// A temporary slot's lost connection: a gap, then a reconnect.
	if terminate(t, conn, src.Slot()) == 0 {
		t.Fatalf("no walsender reads slot %s", src.Slot())
	}
	eventually(t, "a reconnect", func() bool { _, _, r := w.seen(); return len(r) >= 1 })
	_, gaps, rs := w.seen()
	_, loggedGaps := log.snapshot()
	if len(gaps) < 1 || len(loggedGaps) != len(gaps) || rs[0].Err == nil || rs[0].Slot != src.Slot() {
		t.Fatalf("Observer saw gaps %+v (OnGap %+v), reconnects %+v; want a gap each, then the reconnect to %s",
			gaps, loggedGaps, rs, src.Slot())
	}
	if st := src.Stats(); st.Gaps != uint64(len(gaps)) || st.Reconnects < 1 {
		t.Fatalf("Stats: Gaps %d, Reconnects %d; want %d and at least 1", st.Gaps, st.Reconnects, len(gaps))
	}
}

func TestLagHistogramBuckets(t *testing.T) {
	var h lagCounts
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond, time.Millisecond + 1, 3 * time.Second, time.Minute} {
		h.add(d)
	}
	got := h.snapshot()
	want := map[int]uint64{0: 3, 1: 1, 11: 1, 13: 1} // <=1ms: -1s (as 0), 0, 1ms; <=2ms; <=5s; over 10s
	for i, c := range got.Counts {
		if c != want[i] {
			t.Errorf("bucket %d (<= %v): %d, want %d", i, got.Bounds[min(i, len(got.Bounds)-1)], c, want[i])
		}
	}
	if got.Sum != 3*time.Second+time.Minute+2*time.Millisecond+1 {
		t.Errorf("Sum = %v", got.Sum)
	}
}

package flightpg

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// hooks collects what Options.OnApplied and Options.OnReconnect report.
type hooks struct {
	mu         sync.Mutex
	applied    []Applied
	reconnects []Reconnected
	panicOnce  bool // OnApplied panics on its first call
}

func (h *hooks) onApplied(a Applied) {
	h.mu.Lock()
	h.applied = append(h.applied, a)
	first := len(h.applied) == 1
	h.mu.Unlock()
	if first && h.panicOnce {
		panic("observer bug")
	}
}

func (h *hooks) onReconnect(r Reconnected) {
	h.mu.Lock()
	h.reconnects = append(h.reconnects, r)
	h.mu.Unlock()
}

func (h *hooks) snapshot() ([]Applied, []Reconnected) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Applied(nil), h.applied...), append([]Reconnected(nil), h.reconnects...)
}

// OnApplied is told of each transaction applied, in commit order: its
// commit LSN and time, its lag, its changes, the keys and tags it
// invalidated, whether it distrusted everything. A panic in it is
// recovered and reported to OnError; the Source goes on.
func TestOnAppliedReportsEachTransaction(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, 10) g")
	h := &hooks{panicOnce: true}
	var log errorLog
	src := start(t, &recorder{}, byID, Options{Publication: pub, OnApplied: h.onApplied, OnError: log.onError})

	exec(t, conn, "UPDATE "+tbl+" SET price = 1 WHERE id = 1")             // 1 change, 1 key; OnApplied panics
	exec(t, conn, "UPDATE "+tbl+" SET price = 2 WHERE id BETWEEN 2 AND 4") // 3 changes, 3 keys
	exec(t, conn, "BEGIN; UPDATE "+tbl+" SET price = 3 WHERE id = 5; UPDATE "+tbl+" SET price = 4 WHERE id = 5; COMMIT")
	exec(t, conn, "TRUNCATE "+tbl) // unmapped: distrusts everything
	caughtUp(t, src, conn)

	got, _ := h.snapshot()
	want := []Applied{{Changes: 1, Keys: 1}, {Changes: 3, Keys: 3}, {Changes: 2, Keys: 1}, {Changes: 1, All: true}}
	if len(got) != len(want) {
		t.Fatalf("OnApplied called %d times (%+v); want %d", len(got), got, len(want))
	}
	for i, a := range got {
		w := want[i]
		if a.Changes != w.Changes || a.Keys != w.Keys || a.Tags != 0 || a.All != w.All {
			t.Errorf("transaction %d: %+v; want changes %d, keys %d, all %v", i, a, w.Changes, w.Keys, w.All)
		}
		if a.LSN == 0 || (i > 0 && a.LSN <= got[i-1].LSN) || a.CommitTime.IsZero() || a.Lag < -time.Second {
			t.Errorf("transaction %d: LSN %v (previous %v), commit time %v, lag %v; want increasing LSNs, a commit time, a lag",
				i, a.LSN, got[max(i-1, 0)].LSN, a.CommitTime, a.Lag)
		}
	}
	errs, _ := log.snapshot()
	var pe *flightcache.PanicError
	if len(errs) != 1 || !errors.As(errs[0], &pe) {
		t.Errorf("errors reported %v; want the OnApplied panic, once, as a *flightcache.PanicError", errs)
	}
	if st := src.Stats(); st.Transactions != 4 || st.Panics != 0 {
		t.Errorf("Stats %+v; want 4 transactions, no panic counted (OnApplied's is not the Mapping's)", st)
	}
}

// OnReconnect is told of each replication connection made after a loss:
// the slot, the error that lost the previous one, how long the Source was
// without one.
func TestOnReconnectReportsEachReconnect(t *testing.T) {
	conn := connect(t)
	_, pub := table(t, conn)
	slot := testSlot()
	h := &hooks{}
	src := start(t, &recorder{}, byID, Options{
		Publication: pub, Slot: slot, DropSlotOnClose: true,
		Reconnect:   Reconnect{InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond},
		OnReconnect: h.onReconnect,
	})
	if terminate(t, conn, slot) == 0 {
		t.Fatalf("no walsender reads slot %s", slot)
	}
	eventually(t, "a reconnect", func() bool { _, r := h.snapshot(); return len(r) >= 1 })
	_, rs := h.snapshot()
	if r := rs[0]; r.Slot != slot || r.Err == nil || r.Down <= 0 {
		t.Errorf("Reconnected %+v; want slot %s, the error, a time down", r, slot)
	}
	if st := src.Stats(); st.Reconnects < 1 || st.Gaps != 0 {
		t.Errorf("Stats %+v; want a reconnect, no gap", st)
	}
}

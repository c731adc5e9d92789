package flightpg

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// keySet is a Target that marks each key it is told to drop, in a table
// made beforehand, so that what it records costs no memory as it runs.
type keySet struct {
	seen []bool // written by the Source's goroutine only; read after Wait
	alls int
}

func (k *keySet) Invalidate(id int64) { k.seen[id] = true }
func (k *keySet) InvalidateAll()      { k.alls++ }

// heapObjects returns the bytes of heap objects, live or not yet swept,
// without stopping the world.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A bulk UPDATE of 100,000 rows in one transaction streams through the
// Source in bounded memory (it holds at most MaxPendingKeys keys of it at
// once, and each change only while it is mapped), every key of it is
// dropped, and the next updates are applied at once again.
func TestBulkUpdateInBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("bulk update of 100,000 rows")
	}
	conn := connect(t)
	tbl, pub := table(t, conn)
	const rows = 100_000
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 0 FROM generate_series(1, $1::int) g", rows)
	target := &keySet{seen: make([]bool, rows+1)}
	src := start(t, target, byID, Options{Publication: pub})
	caughtUp(t, src, conn)

	runtime.GC()
	baseline := heapObjects()
	var peak uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	var once sync.Once
	go func() {
		defer close(sampled)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			peak = max(peak, heapObjects())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer once.Do(func() { close(stop) })

	began := time.Now()
	exec(t, conn, "UPDATE "+tbl+" SET price = price + 1")
	committed := time.Now()
	caughtUp(t, src, conn)
	applied := time.Now()
	once.Do(func() { close(stop) })
	<-sampled

	missing := 0
	for id := 1; id <= rows; id++ {
		if !target.seen[id] {
			missing++
		}
	}
	st := src.Stats()
	if missing != 0 || target.alls != 1 || st.Invalidations != rows {
		t.Errorf("bulk update: %d of %d keys not dropped, %d InvalidateAll (New's: 1), %d Invalidations; want 0, 1, %d",
			missing, rows, target.alls, st.Invalidations, rows)
	}
	const bound = 64 << 20
	over := int64(peak) - int64(baseline)
	if over > bound {
		t.Errorf("heap rose %d MB over its baseline of %d MB while the bulk update streamed; want at most %d MB",
			over>>20, baseline>>20, bound>>20)
	}

	// Lag recovers: single updates after it are applied as they come.
	var worst time.Duration
	for i := range 20 {
		exec(t, conn, "UPDATE "+tbl+" SET price = price + 1 WHERE id = $1", i+1)
		at := time.Now()
		caughtUp(t, src, conn)
		worst = max(worst, time.Since(at))
	}
	t.Logf("bulk UPDATE of %d rows: committed in %v, applied %v after its commit; heap peak %.1f MB over a baseline of %.1f MB; "+
		"then 20 single updates applied within %v each",
		rows, committed.Sub(began).Round(time.Millisecond), applied.Sub(committed).Round(time.Millisecond),
		float64(over)/(1<<20), float64(baseline)/(1<<20), worst.Round(time.Microsecond))
}

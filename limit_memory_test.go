package flightcache

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// What a queued load costs, and what the same load costs in flight
// without a Limit: 10,000 loads either way, whose callers have left
// (FinishAndFill keeps the loads), so that what is measured is the
// Loader's own: each load's goroutine and its state. Limit's godoc and
// docs/design.md rule 22 quote the figures this logs, each subtest run
// alone (-run 'TestLimitQueuedLoadMemory/queued'): the runtime keeps the
// goroutines and stacks of earlier tests for reuse, so later figures are
// lower.
func TestLimitQueuedLoadMemory(t *testing.T) {
	const loads = 10000
	for _, tt := range []struct {
		name  string
		limit Limit
	}{
		{"queued", Limit{MaxLoads: 1}},
		{"in flight without a Limit", Limit{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c loadCost
			synctest.Test(t, func(t *testing.T) { c = heldLoadCost(t, tt.limit, loads) })
			t.Logf("a load %s costs %d bytes: %d of heap, %d of stack", tt.name, c.total(), c.heap, c.stack)
			bound := int64(16 << 10)
			if raceEnabled {
				bound = 32 << 10 // the race detector's stacks are larger (about 14 KiB a load here); the heap is the same
			}
			if c.total() <= 0 || c.total() > bound || c.heap > 8<<10 {
				t.Errorf("a load %s costs %d bytes (%d of heap); want some, at most %d KiB, and at most 8 KiB of heap", tt.name, c.total(), c.heap, bound>>10)
			}
		})
	}
}

// loadCost is the memory one load holds, per load, measured over many.
type loadCost struct{ heap, stack int64 }

func (c loadCost) total() int64 { return c.heap + c.stack }

// heldLoadCost measures n loads held on a Loader with limit: in flight,
// blocked in the downstream, without a Limit; queued behind a load that
// holds every slot with one. Their callers leave before it measures. It
// runs in the caller's synctest bubble.
func heldLoadCost(t *testing.T, limit Limit, n int) loadCost {
	t.Helper()
	d := &downstream{gate: make(chan struct{})}
	l := newLoader(t, d, Options[string, string]{Policy: FinishAndFill, Limit: limit})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var held <-chan result
	n0 := 0 // the held load
	if limit.enabled() {
		n0 = 1
		held = getAsync(ctx, l, "held")
		synctest.Wait() // it holds every slot
	}
	before, goroutines := memStats(), runtime.NumGoroutine()
	leave, left := context.WithTimeout(ctx, time.Minute)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { l.Get(leave, strconv.Itoa(i)) })
	}
	synctest.Wait()
	left() // the callers leave; their loads stay
	wg.Wait()
	synctest.Wait()
	after, more := memStats(), runtime.NumGoroutine()-goroutines
	s := l.Stats()
	if waiting := d.inside.Load() + s.QueuedLoads; waiting != int64(n0+n) || s.Limited != 0 || more != n {
		t.Fatalf("Limit %+v: %d loads held (in flight or queued), Stats.Limited %d, %d more goroutines; want %d, 0, %d",
			limit, waiting, s.Limited, more, n0+n, n)
	}
	close(d.gate)
	if held != nil {
		if r := <-held; r.err != nil {
			t.Errorf("Get(held) = %v; want a value", r.err)
		}
	}
	return loadCost{
		heap:  (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(n),
		stack: (int64(after.StackInuse) - int64(before.StackInuse)) / int64(n),
	}
}

// memStats reads the memory statistics after a GC.
func memStats() (m runtime.MemStats) {
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m
}

package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// dropClock times each write from its call to the drop of the key's
// copy by the last holder that held it when the write was made.
type dropClock struct {
	mu      sync.Mutex
	open    map[string]*pendingDrop // key → the write awaiting its drops; guarded by mu
	took    []time.Duration         // guarded by mu
	unheard int                     // writes replaced before all their drops; guarded by mu
}

type pendingDrop struct {
	at   time.Time
	left int // holders yet to drop
}

func newDropClock() *dropClock { return &dropClock{open: map[string]*pendingDrop{}} }

// expect starts timing a write of key that holders holders must drop.
func (d *dropClock) expect(key string, holders int, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open[key] != nil {
		d.unheard++
	}
	d.open[key] = &pendingDrop{at: at, left: holders}
}

// dropped notes that a holder dropped key at at.
func (d *dropClock) dropped(key string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.open[key]
	if p == nil {
		return
	}
	if p.left--; p.left == 0 {
		d.took = append(d.took, at.Sub(p.at))
		delete(d.open, key)
	}
}

// result returns the timed writes' p50, p90 and p99, how many were
// timed, and how many writes still wait for a drop (or were replaced
// before it).
func (d *dropClock) result() (pcts [3]time.Duration, n, unheard int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := slices.Clone(d.took)
	slices.Sort(s)
	for i, p := range []int{50, 90, 99} {
		pcts[i] = pct(s, p)
	}
	return pcts, len(s), d.unheard + len(d.open)
}

// pct returns the p-th percentile of the sorted s.
func pct(s []time.Duration, p int) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)]
}

// pace calls op(0), op(1), ... at rate per second on workers goroutines
// until ctx ends, and returns how many calls ended. When the workers
// fall behind, the calls due queue up (the achieved rate says so).
func pace(ctx context.Context, rate, workers int, op func(i int)) int64 {
	if rate <= 0 {
		return 0
	}
	jobs := make(chan int, workers)
	var done atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				op(i)
				done.Add(1)
			}
		})
	}
	feed(ctx, rate, jobs)
	close(jobs)
	wg.Wait()
	return done.Load()
}

// feed sends jobs 0, 1, ... at rate per second until ctx ends.
func feed(ctx context.Context, rate int, jobs chan<- int) {
	start := time.Now()
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for sent := 0; ; {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for due := int(float64(rate) * now.Sub(start).Seconds()); sent < due; sent++ {
				select {
				case jobs <- sent:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

package flightcache

import (
	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/limit"

	"context"
	"runtime/pprof"
	"sync/atomic"
)

// launch starts c's load goroutine, counting it in on s, the stripe of the
// operation that starts it, which is still inside: the goroutine is counted
// in before that operation is counted out, on one stripe, so Close (which
// reads a stripe's outs before its ins) cannot see both out at once.
func (l *Loader[K, V]) launch(c *call[K, V], s *life.Stripe) {
	c.slot = s
	l.spawn(c, s)
}

// spawn runs a load (a call's, or a batch's), counted in on s, on a load
// goroutine of the pool.
func (l *Loader[K, V]) spawn(j life.Job, s *life.Stripe) {
	s.Enter()
	l.stats.inFlight.Add(1)
	l.pool.Go(j)
}

// Run runs c's load, on a goroutine of the pool.
func (c *call[K, V]) Run() {
	defer c.l.gate.ExitChild(c.slot)
	c.l.run(c)
}

// takeLabels gives the load goroutine the profiler labels of ctx, the
// context of the Get that started the load, as a goroutine started for it
// would have had them. Reading them calls ctx.Value, which is user code: a
// panic there is counted (Stats.Panics) and leaves the goroutine without
// labels, and the load goes on. Callers run it after deferring the load's
// delivery, so a Goexit there reaches the waiters as ErrGoexit.
func (l *Loader[K, V]) takeLabels(ctx context.Context) {
	if l.user.guard(func() { pprof.SetGoroutineLabels(ctx) }, nil) != nil {
		pprof.SetGoroutineLabels(context.Background())
	}
}

// Run runs b's load, on a goroutine of the pool.
func (b *batch[K, V]) Run() {
	defer b.l.gate.ExitChild(b.slot)
	b.l.runBatch(b)
}

// refreshSlots is the MaxRefreshes bound on background loads: a
// background load takes a slot when it is published (flights.start: a
// background batch takes one for all its calls) and gives it back when it
// ends (loadEnded), and nowhere else.
type refreshSlots struct {
	max  int64
	used atomic.Int64
}

// take takes a slot, or counts the load in dropped when all are used.
func (s *refreshSlots) take(dropped *atomic.Uint64) bool {
	if s.used.Add(1) > s.max {
		s.used.Add(-1)
		dropped.Add(1)
		return false
	}
	return true
}

// give gives a slot back.
func (s *refreshSlots) give() { s.used.Add(-1) }

// takeBackground takes what a background load holds while it runs, when
// it is published (flights.start): a MaxRefreshes slot and, with a Limit,
// a downstream slot, which a refresh never queues for (TryBackground). ok
// false drops the refresh (counted in RefreshesDropped or
// RefreshesLimited); the stale value keeps serving.
func (l *Loader[K, V]) takeBackground() (s limit.Slot, ok bool) {
	if !l.refreshSlots.take(&l.stats.refreshesDropped) {
		return limit.Slot{}, false
	}
	if s, ok = l.lim.TryBackground(); !ok {
		l.refreshSlots.give()
	}
	return s, ok
}

// loadEnded counts a load (a single key's, or a batch's LoadMany call) as
// ended, before any of its waiters wakes, so that Stats read after a Get
// returns include the load that answered it; a background load gives back
// what takeBackground took, s its Limit slot. Whether its error is a
// not-found is counted apart, once judged (deliver, completeBatch).
func (l *Loader[K, V]) loadEnded(err error, background bool, s limit.Slot) {
	l.stats.inFlight.Add(-1)
	l.stats.loads.Add(1)
	if err != nil {
		l.stats.loadErrors.Add(1)
	}
	if background {
		l.refreshSlots.give()
		s.Release()
	}
}

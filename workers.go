package flightcache

import (
	"context"
	"reflect"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"
)

// launch starts c's load goroutine, counting it in on s, the stripe of the
// operation that starts it, which is still inside: the goroutine is counted
// in before that operation is counted out, on one stripe, so Close (which
// reads a stripe's outs before its ins) cannot see both out at once.
func (l *Loader[K, V]) launch(c *call[K, V], s *stripe) {
	c.slot = s
	l.spawn(c, s)
}

// spawn runs a load (a call's, or a batch's), counted in on s, on a load
// goroutine: an idle one if one waits now, else a new one.
func (l *Loader[K, V]) spawn(b interface{ body() }, s *stripe) {
	s.opsIn.Add(1)
	l.stats.inFlight.Add(1)
	select {
	case l.workers.jobs <- b:
	default:
		l.workers.running.Add(1)
		l.workers.started.Add(1)
		go l.worker(b)
	}
}

// workers are the Loader's load goroutines. One that ends a load waits for
// the next, if fewer than maxIdle already wait, rather than exit: a new
// goroutine starts on a small stack, and a load grows it (a copy of the
// whole stack, a fifth of a miss's CPU), where a reused one has grown
// already. They all exit at Close; teardown waits for them (rule 8).
type workers struct {
	jobs    chan interface{ body() } // unbuffered: a load goes to a worker waiting now, or to a new one
	idle    atomic.Int32             // workers waiting for a load
	started atomic.Uint64            // workers started, ever (tests)
	maxIdle int32
	running sync.WaitGroup
}

func (w *workers) init() {
	w.jobs = make(chan interface{ body() })
	w.maxIdle = int32(max(8, 4*runtime.GOMAXPROCS(0)))
}

// worker runs b, then the loads handed to it, until it would wait for one
// while maxIdle others wait too, has waited workerIdle while keptIdle
// others waited, or the Loader closes.
func (l *Loader[K, V]) worker(b interface{ body() }) {
	w := &l.workers
	defer w.running.Done()
	var idle *time.Timer
	for {
		loaderGoroutine(b)
		n := w.idle.Add(1)
		if n > w.maxIdle {
			w.idle.Add(-1)
			return
		}
		var expired <-chan time.Time // nil: the first few wait without a timer, so a stream of misses pays none
		if n > keptIdle {
			if idle == nil {
				idle = time.NewTimer(workerIdle)
			} else {
				idle.Reset(workerIdle)
			}
			expired = idle.C
		}
		select {
		case b = <-w.jobs:
		case <-expired:
			b = nil
		case <-l.ctx.Done():
			b = nil
		}
		w.idle.Add(-1)
		if expired != nil {
			idle.Stop()
		}
		if b == nil {
			return
		}
	}
}

// keptIdle load goroutines wait for a load until Close; the others of a
// burst, up to maxIdle, leave after waiting workerIdle.
const keptIdle = 2

// workerIdle is how long an idle load goroutine beyond keptIdle waits for
// a load before it leaves.
const workerIdle = 10 * time.Second

// body runs c's load; see loaderGoroutine.
func (c *call[K, V]) body() {
	defer c.l.exitChild(c.slot)
	c.l.run(c)
}

// takeLabels gives the load goroutine the profiler labels of ctx, the
// context of the Get that started the load, as a goroutine started for it
// would have had them. Reading them calls ctx.Value, which is user code: a
// panic there is counted (Stats.Panics) and leaves the goroutine without
// labels, and the load goes on. Callers run it after deferring the load's
// delivery, so a Goexit there reaches the waiters as ErrGoexit.
func (l *Loader[K, V]) takeLabels(ctx context.Context) {
	if l.guard(func() { pprof.SetGoroutineLabels(ctx) }, nil) != nil {
		pprof.SetGoroutineLabels(context.Background())
	}
}

// loaderGoroutine is the first frame of every load goroutine, so that
// onLoaderGoroutine can find it.
//
//go:noinline
func loaderGoroutine(b interface{ body() }) { b.body() }

// loaderGoroutinePC is the entry address of loaderGoroutine.
var loaderGoroutinePC = reflect.ValueOf(loaderGoroutine).Pointer()

// onLoaderGoroutine reports whether the caller runs on a load goroutine of
// some Loader.
func onLoaderGoroutine() bool { return calledUnder(loaderGoroutinePC) }

// calledUnder reports whether the function whose entry address is entry
// is among the caller's callers.
func calledUnder(entry uintptr) bool {
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Entry == entry {
			return true
		}
		if !more {
			return false
		}
	}
}

// body runs b's load; see loaderGoroutine.
func (b *batch[K, V]) body() {
	defer b.l.exitChild(b.slot)
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
// a downstream slot, which a refresh never queues for (tryBackground). ok
// false drops the refresh (counted in RefreshesDropped or
// RefreshesLimited); the stale value keeps serving.
func (l *Loader[K, V]) takeBackground() (s slot, ok bool) {
	if !l.refreshSlots.take(&l.stats.refreshesDropped) {
		return slot{}, false
	}
	if s, ok = l.lim.tryBackground(); !ok {
		l.refreshSlots.give()
	}
	return s, ok
}

// backgroundSlot is the Limit slot takeBackground took for a background
// load, which its end gives back (loadEnded): every such slot is the same,
// so a load keeps none of its own (a call is allocated with every miss).
func (l *Loader[K, V]) backgroundSlot() slot { return slot{lm: l.lim, bg: true} }

// loadEnded counts a load (a single key's, or a batch's LoadMany call) as
// ended, before any of its waiters wakes, so that Stats read after a Get
// returns include the load that answered it; a background load gives back
// what takeBackground took, s its Limit slot. Whether its error is a
// not-found is counted apart, once judged (deliver, completeBatch).
func (l *Loader[K, V]) loadEnded(err error, background bool, s slot) {
	l.stats.inFlight.Add(-1)
	l.stats.loads.Add(1)
	if err != nil {
		l.stats.loadErrors.Add(1)
	}
	if background {
		l.refreshSlots.give()
		s.release()
	}
}

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

// How a Loader shuts down. One mechanism says "no new work, wait for what
// runs": the closed flag and the counter stripes (stats.go).
//
//   - Every operation that touches the cache or starts a goroutine enters
//     on a stripe (a Get counts in gets and leaves through one of its
//     outcomes; Set, Invalidate, loads and refreshes count in ops and out of
//     it) and checks the flag after counting itself in: after Close, it
//     counts itself out at once and does nothing. A Get counts out in the
//     defer it sets as soon as it is in (exitGet), so that a panic of its
//     caller's context cannot leave it in; Set and Invalidate call no user
//     code while they are in, Refresh defers exitOp.
//   - A load goroutine is counted in by the operation that starts it, while
//     that operation is still inside, so the count cannot reach zero between
//     the two.
//   - Close sets the flag, cancels every load (cancelAll), and checks
//     whether everything has left; after the flag, so does every operation
//     that leaves. The one that sees all stripes balanced closes idle.
//   - The writer goroutine, the only code left running, sees idle, closes
//     ristretto (whose Close must not race its Get or Set), waits for the
//     idle load goroutines to leave (they do when the Loader's context
//     ends), and closes closeDone. Close and Shutdown wait for closeDone.
//
// Close called from user code that runs on a load goroutine (a LoadFunc,
// OnLoad, Cost, Retryable, IsFailure, a Remote, a custom breaker) cannot
// wait: its own load keeps the Loader from going idle. It must tell that it
// runs there, and the only thing that knows is the goroutine's stack: the
// caller of Close may be any code, passed no context, and Go has no
// goroutine-local state. So every load runs under loaderGoroutine (a reused
// load goroutine calls it once per load), and Close looks for that
// function in its stack, by address, not by name: a rename cannot break it
// silently (TestCloseFromLoaderGoroutine checks the lookup both ways).
// Shutdown(ctx) needs no such look: it waits until ctx ends.

// Close stops the Loader: later Gets return [ErrClosed], Set and Invalidate
// do nothing, loads and refreshes in flight have their contexts cancelled
// (their waiters get ErrClosed), and Close waits for every goroutine the
// Loader started before it frees the cache. It is idempotent and always
// returns nil.
//
// WARNING: Close waits for LoadFuncs to return; one that ignores its
// context delays Close until it does. [Loader.Shutdown] bounds the wait.
//
// NOTE: Close called on a load goroutine (from a LoadFunc, Cost, OnLoad,
// Retryable, IsFailure, a Remote or a custom breaker) cannot wait for
// itself: it starts the shutdown and returns at once, and the Loader
// finishes closing when the last of its loads ends. Close cannot tell which
// Loader a load goroutine belongs to, so it returns at once too when called
// from another Loader's callback; a later Close from outside waits.
func (l *Loader[K, V]) Close() error {
	l.shutdown()
	if onLoaderGoroutine() {
		return nil
	}
	<-l.closeDone
	return nil
}

// Shutdown is [Loader.Close] that waits at most until ctx ends: it stops the
// Loader as Close does and returns nil once every goroutine of the Loader
// has ended, or ctx.Err() if ctx ends first (the Loader then finishes
// closing in the background). Like Close, it may be called more than once,
// and concurrently with Close.
func (l *Loader[K, V]) Shutdown(ctx context.Context) error {
	l.shutdown()
	select {
	case <-l.closeDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown sets the closed flag, once, and cancels every load.
func (l *Loader[K, V]) shutdown() {
	if l.closed.Swap(true) {
		return
	}
	l.stop(ErrClosed)      // the context Remote.Set and Remote.Invalidate run under
	l.writer.turns.close() // Sets and Invalidates waiting their turn do nothing
	l.flights.cancelAll(ErrClosed)
	l.checkIdle()
}

// enterGet counts n Gets in: a Get, or the keys of a GetMany. It returns
// false (the Gets counted out as closed) after Close. A Get it lets in
// defers exitGet at once.
func (l *Loader[K, V]) enterGet(n uint64) (*stripe, bool) {
	if l.closed.Load() {
		// Refused at the door, off the stripes: a stream of refused Gets
		// must not keep Close checking them.
		l.stats.closedEarly.Add(n)
		return nil, false
	}
	s := l.stats.acquire()
	s.gets.Add(n)
	if l.closed.Load() { // Close began between the two checks
		l.exitGet(s, &s.closed, n)
		return nil, false
	}
	return s, true
}

// exitGet counts out through outcome the n Gets still in on s, and gives s
// back. It is a Get's one way out, deferred as soon as enterGet has let it
// in, so the count balances whatever panics on the way (a Get's caller's
// context is the caller's code: docs/design.md rule 23). A Get sets the
// outcome for the defer once it knows it; a GetMany counts each key out as
// it answers it, and leaves exitGet none, or those a panic kept it from
// answering. A nil outcome is for Gets that a panic cut short before they
// had one: each leaves as a miss that its context ended (Misses,
// Canceled), through passed.
func (l *Loader[K, V]) exitGet(s *stripe, outcome *atomic.Uint64, n uint64) {
	if n > 0 {
		if outcome == nil {
			l.stats.misses.Add(n)
			l.stats.canceled.Add(n)
			outcome = &s.passed
		}
		outcome.Add(n)
	}
	l.stats.release(s)
	if l.closed.Load() {
		l.checkIdle()
	}
}

// enterOp counts an operation other than a Get in (Set, Invalidate). It
// returns false after Close.
func (l *Loader[K, V]) enterOp() (*stripe, bool) {
	s := l.stats.acquire()
	s.opsIn.Add(1)
	if l.closed.Load() {
		l.exitOp(s)
		return nil, false
	}
	return s, true
}

// exitOp counts an operation out.
func (l *Loader[K, V]) exitOp(s *stripe) {
	l.exitChild(s)
	l.stats.release(s)
}

// exitChild counts out a load goroutine, counted in by launch on the stripe
// of the operation that started it. Not handing the stripe back to the pool:
// that operation may hold it still.
func (l *Loader[K, V]) exitChild(s *stripe) {
	s.opsOut.Add(1)
	if l.closed.Load() {
		l.checkIdle()
	}
}

// checkIdle closes idle once the Loader is closed and nothing is inside.
func (l *Loader[K, V]) checkIdle() {
	if l.stats.quiet() && l.idleOnce.CompareAndSwap(false, true) {
		close(l.idle)
	}
}

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
func onLoaderGoroutine() bool {
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
		if f.Entry == loaderGoroutinePC {
			return true
		}
		if !more {
			return false
		}
	}
}

// teardown frees the cache; the writer goroutine runs it once the Loader is
// closed and idle, so nothing else can be inside ristretto.
func (l *Loader[K, V]) teardown() {
	l.tearingDown.Store(true)
	l.timeouts.stop()
	l.cache.Close()
	l.workers.running.Wait() // idle ones leave at ctx's end; busy ones are done
	close(l.closeDone)
}

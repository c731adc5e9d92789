package flightcache

import (
	"context"
	"sync"
	"sync/atomic"
)

// How a Loader shuts down. One mechanism says "no new work, wait for what
// runs": the closed flag and the counter stripes (stats.go).
//
//   - Every operation that touches the cache or starts a goroutine enters
//     on a stripe (a Get counts in gets and leaves through one of its
//     outcomes; Set, Invalidate, loads and refreshes count in ops and out of
//     it). After Close it is refused at the door, before it touches a
//     stripe, so that a stream of calls after Close cannot keep Close from
//     seeing every stripe balance; and it checks the flag again after
//     counting itself in: if Close began in between, it counts itself out
//     at once and does nothing. A Get counts out in the defer it sets as
//     soon as it is in (exitGet), so that a panic of its caller's context
//     cannot leave it in; Set and Invalidate call no user code while they
//     are in, Refresh defers exitOp.
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
// Close from an EvictionObserver on the writer's goroutine cannot wait
// either, for the writer closes the Loader: the writer runs under
// writerGoroutine, which Close looks for the same way (departures.go).
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
// Retryable, IsFailure, a Remote or a custom breaker), or on the Loader's
// writer (from an EvictionObserver's Evicted), cannot wait for itself: it
// starts the shutdown and returns at once, and the Loader finishes closing
// when the last of its loads, and the callback, ends. Close cannot tell
// which Loader such a goroutine belongs to, so it returns at once too when
// called from another Loader's callback; a later Close from outside waits.
func (l *Loader[K, V]) Close() error {
	l.shutdown()
	if onLoaderGoroutine() || onWriterGoroutine() {
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
	l.writer.turns.Close() // Sets and Invalidates waiting their turn do nothing
	l.lim.close()          // loads waiting for a downstream slot get ErrClosed
	l.flights.cancelAll(ErrClosed)
	l.checkIdle()
}

// gets is the count of the Gets one call let in: one Get, or the keys of
// a GetMany. Each is counted out by how it was answered (answer), all at
// once, when the call returns (exitGet): until then the call is inside, so
// Close cannot find the stripes balanced before a load or a batch the call
// starts is counted in. This, enterGet and exitGet are the only code that
// counts Gets in and out.
type gets struct {
	s                   *stripe
	n                   uint64 // let in
	hits, stale, passed uint64 // answered so far
}

// answer counts one Get as answered: from a fresh value (SourceHit), at
// once with a stale one (SourceStale), or after the in-flight map (any
// other Source: a miss, counted in Stats.Misses where it waited).
func (g *gets) answer(src Source) {
	switch src {
	case SourceHit:
		g.hits++
	case SourceStale, SourceStaleLimited:
		g.stale++
	default:
		g.passed++
	}
}

// enterGet lets n Gets in, into g: a Get, or the keys of a GetMany. It
// returns false (the Gets counted out as closed) after Close. A call it
// lets in defers exitGet(g) at once.
func (l *Loader[K, V]) enterGet(g *gets, n uint64) bool {
	if l.closed.Load() {
		// Refused at the door, off the stripes: a stream of refused Gets
		// must not keep Close checking them.
		l.stats.closedEarly.Add(n)
		return false
	}
	s := l.stats.acquire()
	s.gets.Add(n)
	if l.closed.Load() { // Close began between the two checks
		s.closed.Add(n)
		l.release(s)
		return false
	}
	g.s, g.n = s, n
	return true
}

// exitGet counts out the Gets g let in, and gives its stripe back. It is
// their one way out, deferred as soon as enterGet has let them in, so the
// count balances whatever panics on the way (a Get's caller's context is
// the caller's code: docs/design.md rule 23). A Get a panic cut short
// before it was answered leaves as a miss that its context ended (Misses,
// Canceled).
func (l *Loader[K, V]) exitGet(g *gets) {
	s := g.s
	if cut := g.n - g.hits - g.stale - g.passed; cut > 0 {
		l.stats.misses.Add(cut)
		l.stats.canceled.Add(cut)
		g.passed += cut
	}
	if g.hits > 0 {
		s.hits.Add(g.hits)
	}
	if g.stale > 0 {
		s.stale.Add(g.stale)
	}
	if g.passed > 0 {
		s.passed.Add(g.passed)
	}
	l.release(s)
}

// release gives a stripe back once its operation has counted out, and
// checks whether a Close is waiting for that.
func (l *Loader[K, V]) release(s *stripe) {
	l.stats.release(s)
	if l.closed.Load() {
		l.checkIdle()
	}
}

// enterOp counts an operation other than a Get in (Set, Invalidate,
// InvalidateAll, Refresh). It returns false after Close.
func (l *Loader[K, V]) enterOp() (*stripe, bool) {
	if l.closed.Load() {
		// Refused at the door, as a Get is (enterGet): counted in and out
		// on a stripe, a stream of refused Sets kept Close from ever
		// seeing every stripe balance.
		return nil, false
	}
	s := l.stats.acquire()
	s.opsIn.Add(1)
	if l.closed.Load() { // Close began between the two checks
		l.exitOp(s)
		return nil, false
	}
	return s, true
}

// exitOp counts an operation out.
func (l *Loader[K, V]) exitOp(s *stripe) {
	s.opsOut.Add(1)
	l.release(s)
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

// teardown frees the cache; the writer goroutine runs it once the Loader is
// closed and idle, so nothing else can be inside ristretto.
func (l *Loader[K, V]) teardown() {
	l.tearingDown.Store(true)
	l.timeouts.Stop()
	l.cache.Close()
	l.workers.running.Wait() // idle ones leave at ctx's end; busy ones are done
	l.obs.close()            // every counter is final: a StatsObserver's stats freeze
	close(l.closeDone)
}

// stripe holds the counters the hit path touches. Each Get takes one stripe
// for its whole run from a sync.Pool, so a goroutine mostly reuses the stripe
// of its own P and counters do not bounce between cores. The pool only hands
// out pointers into a fixed array: a stripe dropped from the pool at a GC is
// never lost, only handed out again later.
//
// The pool lives apart from the Loader (stripePool), and holds nothing that
// leads back to it: the runtime keeps every pool that has been used until
// the GC after next, so a pool inside the Loader kept a closed Loader, its
// cache and its values alive through one more GC.
//
// gets is incremented when a Get starts, and exactly one of the exit
// counters when it ends: hits, stale and closed are outcomes; passed means
// "went on to the in-flight map", where the Get is classified (a miss, or a
// late hit). The stripes are also how Close knows that nothing runs any
// more (lifecycle.go).
type stripe struct {
	gets   atomic.Uint64
	hits   atomic.Uint64
	stale  atomic.Uint64
	passed atomic.Uint64 // left after the locked path (a miss, or a late hit: counted apart)
	closed atomic.Uint64
	opsIn  atomic.Uint64   // Sets, Invalidates and load goroutines counted in (lifecycle.go)
	opsOut atomic.Uint64   // and out
	_      [128 - 7*8]byte // one stripe per pair of cache lines
}

// exits is how many Gets have left on this stripe.
func (s *stripe) exits() uint64 {
	return s.hits.Load() + s.stale.Load() + s.passed.Load() + s.closed.Load()
}

// stripePool hands out the stripes.
type stripePool struct {
	sync.Pool               // of *stripe, pointing into stripes
	stripes   []stripe      // the same as the counters'
	next      atomic.Uint32 // round-robin index for New
}

func (c *counters) acquire() *stripe { return c.pool.Get().(*stripe) }

func (c *counters) release(s *stripe) { c.pool.Put(s) }

// quiet reports whether no operation is inside the Loader. Per stripe, the
// outs are read before the ins: an operation that counts in after its
// stripe was read sees the closed flag (set before quiet is called) and
// does nothing, and a load goroutine is counted in on its starter's stripe
// before the starter counts out.
func (c *counters) quiet() bool {
	for i := range c.stripes {
		s := &c.stripes[i]
		out, opsOut := s.exits(), s.opsOut.Load()
		if out != s.gets.Load() || opsOut != s.opsIn.Load() {
			return false
		}
	}
	return true
}

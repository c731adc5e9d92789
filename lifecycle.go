package flightcache

import (
	"context"

	"github.com/flightcache/flightcache/internal/life"
)

// How a Loader shuts down: its gate (internal/life) says "no new work,
// wait for what runs".
//
//   - Every Get, Set, Invalidate, InvalidateAll and Refresh enters the
//     gate, and is refused at the door after Close. A Get counts out in the
//     defer it sets as soon as it is in (exitGets), so that a panic of its
//     caller's context cannot leave it in.
//   - A load goroutine is counted in (Stripe.Enter) by the operation that
//     starts it, while that operation is still inside, so the count cannot
//     reach zero between the two.
//   - Close closes the gate, cancels every load (cancelAll), and checks
//     whether everything has left; so does every call that leaves after
//     it. The one that sees the gate balance closes its Idle channel.
//   - The writer goroutine, the only code left running, sees Idle, closes
//     ristretto (whose Close must not race its Get or Set), waits for the
//     idle load goroutines to leave (they do when the Loader's context
//     ends), and closes closeDone. Close and Shutdown wait for closeDone.
//
// Close called from user code on a load goroutine (a LoadFunc, OnLoad,
// Cost, Retryable, IsFailure, a Remote, a custom breaker) cannot wait: its
// own load keeps the Loader from going idle; nor can Close from an
// EvictionObserver on the writer's goroutine, for the writer closes the
// Loader. It tells both by the goroutine's stack (life.OnPool,
// life.OnWriter; TestCloseFromLoaderGoroutine checks the lookup both
// ways). Shutdown(ctx) needs no such look: it waits until ctx ends.

// Close stops the Loader: later Gets return [ErrClosed], Set and Invalidate
// do nothing, loads and refreshes in flight have their contexts cancelled
// (their waiters get ErrClosed), and Close waits for every goroutine the
// Loader started before it frees the cache. It is idempotent and always
// returns nil.
//
// WARNING: Close waits for LoadFuncs to return; one that ignores its
// context delays Close until it does. [Loader.Shutdown] bounds the wait.
//
// NOTE: Close called from a callback (a LoadFunc, an Observer, Evicted...)
// cannot wait for itself: it starts the shutdown and returns at once, and
// the Loader finishes closing when the callback ends. It returns at once
// from another Loader's callback too; a later Close from outside waits.
func (l *Loader[K, V]) Close() error {
	l.shutdown()
	if life.OnPool() || life.OnWriter() {
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

// shutdown closes the gate, once, and cancels every load.
func (l *Loader[K, V]) shutdown() {
	if !l.gate.Close() {
		return
	}
	l.stop(ErrClosed)      // the context Remote.Set and Remote.Invalidate run under
	l.writer.turns.Close() // Sets and Invalidates waiting their turn do nothing
	l.lim.Close()          // loads waiting for a downstream slot get ErrClosed
	l.flights.cancelAll(ErrClosed)
	l.gate.CheckIdle()
}

// answered counts one Get of in as answered: from a fresh value
// (SourceHit), at once with a stale one (SourceStale), or after the
// in-flight map (any other Source: a miss, counted in Stats.Misses where
// it waited).
func answered(in *life.Gets, src Source) {
	switch src {
	case SourceHit:
		in.Hit()
	case SourceStale, SourceStaleLimited:
		in.Stale()
	default:
		in.Passed()
	}
}

// exitGets counts out the Gets in let in. It is their one way out,
// deferred as soon as the gate has let them in, so the count balances
// whatever panics on the way (a Get's caller's context is the caller's
// code: docs/design.md rule 23). A Get a panic cut short before it was
// answered leaves as a miss that its context ended (Misses, Canceled).
func (l *Loader[K, V]) exitGets(in *life.Gets) {
	if cut := in.Unanswered(); cut > 0 {
		l.stats.misses.Add(cut)
		l.stats.canceled.Add(cut)
	}
	l.gate.ExitGets(in)
}

// teardown frees the cache; the writer goroutine runs it once the Loader is
// closed and idle, so nothing else can be inside ristretto.
func (l *Loader[K, V]) teardown() {
	l.tearingDown.Store(true)
	l.timeouts.Stop()
	l.cache.Close()
	l.pool.Wait() // idle ones leave at ctx's end; busy ones are done
	l.obs.close() // every counter is final: a StatsObserver's stats freeze
	close(l.closeDone)
}

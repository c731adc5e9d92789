package flightcache

import (
	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/queue"
)

// How the writer reports what left the cache, and why an EvictionObserver
// that writes to its Loader cannot wedge it.
//
// ristretto calls OnEvict and OnReject on its own goroutine as it applies
// what the writer issued, and the writer waits for that goroutine
// (ristretto's Wait) in every round; the Clear of an InvalidateAll calls
// OnEvict on the writer itself. Evicted used to run there, and a Set or an
// Invalidate made from it waited for a place among the pending writes
// (rule 19), which only the writer gives back. Consider the following
// serialized event ordering, MaxPendingWrites 1:
//
//  1. Set(A): takes the one place, opens write W, hands it over.
//  2. writer: issues W and waits for ristretto to apply it.
//  3. ristretto's goroutine: applies W, evicts B, calls Evicted(B), which
//     calls Invalidate(dep/B): no place is free, so it waits for the
//     writer to close W.
//  4. writer: still waits, in ristretto's Wait, for ristretto's goroutine,
//     which waits for the writer. Every Set, Invalidate and Close from
//     now on waits for good.
//
// So no user code runs in a round, nor on ristretto's goroutine:
// OnEvict, OnReject, the Clear and issue only mark what left gone and keep
// its event (left, observing.go). The writer reports the events after the
// round (reportLeft), holding no lock and no place, with ristretto idle:
// every write of the round has been applied and settled, its place given
// back, and the writes still open are back in the queue. The events wait
// at most for the end of their round: one round's departures, a cache's
// worth after a Clear.
//
// A Set or an Invalidate that Evicted makes there runs on the writer's
// goroutine, and may find its share full: it cannot wait for the writer,
// which is its own goroutine. It takes its turn as every producer does,
// first come first served, so rule 19's bounds and fair turns hold; and
// instead of waiting for its turn it does the writer's rounds until its
// turn comes (takeWrite, workOff). The writer's goroutine is told by its
// stack, as a load goroutine is: it runs under
// life.RunWriter. That tells a writer's goroutine, not which Loader's;
// each round holds its writer's rounds lock, so another Loader's writer
// whose Evicted writes to this Loader does this Loader's rounds in turn
// with this Loader's writer, never at once. A round calls no user code and
// waits only for ristretto, so nothing waits in a cycle. Close called
// there cannot wait for the writer either: it starts the shutdown and
// returns (lifecycle.go).

// reportLeft reports, on the writer's goroutine, the events the last
// round kept (left), and those of the rounds that Evicted's writes do
// meanwhile (workOff).
func (l *Loader[K, V]) reportLeft() {
	if !l.obs.observesEvictions() {
		return // nothing is kept (left)
	}
	wr := &l.writer
	for {
		wr.leftMu.Lock()
		evs := wr.left
		wr.left = nil // a Clear's are a cache's worth: not kept for the next round
		wr.leftMu.Unlock()
		if len(evs) == 0 {
			return
		}
		for _, ev := range evs {
			l.obs.evicted(ev)
		}
	}
}

// takeWrite takes a place of the writes' share for a write of cost,
// waiting its turn if the share is full; false after Close. On the
// writer's goroutine (a write Evicted makes) it does the writer's rounds
// until its turn comes instead of waiting.
func (l *Loader[K, V]) takeWrite(cost int64) (place, bool) {
	p := place{kind: writePlace, cost: cost}
	w, st := l.writer.turns.Ask(cost)
	switch {
	case w == nil:
		return p, st == queue.Taken
	case l.obs.observesEvictions() && life.OnWriter():
		l.workOff(w.Ready())
	default:
		<-w.Ready()
	}
	return p, w.Granted()
}

// workOff does the writer's rounds until ready closes. When a round finds
// nothing to take (a producer holds a place it has not handed over yet),
// it waits for a write to be handed over, then takes it. The events its
// rounds keep (left) are reported by this Loader's writer after its next
// round, which workOff wakes: it may run on another Loader's writer.
func (l *Loader[K, V]) workOff(ready <-chan struct{}) {
	defer l.writer.signal()
	var batch, again []*write[K, V]
	for {
		batch, again = l.round(batch, again)
		select {
		case <-ready:
			return
		default:
		}
		if len(batch) == 0 {
			select {
			case <-l.writer.wake: // the next round takes what it announced
			case <-ready:
				return
			}
		}
	}
}

package flightcache

import (
	"github.com/flightcache/flightcache/internal/life"
	"github.com/flightcache/flightcache/internal/queue"
)

// What left the cache, and the writes an EvictionObserver makes on the
// writer's goroutine (docs/internals.md, "The write path"). Whoever marks an
// entry gone reports it, once. ristretto's callbacks, the Clear and issue
// run in the writer's rounds, which call no user code and which the
// writer waits for: they only keep the event (noteDeparture), and the writer
// reports it after the round (reportDepartures), holding no lock and no place.
// A Set or Invalidate that Evicted makes there cannot wait for its own
// goroutine: it does the writer's rounds until its turn comes (takeWrite,
// workOff).

// reportDepartures reports, on the writer's goroutine, the events the last
// round kept (noteDeparture), and those of the rounds that Evicted's writes do
// meanwhile (workOff).
func (wr *writer[K, V]) reportDepartures() {
	if !wr.obs.observesEvictions() {
		return // nothing is kept (noteDeparture)
	}
	for {
		wr.departuresMu.Lock()
		evs := wr.departures
		wr.departures = nil // a Clear's are a cache's worth: not kept for the next round
		wr.departuresMu.Unlock()
		if len(evs) == 0 {
			return
		}
		for _, ev := range evs {
			wr.obs.evicted(ev)
		}
	}
}

// replaced reports e (nil: none), an entry put marked gone, as having
// left by cause: EvictionReplaced or EvictionInvalidated, refined by
// departureCause. The caller holds nothing: Evicted is user code.
func (wr *writer[K, V]) replaced(e *entry[K, V], cause EvictionCause) {
	if e != nil && wr.obs.observesEvictions() {
		wr.obs.evicted(EvictionEvent[K]{Key: e.key, Cause: wr.departureCause(e, cause), Cost: wr.unknownCost()})
	}
}

// unknownCost is the cost reported for an entry whose cost only the cache
// knew: every entry costs 1 without Options.Cost, and the Loader keeps no
// cost per entry (0, unknown, with it).
func (wr *writer[K, V]) unknownCost() int64 {
	if !wr.costed {
		return 1
	}
	return 0
}

// departureCause refines cause for an entry that leaves now: one from before an
// InvalidateAll left by it; one a newer value replaced or the policy
// evicted past its windows had expired.
func (wr *writer[K, V]) departureCause(e *entry[K, V], cause EvictionCause) EvictionCause {
	switch {
	case wr.invalidated(e):
		return EvictionInvalidated
	case (cause == EvictionReplaced || cause == EvictionPolicy) && wr.expired(e):
		return EvictionExpired
	}
	return cause
}

// noteEvicted takes note of an entry ristretto's OnEvict hands over, with
// its cost. While the writer clears the cache for an InvalidateAll
// (clearing, in a round, under ristretto's locks), the entries from before
// it are invalidated, and the others have not left: they are issued again.
func (wr *writer[K, V]) noteEvicted(e *entry[K, V], cost int64, clearing bool) {
	switch {
	case e == nil || !wr.obs.observesEvictions():
	case clearing:
		if wr.invalidated(e) {
			wr.noteDeparture(e, EvictionInvalidated, wr.unknownCost())
		}
	default:
		wr.noteDeparture(e, EvictionPolicy, cost)
	}
}

// refused takes note of an entry ristretto's admission policy refused.
func (wr *writer[K, V]) refused(e *entry[K, V], cost int64) {
	if e != nil {
		wr.noteDeparture(e, EvictionRejected, cost)
	}
}

// noteDeparture marks e gone and, if an EvictionObserver is set and e was not
// reported already, keeps its event, as having left by cause (departureCause),
// for reportDepartures. It calls no user code: it runs in the writer's rounds,
// on ristretto's goroutine too.
func (wr *writer[K, V]) noteDeparture(e *entry[K, V], cause EvictionCause, cost int64) {
	if !wr.obs.observesEvictions() || e.markGone() == nil {
		return
	}
	ev := EvictionEvent[K]{Key: e.key, Cause: wr.departureCause(e, cause), Cost: cost}
	wr.departuresMu.Lock()
	wr.departures = append(wr.departures, ev)
	wr.departuresMu.Unlock()
}

// takeWrite takes a place of the writes' share for a write of cost,
// waiting its turn if the share is full; false after Close. On the
// writer's goroutine (a write Evicted makes) it does the writer's rounds
// until its turn comes instead of waiting (docs/design.md).
func (wr *writer[K, V]) takeWrite(cost int64) (place, bool) {
	p := place{kind: writePlace, cost: cost}
	w, st := wr.turns.Ask(cost)
	switch {
	case w == nil:
		return p, st == queue.Taken
	case wr.obs.observesEvictions() && life.OnWriter():
		wr.workOff(w.Ready())
	default:
		<-w.Ready()
	}
	return p, w.Granted()
}

// workOff does the writer's rounds until ready closes: a write made on the
// writer's goroutine whose turn has not come (takeWrite). When a round
// finds nothing to take (a producer holds a place it has not handed over
// yet), it waits for a write to be handed over, then takes it. The events
// its rounds keep are reported by this writer after its next round, which
// workOff wakes: it may run on another Loader's writer.
func (wr *writer[K, V]) workOff(ready <-chan struct{}) {
	defer wr.signal()
	var ws, again []*write[K, V]
	for {
		ws, again = wr.round(ws, again)
		select {
		case <-ready:
			return
		default:
		}
		if len(ws) == 0 {
			select {
			case <-wr.wake: // the next round takes what it announced
			case <-ready:
				return
			}
		}
	}
}

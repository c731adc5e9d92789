package flightcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// dependents is an EvictionObserver as a cache of derived values would
// have one: when a key leaves, Evicted drops its dependent key (dep/key),
// with Invalidate, or rewrites it, with Set, on the Loader in l (the one
// it observes, or another); with only set, for departures of that cause
// only; with every set, it also calls Peek, Refresh, Get (with a
// deadline) and, now and then, InvalidateAll. With closeOn set, it closes
// the Loader instead, from inside the first Evicted call of that cause.
type dependents struct {
	quiet
	l       atomic.Pointer[Loader[string, string]]
	set     bool
	every   bool
	only    EvictionCause
	closeOn EvictionCause
	closing atomic.Bool
	closed  chan error   // Close's return, from inside Evicted
	calls   atomic.Int64 // Evicted calls for keys that have a dependent
	writes  atomic.Int64 // Sets and Invalidates made, and returned
	stale   atomic.Int64 // a dependent still seen after its Invalidate returned
	failed  atomic.Int64 // Gets from Evicted that failed
}

func (d *dependents) Evicted(ev EvictionEvent[string]) {
	l := d.l.Load()
	if l == nil {
		return
	}
	if d.closeOn != 0 {
		if ev.Cause == d.closeOn && d.closing.CompareAndSwap(false, true) {
			d.closed <- l.Close()
		}
		return
	}
	if strings.HasPrefix(ev.Key, "dep/") || d.only != 0 && ev.Cause != d.only {
		return
	}
	n := d.calls.Add(1)
	dep := "dep/" + ev.Key
	if d.every {
		d.callEvery(l, dep, n)
	}
	if d.set {
		l.Set(dep, ev.Key)
	} else {
		l.Invalidate(dep)
		if _, _, ok := l.Peek(dep); ok {
			d.stale.Add(1)
		}
	}
	d.writes.Add(1)
}

// callEvery calls the Loader's other methods from Evicted, n-th call.
func (d *dependents) callEvery(l *Loader[string, string], dep string, n int64) {
	l.Peek(dep)
	l.Refresh(context.Background(), dep)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.Get(ctx, "got/"+dep); err != nil && !errors.Is(err, ErrClosed) {
		d.failed.Add(1)
	}
	if n%100 == 0 {
		l.InvalidateAll()
	}
}

// within runs f on its own goroutine and reports whether it returned
// within d; a test whose operation hangs fails instead of hanging.
func within(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// An EvictionObserver whose Evicted calls Invalidate or Set of another key
// of its Loader does not wedge it: Evicted used to run on ristretto's
// goroutine, or on the writer's after the Clear of an InvalidateAll, where
// a write waiting for a place waited for the writer, which waited for that
// very goroutine (in ristretto's Wait) or was that goroutine. Every Set,
// Invalidate and Close then hung for good, here within a few rounds (a
// hundred with the default MaxPendingWrites, which a MaxCost of 8 bounds
// too). With a small MaxCost, evictions are constant; every round of
// operations has a deadline (and every Get its own), the Loader closes
// within one and leaves no goroutine behind, every callback's write
// returns, and no dependent is seen after the Invalidate that dropped it
// returned (docs/design.md rule 28: a callback may call its Loader).
func TestEvictedMayWrite(t *testing.T) {
	for _, tc := range []evictCase{
		{"Invalidate", false, false, 0, 0, 1, 1500},
		{"Set", true, false, 0, 0, 1, 1500},
		{"Invalidate after InvalidateAll", false, false, 0, 2, 1, 1500},
		{"Set after InvalidateAll", true, false, 0, 2, 1, 1500},
		// What the Clear of an InvalidateAll drops was reported on the
		// writer's own goroutine.
		{"Invalidate on what InvalidateAll drops", false, false, EvictionInvalidated, 2, 1, 1500},
		{"Invalidate, default MaxPendingWrites", false, false, 0, 0, 0, 4000},
		{"every method", true, true, 0, 0, 1, 1500},
	} {
		if raceEnabled {
			// A wedge came within a few rounds (a hundred with the default
			// MaxPendingWrites): a third of them still covers it many times.
			tc.rounds /= 3
		}
		t.Run(tc.name, tc.run)
	}
}

// evictCase is one case of TestEvictedMayWrite.
type evictCase struct {
	name   string
	set    bool
	every  bool          // call the other methods too (callEvery)
	only   EvictionCause // react to departures of this cause only; 0: all
	clear  int           // an InvalidateAll every clear rounds; 0: none
	places int           // Options.MaxPendingWrites
	rounds int
}

func (tc evictCase) run(t *testing.T) {
	d := &dependents{set: tc.set, every: tc.every, only: tc.only}
	l, err := New((&downstream{}).load, Options[string, string]{
		TTL: time.Minute, MaxCost: 8, MaxPendingWrites: tc.places, Observer: d,
	})
	if err != nil {
		t.Fatal(err)
	}
	d.l.Store(l)
	for i := range tc.rounds {
		var err error
		if !within(5*time.Second, func() { err = evictionRound(l, i, tc.clear) }) {
			t.Fatalf("round %d of %d (Sets, a Get, an Invalidate) still running after 5s: the Loader is wedged (%d Evicted calls so far)",
				i, tc.rounds, d.calls.Load())
		}
		if err != nil {
			t.Fatalf("round %d: Get = %v", i, err)
		}
	}
	if !within(10*time.Second, func() { l.Close() }) {
		t.Fatal("Close still running after 10s")
	}
	if n := d.calls.Load(); n < int64(tc.rounds/4) {
		t.Errorf("%d Evicted calls in %d rounds of a cache of 8; want constant departures", n, tc.rounds)
	}
	if c, w := d.calls.Load(), d.writes.Load(); w != c {
		t.Errorf("%d Evicted calls returned from %d writes; want every write to return", c, w)
	}
	if n := d.failed.Load(); n > 0 {
		t.Errorf("%d Gets from Evicted failed", n)
	}
	if n := d.stale.Load(); n > 0 {
		t.Errorf("%d dependents still seen after the Invalidate that dropped them returned", n)
	}
	goleak.VerifyNone(t)
}

// evictionRound is round i of TestEvictedMayWrite: every clear rounds an
// InvalidateAll first, then a Set of a new key and of its dependent, a Get
// of a new key (a load, then a fill), a Set over the key of the round
// before, and an Invalidate of an older key. It returns the Get's error.
func evictionRound(l *Loader[string, string], i, clear int) error {
	if clear > 0 && i%clear == 0 {
		l.InvalidateAll()
	}
	k := fmt.Sprint("k", i)
	l.Set(k, k)
	l.Set("dep/"+k, k)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.Get(ctx, fmt.Sprint("g", i))
	l.Set(fmt.Sprint("k", i-1), k)
	l.Invalidate(fmt.Sprint("k", i/2))
	return err
}

// Close called from inside Evicted returns at once, on whichever
// goroutine Evicted runs: the writer's (or, before, ristretto's) for an
// entry the policy evicted, the caller's of Set or Invalidate for one
// they replaced or dropped. It cannot wait there: the caller of Set was
// still counted in, and ristretto's goroutine or the writer's is what
// Close waits for. The Loader then closes: a later Close from outside
// returns within a deadline (docs/design.md rule 28).
func TestEvictedMayClose(t *testing.T) {
	for _, cause := range []EvictionCause{EvictionPolicy, EvictionReplaced, EvictionInvalidated} {
		t.Run(cause.String(), func(t *testing.T) {
			d := &dependents{closeOn: cause, closed: make(chan error, 1)}
			l, err := New((&downstream{}).load, Options[string, string]{
				TTL: time.Minute, MaxCost: 4, MaxPendingWrites: 1, Observer: d,
			})
			if err != nil {
				t.Fatal(err)
			}
			d.l.Store(l)
			var closeErr error
			for i := 0; !d.closing.Load(); i++ {
				if i == 1000 {
					t.Fatalf("no %v eviction in %d rounds", cause, i)
				}
				if !within(5*time.Second, func() { evictionRound(l, i, 0) }) {
					t.Fatalf("round %d still running after 5s: Close from Evicted wedged the Loader", i)
				}
			}
			select {
			case closeErr = <-d.closed:
			case <-time.After(5 * time.Second):
				t.Fatal("Close from Evicted still running after 5s")
			}
			if closeErr != nil {
				t.Errorf("Close from Evicted = %v", closeErr)
			}
			if !within(10*time.Second, func() { l.Close() }) {
				t.Fatal("Close after a Close from Evicted still running after 10s")
			}
			if _, err := l.Get(t.Context(), "k"); !errors.Is(err, ErrClosed) {
				t.Errorf("Get after Close from Evicted = %v; want ErrClosed", err)
			}
			goleak.VerifyNone(t)
		})
	}
}

// Two Loaders whose Evicted writes to the other: each writer may find the
// other's share full, and does the other Loader's rounds itself, one at a
// time with that Loader's own writer (write.go). Neither wedges
// (docs/design.md rule 28).
func TestEvictedWritesToAnotherLoader(t *testing.T) {
	var ls [2]*Loader[string, string]
	var ds [2]*dependents
	for i := range ls {
		ds[i] = &dependents{set: i == 1}
		l, err := New((&downstream{}).load, Options[string, string]{
			TTL: time.Minute, MaxCost: 8, MaxPendingWrites: 1, Observer: ds[i],
		})
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	ds[0].l.Store(ls[1]) // A's departures invalidate in B
	ds[1].l.Store(ls[0]) // B's set in A
	for i := range 1500 {
		l := ls[i%2]
		if !within(5*time.Second, func() { evictionRound(l, i/2, 4) }) {
			t.Fatalf("round %d still running after 5s (%d and %d Evicted calls so far)", i, ds[0].calls.Load(), ds[1].calls.Load())
		}
	}
	for i, l := range ls {
		// What a round done by the other Loader's writer saw leave is
		// reported by this Loader's own writer, which that round woke.
		waitFor(t, fmt.Sprintf("Loader %d to report every departure", i), 10*time.Second, func() bool {
			l.writer.departuresMu.Lock()
			defer l.writer.departuresMu.Unlock()
			return len(l.writer.departures) == 0
		})
	}
	for _, l := range ls {
		if !within(10*time.Second, func() { l.Close() }) {
			t.Fatal("Close still running after 10s")
		}
	}
	for i, d := range ds {
		if c, w := d.calls.Load(), d.writes.Load(); c < 100 || w != c {
			t.Errorf("Loader %d: %d Evicted calls, %d writes returned; want many, all returned", i, c, w)
		}
		// No check of stale dependents here: the rounds of the other
		// Loader set the same dependents meanwhile.
	}
	goleak.VerifyNone(t)
}

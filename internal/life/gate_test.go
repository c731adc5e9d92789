package life

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func idle(g *Gate) bool {
	select {
	case <-g.Idle():
		return true
	default:
		return false
	}
}

// Idle closes only once the gate is closed and the last call has left:
// a Get, an operation and a child each hold it open.
func TestGateIdleWaitsForEveryCall(t *testing.T) {
	var g Gate
	g.Init()
	var in Gets
	if !g.EnterGets(&in, 3) {
		t.Fatal("EnterGets refused an open gate")
	}
	s, ok := g.EnterOp()
	if !ok {
		t.Fatal("EnterOp refused an open gate")
	}
	s.Enter() // a child of the operation
	g.ExitOp(s)
	if !g.Close() || g.Close() {
		t.Fatal("Close: want true the first time only")
	}
	g.CheckIdle()
	if idle(&g) {
		t.Fatal("idle with a Get and a child inside")
	}
	in.Hit()
	in.Stale()
	g.ExitGets(&in) // the third Get has no outcome: it leaves as passed
	if idle(&g) {
		t.Fatal("idle with a child inside")
	}
	g.ExitChild(s)
	if !idle(&g) {
		t.Fatal("not idle once every call has left")
	}
	if c := g.Counts(); c != (Counts{Gets: 3, Hits: 1, Stale: 1}) {
		t.Fatalf("Counts = %+v", c)
	}
}

// After Close every call is refused at the door, and a refused Get counts
// as closed without touching a stripe.
func TestGateRefusesAfterClose(t *testing.T) {
	var g Gate
	g.Init()
	g.Close()
	g.CheckIdle()
	if !idle(&g) {
		t.Fatal("a closed gate with nothing inside is not idle")
	}
	var in Gets
	if g.EnterGets(&in, 2) {
		t.Fatal("EnterGets let Gets into a closed gate")
	}
	if _, ok := g.EnterOp(); ok {
		t.Fatal("EnterOp let an operation into a closed gate")
	}
	if c := g.Counts(); c.Gets != 2 || c.Closed != 2 {
		t.Fatalf("Counts = %+v; want 2 Gets, 2 closed", c)
	}
	if n := g.OpsIn(); n != 0 {
		t.Fatalf("OpsIn = %d; want 0: refused at the door", n)
	}
}

// Unanswered is what a panic cut short: ExitGets counts them out all the
// same, so the gate balances.
func TestGateUnanswered(t *testing.T) {
	var g Gate
	g.Init()
	var in Gets
	g.EnterGets(&in, 4)
	in.Passed()
	if n := in.Unanswered(); n != 3 {
		t.Fatalf("Unanswered = %d; want 3", n)
	}
	g.ExitGets(&in)
	g.Close()
	g.CheckIdle()
	if !idle(&g) {
		t.Fatal("Gets cut short kept the gate from balancing")
	}
}

// Calls entering and leaving while Close runs: Idle closes exactly once,
// after the last one left. Close waits until every goroutine has been in
// at least once, so it always races calls in flight; every Get let in is
// counted, and a Get refused after Close is counted as closed.
func TestGateCloseRacingCalls(t *testing.T) {
	for range 50 {
		var g Gate
		g.Init()
		var wg, started, inside sync.WaitGroup
		var hits, refused atomic.Uint64
		for range 8 {
			started.Add(1)
			wg.Go(func() {
				first := true
				for {
					var in Gets
					if !g.EnterGets(&in, 1) {
						refused.Add(1)
						return
					}
					in.Hit()
					hits.Add(1)
					g.ExitGets(&in)
					s, ok := g.EnterOp()
					if !ok {
						return
					}
					s.Enter()
					inside.Add(1)
					go func() { defer inside.Done(); g.ExitChild(s) }()
					g.ExitOp(s)
					if first {
						first = false
						started.Done()
					}
					runtime.Gosched() // let the others start: Close waits for them
				}
			})
		}
		waitGroup(t, "every goroutine's first call", &started)
		if idle(&g) {
			t.Fatal("idle before Close")
		}
		g.Close()
		g.CheckIdle()
		waitGroup(t, "the callers to see the gate closed", &wg)
		waitGroup(t, "the children to leave", &inside)
		select {
		case <-g.Idle(): // never closed twice (that panics), and closed once all left
		case <-time.After(10 * time.Second):
			t.Fatal("Idle not closed 10s after the last call left")
		}
		if c := g.Counts(); c.Hits != hits.Load() || c.Closed != refused.Load() || c.Gets != c.Hits+c.Closed {
			t.Fatalf("Counts = %+v; want %d hits and %d closed, all of the Gets", c, hits.Load(), refused.Load())
		}
	}
}

// waitGroup waits for wg, failing the test after 10s: a deadlock fails
// fast, not at the package's timeout.
func waitGroup(t *testing.T, what string, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10s for %s", what)
	}
}

// The strict twin of the root package's real-clock starvation tests
// (TestCloseReturnsWhileGetsKeepComing): calls refused after Close never touch a
// stripe, so however many keep coming, the gate balances the moment the
// last call let in before Close leaves. (Refused Gets were once counted on
// the stripes, and a stream of them kept quiet from ever holding.)
func TestGateRefusedCallsDoNotHoldClose(t *testing.T) {
	var g Gate
	g.Init()
	var held Gets
	if !g.EnterGets(&held, 1) {
		t.Fatal("EnterGets refused an open gate")
	}
	g.Close()
	g.CheckIdle()
	before := stripeCounts(&g)
	for range 10000 {
		var in Gets
		if g.EnterGets(&in, 1) {
			t.Fatal("EnterGets let a Get into a closed gate")
		}
		if _, ok := g.EnterOp(); ok {
			t.Fatal("EnterOp let an operation into a closed gate")
		}
		g.CheckIdle()
	}
	if after := stripeCounts(&g); after != before {
		t.Fatalf("refused calls changed the stripes: %+v, then %+v", before, after)
	}
	if idle(&g) {
		t.Fatal("idle with a Get inside")
	}
	held.Hit()
	g.ExitGets(&held)
	if !idle(&g) {
		t.Fatal("not idle once the last Get let in left, with 10,000 refused calls behind it")
	}
	if c := g.Counts(); c.Gets != 10001 || c.Closed != 10000 || c.Hits != 1 {
		t.Fatalf("Counts = %+v; want 10,001 Gets: 1 hit, 10,000 closed", c)
	}
}

// stripeCounts sums every stripe's counters, the refused Gets left out.
func stripeCounts(g *Gate) [7]uint64 {
	var sum [7]uint64
	for i := range g.stripes {
		s := &g.stripes[i]
		for j, v := range []uint64{s.gets.Load(), s.hits.Load(), s.stale.Load(), s.passed.Load(), s.closed.Load(), s.opsIn.Load(), s.opsOut.Load()} {
			sum[j] += v
		}
	}
	return sum
}

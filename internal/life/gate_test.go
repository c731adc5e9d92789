package life

import (
	"sync"
	"testing"
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
// after the last one left.
func TestGateCloseRacingCalls(t *testing.T) {
	for range 50 {
		var g Gate
		g.Init()
		var wg sync.WaitGroup
		var inside sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					var in Gets
					if !g.EnterGets(&in, 1) {
						return
					}
					in.Hit()
					g.ExitGets(&in)
					s, ok := g.EnterOp()
					if !ok {
						return
					}
					s.Enter()
					inside.Add(1)
					go func() { defer inside.Done(); g.ExitChild(s) }()
					g.ExitOp(s)
				}
			}()
		}
		g.Close()
		g.CheckIdle()
		wg.Wait()
		inside.Wait()
		<-g.Idle() // never closed twice (that panics), and closed once all left
	}
}

package life

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

type jobFunc func()

func (f jobFunc) Run() { f() }

// A job runs under OnPool, a RunWriter function under OnWriter, and
// neither elsewhere: the lookup is by the marking function's address, so
// a rename cannot break it silently.
func TestOnPoolAndOnWriter(t *testing.T) {
	if OnPool() || OnWriter() {
		t.Fatal("OnPool or OnWriter true on a test goroutine")
	}
	done := make(chan struct{})
	var p Pool
	p.Init(done)
	got := make(chan [2]bool)
	p.Go(jobFunc(func() { got <- [2]bool{OnPool(), OnWriter()} }))
	var g [2]bool
	select {
	case g = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("waited 10s for the job to run")
	}
	if g != [2]bool{true, false} {
		t.Fatalf("in a job: OnPool, OnWriter = %v; want true, false", g)
	}
	RunWriter(func() {
		if OnPool() || !OnWriter() {
			t.Error("under RunWriter: want OnWriter only")
		}
	})
	close(done)
	var left sync.WaitGroup
	left.Go(p.Wait)
	waitGroup(t, "the pool's goroutines to leave", &left)
}

// Jobs one after another reuse one goroutine; a burst starts more, and
// all but Kept of them leave after IdleFor; all leave once done closes.
func TestPoolReusesAndShrinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		done := make(chan struct{})
		var p Pool
		p.Init(done)
		for range 100 {
			ran := make(chan struct{})
			p.Go(jobFunc(func() { close(ran) }))
			<-ran
			synctest.Wait() // back to waiting
		}
		if n := p.Started(); n != 1 {
			t.Fatalf("Started = %d for 100 jobs one at a time; want 1", n)
		}
		const burst = 6
		gate := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(burst)
		for range burst {
			p.Go(jobFunc(func() { <-gate; wg.Done() }))
			// Every goroutine is in its job before the next Go: the one
			// reused from above has stopped counting itself idle, so each
			// goroutine of the burst counts the others exactly when it
			// goes idle, and exactly Kept of them wait with no timer (as
			// the Loader's burst in TestIdleLoadGoroutinesLeave does). A
			// goroutine that has taken a job but not yet uncounted itself
			// makes a later one count it, and then fewer than Kept stay.
			synctest.Wait()
		}
		close(gate)
		wg.Wait()
		synctest.Wait()
		if n := p.Idle(); n != burst {
			t.Fatalf("Idle = %d after a burst of %d; want %d", n, burst, burst)
		}
		time.Sleep(IdleFor + time.Second)
		synctest.Wait()
		// Kept goroutines wait for a job until done (Kept's doc).
		if n := p.Idle(); n != Kept {
			t.Fatalf("Idle = %d after IdleFor; want Kept (%d)", n, Kept)
		}
		close(done)
		p.Wait()
		if n := p.Idle(); n != 0 {
			t.Fatalf("Idle = %d after done; want 0", n)
		}
	})
}

// No more than MaxIdle goroutines stay waiting after a large burst.
func TestPoolKeepsAtMostMaxIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		done := make(chan struct{})
		var p Pool
		p.Init(done)
		n := 3 * p.MaxIdle()
		gate := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(n)
		for range n {
			p.Go(jobFunc(func() { <-gate; wg.Done() }))
		}
		close(gate)
		wg.Wait()
		synctest.Wait()
		if got := p.Idle(); got != p.MaxIdle() {
			t.Fatalf("Idle = %d after a burst of %d; want MaxIdle (%d)", got, n, p.MaxIdle())
		}
		close(done)
		p.Wait()
	})
}

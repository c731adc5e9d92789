package flightredis

import (
	"sync"
	"testing"
	"time"
)

// A test that waits on the real clock for a goroutine (a receive, a
// WaitGroup) waits with a deadline of its own, in seconds: a deadlock then
// fails that test, with what it waited for, rather than the whole package
// at go test's timeout.

// within receives from ch, failing the test if nothing comes in d.
func within[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("no %s in %v", what, d)
		panic("unreachable")
	}
}

// waitAll waits for wg, failing the test if it is not done in d.
func waitAll(t testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	within(t, done, d, what)
}

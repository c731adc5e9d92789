package loadctx_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/internal/loadctx"
)

var errTimeout = errors.New("timed out")

// endedAt returns the offset from epoch at which c ends.
func endedAt(c *loadctx.Context, epoch time.Time) time.Duration {
	<-c.Done()
	return time.Since(epoch)
}

// A context added to a Timeouts has its deadline, the timeout after its
// start (an offset from the epoch), and ends there with DeadlineExceeded
// and the Timeouts' cause; contexts added at different times end at their
// own deadlines, from one timer.
func TestTimeoutsEndInStartOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Now()
		time.Sleep(time.Second) // offsets need not start at 0
		tm := loadctx.NewTimeouts(100*time.Millisecond, epoch, errTimeout)
		defer tm.Stop()
		var cs [3]loadctx.Context
		for i := range cs {
			tm.Add(&cs[i], time.Since(epoch))
			if i < 2 {
				time.Sleep(30 * time.Millisecond)
			}
		}
		for i := range cs {
			want := time.Second + time.Duration(100+30*i)*time.Millisecond
			if d, ok := cs[i].Deadline(); !ok || d.Sub(epoch) != want {
				t.Errorf("context %d: Deadline %v, %v; want %v", i, d.Sub(epoch), ok, want)
			}
			if at := endedAt(&cs[i], epoch); at != want {
				t.Errorf("context %d ended at %v; want %v", i, at, want)
			}
			if cs[i].Err() != context.DeadlineExceeded || context.Cause(&cs[i]) != errTimeout {
				t.Errorf("context %d: Err, Cause = %v, %v; want DeadlineExceeded, %v", i, cs[i].Err(), context.Cause(&cs[i]), errTimeout)
			}
		}
	})
}

// Remove takes a context off the list: it no longer ends at its deadline,
// and the others still do. Added again, it counts from its new start.
func TestTimeoutsRemove(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Now()
		tm := loadctx.NewTimeouts(100*time.Millisecond, epoch, errTimeout)
		defer tm.Stop()
		var first, second loadctx.Context
		tm.Add(&first, 0)
		tm.Add(&second, 0)
		tm.Remove(&first)
		tm.Remove(&first) // twice: nothing
		if at := endedAt(&second, epoch); at != 100*time.Millisecond {
			t.Errorf("second ended at %v; want 100ms", at)
		}
		time.Sleep(time.Second)
		if first.Err() != nil {
			t.Fatalf("a removed context ended: %v", first.Err())
		}
		tm.Add(&first, time.Since(epoch))
		if at := endedAt(&first, epoch); at != 1200*time.Millisecond {
			t.Errorf("first, added again at 1.1s, ended at %v; want 1.2s", at)
		}
	})
}

// A context whose start was read before another's was added keeps the
// list in deadline order: its deadline moves up to the other's.
func TestTimeoutsLateAddMovesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Now()
		tm := loadctx.NewTimeouts(100*time.Millisecond, epoch, errTimeout)
		defer tm.Stop()
		var later, earlier loadctx.Context
		tm.Add(&later, 50*time.Millisecond)
		tm.Add(&earlier, 10*time.Millisecond)
		if d, _ := earlier.Deadline(); d.Sub(epoch) != 150*time.Millisecond {
			t.Errorf("earlier's deadline %v; want the tail's, 150ms", d.Sub(epoch))
		}
		if at := endedAt(&earlier, epoch); at != 150*time.Millisecond {
			t.Errorf("earlier ended at %v; want 150ms", at)
		}
	})
}

// A deadline past the end of time saturates; Stop ends no context more.
func TestTimeoutsSaturateAndStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Now()
		tm := loadctx.NewTimeouts(time.Hour, epoch, errTimeout)
		var far, near loadctx.Context
		tm.Add(&far, math.MaxInt64-time.Minute)
		if d, _ := far.Deadline(); d.Sub(epoch) != math.MaxInt64 {
			t.Errorf("deadline %v; want the largest", d.Sub(epoch))
		}
		tm.Remove(&far)
		tm.Add(&near, 0)
		tm.Stop()
		time.Sleep(2 * time.Hour)
		if near.Err() != nil {
			t.Errorf("a context ended after Stop: %v", near.Err())
		}
	})
}

// Overdue says whether a context's deadline has passed at an offset,
// whether or not it has ended: false before it is added, false short of
// its deadline, true from its deadline on, though the timer that ends it
// has not fired (it is stopped here).
func TestOverdueBeforeTheEnd(t *testing.T) {
	epoch := time.Now()
	tm := loadctx.NewTimeouts(time.Hour, epoch, errTimeout)
	defer tm.Stop()
	var c loadctx.Context
	if c.Overdue(math.MaxInt64) {
		t.Error("Overdue before Add = true; want false: no deadline")
	}
	tm.Add(&c, 5*time.Second)
	tm.Stop()
	due := 5*time.Second + time.Hour
	if c.Overdue(due - 1) {
		t.Errorf("Overdue(%v) = true; want false before the deadline %v", due-1, due)
	}
	if !c.Overdue(due) || !c.Overdue(due+time.Hour) {
		t.Errorf("Overdue at and past the deadline %v = false; want true", due)
	}
	if c.Err() != nil {
		t.Errorf("Err = %v; want nil: the context has not ended", c.Err())
	}
}

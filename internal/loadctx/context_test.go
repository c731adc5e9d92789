package loadctx_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/internal/loadctx"
)

type key string

// values answers key("v") with "yes", and counts the calls.
type values struct{ calls int }

func (v *values) Value(k any) any {
	v.calls++
	if k == key("v") {
		return "yes"
	}
	return nil
}

// A Context answers Value from the Values it was given, and nothing
// without; it has no deadline until it is added to a Timeouts.
func TestContextValues(t *testing.T) {
	var c loadctx.Context
	if v := c.Value(key("v")); v != nil {
		t.Errorf("Value without Values = %v; want nil", v)
	}
	var vs values
	c.Init(&vs)
	if v := c.Value(key("v")); v != "yes" || vs.calls != 1 {
		t.Errorf("Value = %v after %d calls; want yes after 1", v, vs.calls)
	}
	if v := c.Value(key("other")); v != nil {
		t.Errorf("Value of an unknown key = %v; want nil", v)
	}
	if _, ok := c.Deadline(); ok {
		t.Error("Deadline ok before Add; want none")
	}
	if c.Err() != nil {
		t.Errorf("Err before the end = %v; want nil", c.Err())
	}
	if s := c.String(); s != "flightcache.loadContext" {
		t.Errorf("String = %q", s)
	}
}

// Cancel ends a Context once: Done closes (asked for before or after),
// Err is Canceled, and Cause is the cause of the first Cancel; a cause of
// context.Canceled is none of its own. Values stay.
func TestContextCancel(t *testing.T) {
	own := errors.New("own cause")
	for _, tt := range []struct {
		name      string
		cause     error
		doneFirst bool
	}{
		{"plain", context.Canceled, false},
		{"plain/Done before", context.Canceled, true},
		{"own cause", own, false},
		{"own cause/Done before", own, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var c loadctx.Context
			c.Init(&values{})
			var done <-chan struct{}
			if tt.doneFirst {
				done = c.Done()
				select {
				case <-done:
					t.Fatal("Done closed before Cancel")
				default:
				}
			}
			c.Cancel(tt.cause)
			c.Cancel(errors.New("too late"))
			if !tt.doneFirst {
				done = c.Done()
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Done not closed 10s after Cancel")
			}
			if c.Err() != context.Canceled || context.Cause(&c) != tt.cause {
				t.Errorf("Err, Cause = %v, %v; want Canceled, %v", c.Err(), context.Cause(&c), tt.cause)
			}
			if v := c.Value(key("v")); v != "yes" {
				t.Errorf("Value after the end = %v; want yes", v)
			}
		})
	}
}

// Contexts derived from a Context end with it, with its error and cause;
// an AfterFunc registered before the end runs once it ends, unless it
// was stopped, and one registered after runs at once.
func TestContextDerivedAndAfterFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := errors.New("cause")
		var c loadctx.Context
		derived, cancel := context.WithCancel(&c)
		defer cancel()
		ran := make(chan string, 3)
		context.AfterFunc(&c, func() { ran <- "kept" })
		stop := context.AfterFunc(&c, func() { ran <- "stopped" })
		if !stop() {
			t.Error("stop before the end = false; want true")
		}
		c.Cancel(cause)
		<-derived.Done()
		if derived.Err() != context.Canceled || context.Cause(derived) != cause {
			t.Errorf("derived Err, Cause = %v, %v; want Canceled, %v", derived.Err(), context.Cause(derived), cause)
		}
		late := context.AfterFunc(&c, func() { ran <- "late" })
		synctest.Wait()
		close(ran)
		var got []string
		for r := range ran {
			got = append(got, r)
		}
		if len(got) != 2 || got[0] == "stopped" || got[1] == "stopped" {
			t.Errorf("AfterFuncs ran: %v; want kept and late", got)
		}
		if late() {
			t.Error("stop after the end = true; want false")
		}
	})
}

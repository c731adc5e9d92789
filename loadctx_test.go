package flightcache

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxKey string

// A load's context (buildContext, downstream.go; internal/loadctx) behaves as the standard contexts it
// replaces: its deadline is LoadTimeout after the load began, and at the
// deadline it ends with DeadlineExceeded and the cause ErrLoadTimeout, in
// contexts derived from it too; it keeps the caller's values but neither
// its cancellation nor its cause.
func TestLoadContextTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type seen struct {
			deadline            time.Duration
			err, cause          error
			derived, derivCause error
			value               any
			afterFunc           bool
		}
		got := make(chan seen, 1)
		start := time.Now()
		l, err := New(func(ctx context.Context, k string) (string, error) {
			var s seen
			d, _ := ctx.Deadline()
			s.deadline = d.Sub(start)
			s.value = ctx.Value(ctxKey("trace"))
			derived, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			ran := make(chan struct{})
			context.AfterFunc(ctx, func() { close(ran) })
			<-derived.Done()
			<-ran
			s.afterFunc = true
			s.err, s.cause = ctx.Err(), context.Cause(ctx)
			s.derived, s.derivCause = derived.Err(), context.Cause(derived)
			got <- s
			return "", ctx.Err()
		}, Options[string, string]{TTL: time.Minute, LoadTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		caller, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey("trace"), "t-1"))
		cancel(errors.New("the caller's own cause")) // the load must not inherit it
		_, err = l.Get(context.WithoutCancel(caller), "k")
		if !errors.Is(err, ErrLoadTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get = %v; want ErrLoadTimeout and DeadlineExceeded", err)
		}
		s := <-got
		if s.deadline != 100*time.Millisecond || s.value != "t-1" || !s.afterFunc {
			t.Errorf("deadline %v, value %v, AfterFunc ran %v; want 100ms, t-1, true", s.deadline, s.value, s.afterFunc)
		}
		if s.err != context.DeadlineExceeded || s.cause != ErrLoadTimeout {
			t.Errorf("ctx.Err, Cause = %v, %v; want DeadlineExceeded, ErrLoadTimeout", s.err, s.cause)
		}
		if s.derived != context.DeadlineExceeded || s.derivCause != ErrLoadTimeout {
			t.Errorf("derived ctx.Err, Cause = %v, %v; want DeadlineExceeded, ErrLoadTimeout", s.derived, s.derivCause)
		}
	})
}

// Loads that start at different times end at their own deadlines: one
// timer per Loader serves them in start order.
func TestLoadTimeoutsInStartOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		ended := make(chan [2]any, 3)
		l, err := New(func(ctx context.Context, k string) (string, error) {
			<-ctx.Done()
			ended <- [2]any{k, time.Since(start)}
			return "", ctx.Err()
		}, Options[string, string]{TTL: time.Minute, LoadTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for i, k := range []string{"a", "b", "c"} {
			go l.Get(context.Background(), k)
			if i < 2 {
				time.Sleep(30 * time.Millisecond)
			}
		}
		want := map[string]time.Duration{"a": 100 * time.Millisecond, "b": 130 * time.Millisecond, "c": 160 * time.Millisecond}
		for range 3 {
			e := <-ended
			if k, at := e[0].(string), e[1].(time.Duration); at != want[k] {
				t.Errorf("load of %s ended at %v; want %v", k, at, want[k])
			}
		}
	})
}

// Close ends a load's context with the cause ErrClosed; the load's own end
// (it returned) is a plain Canceled with no cause of its own.
func TestLoadContextCauses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		causes := make(chan [2]error, 2)
		keep := make(chan context.Context, 1)
		l, err := New(func(ctx context.Context, k string) (string, error) {
			if k == "quick" {
				keep <- ctx
				return k, nil
			}
			<-ctx.Done()
			causes <- [2]error{ctx.Err(), context.Cause(ctx)}
			return "", ctx.Err()
		}, Options[string, string]{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Get(context.Background(), "quick"); err != nil {
			t.Fatal(err)
		}
		done := <-keep
		if done.Err() != context.Canceled || context.Cause(done) != context.Canceled {
			t.Errorf("a finished load's ctx: Err %v, Cause %v; want Canceled, Canceled", done.Err(), context.Cause(done))
		}
		go l.Get(context.Background(), "slow")
		synctest.Wait()
		l.Close()
		if c := <-causes; c[0] != context.Canceled || c[1] != ErrClosed {
			t.Errorf("a load stopped by Close: Err %v, Cause %v; want Canceled, ErrClosed", c[0], c[1])
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// badError is an error whose method named broken panics. The Loader
// inspects a load's error (errors.Is and errors.As call its Unwrap, Is and
// As; its text is read with Error), on the load's goroutine: docs/internals.md
// "One guard for user code" says a panic there is a *PanicError for the
// waiters, as a LoadFunc's panic is (rule 7), never a crash.
type badError struct{ broken string }

func (e *badError) panicIf(method string) {
	if e.broken == method {
		panic("badError." + method + " panicked")
	}
}

func (e *badError) Error() string        { e.panicIf("Error"); return "bad error" }
func (e *badError) Unwrap() error        { e.panicIf("Unwrap"); return errBoom }
func (e *badError) Is(target error) bool { e.panicIf("Is"); return false }
func (e *badError) As(target any) bool   { e.panicIf("As"); return false }

// badErrorMethods are the methods of an error the Loader may call.
var badErrorMethods = []string{"Unwrap", "Is", "As", "Error"}

// badErrorOptions are the Options every badError test uses: retries, which
// a *PanicError must not use, and a breaker that one failure opens.
func badErrorOptions() Options[string, string] {
	return Options[string, string]{
		TTL:     time.Minute,
		Retry:   Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
		Breaker: Breaker{ConsecutiveFailures: 1},
	}
}

// wantPanicError fails t unless err is a *PanicError whose value is the
// panic of badError's method.
func wantPanicError(t *testing.T, what string, err error, method string) {
	t.Helper()
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "badError."+method+" panicked" {
		t.Fatalf("%s = %v; want a *PanicError of badError.%s", what, err, method)
	}
}

// wantFailureCounted fails t unless the Loader counted one panic, made
// one downstream call (calls, as the downstream counted them: a
// *PanicError is not retried), and its breaker heard a failure: it is open.
func wantFailureCounted(t *testing.T, l *Loader[string, string], calls int64) {
	t.Helper()
	if s := l.Stats(); s.Panics != 1 || calls != 1 || s.Retries != 0 || s.Breaker != BreakerOpen {
		t.Fatalf("Stats Panics %d, Retries %d, Breaker %v, with %d downstream calls; want 1, 0, open, 1 call", s.Panics, s.Retries, s.Breaker, calls)
	}
}

// A LoadFunc's error whose Unwrap, Is, As or Error panics reaches Get as a
// *PanicError: not retried, not cached, a breaker failure.
func TestBadErrorFromLoadFunc(t *testing.T) {
	for _, method := range badErrorMethods {
		t.Run(method, func(t *testing.T) {
			d := &downstream{fail: func(int64, string) error { return &badError{method} }}
			l := newLoader(t, d, badErrorOptions())
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := l.Get(ctx, "k")
			wantPanicError(t, "Get", err, method)
			wantFailureCounted(t, l, d.calls.Load())
			if _, err := l.Get(ctx, "k"); !errors.Is(err, ErrBreakerOpen) {
				t.Fatalf("second Get = %v; want ErrBreakerOpen (nothing cached, the breaker open)", err)
			}
		})
	}
}

// The same error from LoadMany is a *PanicError for each key of GetMany.
func TestBadErrorFromLoadMany(t *testing.T) {
	for _, method := range badErrorMethods {
		t.Run(method, func(t *testing.T) {
			opts := badErrorOptions()
			var calls atomic.Int64
			opts.LoadMany = func(context.Context, []string) (map[string]string, error) {
				calls.Add(1)
				return nil, &badError{method}
			}
			l := newLoader(t, &downstream{}, opts)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			got, err := l.GetMany(ctx, []string{"a", "b"})
			var me *ManyError[string]
			if !errors.As(err, &me) || len(me.Errs) != 2 || len(got) != 0 {
				t.Fatalf("GetMany = %v, %v; want a *ManyError for a and b", got, err)
			}
			wantPanicError(t, "GetMany's error for a", me.Errs["a"], method)
			wantPanicError(t, "GetMany's error for b", me.Errs["b"], method)
			wantFailureCounted(t, l, calls.Load())
		})
	}
}

// The same error from Reload, revalidating a value held, is a *PanicError
// for the Get; the value held stays.
func TestBadErrorFromReload(t *testing.T) {
	for _, method := range badErrorMethods {
		t.Run(method, func(t *testing.T) {
			opts := badErrorOptions()
			var calls atomic.Int64
			opts.Reload = func(context.Context, string, string) (string, error) {
				calls.Add(1)
				return "", &badError{method}
			}
			l := newLoader(t, &downstream{}, opts)
			l.Set("k", "held")
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := l.Get(WithRevalidate(ctx), "k")
			wantPanicError(t, "revalidating Get", err, method)
			wantFailureCounted(t, l, calls.Load())
			if v, err := l.Get(ctx, "k"); v != "held" || err != nil {
				t.Fatalf("Get after the failed reload = %q, %v; want the value held", v, err)
			}
		})
	}
}

// badRemote answers every Load with its own error, without loading.
type badRemote struct{ err error }

func (r badRemote) Load(context.Context, string, func(context.Context) (string, error)) (RemoteValue[string], error) {
	return RemoteValue[string]{}, r.err
}
func (badRemote) Set(context.Context, string, RemoteValue[string]) {}
func (badRemote) Invalidate(context.Context, string)               {}

// A Remote's own error, and a custom breaker's refusal, are inspected as a
// LoadFunc's error is: one that panics reaches Get as a *PanicError (the
// breaker's still matches ErrBreakerOpen: it refused).
func TestBadErrorFromRemoteAndBreaker(t *testing.T) {
	for _, method := range badErrorMethods {
		t.Run("Remote/"+method, func(t *testing.T) {
			d := &downstream{}
			l := newLoader(t, d, Options[string, string]{Remote: badRemote{&badError{method}}})
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := l.Get(ctx, "k")
			wantPanicError(t, "Get", err, method)
			if s := l.Stats(); s.Panics != 1 || d.calls.Load() != 0 {
				t.Fatalf("Stats Panics %d with %d downstream calls; want 1, 0", s.Panics, d.calls.Load())
			}
		})
		t.Run("Breaker/"+method, func(t *testing.T) {
			d := &downstream{}
			l := newLoader(t, d, Options[string, string]{Breaker: Breaker{Custom: refusingBreaker{&badError{method}}}})
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := l.Get(ctx, "k")
			wantPanicError(t, "Get", err, method)
			if !errors.Is(err, ErrBreakerOpen) || l.Stats().Panics != 1 || d.calls.Load() != 0 {
				t.Fatalf("Get = %v, Stats.Panics %d, %d downstream calls; want ErrBreakerOpen, 1, 0", err, l.Stats().Panics, d.calls.Load())
			}
		})
	}
}

// A runtime.Goexit in Cost (t.FailNow in a test's Cost, say) ends the load
// goroutine as it delivers; the waiters must still get the value (uncached)
// rather than hang with the key wedged in flight. In a bubble a wedged Get
// runs into its (fake) timeout as soon as everything else has blocked.
func TestGoexitInCostStillDeliversAndFreesKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		l, err := New(func(ctx context.Context, k string) (string, error) { return "v", nil },
			Options[string, string]{TTL: time.Minute, MaxCost: 100, Cost: func(string) int64 {
				if n.Add(1) == 1 {
					runtime.Goexit()
				}
				return 1
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for i := 0; i < 2; i++ {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			_, err := l.Get(ctx, "k")
			cancel()
			if err != nil {
				t.Errorf("Get #%d: %v (InFlight=%d)", i+1, err, l.Stats().InFlight)
			}
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

// The built-in breaker's refusals, open and half-open with its probe
// taken, say "circuit breaker open" once, and match ErrBreakerOpen and
// gobreaker's own error. (Their text now ends with the failure that keeps
// the breaker open: TestBreakerOpenNamesTheLastFailure.)
func TestBreakerOpenErrorSaysItOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		probing := make(chan struct{})
		release := make(chan struct{})
		healthy := false
		l, err := New(func(ctx context.Context, key string) (string, error) {
			if !healthy {
				return "", errBoom
			}
			close(probing)
			select {
			case <-release:
				return "v", nil
			case <-time.After(time.Minute):
				return "", errors.New("the test never released the probe")
			}
		}, Options[string, string]{TTL: time.Minute, Breaker: Breaker{ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := l.Get(t.Context(), "a"); !errors.Is(err, errBoom) {
			t.Fatalf("first Get = %v; want errBoom", err)
		}
		_, err = l.Get(t.Context(), "b")
		refused := ErrBreakerOpen.Error() + " (last failure: boom)"
		checkBreakerOpen(t, "open", err, gobreaker.ErrOpenState, refused)

		time.Sleep(11 * time.Second) // half-open: one probe
		healthy = true
		probe := getAsync(t.Context(), l, "a")
		<-probing
		_, err = l.Get(t.Context(), "b")
		checkBreakerOpen(t, "half-open, probe taken", err, gobreaker.ErrTooManyRequests, refused)
		close(release)
		if r := <-probe; r.err != nil {
			t.Errorf("probe = %v; want its value", r.err)
		}
	})
}

// checkBreakerOpen checks a refused Get's error: its text, and that it
// matches ErrBreakerOpen and the breaker's own refusal.
func checkBreakerOpen(t *testing.T, what string, err, refusal error, text string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: Get succeeded; want a refusal", what)
	}
	if err.Error() != text {
		t.Errorf("%s: error text %q; want %q", what, err.Error(), text)
	}
	if !errors.Is(err, ErrBreakerOpen) || !errors.Is(err, refusal) {
		t.Errorf("%s: %v does not match both ErrBreakerOpen and %v", what, err, refusal)
	}
}

// refusingBreaker is a custom breaker that refuses every call with err.
type refusingBreaker struct{ err error }

func (b refusingBreaker) Allow() (func(Outcome), error) { return nil, b.err }
func (b refusingBreaker) State() BreakerState           { return BreakerOpen }

// fleetRefusal is a custom breaker's own refusal, with a reason.
type fleetRefusal struct{ name string }

func (e *fleetRefusal) Error() string { return "shared breaker " + e.name + " is open" }

// A custom breaker's refusal keeps its own text after ErrBreakerOpen's,
// unless it is gobreaker's (which would repeat it) or matches
// ErrBreakerOpen already (returned as it is); errors.Is and errors.As find
// it.
func TestCustomBreakerRefusal(t *testing.T) {
	own := &fleetRefusal{name: "prices"}
	already := fmt.Errorf("%w: the fleet says so", ErrBreakerOpen)
	for _, tc := range []struct {
		name    string
		refusal error
		text    string
	}{
		{"its own error", own, "flightcache: circuit breaker open: shared breaker prices is open"},
		{"gobreaker's", gobreaker.ErrOpenState, "flightcache: circuit breaker open"},
		{"wrapping gobreaker's", fmt.Errorf("fleet: %w", gobreaker.ErrOpenState), "flightcache: circuit breaker open: fleet: circuit breaker is open"},
		{"matching ErrBreakerOpen", already, already.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls int
			l, err := New(func(context.Context, string) (string, error) { calls++; return "v", nil },
				Options[string, string]{TTL: time.Minute, Breaker: Breaker{Custom: refusingBreaker{tc.refusal}}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			_, err = l.Get(t.Context(), "k")
			checkBreakerOpen(t, tc.name, err, tc.refusal, tc.text)
			if calls != 0 {
				t.Errorf("LoadFunc calls = %d; want 0", calls)
			}
			if tc.refusal == own {
				if fr, ok := errors.AsType[*fleetRefusal](err); !ok || fr != own {
					t.Errorf("errors.As found %v, %v; want the breaker's own refusal", fr, ok)
				}
			}
		})
	}
}

// dialError is a downstream failure of a type a caller would look for
// with errors.As.
type dialError struct{ addr string }

func (e *dialError) Error() string { return "dial tcp " + e.addr + ": connect: connection refused" }

// A call the built-in breaker refuses names, in its text, the last failure
// that keeps it open: open, and half-open with its probe taken, with or
// without a Limit (whose admit refuses a load at once while the breaker is
// open). It matches ErrBreakerOpen and not that failure, another call's:
// only its text is kept (errors.Is and errors.As do not find it), cut to
// 256 bytes. A probe that fails opens the breaker again, and is named from
// then on. Before, every refusal read "flightcache: circuit breaker open",
// whatever the outage.
func TestBreakerOpenNamesTheLastFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		lim  Limit
	}{{"no Limit", Limit{}}, {"Limit", Limit{MaxLoads: 4}}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { breakerNamesItsCause(t, tc.lim) })
		})
	}
}

func breakerNamesItsCause(t *testing.T, lim Limit) {
	refused := &dialError{addr: "10.0.0.7:5432"}
	long := errors.New(strings.Repeat("x", 300) + " END")
	var fail atomic.Pointer[error]
	fail.Store(new(error(refused)))
	probing, release := make(chan struct{}), make(chan struct{})
	l, err := New(func(ctx context.Context, key string) (string, error) {
		if key == "probe" {
			close(probing)
			<-release
		}
		return "", *fail.Load()
	}, Options[string, string]{TTL: time.Minute, Limit: lim, Breaker: Breaker{OpenTimeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	for i := range DefaultConsecutiveFailures {
		if _, err := l.Get(ctx, fmt.Sprint("k", i)); !errors.Is(err, refused) {
			t.Fatalf("Get %d = %v; want the downstream's failure", i, err)
		}
	}
	_, err = l.Get(ctx, "next")
	checkCause(t, "open", err, refused.Error(), refused)

	time.Sleep(11 * time.Second) // half-open: one probe
	probe := getAsync(ctx, l, "probe")
	<-probing
	_, err = l.Get(ctx, "next")
	checkCause(t, "half-open, probe taken", err, refused.Error(), refused)

	fail.Store(&long)
	close(release)
	if r := <-probe; !errors.Is(r.err, long) {
		t.Fatalf("probe = %v; want its failure", r.err)
	}
	_, err = l.Get(ctx, "next")
	checkCause(t, "open again", err, strings.Repeat("x", 256)+"...", long)
}

// checkCause checks the error of a call the breaker refused: it names
// cause, the last failure's text, and matches ErrBreakerOpen but not
// failure.
func checkCause(t *testing.T, what string, err error, cause string, failure error) {
	t.Helper()
	want := ErrBreakerOpen.Error() + " (last failure: " + cause + ")"
	if err == nil || err.Error() != want {
		t.Fatalf("%s: refused Get = %v; want %q", what, err, want)
	}
	if !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("%s: %v does not match ErrBreakerOpen", what, err)
	}
	if errors.Is(err, failure) {
		t.Errorf("%s: %v matches the failure that opened the breaker, another call's", what, err)
	}
	if de, ok := errors.AsType[*dialError](err); ok {
		t.Errorf("%s: errors.As found %v in the refusal; want the failure's text only", what, de)
	}
}

// gatedBreaker is a custom breaker that lets every call through until the
// test opens it, then refuses with gobreaker's own error.
type gatedBreaker struct{ open atomic.Bool }

func (b *gatedBreaker) Allow() (func(Outcome), error) {
	if b.open.Load() {
		return nil, gobreaker.ErrOpenState
	}
	return func(Outcome) {}, nil
}

func (b *gatedBreaker) State() BreakerState {
	if b.open.Load() {
		return BreakerOpen
	}
	return BreakerClosed
}

// A custom breaker keeps its own refusal's text: the Loader names no
// failure of its own in it (a shared breaker's cause may be another
// process's).
func TestCustomBreakerRefusalNamesNoFailure(t *testing.T) {
	b := &gatedBreaker{}
	refused := &dialError{addr: "10.0.0.7:5432"}
	l, err := New(func(context.Context, string) (string, error) { return "", refused },
		Options[string, string]{TTL: time.Minute, Breaker: Breaker{Custom: b}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := l.Get(ctx, "a"); !errors.Is(err, refused) {
		t.Fatalf("Get(a) = %v; want the downstream's failure", err)
	}
	b.open.Store(true)
	_, err = l.Get(ctx, "b")
	checkBreakerOpen(t, "custom, open", err, gobreaker.ErrOpenState, ErrBreakerOpen.Error())
}

// An attempt that panics or ends its goroutine is a failure with no error
// of its own: the refusals name the *PanicError, or ErrGoexit.
func TestBreakerOpenNamesAPanicOrGoexit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		load  func()
		cause string
	}{
		{"panic", func() { panic("pool exhausted") }, "flightcache: user code panicked: pool exhausted"},
		{"Goexit", runtime.Goexit, ErrGoexit.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, err := New(func(context.Context, string) (string, error) { tc.load(); return "v", nil },
					Options[string, string]{TTL: time.Minute, Breaker: Breaker{ConsecutiveFailures: 1}})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				if _, err := l.Get(ctx, "a"); err == nil {
					t.Fatal("Get(a) succeeded; want the failure")
				}
				_, err = l.Get(ctx, "b")
				checkCause(t, tc.name, err, tc.cause, ErrGoexit)
				if pe, ok := errors.AsType[*PanicError](err); ok {
					t.Errorf("%s: errors.As found %v in the refusal; want its text only", tc.name, pe)
				}
			})
		})
	}
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

// The built-in breaker's refusals, open and half-open with its probe
// taken, say "circuit breaker open" once, and match ErrBreakerOpen and
// gobreaker's own error.
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
		checkBreakerOpen(t, "open", err, gobreaker.ErrOpenState, ErrBreakerOpen.Error())

		time.Sleep(11 * time.Second) // half-open: one probe
		healthy = true
		probe := getAsync(t.Context(), l, "a")
		<-probing
		_, err = l.Get(t.Context(), "b")
		checkBreakerOpen(t, "half-open, probe taken", err, gobreaker.ErrTooManyRequests, ErrBreakerOpen.Error())
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

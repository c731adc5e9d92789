package flightcache

import (
	"errors"

	"github.com/sony/gobreaker/v2"
)

// This file holds the circuit breaker: the interface a Loader calls, and
// its own implementation on gobreaker/v2. How a load uses it (retries
// outside, breaker inside) is in retry.go.

// BreakerState is the state of a Loader's circuit breaker.
type BreakerState uint8

const (
	// BreakerClosed: calls flow (also reported when the breaker is disabled).
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: a few probe calls test whether the downstream is back.
	BreakerHalfOpen
	// BreakerOpen: calls fail at once with ErrBreakerOpen.
	BreakerOpen
)

// String returns "closed", "half-open" or "open".
func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	default:
		return "closed"
	}
}

// CircuitBreaker decides whether a downstream call may run. The Loader has
// its own, built on gobreaker/v2 from [Options.Breaker]; [Breaker.Custom]
// replaces it, for example with one whose state is shared by processes.
// Implementations must be safe for concurrent use.
type CircuitBreaker interface {
	// Allow asks to make one downstream call. A non-nil error refuses it:
	// callers receive it wrapped so that it matches [ErrBreakerOpen].
	// Otherwise done must be called exactly once, with the call's outcome.
	Allow() (done func(Outcome), err error)
	// State reports the breaker's state, for [Stats].
	State() BreakerState
}

// Outcome is what one downstream call says about the downstream's health.
type Outcome uint8

const (
	// OutcomeSuccess: the downstream answered (a not-found included).
	OutcomeSuccess Outcome = iota
	// OutcomeFailure: the downstream failed, panicked or ran past
	// LoadTimeout.
	OutcomeFailure
	// OutcomeIgnored: the call was cut short by its callers or by Close;
	// it says nothing about the downstream and counts neither way.
	OutcomeIgnored
)

var (
	errFailure  = errors.New("flightcache: downstream failure")
	errExcluded = errors.New("flightcache: excluded from breaker counts")
)

// gobreaker wraps gobreaker's two-step breaker. The two-step form lets the
// load report an outcome even when the LoadFunc ends its goroutine with
// runtime.Goexit, which Execute cannot see (it would leave a half-open probe
// counted forever).
type gobreakerBreaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
}

// noBreaker lets every call through.
type noBreaker struct{}

func (noBreaker) Allow() (func(Outcome), error) { return func(Outcome) {}, nil }
func (noBreaker) State() BreakerState           { return BreakerClosed }

func newBreaker(b Breaker) CircuitBreaker {
	switch {
	case b.Custom != nil:
		return b.Custom
	case b.Disabled:
		return noBreaker{}
	}
	n := b.ConsecutiveFailures
	return &gobreakerBreaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "flightcache",
		MaxRequests: b.HalfOpenRequests,
		Timeout:     b.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= n },
		IsExcluded:  func(err error) bool { return err == errExcluded },
		// No OnStateChange: it runs under the breaker's lock, and nothing
		// here may call back into the breaker from it.
	})}
}

func (b *gobreakerBreaker) State() BreakerState {
	switch b.cb.State() {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	default:
		return BreakerClosed
	}
}

func (b *gobreakerBreaker) Allow() (func(Outcome), error) {
	done, err := b.cb.Allow()
	if err != nil {
		return nil, err
	}
	return func(o Outcome) {
		switch o {
		case OutcomeSuccess:
			done(nil)
		case OutcomeIgnored:
			done(errExcluded)
		default:
			done(errFailure)
		}
	}, nil
}

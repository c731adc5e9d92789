package flightcache

import (
	"errors"
	"sync/atomic"

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
	// callers receive it wrapped so that it matches [ErrBreakerOpen], its
	// text after ErrBreakerOpen's (unless it is gobreaker's own).
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

// gobreakerBreaker wraps gobreaker's two-step breaker. The two-step form
// lets the load report an outcome even when the LoadFunc ends its goroutine
// with runtime.Goexit, which Execute cannot see (it would leave a half-open
// probe counted forever).
//
// While the breaker is closed with no failure in its current streak
// (healthy), Allow takes no lock and allocates nothing: a success or an
// ignored call changes nothing gobreaker decides on (it trips on
// ConsecutiveFailures only), and a failure is then reported to gobreaker as
// one call, which ends the healthy state. Successes admitted while healthy
// do not reset a streak that began meanwhile; every call made once the
// streak has begun goes through gobreaker.
type gobreakerBreaker struct {
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	healthy  atomic.Bool
	fastDone func(Outcome) // b.reportFast, made once
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
	gb := &gobreakerBreaker{cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "flightcache",
		MaxRequests: b.HalfOpenRequests,
		Timeout:     b.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= n },
		IsExcluded:  func(err error) bool { return err == errExcluded },
		// No OnStateChange: it runs under the breaker's lock, and nothing
		// here may call back into the breaker from it.
	})}
	gb.fastDone = gb.reportFast
	gb.healthy.Store(true)
	return gb
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
	if b.healthy.Load() {
		return b.fastDone, nil
	}
	done, err := b.cb.Allow()
	if err != nil {
		return nil, err
	}
	return func(o Outcome) {
		done(outcomeError(o))
		b.check()
	}, nil
}

// reportFast reports the outcome of a call admitted while healthy.
func (b *gobreakerBreaker) reportFast(o Outcome) {
	if o != OutcomeFailure {
		return
	}
	b.healthy.Store(false)
	if done, err := b.cb.Allow(); err == nil {
		done(errFailure)
	}
	b.check()
}

// check sets healthy from gobreaker's state.
func (b *gobreakerBreaker) check() {
	b.healthy.Store(b.cb.State() == gobreaker.StateClosed && b.cb.Counts().ConsecutiveFailures == 0)
}

// outcomeError is how gobreaker hears an outcome: nil is a success,
// errExcluded is excluded from its counts (Settings.IsExcluded).
func outcomeError(o Outcome) error {
	switch o {
	case OutcomeSuccess:
		return nil
	case OutcomeIgnored:
		return errExcluded
	default:
		return errFailure
	}
}

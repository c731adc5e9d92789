package flightcache

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sony/gobreaker/v2"
)

// Breaker configures the circuit breaker (github.com/sony/gobreaker/v2)
// around the downstream call: while it is open, loads fail at once with an
// error matching [ErrBreakerOpen] and never reach the LoadFunc. A failure
// of the downstream counts, a load that hits LoadTimeout included; a
// caller leaving, Close and a not-found never do, and an invalid key
// counts neither way (docs/options.md, "What the breaker counts").
type Breaker struct {
	// Disabled turns the breaker off.
	Disabled bool
	// ConsecutiveFailures opens the breaker after this many failures in a
	// row of the downstream calls, in the order they end: a success in
	// between starts the count again. Each attempt of a retried load is one
	// call, so with Retry.MaxAttempts >= ConsecutiveFailures one failing
	// load can open the breaker. 0 means DefaultConsecutiveFailures (5).
	ConsecutiveFailures uint32
	// OpenTimeout is how long the breaker stays open before it lets probe
	// requests through (half-open). 0 means DefaultOpenTimeout (5s).
	OpenTimeout time.Duration
	// HalfOpenRequests is how many probe calls may run while half-open; that
	// many successes close the breaker. 0 means DefaultHalfOpenRequests (1).
	HalfOpenRequests uint32
	// IsFailure, if set, reports whether a LoadFunc error counts against
	// the downstream; errors it rejects count as successes (the downstream
	// answered). It is not asked about a not-found, nor about an error
	// matching [ErrInvalidKey] (which counts neither way). nil means every
	// error counts.
	IsFailure func(error) bool
	// Custom, if set, replaces the Loader's own breaker, and the fields
	// above but IsFailure are ignored: for example a breaker whose state is
	// shared by processes (the flightredis module has one).
	Custom CircuitBreaker
}

// WithDefaults returns b with the default of every zero threshold set:
// ConsecutiveFailures DefaultConsecutiveFailures, OpenTimeout
// DefaultOpenTimeout, HalfOpenRequests DefaultHalfOpenRequests; the other
// fields as they are. These are the settings the Loader's own breaker
// runs with, for a [CircuitBreaker] of another kind (the shared breaker of
// the flightredis module) to trip, wait and probe as it would.
func (b Breaker) WithDefaults() Breaker {
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if b.OpenTimeout == 0 {
		b.OpenTimeout = DefaultOpenTimeout
	}
	if b.HalfOpenRequests == 0 {
		b.HalfOpenRequests = DefaultHalfOpenRequests
	}
	return b
}

// This file holds the circuit breaker: the interface a Loader calls, and
// its own implementation on gobreaker/v2. How a load uses it (retries
// outside, breaker inside) is in downstream.go.

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

// MarshalText returns the state's name, as String does: so [Stats]
// marshals to JSON with "Breaker":"open", and a map keyed by BreakerState
// has names for keys. It never fails.
func (s BreakerState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText sets s to the state named text: "closed", "half-open" or
// "open". Any other text is an error, and leaves s as it was.
func (s *BreakerState) UnmarshalText(text []byte) error {
	switch string(text) {
	case "closed":
		*s = BreakerClosed
	case "half-open":
		*s = BreakerHalfOpen
	case "open":
		*s = BreakerOpen
	default:
		return fmt.Errorf("flightcache: unknown BreakerState %q; want closed, half-open or open", text)
	}
	return nil
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
	// OutcomeIgnored: the call was cut short by its callers or by Close,
	// or its error says the key is the caller's fault ([ErrInvalidKey]);
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
// While gobreaker is closed, Allow takes no lock and allocates nothing, and
// the breaker counts the streak itself: streak is the failures in a row of
// the calls admitted while closed, in the order their outcomes are reported
// (the order of the atomic operations on it). A success resets it, a
// failure adds one, and the failure that makes it reach n trips gobreaker:
// it reports that failure, and ReadyToTrip opens the breaker because the
// streak has reached n. A streak at n stays there (successes no longer
// reset it) until gobreaker closes again: whatever completes meanwhile, on
// calls admitted before it opened, changes nothing, as gobreaker would drop
// the outcomes of an older generation. While gobreaker is open or half-open,
// calls go through it, its probes included.
//
// closed and streak mirror gobreaker's state changes, written in
// OnStateChange (under gobreaker's lock: atomic stores only, nothing that
// calls back into it). So streak is n whenever gobreaker is not closed, and
// a failure can take it to n only while gobreaker is closed.
//
// cause is the text of the last failure reported (failed), which the
// refusals name: the failure that opened the breaker, or a later one that
// kept it open.
type gobreakerBreaker struct {
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	n        uint32                 // Breaker.ConsecutiveFailures
	closed   atomic.Bool            // gobreaker is closed: calls take the fast path
	streak   atomic.Uint32          // failures in a row while closed, up to n
	fastDone func(Outcome)          // b.reportFast, made once
	cause    atomic.Pointer[string] // the last failure's text, at most maxCause bytes (and "...")
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
	gb := &gobreakerBreaker{n: b.ConsecutiveFailures}
	gb.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "flightcache",
		MaxRequests: b.HalfOpenRequests,
		Timeout:     b.OpenTimeout,
		ReadyToTrip: func(gobreaker.Counts) bool { return gb.streak.Load() >= gb.n },
		IsExcluded:  func(err error) bool { return sameError(err, errExcluded) },
		// Runs under gobreaker's lock: it must not call back into it.
		OnStateChange: func(_ string, _, to gobreaker.State) {
			if to == gobreaker.StateClosed {
				gb.streak.Store(0) // before closed: a fast call sees a clean streak
				gb.closed.Store(true)
			} else {
				gb.closed.Store(false)
			}
		},
	})
	gb.fastDone = gb.reportFast
	gb.closed.Store(true)
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
	if b.closed.Load() {
		return b.fastDone, nil
	}
	done, err := b.cb.Allow()
	if err != nil {
		return nil, b.refusal(err)
	}
	return func(o Outcome) {
		// Counted in the streak too: gobreaker may have closed since this
		// call was admitted, and its failure then counts as a closed one.
		trip := b.count(o)
		done(outcomeError(o))
		if trip {
			b.trip()
		}
	}, nil
}

// refusal is the error of a call b refuses with err, gobreaker's
// ErrOpenState or ErrTooManyRequests: it matches ErrBreakerOpen and err,
// and names the last failure, by its text only.
func (b *gobreakerBreaker) refusal(err error) error {
	e := &breakerOpenError{refusal: err, quiet: true}
	if c := b.cause.Load(); c != nil {
		e.cause = *c
	}
	return e
}

// maxCause bounds the text of a failure a refusal names.
const maxCause = 256

// failed keeps text, the error text of a failure about to be reported, for
// the refusals to name. It is cut to maxCause bytes, at a character's
// start; an outage that repeats one text stores it once.
func (b *gobreakerBreaker) failed(text string) {
	if len(text) > maxCause {
		n := maxCause
		for n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		text = text[:n] + "..." // a copy: the long text is not kept alive
	}
	if c := b.cause.Load(); c != nil && *c == text {
		return
	}
	b.cause.Store(&text)
}

// reportFast reports the outcome of a call admitted while closed.
func (b *gobreakerBreaker) reportFast(o Outcome) {
	if b.count(o) {
		b.trip()
	}
}

// count adds o to the streak. It reports whether o is the failure that
// makes the streak reach n, which must then trip gobreaker.
func (b *gobreakerBreaker) count(o Outcome) bool {
	for {
		s := b.streak.Load()
		switch {
		case s >= b.n, o == OutcomeIgnored, o == OutcomeSuccess && s == 0:
			return false // tripped already, or nothing changes
		case o == OutcomeSuccess:
			if b.streak.CompareAndSwap(s, 0) {
				return false
			}
		default:
			if b.streak.CompareAndSwap(s, s+1) {
				return s+1 == b.n
			}
		}
	}
}

// trip reports one failure to gobreaker, which opens: the streak has
// reached n (ReadyToTrip). If gobreaker has opened meanwhile it refuses the
// call, and nothing is reported.
func (b *gobreakerBreaker) trip() {
	if done, err := b.cb.Allow(); err == nil {
		done(errFailure)
	}
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

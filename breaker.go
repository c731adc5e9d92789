package flightcache

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/cenkalti/backoff/v4"
	"github.com/sony/gobreaker/v2"
)

// The downstream call path, inside one load:
//
//	retry (backoff/v4, outside) → breaker (gobreaker/v2, inside) → LoadFunc
//
// Retries wrap the breaker, so every attempt asks the breaker first and a
// refusal ends the retries at once (it is marked backoff.Permanent). The
// whole sequence runs under the load's context, whose deadline is
// LoadTimeout. Each load gets its own ExponentialBackOff: it is not safe for
// concurrent use.

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

// allow asks the breaker for one call, wrapping a refusal in ErrBreakerOpen.
func (l *Loader[K, V]) allow() (func(Outcome), error) {
	done, err := l.breaker.Allow()
	if err != nil {
		if !errors.Is(err, ErrBreakerOpen) {
			err = fmt.Errorf("%w: %w", ErrBreakerOpen, err)
		}
		return nil, err
	}
	return done, nil
}

// verdict classifies a LoadFunc result for the breaker. Not-found is a
// healthy answer; a caller leaving or Close cancelling says nothing about
// the downstream; a load that ran past LoadTimeout does.
func (l *Loader[K, V]) verdict(ctx context.Context, err error) Outcome {
	switch {
	case err == nil, errors.Is(err, ErrNotFound):
		return OutcomeSuccess
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrLoadTimeout):
		return OutcomeIgnored
	case errors.Is(err, context.Canceled):
		return OutcomeIgnored
	case l.opts.Breaker.IsFailure != nil && !l.userBool(l.opts.Breaker.IsFailure, err, true):
		return OutcomeSuccess
	}
	return OutcomeFailure
}

// retryable reports whether a failed attempt may be tried again.
func (l *Loader[K, V]) retryable(ctx context.Context, err error) bool {
	var pe *PanicError
	switch {
	case ctx.Err() != nil,
		errors.Is(err, ErrNotFound),
		errors.Is(err, ErrBreakerOpen),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &pe):
		return false
	case l.opts.Retry.Retryable == nil:
		return true
	}
	return l.userBool(l.opts.Retry.Retryable, err, false)
}

// userBool calls a user predicate, turning a panic into onPanic.
func (l *Loader[K, V]) userBool(f func(error) bool, err error, onPanic bool) (ok bool) {
	defer func() {
		if recover() != nil {
			l.stats.panics.Add(1)
			ok = onPanic
		}
	}()
	return f(err)
}

// load runs the LoadFunc for key with retries and the breaker, under ctx.
// It counts the LoadFunc calls it makes in *calls as they start, so that the
// count survives a call that ends the goroutine.
func (l *Loader[K, V]) load(ctx context.Context, key K, calls *int) (v V, err error) {
	if l.opts.Retry.MaxAttempts <= 1 {
		v, err = l.attempt(ctx, key, calls)
		return v, l.stopped(ctx, err, err)
	}
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(l.opts.Retry.InitialInterval),
		backoff.WithMaxInterval(l.opts.Retry.MaxInterval),
		backoff.WithMaxElapsedTime(0), // LoadTimeout bounds the load instead
	)
	policy := backoff.WithContext(backoff.WithMaxRetries(bo, uint64(l.opts.Retry.MaxAttempts-1)), ctx)
	var last error
	v, err = backoff.RetryWithData(func() (V, error) {
		v, err := l.attempt(ctx, key, calls)
		if err != nil {
			last = err
			if !l.retryable(ctx, err) {
				return v, backoff.Permanent(err)
			}
		}
		return v, err
	}, policy)
	return v, l.stopped(ctx, err, last)
}

// stopped explains an error of a load whose context has ended: it keeps the
// last real error (backoff reports only ctx.Err() when it stops between
// attempts) and adds why the context ended, Close or LoadTimeout.
func (l *Loader[K, V]) stopped(ctx context.Context, err, last error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if last != nil {
		err = last
	}
	if cause := context.Cause(ctx); (cause == ErrClosed || cause == ErrLoadTimeout) && !errors.Is(err, cause) {
		err = fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// attempt makes one downstream call through the breaker, counting it in
// *calls (and in Stats.Retries past the first) unless the breaker refuses
// it. A panic in the LoadFunc becomes a *PanicError;
// a runtime.Goexit is reported to the breaker as a failure and then allowed
// to end the goroutine (the load goroutine's deferred finish shares
// errGoexit with the waiters).
func (l *Loader[K, V]) attempt(ctx context.Context, key K, calls *int) (v V, err error) {
	done, err := l.allow()
	if err != nil {
		l.stats.breakerRejected.Add(1)
		return v, err
	}
	if *calls++; *calls > 1 {
		l.stats.retries.Add(1)
	}
	returned, reported := false, false
	defer func() {
		if !returned {
			if r := recover(); r != nil {
				l.stats.panics.Add(1)
				err = &PanicError{Value: r, Stack: debug.Stack()}
			}
		}
		if !reported { // a panic, or runtime.Goexit in LoadFunc or IsFailure
			done(OutcomeFailure)
		}
	}()
	v, err = l.loadFn(ctx, key)
	returned = true
	o := l.verdict(ctx, err)
	reported = true
	done(o)
	return v, err
}

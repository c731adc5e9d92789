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

// errExcluded marks an outcome the breaker must not count either way.
var errExcluded = errors.New("flightcache: excluded from breaker counts")

// breaker wraps gobreaker's two-step breaker. The two-step form lets the
// load report an outcome even when the LoadFunc ends its goroutine with
// runtime.Goexit, which Execute cannot see (it would leave a half-open probe
// counted forever).
type breaker struct {
	cb        *gobreaker.TwoStepCircuitBreaker[struct{}] // nil when disabled
	isFailure func(error) bool
}

func newBreaker(b Breaker) *breaker {
	if b.Disabled {
		return &breaker{}
	}
	n := b.ConsecutiveFailures
	return &breaker{
		isFailure: b.IsFailure,
		cb: gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			Name:        "flightcache",
			MaxRequests: b.HalfOpenRequests,
			Timeout:     b.OpenTimeout,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= n },
			IsExcluded:  func(err error) bool { return errors.Is(err, errExcluded) },
			// No OnStateChange: it runs under the breaker's lock, and
			// nothing here may call back into the breaker from it.
		}),
	}
}

func (b *breaker) state() BreakerState {
	if b.cb == nil {
		return BreakerClosed
	}
	switch b.cb.State() {
	case gobreaker.StateOpen:
		return BreakerOpen
	case gobreaker.StateHalfOpen:
		return BreakerHalfOpen
	default:
		return BreakerClosed
	}
}

func noop(error) {}

// allow asks the breaker for one call. done must be called with the call's
// outcome, as classified by verdict.
func (b *breaker) allow() (done func(error), err error) {
	if b.cb == nil {
		return noop, nil
	}
	done, err = b.cb.Allow()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBreakerOpen, err)
	}
	return done, nil
}

// verdict turns a LoadFunc result into what the breaker should count: nil
// for a success, errExcluded for no count, anything else for a failure.
// Not-found is a healthy answer; a caller leaving or Close cancelling says
// nothing about the downstream; a load that ran past LoadTimeout does.
func (l *Loader[K, V]) verdict(ctx context.Context, err error) error {
	switch {
	case err == nil, errors.Is(err, ErrNotFound):
		return nil
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrLoadTimeout):
		return errExcluded
	case errors.Is(err, context.Canceled):
		return errExcluded
	case l.breaker.isFailure != nil && !l.userBool(l.breaker.isFailure, err, true):
		return nil
	}
	return err
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
func (l *Loader[K, V]) load(ctx context.Context, key K) (v V, attempts int, err error) {
	if l.opts.Retry.MaxAttempts <= 1 {
		var called bool
		v, called, err = l.attempt(ctx, key)
		if called {
			attempts = 1
		}
		return v, attempts, l.stopped(ctx, err, err)
	}
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(l.opts.Retry.InitialInterval),
		backoff.WithMaxInterval(l.opts.Retry.MaxInterval),
		backoff.WithMaxElapsedTime(0), // LoadTimeout bounds the load instead
	)
	policy := backoff.WithContext(backoff.WithMaxRetries(bo, uint64(l.opts.Retry.MaxAttempts-1)), ctx)
	var last error
	v, err = backoff.RetryWithData(func() (V, error) {
		v, called, err := l.attempt(ctx, key)
		if called {
			attempts++
		}
		if err != nil {
			last = err
			if !l.retryable(ctx, err) {
				return v, backoff.Permanent(err)
			}
		}
		return v, err
	}, policy)
	if attempts > 1 {
		l.stats.retries.Add(uint64(attempts - 1))
	}
	return v, attempts, l.stopped(ctx, err, last)
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

// attempt makes one downstream call through the breaker. called is false
// when the breaker refused. A panic in the LoadFunc becomes a *PanicError;
// a runtime.Goexit is reported to the breaker as a failure and then allowed
// to end the goroutine (the load goroutine's deferred finish shares
// errGoexit with the waiters).
func (l *Loader[K, V]) attempt(ctx context.Context, key K) (v V, called bool, err error) {
	done, err := l.breaker.allow()
	if err != nil {
		l.stats.breakerRejected.Add(1)
		return v, false, err
	}
	returned := false
	l.inUser.Add(1)
	defer func() {
		l.inUser.Add(-1)
		if returned {
			return
		}
		if r := recover(); r != nil {
			l.stats.panics.Add(1)
			err = &PanicError{Value: r, Stack: debug.Stack()}
			done(err)
			return
		}
		done(errGoexit)
	}()
	v, err = l.loadFn(ctx, key)
	returned = true
	done(l.verdict(ctx, err))
	return v, true, err
}

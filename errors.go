package flightcache

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/flightcache/flightcache/remote"
	"github.com/sony/gobreaker/v2"
)

// ErrClosed is returned by [Loader.Get] and [Loader.GetInfo] after
// [Loader.Close] has been called, and to callers whose load was stopped by
// Close.
var ErrClosed = remote.ErrClosed

// ErrNotFound is the error a [LoadFunc] returns, wrapped or not, for a key
// that does not exist downstream. It is never counted as a breaker failure
// and is never retried. With [Options.NotFoundTTL] > 0 it is cached (negative
// caching) and later Gets return the same error until it expires.
//
// A LoadFunc's own not-found error (sql.ErrNoRows, a 404 mapped to
// ErrProductNotFound) is none of this unless it wraps ErrNotFound, as
// fmt.Errorf("%w: %w", ErrNotFound, err) does (callers still find err with
// errors.Is), or [Options.IsNotFound] says it is a not-found: otherwise it
// is a failure, retried, counted against the breaker and never cached.
//
// Every not-found a caller receives matches ErrNotFound (with [errors.Is]),
// whichever path it took: [Loader.Get] or [Loader.GetInfo], fresh or
// cached, from a LoadFunc, a [ReloadFunc] or a [LoadManyFunc], local or
// from a [Remote]. One that the LoadFunc (or Reload, or LoadMany) returned
// matches that error too, and errors.As finds it: one only IsNotFound
// recognised reaches its callers wrapped, its text ErrNotFound's followed
// by its own ("flightcache: not found: sql: no rows in result set"). One
// the Loader made (a key missing from LoadMany's map) or another process
// found (flightredis's ErrSharedNotFound, or its ErrPeerFailed) matches
// ErrNotFound alone: no Go error value crosses processes, at most its
// text. [Loader.GetMany] reports no not-found: such a key is absent from
// its map, not failed.
var ErrNotFound = remote.ErrNotFound

// notFoundError is a load's own not-found error, one only
// [Options.IsNotFound] recognised, as its callers receive it: it matches
// ErrNotFound and that error, and its text is ErrNotFound's followed by
// the error's, read once under the guard (classifyLoad).
type notFoundError struct {
	err  error
	text string
}

// Error is ErrNotFound's text followed by the load's own error's.
func (e *notFoundError) Error() string { return e.text }

// Unwrap returns ErrNotFound and the load's own error.
func (e *notFoundError) Unwrap() []error { return []error{ErrNotFound, e.err} }

// ErrNotModified is what a [ReloadFunc] returns when the value it was
// given is still current (HTTP's 304 Not Modified): the Loader keeps that
// value, renews its freshness from now ([Options.Freshness] is asked again
// for it), and gives it to the reload's callers. It never reaches a caller.
// Returned by a plain LoadFunc it is an error like any other.
var ErrNotModified = remote.ErrNotModified

// ErrBreakerOpen matches (with [errors.Is]) the error a caller receives when
// the circuit breaker refused the downstream call, because it is open or
// because it is half-open and its probe requests are taken. The breaker's
// own refusal matches too, with errors.Is and errors.As (gobreaker's
// ErrOpenState or ErrTooManyRequests for the built-in breaker), but its
// text is not repeated.
//
// The built-in breaker's refusal names instead the last failure that keeps
// it open, by its text, cut to 256 bytes: "flightcache: circuit breaker
// open (last failure: dial tcp 10.0.0.7:5432: connect: connection
// refused)" (a panic or a runtime.Goexit is named by its [PanicError]'s or
// [ErrGoexit]'s text). That failure was another call's: the refusal does
// not match it (errors.Is, errors.As), so that code looking for the
// downstream's own errors (a Retryable, a not-found check) never takes a
// refusal for one.
//
// The refusal of a [Breaker.Custom] breaker other than gobreaker's two
// errors is kept in the text, after a colon: it says which breaker, or
// why. The Loader adds no failure of its own to a custom breaker's refusal:
// a breaker shared by processes may be open for another's.
var ErrBreakerOpen = remote.ErrBreakerOpen

// breakerOpenError is the error of a call the breaker refused: it matches
// ErrBreakerOpen and the breaker's refusal, and says ErrBreakerOpen's text
// once (with the refusal's own text only when it adds something, and the
// built-in breaker's cause, gobreakerBreaker.refusal).
type breakerOpenError struct {
	refusal error
	quiet   bool   // the refusal is gobreaker's own: its text would repeat ErrBreakerOpen's
	cause   string // the text of the failure that keeps the built-in breaker open; "": none known
}

// breakerOpen wraps a breaker's refusal (not nil) into the error callers
// receive.
func breakerOpen(refusal error) error {
	if errors.Is(refusal, ErrBreakerOpen) {
		return refusal // a custom breaker's, already ours
	}
	quiet := refusal == gobreaker.ErrOpenState || refusal == gobreaker.ErrTooManyRequests
	return &breakerOpenError{refusal: refusal, quiet: quiet}
}

// Error is ErrBreakerOpen's text, followed by a custom breaker's reason,
// or by the failure that keeps the built-in breaker open.
func (e *breakerOpenError) Error() string {
	switch {
	case !e.quiet:
		return ErrBreakerOpen.Error() + ": " + e.refusal.Error()
	case e.cause != "":
		return ErrBreakerOpen.Error() + " (last failure: " + e.cause + ")"
	}
	return ErrBreakerOpen.Error()
}

// Unwrap returns ErrBreakerOpen and the breaker's refusal.
func (e *breakerOpenError) Unwrap() []error { return []error{ErrBreakerOpen, e.refusal} }

// ErrLimited is the error of a load that found no free slot under
// [Options.Limit] and could not wait for one: it waited [Limit.MaxWait],
// or the queue was full at an explicit [Limit.MaxQueue]. Like
// [ErrBreakerOpen] it says nothing about the key: it is never cached, never
// retried, never counted as a breaker failure, and a stale value within
// [Options.StaleIfError] covers it like any failure.
var ErrLimited = remote.ErrLimited

// ErrLoadTimeout matches (with [errors.Is]) the error of a load that ran
// past [Options.LoadTimeout], retries included. The load's own error (usually
// [context.DeadlineExceeded]) matches too, and its text follows
// ErrLoadTimeout's. That holds as well for an error of the LoadFunc's own
// that comes once the LoadTimeout has passed, before the load's context
// has ended (a driver's dial deadline, taken from that context, firing
// first: "flightcache: load timed out: dial tcp ...: i/o timeout").
var ErrLoadTimeout = remote.ErrLoadTimeout

// ErrInvalidKey matches (with [errors.Is]) the error of a key that is the
// caller's fault, not the downstream's: one [Options.ValidateKey]
// rejected, and one whose load returned an error wrapping ErrInvalidKey
// (a [LoadFunc], a [ReloadFunc], or a [LoadManyFunc] for its whole call):
//
//	return p, fmt.Errorf("%w: %w", flightcache.ErrInvalidKey, err)
//
// Such an error fails that key's callers only: it is never retried,
// never counted by the breaker (as a failure or as a success:
// [OutcomeIgnored]; [Breaker.IsFailure] is not asked), never cached (as a
// value or as a not-found: it is never a not-found, whatever it wraps),
// and never covered by a stale value ([Options.StaleIfError]). Its
// callers' error matches ErrInvalidKey and the error it wraps. So one
// request with a malformed id (a collation error, a 400 from the service
// behind) cannot open the breaker for everyone.
var ErrInvalidKey = remote.ErrInvalidKey

// invalidKeyError is the error of a key [Options.ValidateKey] rejected:
// it matches ErrInvalidKey and ValidateKey's own error (or the
// *PanicError of a ValidateKey that panicked), and its text names the
// option, followed by that error's, read once under the guard
// (userCode.invalidKey). It does not format the key, which may be long,
// hold what the caller should not log, or format through user code.
type invalidKeyError struct {
	err  error
	text string
}

// Error is ErrInvalidKey's text, the option that rejected the key, and
// its error's text.
func (e *invalidKeyError) Error() string { return e.text }

// Unwrap returns ErrInvalidKey and ValidateKey's error.
func (e *invalidKeyError) Unwrap() []error { return []error{ErrInvalidKey, e.err} }

// ErrRecursiveLoad is returned when a [LoadFunc], directly or through other
// loads, calls Get for a key whose load it is part of. Waiting would never
// end (until LoadTimeout), so the Get fails at once instead. The load is
// recognised through its context: a LoadFunc must pass the context it was
// given (or one derived from it) to the Gets it makes.
var ErrRecursiveLoad = errors.New("flightcache: Get called from inside the load of the same key")

// errNilContext is returned for a nil context instead of a panic deep inside.
var errNilContext = errors.New("flightcache: nil context")

// ErrGoexit matches (with [errors.Is]) the error the callers of a load
// receive when its [LoadFunc] (or a [Remote], or a custom breaker on the load
// path) called runtime.Goexit, as t.FailNow does: the load goroutine ended
// without a value or an error. Nothing is cached and the breaker counts a
// failure.
var ErrGoexit = errors.New("flightcache: load function called runtime.Goexit")

// PanicError is the error every waiter of a load receives when the
// [LoadFunc] (or a [Remote] or custom breaker on the load path) panicked,
// or when a method (Error, Unwrap, Is, As) of the error one of them
// returned panicked as the Loader inspected it, and the error a Get, Set
// or Invalidate gets when [Options.Hash] panicked. The panic is recovered,
// so the process keeps running; nothing is cached and the breaker counts a
// failure.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the stack of the goroutine at the time of the panic, without
	// its "goroutine N [running]:" header (that goroutine may be gone or
	// doing something else by the time the error is read).
	Stack []byte
}

// Error reports the panic value; the stack is in the Stack field.
func (e *PanicError) Error() string {
	return fmt.Sprintf("flightcache: user code panicked: %v", e.Value)
}

// Unwrap returns the panic value if it is an error, so that errors.Is and
// errors.As see through a panic(err).
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// sameError reports whether a == b, and is how the package compares two
// errors: == panics when both hold the same type whose value cannot be
// compared (a struct value holding a map, say), even when the type itself
// is comparable. Such an error is the same as no other.
func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	v := reflect.ValueOf(a)
	return v.Type() == reflect.TypeOf(b) && v.Comparable() && a == b
}

// optionError names the field that failed validation.
func optionError(field, format string, args ...any) error {
	return fmt.Errorf("flightcache: Options.%s %s", field, fmt.Sprintf(format, args...))
}

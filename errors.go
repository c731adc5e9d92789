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
// that does not exist downstream: an answer, not a failure (never retried,
// a success for the breaker, cached for [Options.NotFoundTTL]). A LoadFunc's
// own not-found error (sql.ErrNoRows) is one only if it wraps ErrNotFound,
// as fmt.Errorf("%w: %w", ErrNotFound, err) does, or [Options.IsNotFound]
// says so. Every not-found a caller receives matches ErrNotFound, and the
// LoadFunc's own error where it made one; [Loader.GetMany] leaves such a
// key out of its map (docs/design.md rule 25).
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
// the circuit breaker refused the downstream call (open, or half-open with
// its probes taken). The breaker's own refusal matches too. The built-in
// breaker's text names the last failure that keeps it open ("flightcache:
// circuit breaker open (last failure: dial tcp ...: connection refused)"),
// but the refusal never matches that failure, which was another call's; a
// [Breaker.Custom] refusal's text follows, after a colon.
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
// [Options.Limit] and could not wait for one ([Limit.MaxWait], or a full
// [Limit.MaxQueue]). It says nothing about the key: never cached, retried
// or counted by the breaker; a stale value within [Options.StaleIfError]
// covers it.
var ErrLimited = remote.ErrLimited

// ErrLoadTimeout matches (with [errors.Is]) the error of a load that ran
// past [Options.LoadTimeout], retries included; the load's own error
// matches too and its text follows ("flightcache: load timed out: dial tcp
// ...: i/o timeout"), also when the LoadFunc's error came just before the
// load's context ended (docs/design.md rule 32).
var ErrLoadTimeout = remote.ErrLoadTimeout

// ErrInvalidKey matches (with [errors.Is]) the error of a key that is the
// caller's fault, not the downstream's: one [Options.ValidateKey] rejected,
// or one whose load returned an error wrapping it:
//
//	return p, fmt.Errorf("%w: %w", flightcache.ErrInvalidKey, err)
//
// Such an error fails that key's callers only: never retried, cached or
// covered by a stale value, and never counted by the breaker, so one
// malformed id cannot open it for everyone (docs/design.md rule 33).
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
// loads, calls Get for a key whose load it is part of, instead of waiting on
// itself. The load is recognised through its context: a LoadFunc must pass
// the context it was given (or one derived from it) to the Gets it makes.
var ErrRecursiveLoad = errors.New("flightcache: Get called from inside the load of the same key")

// errNilContext is returned for a nil context instead of a panic deep inside.
var errNilContext = errors.New("flightcache: nil context")

// ErrGoexit matches (with [errors.Is]) the error the callers of a load
// receive when its [LoadFunc] (or other user code on the load's path)
// called runtime.Goexit, as t.FailNow does:
// nothing is cached and the breaker counts a failure.
var ErrGoexit = errors.New("flightcache: load function called runtime.Goexit")

// PanicError is the error every waiter of a load receives when user code
// on the load's path (the [LoadFunc], a Remote, a custom breaker, or a
// method of the error one returned) panicked, and a Get's when
// [Options.Hash] panicked. The panic is recovered: the process keeps
// running, nothing is cached and the breaker counts a failure.
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

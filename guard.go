package flightcache

import (
	"bytes"
	"runtime/debug"
	"sync/atomic"
)

// userCode is how the Loader calls user code: through guard, and inspect
// for the errors it makes. A Loader holds one, made in New, and hands it
// to what calls user code for it (its downstream, its observing); it is
// safe for concurrent use.
type userCode struct {
	panics *atomic.Uint64 // Stats.Panics: the Loader's counter of the panics guard recovers
}

// guard is the one way the Loader calls user code: the LoadFunc, Cost,
// OnLoad, Retry.Retryable, Breaker.IsFailure, IsNotFound, Hash, a Remote
// and a custom breaker all run through it, and so do the methods of the
// errors they return whenever the Loader inspects one (inspect).
//
// f runs on the calling goroutine. If it returns, guard returns nil. If it
// panics, the panic is recovered, counted in Stats.Panics, and returned as a
// *PanicError. If it calls runtime.Goexit, nothing can stop the goroutine
// from ending: guard runs onGoexit (if not nil) on the way out, so the
// caller can leave its state consistent (hand the waiters ErrGoexit, say),
// and the deferred calls of the goroutine run after it.
//
// The two nested defers tell the three endings apart as
// golang.org/x/sync/singleflight's doCall does: the inner one sees a panic
// (recover is not nil), the outer one sees neither a return nor a panic,
// which is a Goexit.
func (u userCode) guard(f func(), onGoexit func()) (err error) {
	returned, panicked := false, false
	defer func() {
		if !returned && !panicked && onGoexit != nil {
			onGoexit()
		}
	}()
	func() {
		defer func() {
			if returned {
				return
			}
			if r := recover(); r != nil { // since Go 1.21, panic(nil) recovers a *runtime.PanicNilError
				panicked = true
				u.panics.Add(1)
				err = newPanicError(r)
			}
		}()
		f()
		returned = true
	}()
	return err
}

// newPanicError captures the stack of a recovered panic. The first line of
// debug.Stack ("goroutine N [running]:") is dropped: by the time a waiter
// reads the error that goroutine may have ended or moved on.
func newPanicError(v any) *PanicError {
	stack := debug.Stack()
	if i := bytes.IndexByte(stack, '\n'); i >= 0 {
		stack = stack[i+1:]
	}
	return &PanicError{Value: v, Stack: stack}
}

// inspect runs f, which inspects *err, an error user code made, through
// the guard (with onGoexit, as guard's). errors.Is and errors.As call the
// error's Unwrap, Is and As methods, and its Error is user code too: any
// of them may panic. If f panics, *err becomes the *PanicError, as if the
// code that made the error had panicked, and inspect reports false: what
// f found is not to be used. A nil error needs no inspection: callers
// call inspect only for a non-nil one, which keeps a successful load off
// this path.
func (u userCode) inspect(err *error, f func(), onGoexit func()) bool {
	if perr := u.guard(f, onGoexit); perr != nil {
		*err = perr
		return false
	}
	return true
}

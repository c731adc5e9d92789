package flightcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/sony/gobreaker/v2"
)

// callee is the Loader's side of its downstream calls: the breaker, which
// says whether one may run (breakerIsOpen, allow), and what a call's error
// says, for the breaker, for the retries and for the cache (classify,
// classifyLoad, stopped, invalidKey). It knows nothing of keys, values, the cache or
// the loads in flight. Every question it asks of user code (a custom
// breaker, IsNotFound, Retryable, IsFailure, the methods of an error) goes
// through the guard. A Loader holds one, made in New and never changed; it
// is safe for concurrent use.
type callee struct {
	user         userCode         // the Loader's guard
	breaker      CircuitBreaker   // the built-in one (newBreaker), a noBreaker, or Breaker.Custom; never nil
	isNotFoundFn func(error) bool // Options.IsNotFound; nil: ErrNotFound alone
	isFailureFn  func(error) bool // Options.Breaker.IsFailure; nil: every error verdict does not excuse
	retryableFn  func(error) bool // Options.Retry.Retryable; nil: every error retryable does not exclude
	maxAttempts  int              // Options.Retry.MaxAttempts, at least 1
}

// newCallee returns the callee of a Loader with options b, r and
// isNotFound (defaults applied), whose guard is user.
func newCallee(user userCode, b Breaker, r Retry, isNotFound func(error) bool) callee {
	return callee{
		user:         user,
		breaker:      newBreaker(b),
		isNotFoundFn: isNotFound,
		isFailureFn:  b.IsFailure,
		retryableFn:  r.Retryable,
		maxAttempts:  r.MaxAttempts,
	}
}

// openRefusal is the error of a load admit fails because the breaker is
// open, as the breaker would refuse it: the built-in one's names its last
// failure.
func (c *callee) openRefusal() error {
	if b, ok := c.breaker.(*gobreakerBreaker); ok {
		return b.refusal(gobreaker.ErrOpenState)
	}
	return breakerOpen(gobreaker.ErrOpenState)
}

// breakerIsOpen reports whether the breaker is open now (State is user code
// for a custom breaker: a panic says no).
func (c *callee) breakerIsOpen() (open bool) {
	c.user.guard(func() { open = c.breaker.State() == BreakerOpen }, nil)
	return open
}

// stopped explains an error of a load whose context has ended, or whose
// LoadTimeout had passed when the error came (late: the timer that ends
// the load's context fires a little after its deadline, and a deadline
// the LoadFunc took from that context, a driver's dial deadline, may fire
// first, with an error of the LoadFunc's own, "i/o timeout"): it keeps the
// last real error (backoff reports only ctx.Err() when it stops between
// attempts) and adds why the load stopped, Close or LoadTimeout, so that
// a load that ran to its LoadTimeout matches ErrLoadTimeout whichever
// deadline fired first.
func (c *callee) stopped(ctx context.Context, late bool, err, last error) error {
	if err == nil {
		return nil
	}
	var cause error
	switch {
	case ctx.Err() != nil:
		cause = context.Cause(ctx)
	case late:
		cause = ErrLoadTimeout
	default:
		return err
	}
	if last != nil {
		err = last
	}
	if sameError(cause, ErrClosed) || sameError(cause, ErrLoadTimeout) {
		e := err
		c.user.inspect(&err, func() {
			if !errors.Is(e, cause) {
				err = fmt.Errorf("%w: %w", cause, e)
			}
		}, nil)
	}
	return err
}

// keepCause gives the built-in breaker the text of err, ErrGoexit or the
// *PanicError of an attempt about to be reported as a failure, for the
// refusals it may cause to name (gobreakerBreaker.failed; classify does
// the same for an error the call returned). A *PanicError's text formats
// its Value, which may run user code: read through the guard.
func (c *callee) keepCause(err error) {
	if b, ok := c.breaker.(*gobreakerBreaker); ok {
		var text string
		if c.user.guard(func() { text = err.Error() }, nil) == nil {
			b.failed(text)
		}
	}
}

// classify is what err (not nil), the error of one attempt, says: outcome,
// for the breaker; final, that it is not to be retried (a not-found, or
// not retryable; every error is, without Retry). It also reads the
// error's text, which reaches every caller (and ManyError's), and which
// the built-in breaker keeps for its refusals to name if the attempt is a
// failure. The error is user code's: everything is asked through the
// guard, once per attempt, before the breaker hears the outcome. If
// inspecting it panics, *err becomes the *PanicError and ok is false.
func (c *callee) classify(ctx context.Context, err *error, reload bool) (outcome Outcome, final, ok bool) {
	e := *err
	var text string
	ok = c.user.inspect(err, func() {
		text = e.Error()
		if kf, many := e.(*keyFaults); many { // a LoadMany's *ManyError (callee.go)
			outcome, final = c.classifyKeys(ctx, kf)
			return
		}
		nf := c.notFound(e)
		outcome = c.verdict(ctx, e, nf)
		if reload && errors.Is(e, ErrNotModified) {
			outcome = OutcomeSuccess // the downstream answered
		}
		final = nf || c.maxAttempts <= 1 || !c.retryable(ctx, e)
	}, nil)
	if !ok {
		return OutcomeFailure, true, false
	}
	if b, own := c.breaker.(*gobreakerBreaker); own && outcome == OutcomeFailure {
		b.failed(text)
	}
	return outcome, final, true
}

// allow asks the breaker for one call, wrapping a refusal so that it
// matches ErrBreakerOpen (breakerOpen). A breaker that panics refuses.
func (c *callee) allow() (done func(Outcome), err error) {
	if perr := c.user.guard(func() { done, err = c.breaker.Allow() }, nil); perr != nil {
		return nil, &breakerOpenError{refusal: perr}
	}
	if err != nil {
		// A custom breaker's refusal is user code's error. It is read here
		// as the load's error will be (classifyLoad), so that a method
		// that panics makes the refusal a *PanicError, still a refusal.
		refusal := err
		if !c.user.inspect(&refusal, func() {
			_ = refusal.Error()
			plainNotFound(refusal)
			err = breakerOpen(refusal) // errors.Is of it
		}, nil) {
			err = &breakerOpenError{refusal: refusal} // refusal is the *PanicError
		}
		return nil, err
	}
	if done == nil {
		done = func(Outcome) {}
	}
	return done, nil
}

// verdict classifies a LoadFunc result for the breaker; nf: err is a
// not-found (notFound). Not-found is a healthy answer; an invalid key
// (invalidKey), a caller leaving or Close cancelling say nothing about the
// downstream, either way; a load that ran past LoadTimeout does.
func (c *callee) verdict(ctx context.Context, err error, nf bool) Outcome {
	// A load past LoadTimeout is the downstream's fault, whatever error the
	// LoadFunc made of it.
	switch {
	case err == nil, nf:
		return OutcomeSuccess
	case invalidKey(err): // the caller's input, not the downstream's health
		return OutcomeIgnored
	case !timedOut(ctx) && (ctx.Err() != nil || errors.Is(err, context.Canceled)):
		return OutcomeIgnored
	case c.isFailureFn != nil && !c.userBool(c.isFailureFn, err, true):
		return OutcomeSuccess
	}
	return OutcomeFailure
}

// timedOut reports whether ctx, a load's context, ended at LoadTimeout.
func timedOut(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrLoadTimeout)
}

// invalidKey reports whether err says the key is the caller's fault
// ([ErrInvalidKey]): an error never retried (retryable), never counted by
// the breaker (verdict), never a not-found (plainNotFound) and never
// cached. This is the one place that says so, for every error judged here:
// an attempt's (classify), a load's (classifyLoad), and so for a LoadFunc's,
// a Reload's, or a LoadMany call's. It inspects err: only within an
// inspection.
func invalidKey(err error) bool { return errors.Is(err, ErrInvalidKey) }

// retryable reports whether a failed attempt that is not a not-found (the
// caller asked notFound) may be tried again. It inspects err: only within
// an inspection (classify).
func (c *callee) retryable(ctx context.Context, err error) bool {
	var pe *PanicError
	switch {
	case ctx.Err() != nil,
		errors.Is(err, ErrNotModified),
		errors.Is(err, ErrBreakerOpen),
		invalidKey(err),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &pe):
		return false
	case c.retryableFn == nil:
		return true
	}
	return c.userBool(c.retryableFn, err, false)
}

// notFound reports whether err means the key does not exist: it matches
// ErrNotFound, or Options.IsNotFound (user code, through the guard: a
// panic means no) says so (Options.NotFound is the same rule for a
// Remote). nil, a panic of the LoadFunc and ErrGoexit never are. It
// inspects err: only within an inspection (classify, classifyLoad).
func (c *callee) notFound(err error) bool {
	if nf, sure := plainNotFound(err); sure || c.isNotFoundFn == nil {
		return nf
	}
	return c.isNotFound(err, nil)
}

// classifyLoad is the judgement of a load's error *err (not nil), once for
// all its callers: whether it is a not-found (notFound), with its text
// read, as classify reads an attempt's. A not-found only IsNotFound
// recognised becomes a *notFoundError, so that every caller's not-found
// matches ErrNotFound: made here, once per load, it is what the cache
// keeps, and a hit of it costs nothing more. The error is user code's: it
// is inspected through the guard, and a panic makes *err the *PanicError
// (no not-found). onGoexit is the guard's, for a caller that must leave
// its state consistent if the error or IsNotFound ends the goroutine.
func (c *callee) classifyLoad(err *error, onGoexit func()) (nf bool) {
	e := *err
	var sure bool
	var text string
	if !c.user.inspect(err, func() { text = e.Error(); nf, sure = plainNotFound(e) }, onGoexit) {
		return false
	}
	if sure || c.isNotFoundFn == nil {
		return nf
	}
	if nf = c.isNotFound(e, onGoexit); nf {
		*err = &notFoundError{err: e, text: ErrNotFound.Error() + ": " + text}
	}
	return nf
}

// isNotFound asks Options.IsNotFound about err, through the guard: a panic
// means no.
func (c *callee) isNotFound(err error, onGoexit func()) (nf bool) {
	if c.user.guard(func() { nf = c.isNotFoundFn(err) }, onGoexit) != nil {
		return false
	}
	return nf
}

// userBool calls a user predicate through the guard; a panic gives onPanic.
func (c *callee) userBool(f func(error) bool, err error, onPanic bool) (ok bool) {
	if c.user.guard(func() { ok = f(err) }, nil) != nil {
		return onPanic
	}
	return ok
}

// userCode is how the Loader calls user code: through guard, and inspect
// for the errors it makes. A Loader holds one, made in New, and hands it
// to what calls user code for it (its downstream, its observing); it is
// safe for concurrent use.
type userCode struct {
	panics *atomic.Uint64 // Stats.Panics: the Loader's counter of the panics guard recovers
}

// guard is the one way the Loader calls user code: the LoadFunc, Cost,
// OnLoad, Retry.Retryable, Breaker.IsFailure, IsNotFound, Hash,
// ValidateKey, a Remote and a custom breaker all run through it, and so do the methods of the
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

// checkKey asks Options.ValidateKey about key, on the caller's goroutine,
// before anything is counted, locked or looked up: nil when there is no
// ValidateKey or it accepts key; else the error key's caller gets
// (rejected), counted in Stats.InvalidKeys. ValidateKey is user code: a
// panic rejects the key, with its *PanicError (counted in Stats.Panics);
// a runtime.Goexit ends the caller's goroutine, which holds nothing of
// the Loader's yet.
func (l *Loader[K, V]) checkKey(key K) error {
	if l.opts.ValidateKey == nil {
		return nil
	}
	var err error
	if perr := l.user.guard(func() { err = l.opts.ValidateKey(key) }, nil); perr != nil {
		err = perr
	}
	if err == nil {
		return nil
	}
	l.stats.invalidKeys.Add(1)
	return l.user.rejected(err)
}

// rejected is the error of a key ValidateKey rejected with err (not nil):
// it matches ErrInvalidKey and err, and its text, read here once through
// the guard, names the option. If err's Error panics, the error wraps that
// panic's *PanicError instead, as if ValidateKey had panicked; if that
// one's text panics too (its Value formats through user code), the text
// says so.
func (u userCode) rejected(err error) error {
	text := "its error's text panicked"
	if !u.inspect(&err, func() { text = err.Error() }, nil) {
		e := err // the *PanicError
		u.guard(func() { text = e.Error() }, nil)
	}
	return &invalidKeyError{err: err, text: ErrInvalidKey.Error() + " (Options.ValidateKey): " + text}
}

// Per-key errors of a LoadMany call (docs/design.md rule 15). A
// LoadManyFunc may return its map together with a *ManyError: each key in
// its Errs fails alone with its own error, judged as a single load's error
// is (complete → callee.classifyLoad: a not-found is cached per
// NotFoundTTL), and every other key is answered from the map. The call is
// one downstream call; what the breaker and the retries make of it is
// classifyKeys's rule: a call the downstream answered (a success, never
// retried) unless every key of it failed with an error the breaker counts,
// which makes it the call's failure, retried as a failed call is.

// manyCall is the downstream call of one LoadMany attempt for keys (each
// distinct), for callDownstream: it keeps in got what a *ManyError
// answered, and hands the attempt's classification a *keyFaults in its
// place.
func (b *batch[K, V]) manyCall(ctx context.Context, keys []K, got *manyAnswer[K, V]) func() (map[K]V, error) {
	return func() (map[K]V, error) {
		*got = manyAnswer[K, V]{}
		m, err := b.l.opts.LoadMany(ctx, keys)
		me, ok := err.(*ManyError[K]) // a type assertion runs no user code
		if !ok {
			return m, err
		}
		asked := askedErrors(me, keys)
		if asked == nil { // no key asked for failed: a plain answer
			return m, nil
		}
		got.m, got.many = m, asked
		got.kf = &keyFaults{many: asked, errs: asked.Unwrap(), all: len(asked.Errs) == len(keys)}
		return m, got.kf
	}
}

// manyAnswer is the last LoadMany attempt's answer when it came with a
// *ManyError: its map, its errors for the keys asked, and the *keyFaults
// its attempt reported in their place.
type manyAnswer[K comparable, V any] struct {
	m    map[K]V
	many *ManyError[K]
	kf   *keyFaults
}

// of is what callDownstream's (m, err) for a LoadMany call says once got
// is known: the answer of a last attempt that came with a *ManyError (its
// *keyFaults, perhaps wrapped for a load that ended: stopped) is its map
// and its *ManyError; anything else stays as it is. Looking into err (to
// find a wrapped *keyFaults) is user code, through the guard.
func (got *manyAnswer[K, V]) of(u userCode, m map[K]V, err error) (map[K]V, error) {
	if got.kf == nil || err == nil {
		return m, err
	}
	ours := err == error(got.kf)
	if !ours {
		u.guard(func() { ours = errors.Is(err, got.kf) }, nil)
	}
	if !ours {
		return m, err
	}
	return got.m, got.many
}

// askedErrors is me's errors for keys, the keys of the call (distinct): a
// key not asked for is ignored, as in the map; a nil error is no error.
// nil when none is left.
func askedErrors[K comparable](me *ManyError[K], keys []K) *ManyError[K] {
	if me == nil || len(me.Errs) == 0 {
		return nil
	}
	var errs map[K]error
	for _, k := range keys {
		if err, ok := me.Errs[k]; ok && err != nil {
			if errs == nil {
				errs = make(map[K]error, min(len(me.Errs), len(keys)))
			}
			errs[k] = err
		}
	}
	if errs == nil {
		return nil
	}
	return &ManyError[K]{Errs: errs}
}

// keyFaults is what a LoadMany attempt that returned a *ManyError reports
// to its classification (callee.classify → classifyKeys) in its place:
// the distinct errors of the keys asked that failed, and whether every key
// asked failed. Its text is the *ManyError's.
type keyFaults struct {
	many error   // the *ManyError, of the keys asked
	errs []error // its distinct errors
	all  bool    // every key of the call is in it
}

func (k *keyFaults) Error() string { return k.many.Error() }
func (k *keyFaults) Unwrap() error { return k.many }

// classifyKeys is classify for an attempt whose LoadManyFunc returned a
// *ManyError, kf: the downstream answered it (OutcomeSuccess, not
// retried) unless every key of the call failed and none of their errors
// is one the breaker hears as an answer (a not-found, an error IsFailure
// rejects): then the call failed, as a call's error makes it fail (one
// failure for the breaker, retried if one of the errors may be); if no
// key's error counts either way (the callers left, Close), the call is
// ignored. Each error is judged by the rules of a single load's (notFound,
// verdict, retryable), so a key's own fault stays its own. The errors are
// user code's: inspected through the guard by the caller (classify).
func (c *callee) classifyKeys(ctx context.Context, kf *keyFaults) (outcome Outcome, final bool) {
	if !kf.all {
		return OutcomeSuccess, true
	}
	outcome = OutcomeIgnored
	retry := false
	for _, e := range kf.errs {
		nf := c.notFound(e)
		switch c.verdict(ctx, e, nf) {
		case OutcomeSuccess:
			outcome = OutcomeSuccess
		case OutcomeFailure:
			if outcome == OutcomeIgnored {
				outcome = OutcomeFailure
			}
		}
		retry = retry || (!nf && c.retryable(ctx, e))
	}
	return outcome, outcome != OutcomeFailure || c.maxAttempts <= 1 || !retry
}

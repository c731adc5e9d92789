package flightcache

import (
	"context"
	"errors"
)

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
func (l *Loader[K, V]) manyCall(ctx context.Context, keys []K, got *manyAnswer[K, V]) func() (map[K]V, error) {
	return func() (map[K]V, error) {
		*got = manyAnswer[K, V]{}
		m, err := l.opts.LoadMany(ctx, keys)
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

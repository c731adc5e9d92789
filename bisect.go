package flightcache

import (
	"context"
	"errors"
	"maps"
)

// Splitting a failed batch (docs/design.md rule 31). A LoadMany call that
// fails as a whole fails every key in it; when the Loader chose those keys
// together (a gather of unrelated Gets, or a GetMany's batch another
// caller joined), one bad key would fail callers that never asked for it.
// So such a call is split in halves and each half tried again, down to
// single keys, as AWS Lambda's BisectBatchOnFunctionError does: a key that
// still fails alone fails with its own error, and every other key gets its
// value. The tries run one after another on the batch's goroutine, under
// the call's context (its LoadTimeout runs from the call's start, Close
// ends them), holding the call's Limit slot, through the breaker, each
// once: the whole call had its retries. Both halves of a part are tried
// before either is split again, so a single bad key never makes more than
// two failures in a row for the breaker, while a downstream that is down
// fails every try and opens it: the tries it refuses are not split
// further. Under CancelAtZero a part none of whose keys has a caller left
// is not tried. What the split answers is what a LoadManyFunc returning a
// *ManyError answers (keyerrors.go): a map, and each failed key's error.

// loadMany is load for b's LoadMany call of keys (each distinct): one
// downstream call with retries and the breaker, holding one slot of
// Options.Limit for it and for its split (bisect), which follows if it
// fails as a whole and splits says so. A *ManyError comes back as such: a
// key in it failed alone.
func (l *Loader[K, V]) loadMany(ctx context.Context, b *batch[K, V], keys []K, t *tally) (map[K]V, error) {
	if l.lim != nil && !t.background && !t.held {
		s, err := l.admit(ctx, t)
		if err != nil {
			return nil, err
		}
		t.held = true
		defer func() { t.held = false; s.Release() }()
	}
	var got manyAnswer[K, V]
	m, err := callDownstream(l, ctx, l.manyCall(ctx, keys, &got), false, t)
	if m, err = got.of(l.user, m, err); err == nil || !l.splits(ctx, b, keys, err) {
		return m, err
	}
	return l.bisect(ctx, b, keys, err, t)
}

// splits reports whether b's call of keys, which failed as a whole with
// err, is split: it has more than one key, its keys came from more than
// one caller (b is a gather, or another caller joined one of its keys),
// its context has not ended, and err is not one that would answer every
// part as it answered the whole: a not-found, the breaker's refusal,
// ErrLimited, or a *ManyError (its keys failed one by one already).
func (l *Loader[K, V]) splits(ctx context.Context, b *batch[K, V], keys []K, err error) bool {
	if len(keys) < 2 || ctx.Err() != nil || (b.gather == nil && !b.joined.Load()) {
		return false
	}
	if _, many := err.(*ManyError[K]); many {
		return false
	}
	return l.callee.splittable(err)
}

// splittable reports whether a part that failed with err (not nil) is to
// be split: not a not-found, not a refusal of the breaker or of
// Options.Limit. err is user code's: inspected through the guard, and a
// panic says no.
func (c *callee) splittable(err error) (ok bool) {
	c.user.guard(func() {
		ok = !c.notFound(err) && !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, ErrLimited)
	}, nil)
	return ok
}

// part is some of the keys of a split call, with the error of the last
// call that held them.
type part[K comparable] struct {
	keys []K
	err  error
}

// halves splits p's keys in two; each half keeps p's error. The halves do
// not share capacity: a LoadManyFunc that appends to its keys cannot
// overwrite the other half.
func (p part[K]) halves() (part[K], part[K]) {
	mid := len(p.keys) / 2
	return part[K]{p.keys[:mid:mid], p.err}, part[K]{p.keys[mid:], p.err}
}

// bisect splits b's call of keys, which failed as a whole with err, and
// answers each key from the tries of its parts: a map of the values, and
// a *ManyError of each key that failed (alone, or with a part that could
// not be split further), nil if none did.
func (l *Loader[K, V]) bisect(ctx context.Context, b *batch[K, V], keys []K, err error, t *tally) (map[K]V, error) {
	vals := make(map[K]V, len(keys))
	errs := make(map[K]error) // a split follows a failure: some key is likely to fail
	fail := func(keys []K, err error) {
		for _, k := range keys {
			errs[k] = err
		}
	}
	a, z := part[K]{keys, err}.halves()
	queue := []part[K]{a, z} // breadth first: both halves of a part before either is split
	for i := 0; i < len(queue); i++ {
		p := queue[i]
		queue[i] = part[K]{}
		switch {
		case ctx.Err() != nil: // Close, LoadTimeout, every caller gone
			fail(p.keys, l.callee.stopped(ctx, t.overdue(l.now()), p.err, p.err))
			continue
		case !b.wants(p.keys):
			fail(p.keys, p.err)
			continue
		}
		var got manyAnswer[K, V]
		m, _, err := callOnce(l, ctx, l.manyCall(ctx, p.keys, &got), false, t)
		m, err = got.of(l.user, m, l.callee.stopped(ctx, t.overdue(l.now()), err, err))
		many, alone := err.(*ManyError[K]) // got.of's: the keys that failed alone
		switch {
		case err == nil:
		case alone:
			maps.Copy(errs, many.Errs)
		case len(p.keys) == 1 || ctx.Err() != nil || !l.callee.splittable(err):
			fail(p.keys, err)
			continue
		default:
			p.err = err
			a, z := p.halves()
			queue = append(queue, a, z)
			continue
		}
		for _, k := range p.keys {
			if _, failed := errs[k]; failed {
				continue
			}
			if v, ok := m[k]; ok {
				vals[k] = v
			}
		}
	}
	if len(errs) == 0 {
		return vals, nil
	}
	return vals, &ManyError[K]{Errs: errs}
}

// wants reports whether a try of keys, some of b's, would reach a caller:
// always, but under CancelAtZero, where it does only if one of their calls
// still has one (a refresh always does) or a key is not one of its calls'
// (a key not equal to itself: kept, to be safe).
func (b *batch[K, V]) wants(keys []K) bool {
	if b.l.opts.Policy != CancelAtZero {
		return true
	}
	in := make(map[K]struct{}, len(keys))
	for _, k := range keys {
		in[k] = struct{}{}
	}
	for _, c := range b.calls {
		if _, ok := in[c.key]; ok && !b.l.flights.abandoned(c) {
			return true
		}
	}
	for _, c := range b.calls {
		delete(in, c.key)
	}
	return len(in) > 0
}

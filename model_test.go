package flightcache

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// The model-based fuzz test: a byte string is read as a sequence of
// operations (Gets with and without cancellation, Set, Invalidate, time
// advancing) and downstream outcomes (success, failure, panic, not-found),
// run in a synctest bubble against a small reference model of DESIGN.md's
// rules. Every Get's value, error, Source and Age must match the model.

const (
	modelTTL      = 4 * time.Second
	modelSWR      = 2 * time.Second
	modelSIE      = 2 * time.Second
	modelNotFound = time.Second
)

type outcome uint8

const (
	succeed outcome = iota
	fail
	panics
	notFound
)

type modelEntry struct {
	val          string
	notFound     bool
	loadedAt     time.Duration
	refreshAfter time.Duration
}

func (e *modelEntry) phase(now time.Duration) phase {
	w := windows{modelSWR, modelSIE}
	fresh := e.loadedAt + modelTTL
	if e.notFound {
		w, fresh = windows{}, e.loadedAt+modelNotFound
	}
	return w.phaseAt(now, fresh)
}

// model predicts what one Loader does.
type model struct {
	now     time.Duration
	calls   int
	entries map[string]*modelEntry
}

// load applies one downstream call with outcome o, returning its result.
func (m *model) load(key string, o outcome) (string, error) {
	m.calls++
	switch o {
	case fail:
		return "", errBoom
	case panics:
		return "", &PanicError{}
	case notFound:
		m.entries[key] = &modelEntry{notFound: true, loadedAt: m.now}
		return "", ErrNotFound
	}
	v := fmt.Sprintf("%s#%d", key, m.calls)
	m.entries[key] = &modelEntry{val: v, loadedAt: m.now}
	return v, nil
}

// get predicts one Get of key whose load (if any) has outcome o.
func (m *model) get(key string, o outcome) (string, Source, time.Duration, error) {
	e := m.entries[key]
	p := phaseExpired
	if e != nil {
		p = e.phase(m.now)
	}
	switch p {
	case phaseFresh:
		if e.notFound {
			return "", SourceHit, m.now - e.loadedAt, ErrNotFound
		}
		return e.val, SourceHit, m.now - e.loadedAt, nil
	case phaseStale:
		v, age := e.val, m.now-e.loadedAt
		if m.now >= e.refreshAfter {
			if _, err := m.load(key, o); err != nil && !errors.Is(err, ErrNotFound) {
				e.refreshAfter = m.now + 1 // the backoff delay is 1ns in this model
			}
		}
		return v, SourceStale, age, nil
	}
	v, err := m.load(key, o)
	if err != nil && !errors.Is(err, ErrNotFound) && p == phaseStaleIfError {
		return e.val, SourceStaleOnError, m.now - e.loadedAt, nil
	}
	if err != nil {
		return "", SourceLoaded, 0, err
	}
	return v, SourceLoaded, 0, nil
}

func runModel(t *testing.T, ops []byte) {
	synctest.Test(t, func(t *testing.T) {
		m := &model{entries: map[string]*modelEntry{}}
		var next outcome
		var calls int
		l, err := New(func(ctx context.Context, key string) (string, error) {
			calls++
			switch next {
			case fail:
				return "", errBoom
			case panics:
				panic("model panic")
			case notFound:
				return "", ErrNotFound
			}
			return fmt.Sprintf("%s#%d", key, calls), nil
		}, Options[string, string]{
			TTL: modelTTL, StaleWhileRevalidate: modelSWR, StaleIfError: modelSIE, NotFoundTTL: modelNotFound,
			Retry:   Retry{InitialInterval: 1, MaxInterval: 1},
			Breaker: Breaker{Disabled: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		start := time.Now()
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%6, ops[i+1]
			key := fmt.Sprint("k", arg%3)
			next = outcome(arg / 3 % 4)
			m.now = time.Since(start)
			switch op {
			case 0, 1: // Get, and Get with a cancelled context
				ctx := t.Context()
				if op == 1 {
					c, cancel := context.WithCancel(ctx)
					cancel()
					ctx = c
				}
				wv, ws, wage, werr := m.get(key, next)
				v, info, err := l.GetInfo(ctx, key)
				synctest.Wait() // background refreshes and abandoned loads finish
				if op == 1 && errors.Is(err, context.Canceled) && ws != SourceHit && ws != SourceStale {
					break // left before the result: allowed, the load still fills
				}
				var pe *PanicError
				sameErr := errors.Is(err, werr) || (errors.As(werr, &pe) && errors.As(err, &pe))
				if v != wv || info.Source != ws || info.Age != wage || !sameErr {
					t.Fatalf("op %d at %v: Get(%q) with outcome %d = %q, %v, age %v, %v; model says %q, %v, age %v, %v",
						i/2, m.now, key, next, v, info.Source, info.Age, err, wv, ws, wage, werr)
				}
			case 2: // Set
				v := fmt.Sprint("set", i)
				l.Set(key, v)
				m.entries[key] = &modelEntry{val: v, loadedAt: m.now}
			case 3: // Invalidate
				l.Invalidate(key)
				delete(m.entries, key)
			default: // time passes
				time.Sleep(time.Duration(arg%20) * 250 * time.Millisecond)
				synctest.Wait()
			}
			if calls != m.calls {
				t.Fatalf("op %d: %d downstream calls; model says %d", i/2, calls, m.calls)
			}
		}
		synctest.Wait()
		s := l.Stats()
		if s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed || s.InFlight != 0 {
			t.Errorf("Stats do not add up: %+v", s)
		}
	})
}

func FuzzModel(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 4, 18, 0, 0, 4, 10, 0, 4, 0, 4})              // load, expire, stale, refresh
	f.Add([]byte{0, 1, 4, 19, 0, 4, 0, 7, 0, 1, 3, 1, 0, 1})               // failures, stale-if-error
	f.Add([]byte{0, 11, 0, 11, 4, 5, 0, 2, 2, 2, 0, 2, 1, 0, 4, 19, 1, 6}) // not-found, Set, cancelled Gets
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 400 {
			ops = ops[:400]
		}
		runModel(t, ops)
	})
}

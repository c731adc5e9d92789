package flightcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// keyFaulty is a LoadManyFunc that answers every key asked for but those
// in errs, which it fails one by one with a *ManyError; with all, it also
// names a key nobody asked for. It counts its calls.
type keyFaulty struct {
	errs  map[string]error
	calls atomic.Int32
}

func (f *keyFaulty) load(_ context.Context, keys []string) (map[string]string, error) {
	f.calls.Add(1)
	out := map[string]string{}
	errs := map[string]error{"not-asked": errBoom} // ignored: not asked for
	for _, k := range keys {
		if err, ok := f.errs[k]; ok {
			errs[k] = err
			continue
		}
		out[k] = k + "-v"
	}
	return out, &ManyError[string]{Errs: errs}
}

// manyLoader builds a Loader without a LoadFunc, with opts (a TTL of a
// minute unless set), closed when the test ends.
func manyLoader(t testing.TB, opts Options[string, string]) *Loader[string, string] {
	t.Helper()
	if opts.TTL == 0 {
		opts.TTL = time.Minute
	}
	l, err := New(nil, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// docs/design.md rule 15: a LoadManyFunc that returns a *ManyError fails
// each key in it alone, with its own error: a not-found is cached per
// NotFoundTTL as a single load's, a failure is not cached; every other key
// is answered from the map. One downstream call, which the breaker hears
// as an answer (the downstream answered): it stays closed even at
// ConsecutiveFailures 1, and nothing is retried.
func TestLoadManyKeyErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errGone := errors.New("row gone")
		f := &keyFaulty{errs: map[string]error{"bad": errBoom, "gone": ErrNotFound, "gone2": errGone}}
		l := manyLoader(t, Options[string, string]{
			LoadMany:    f.load,
			NotFoundTTL: time.Minute,
			IsNotFound:  func(err error) bool { return errors.Is(err, errGone) },
			Breaker:     Breaker{ConsecutiveFailures: 1},
			Retry:       Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
		})
		vals, err := l.GetMany(t.Context(), []string{"a", "b", "bad", "gone", "gone2"})
		if want := map[string]string{"a": "a-v", "b": "b-v"}; !maps.Equal(vals, want) {
			t.Errorf("GetMany values = %v; want %v", vals, want)
		}
		var me *ManyError[string]
		if !errors.As(err, &me) || len(me.Errs) != 1 || !errors.Is(me.Errs["bad"], errBoom) {
			t.Fatalf("GetMany error = %v; want a *ManyError of bad alone, with its own error", err)
		}
		if n := f.calls.Load(); n != 1 {
			t.Errorf("LoadMany calls = %d; want 1 (an answer is not retried)", n)
		}
		s := l.Stats()
		if s.Breaker != BreakerClosed || s.DownstreamCalls != 1 || s.NotFounds != 2 || s.LoadErrors != 1 || s.LoadNotFounds != 0 {
			t.Errorf("Stats = %+v; want the breaker closed, 1 downstream call, 2 not-founds, 1 load error (the call's ManyError)", s)
		}
		// The not-founds are cached, the failure is not.
		for _, k := range []string{"gone", "gone2"} {
			if _, err := l.Get(t.Context(), k); !errors.Is(err, ErrNotFound) {
				t.Errorf("Get(%s) = %v; want the cached not-found", k, err)
			}
		}
		if n := f.calls.Load(); n != 1 {
			t.Errorf("LoadMany calls after the not-founds' Gets = %d; want 1 (cached)", n)
		}
		// Alone, bad's failure is the call's: the breaker (ConsecutiveFailures 1) opens.
		if _, err := l.Get(t.Context(), "bad"); !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("Get(bad) = %v; want it loaded again, and its failure to open the breaker", err)
		}
		if n := f.calls.Load(); n != 2 {
			t.Errorf("LoadMany calls after Get(bad) = %d; want 2 (a failure is not cached)", n)
		}
	})
}

// Rule 15's breaker rule: a call whose every key failed with an error
// the breaker counts is the call's failure, retried as one (MaxAttempts)
// and counted by the breaker; one whose every key failed but one of them
// as a not-found is an answer.
func TestLoadManyKeyErrorsWholeFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &keyFaulty{errs: map[string]error{"x": errBoom, "y": errBoom, "nf": ErrNotFound}}
		l := manyLoader(t, Options[string, string]{
			LoadMany: f.load,
			Breaker:  Breaker{ConsecutiveFailures: 3},
			Retry:    Retry{MaxAttempts: 2, InitialInterval: time.Millisecond},
		})
		_, err := l.GetMany(t.Context(), []string{"x", "y", "nf"})
		var me *ManyError[string]
		if !errors.As(err, &me) || len(me.Errs) != 2 {
			t.Fatalf("GetMany(x, y, nf) = %v; want x and y failed (nf absent)", err)
		}
		if s := l.Stats(); f.calls.Load() != 1 || s.Breaker != BreakerClosed {
			t.Fatalf("calls %d, breaker %v; want 1 call (a not-found answers), closed", f.calls.Load(), s.Breaker)
		}
		_, err = l.GetMany(t.Context(), []string{"x", "y"})
		if !errors.As(err, &me) || !errors.Is(me.Errs["x"], errBoom) || !errors.Is(me.Errs["y"], errBoom) {
			t.Fatalf("GetMany(x, y) = %v; want each key its own error", err)
		}
		s := l.Stats()
		if n := f.calls.Load(); n != 3 || s.Retries != 1 {
			t.Errorf("calls %d, Retries %d; want 3 and 1: the failed call retried once", n, s.Retries)
		}
		_, err = l.GetMany(t.Context(), []string{"x", "y"})
		if s := l.Stats(); s.Breaker != BreakerOpen || !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("after 3 failed calls: breaker %v, error %v; want open", s.Breaker, err)
		}
	})
}

// Rule 15 and rule 31: a Loader without a LoadFunc loads a Get's key as a
// LoadMany call, alone or in a window; a *ManyError fails only its keys.
func TestLoadManyKeyErrorsAlone(t *testing.T) {
	for _, window := range []time.Duration{0, time.Second} {
		synctest.Test(t, func(t *testing.T) {
			f := &keyFaulty{errs: map[string]error{"bad": errBoom}}
			l := manyLoader(t, Options[string, string]{LoadMany: f.load, BatchWindow: window})
			good, bad := getAsync(t.Context(), l, "good"), getAsync(t.Context(), l, "bad")
			if r := <-good; r.err != nil || r.v != "good-v" {
				t.Errorf("window %v: Get(good) = %q, %v; want good-v", window, r.v, r.err)
			}
			if r := <-bad; !errors.Is(r.err, errBoom) {
				t.Errorf("window %v: Get(bad) = %v; want its own error", window, r.err)
			}
		})
	}
}

// Rule 15: a *ManyError's key errors reach LoadEvent.Err (the call's
// ManyError, of the keys asked); each key was loaded by the call.
func TestLoadManyKeyErrorsEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &keyFaulty{errs: map[string]error{"bad": errBoom}}
		var events eventLog
		l := manyLoader(t, Options[string, string]{LoadMany: f.load, OnLoad: events.add})
		_, infos, err := l.GetManyInfo(t.Context(), []string{"a", "bad"})
		if infos["a"].Source != SourceLoaded || infos["bad"].Source != SourceLoaded || !errors.Is(err, errBoom) {
			t.Errorf("infos = %+v, %v; want both loaded, bad failed with its own error", infos, err)
		}
		synctest.Wait() // OnLoad runs once the keys are delivered
		evs := events.all()
		var me *ManyError[string]
		if len(evs) != 1 || !errors.As(evs[0].Err, &me) || !slices.Equal(slices.Collect(maps.Keys(me.Errs)), []string{"bad"}) {
			t.Errorf("events %+v; want one, its Err the ManyError of bad", evs)
		}
	})
}

// apiError is an error struct value holding a map, as a decoded API error
// body may: its type is comparable, its values may not be.
type apiError struct {
	Code    int
	Details any
}

func (e apiError) Error() string { return fmt.Sprintf("api error %d", e.Code) }

// apiErrCtx is a context that has ended with an apiError holding a map, a
// new one each time Err is called.
type apiErrCtx struct{ context.Context }

// apiErrDone is the Done channel of an apiErrCtx: closed.
var apiErrDone = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (apiErrCtx) Done() <-chan struct{} { return apiErrDone }
func (apiErrCtx) Err() error            { return apiError{Code: 499, Details: map[string]any{"why": "left"}} }

// Reading a GetMany error must not panic when its keys failed with error
// values that hold a map. ManyError dropped duplicate errors with == where
// the errors' type was comparable, and comparing two apiError values
// holding maps panics ("comparing uncomparable type"): errors.Is(err,
// ErrBreakerOpen) and err.Error() both panicked, for the errors of a
// LoadFunc (one per key) and of a LoadMany (one for the whole call) alike.
// GetMany compared a key's error with its context's the same way.
func TestManyErrorOfUncomparableErrorsDoesNotPanic(t *testing.T) {
	for _, tc := range []string{"LoadFunc", "LoadMany", "context"} {
		t.Run(tc, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := Options[string, string]{TTL: time.Minute, Breaker: Breaker{Disabled: true}}
				if tc == "LoadMany" {
					opts.LoadMany = func(_ context.Context, keys []string) (map[string]string, error) {
						return nil, apiError{Code: 503, Details: map[string]any{"keys": keys}}
					}
				}
				l, err := New(func(ctx context.Context, k string) (string, error) {
					if tc == "context" {
						<-ctx.Done() // the GetMany leaves first; Close ends this
					}
					return "", apiError{Code: 500, Details: map[string]any{"key": k}}
				}, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := l.Shutdown(ctx); err != nil {
						t.Errorf("Shutdown: %v; a Get is left inside the Loader", err)
					}
				}()
				ctx := context.Context(t.Context())
				if tc == "context" {
					ctx = apiErrCtx{t.Context()}
				}
				var gerr error
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("GetMany panicked: %v", r)
						}
					}()
					_, gerr = l.GetMany(ctx, []string{"a", "b", "c"})
				}()
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("reading the GetMany error panicked: %v", r)
					}
				}()
				if errors.Is(gerr, ErrBreakerOpen) {
					t.Errorf("GetMany error %v matches ErrBreakerOpen; want only the apiErrors", gerr)
				}
				var ae apiError
				if !errors.As(gerr, &ae) || !strings.Contains(gerr.Error(), "api error") {
					t.Errorf("GetMany error %q; want the keys' apiErrors", gerr)
				}
				if me, ok := gerr.(*ManyError[string]); tc != "context" && (!ok || len(me.Errs) != 3 || len(me.Unwrap()) != 3) {
					t.Errorf("GetMany error %#v; want a ManyError of 3 keys, 3 errors (none provably the same)", gerr)
				}
			})
		})
	}
}

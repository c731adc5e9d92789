package flightcache

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var isNoRows = func(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// docs/design.md rule 25: a LoadFunc's own not-found error is a not-found
// when Options.IsNotFound says so, or when it wraps ErrNotFound: not
// retried, a success for the breaker, cached for NotFoundTTL, and reported
// in LoadEvent.NotFound. Without either it is a failure like any other.
func TestIsNotFound(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		isNotFound func(error) bool
		notFound   bool
	}{
		{"IsNotFound", sql.ErrNoRows, isNoRows, true},
		{"wrapping ErrNotFound", fmt.Errorf("%w: %w", ErrNotFound, sql.ErrNoRows), nil, true},
		{"neither", sql.ErrNoRows, nil, false},
		{"IsNotFound says no", sql.ErrNoRows, func(error) bool { return false }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var log eventLog
				d := &downstream{fail: func(int64, string) error { return tc.err }}
				l := newLoader(t, d, Options[string, string]{
					NotFoundTTL: time.Minute, IsNotFound: tc.isNotFound, OnLoad: log.add,
					Retry:   Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
					Breaker: Breaker{ConsecutiveFailures: 6},
				})
				for i := range 2 {
					if _, err := l.Get(t.Context(), "gone"); !errors.Is(err, sql.ErrNoRows) {
						t.Fatalf("Get %d = %v; want the LoadFunc's sql.ErrNoRows", i, err)
					}
				}
				s := l.Stats()
				if tc.notFound {
					if n := d.calls.Load(); n != 1 {
						t.Errorf("LoadFunc calls = %d; want 1: not retried, then cached", n)
					}
					if s.Hits != 1 || s.Breaker != BreakerClosed {
						t.Errorf("Stats = %+v; want the second Get a hit, the breaker closed", s)
					}
				} else {
					if n := d.calls.Load(); n != 6 {
						t.Errorf("LoadFunc calls = %d; want 6: each Get retried 3 times, nothing cached", n)
					}
					if s.Hits != 0 || s.Breaker != BreakerOpen {
						t.Errorf("Stats = %+v; want no hit, the breaker open after 6 failures", s)
					}
				}
				synctest.Wait() // OnLoad runs after the waiters woke: let it
				if evs := log.all(); len(evs) == 0 || evs[0].NotFound != tc.notFound {
					t.Errorf("events = %+v; want the first with NotFound %v", evs, tc.notFound)
				}
			})
		})
	}
}

// docs/design.md rule 25: a not-found by IsNotFound is never covered by a
// stale value (the key is gone), where another error is.
func TestIsNotFoundIsNeverCoveredByStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := sql.ErrNoRows
		d := &downstream{fail: func(int64, string) error { return fail }}
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Second, StaleIfError: time.Hour, IsNotFound: isNoRows,
			Breaker: Breaker{Disabled: true},
		})
		l.Set("gone", "old")
		l.Set("failing", "old")
		time.Sleep(2 * time.Second)
		if v, info, err := l.GetInfo(t.Context(), "gone"); !errors.Is(err, sql.ErrNoRows) || v != "" || info.Source != SourceLoaded {
			t.Errorf("Get(gone) = %q, %+v, %v; want the not-found, uncovered", v, info, err)
		}
		fail = errBoom
		if v, info, err := l.GetInfo(t.Context(), "failing"); err != nil || v != "old" || info.Source != SourceStaleOnError {
			t.Errorf("Get(failing) = %q, %+v, %v; want the stale value covering the failure", v, info, err)
		}
	})
}

// docs/design.md rules 15 and 24: GetMany leaves out a key whose load
// returned a not-found by IsNotFound, through the LoadFunc or a LoadMany
// that fails as a whole with one, rather than failing it in its
// ManyError; and a later GetMany finds it cached.
func TestIsNotFoundInGetMany(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("LoadMany=%v", batched), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &downstream{fail: func(_ int64, key string) error {
					if key == "gone" {
						return sql.ErrNoRows
					}
					return nil
				}}
				m := &many{fail: func(int) error { return sql.ErrNoRows }}
				opts := Options[string, string]{NotFoundTTL: time.Minute, IsNotFound: isNoRows}
				if batched {
					opts.LoadMany = m.load
				}
				l := newLoader(t, d, opts)
				keys := []string{"gone"}
				if batched {
					keys = []string{"gone", "gone2"}
				}
				for i := range 2 {
					got, err := l.GetMany(t.Context(), keys)
					if err != nil || len(got) != 0 {
						t.Fatalf("GetMany %d = %v, %v; want every key absent, no error", i, got, err)
					}
				}
				if s := l.Stats(); s.Loads != 1 || s.Hits != uint64(len(keys)) {
					t.Errorf("Stats = %+v; want 1 load, then %d hits of the cached not-founds", s, len(keys))
				}
			})
		})
	}
}

// docs/design.md rule 25 (and the guard's table): IsNotFound is user
// code. A panic counts in Stats.Panics and means "not a not-found": the
// error is a failure, retried and not cached.
func TestIsNotFoundPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return sql.ErrNoRows }}
		l := newLoader(t, d, Options[string, string]{
			NotFoundTTL: time.Minute, IsNotFound: func(error) bool { panic("IsNotFound panics") },
			Retry:   Retry{MaxAttempts: 2, InitialInterval: time.Millisecond},
			Breaker: Breaker{Disabled: true},
		})
		for range 2 {
			if _, err := l.Get(t.Context(), "gone"); !errors.Is(err, sql.ErrNoRows) {
				t.Fatalf("Get = %v; want the LoadFunc's error", err)
			}
		}
		if n := d.calls.Load(); n != 4 {
			t.Errorf("LoadFunc calls = %d; want 4: retried, and not cached", n)
		}
		if s := l.Stats(); s.Panics == 0 {
			t.Errorf("Stats.Panics = 0; want IsNotFound's panics counted")
		}
	})
}

// docs/design.md rule 25: an IsNotFound that calls runtime.Goexit ends its
// load goroutine, but no caller is left waiting: on a Get's attempt, in
// the judgement of a LoadMany call's error, and of a Remote's error.
func TestIsNotFoundGoexit(t *testing.T) {
	goexit := func(error) bool { runtime.Goexit(); return false }
	t.Run("Get", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := &downstream{fail: func(int64, string) error { return errBoom }}
			l := newLoader(t, d, Options[string, string]{IsNotFound: goexit})
			if _, err := l.Get(deadline(t), "k"); !errors.Is(err, ErrGoexit) {
				t.Errorf("Get = %v; want ErrGoexit", err)
			}
		})
	})
	t.Run("GetMany", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := &many{fail: func(int) error { return errBoom }}
			l := newManyLoader(t, &downstream{}, m, Options[string, string]{IsNotFound: goexit, Breaker: Breaker{Disabled: true}})
			_, err := l.GetMany(deadline(t), []string{"a", "b"})
			var me *ManyError[string]
			if !errors.As(err, &me) || len(me.Errs) != 2 || !errors.Is(err, ErrGoexit) {
				t.Errorf("GetMany = %v; want both keys failed with ErrGoexit", err)
			}
		})
	})
	t.Run("Remote", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &failingRemote{err: errBoom}
			l := newLoader(t, &downstream{}, Options[string, string]{IsNotFound: goexit, Remote: r})
			if _, err := l.Get(deadline(t), "k"); !errors.Is(err, errBoom) {
				t.Errorf("Get = %v; want the Remote's error, delivered", err)
			}
		})
	})
}

// deadline is the test's context, ended a minute from now (virtual time in
// a synctest bubble): a Get that would wait for good fails instead.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// failingRemote is a Remote whose Load fails with err without loading.
type failingRemote struct{ err error }

func (r *failingRemote) Load(ctx context.Context, key string, load func(context.Context) (string, error)) (RemoteValue[string], error) {
	return RemoteValue[string]{}, r.err
}
func (r *failingRemote) Set(context.Context, string, RemoteValue[string]) {}
func (r *failingRemote) Invalidate(context.Context, string)               {}

// docs/design.md rules 7 and 24: a LoadFunc that panics with ErrNotFound
// gives a *PanicError, which is no not-found: not cached.
func TestPanicIsNeverANotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		l, err := New(func(context.Context, string) (string, error) {
			calls.Add(1)
			panic(ErrNotFound)
		}, Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 2 {
			if _, err := l.Get(t.Context(), "k"); !errors.As(err, new(*PanicError)) {
				t.Fatalf("Get = %v; want a *PanicError", err)
			}
		}
		if n := calls.Load(); n != 2 {
			t.Errorf("LoadFunc calls = %d; want 2: a panic is not cached as a not-found", n)
		}
	})
}

// Options.NotFound is the rule a Remote (and a caller) applies.
func TestOptionsNotFound(t *testing.T) {
	with := Options[string, string]{IsNotFound: isNoRows}
	panics := Options[string, string]{IsNotFound: func(error) bool { panic("no") }}
	var none Options[string, string]
	for _, tc := range []struct {
		name string
		o    Options[string, string]
		err  error
		want bool
	}{
		{"nil", with, nil, false},
		{"ErrNotFound", none, ErrNotFound, true},
		{"wrapped ErrNotFound", none, fmt.Errorf("db: %w", ErrNotFound), true},
		{"own error, no IsNotFound", none, sql.ErrNoRows, false},
		{"own error, IsNotFound", with, fmt.Errorf("db: %w", sql.ErrNoRows), true},
		{"another error, IsNotFound", with, errBoom, false},
		{"IsNotFound panics", panics, sql.ErrNoRows, false},
		{"ErrNotFound, IsNotFound panics", panics, ErrNotFound, true},
		{"a panic with ErrNotFound", none, &PanicError{Value: ErrNotFound}, false},
		{"ErrGoexit", with, ErrGoexit, false},
	} {
		if got := tc.o.NotFound(tc.err); got != tc.want {
			t.Errorf("%s: NotFound(%v) = %v; want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

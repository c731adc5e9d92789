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

// docs/design.md rule 26: a not-found is the downstream's answer that the
// key is gone, so it always drops the value held, whatever NotFoundTTL;
// NotFoundTTL only decides whether the not-found itself is cached. Before
// the fix, with NotFoundTTL 0 (the default) every load that could find the
// key gone while a value was held (a revalidating Get or GetMany, Refresh,
// a Reload, a background refresh) left the old value in the cache: the
// next plain Get was answered with it, and later failures were covered by
// it as stale-on-error.
func TestNotFoundDropsTheValueHeld(t *testing.T) {
	cases := []struct {
		name string
		opts Options[string, string]
		wait time.Duration // how long after the value was loaded the key is found gone
		find func(l *Loader[string, string], ctx context.Context) error
	}{
		{"revalidating Get", Options[string, string]{}, 0, func(l *Loader[string, string], ctx context.Context) error {
			_, err := l.Get(WithRevalidate(ctx), "k")
			return err
		}},
		{"revalidating GetMany", Options[string, string]{}, 0, func(l *Loader[string, string], ctx context.Context) error {
			if m, err := l.GetMany(WithRevalidate(ctx), []string{"k"}); err != nil || len(m) != 0 {
				return errors.New("GetMany did not leave the key out")
			}
			return ErrNotFound
		}},
		{"Refresh", Options[string, string]{}, 0, func(l *Loader[string, string], ctx context.Context) error {
			l.Refresh(ctx, "k")
			synctest.Wait()
			return ErrNotFound
		}},
		{"Reload", Options[string, string]{}, 2 * time.Second, func(l *Loader[string, string], ctx context.Context) error {
			_, err := l.Get(ctx, "k")
			return err
		}},
		{"background refresh", Options[string, string]{StaleWhileRevalidate: time.Hour}, 2 * time.Second, func(l *Loader[string, string], ctx context.Context) error {
			if v, info, err := l.GetInfo(ctx, "k"); v != "v" || info.Source != SourceStale || err != nil {
				return errors.New("the Get in the stale window was not served the stale value")
			}
			synctest.Wait()
			return ErrNotFound
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				notFoundDrops(t, tc.opts, tc.wait, tc.find)
			})
		})
	}
}

func notFoundDrops(t *testing.T, opts Options[string, string], wait time.Duration, find func(*Loader[string, string], context.Context) error) {
	var gone atomic.Bool
	var fail atomic.Value // error
	var calls atomic.Int64
	answer := func() (string, error) {
		calls.Add(1)
		if err, _ := fail.Load().(error); err != nil {
			return "", err
		}
		if gone.Load() {
			return "", ErrNotFound
		}
		return "v", nil
	}
	opts.TTL, opts.StaleIfError = time.Second, time.Hour
	opts.Breaker = Breaker{Disabled: true}
	opts.LoadMany = func(ctx context.Context, keys []string) (map[string]string, error) {
		v, err := answer()
		if errors.Is(err, ErrNotFound) {
			return map[string]string{}, nil
		}
		return map[string]string{keys[0]: v}, err
	}
	opts.Reload = func(ctx context.Context, key, old string) (string, error) { return answer() }
	rec := &recorder{}
	opts.Observer = rec
	l, err := New(func(ctx context.Context, key string) (string, error) { return answer() }, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if v, err := l.Get(ctx, "k"); v != "v" || err != nil {
		t.Fatalf("Get = %q, %v; want v", v, err)
	}
	time.Sleep(wait)
	gone.Store(true)
	if err := find(l, ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the load that finds the key gone = %v; want ErrNotFound", err)
	}
	synctest.Wait()
	before := calls.Load()
	if v, info, err := l.GetInfo(ctx, "k"); !errors.Is(err, ErrNotFound) || v != "" {
		t.Errorf("Get after the key was found gone = %q, %v, %v; want ErrNotFound: the old value is not held", v, info.Source, err)
	}
	if calls.Load() == before {
		t.Errorf("the Get after the not-found made no downstream call: it was answered from the cache")
	}
	fail.Store(errBoom)
	if v, info, err := l.GetInfo(ctx, "k"); !errors.Is(err, errBoom) || v != "" {
		t.Errorf("Get of a failing downstream = %q, %v, %v; want errBoom, not covered by the deleted value", v, info.Source, err)
	}
	if _, _, ok := l.Peek("k"); ok {
		t.Errorf("Peek finds a value for the deleted key")
	}
	synctest.Wait()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.evictions) != 1 || rec.evictions[0].Cause != EvictionInvalidated {
		t.Errorf("evictions = %+v; want the old value's, once, as invalidated", rec.evictions)
	}
}

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

// missingRow is a LoadFunc's own not-found error, of a type a caller finds
// with errors.As.
type missingRow struct{ table string }

func (e *missingRow) Error() string { return "db: no row in " + e.table }

func isMissingRow(err error) bool { _, ok := errors.AsType[*missingRow](err); return ok }

// notFoundPath is one way a caller can receive a not-found: get returns
// the error of key "gone" from l, built with opts.
type notFoundPath struct {
	name string
	opts Options[string, string]
	get  func(ctx context.Context, l *Loader[string, string]) error
	text string // the error's text
	own  bool   // the LoadFunc (or Reload, or LoadMany) made it: it matches row too
	// loadErr is the LoadFunc's error; nil: row.
	loadErr error
}

// docs/design.md rule 25: every not-found a caller receives matches
// ErrNotFound, whichever path it took, and also the error the LoadFunc,
// Reload or LoadMany made, where one did (errors.Is and errors.As find
// it). Its text is ErrNotFound's followed by that error's, never
// ErrNotFound's twice. Before, a not-found only IsNotFound recognised
// reached its callers as the LoadFunc's error alone, which did not match
// ErrNotFound, while one the Loader made matched nothing else.
func TestEveryNotFoundMatchesErrNotFound(t *testing.T) {
	row := &missingRow{table: "products"}
	ownText := "flightcache: not found: db: no row in products"
	wrapped := fmt.Errorf("%w: %w", ErrNotFound, row)
	for _, tc := range notFoundPaths(row, wrapped, ownText) {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
				defer cancel()
				opts := tc.opts
				opts.TTL, opts.IsNotFound = time.Second, isMissingRow
				loadErr := tc.loadErr
				if loadErr == nil {
					loadErr = row
				}
				l, err := New(func(context.Context, string) (string, error) { return "", loadErr }, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				checkNotFound(t, tc, tc.get(ctx, l), row)
			})
		})
	}
}

// checkNotFound checks a not-found a caller received on path tc.
func checkNotFound(t *testing.T, tc notFoundPath, err, row error) {
	t.Helper()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("%s: err = %v; want it to match ErrNotFound", tc.name, err)
	}
	if err.Error() != tc.text {
		t.Errorf("%s: text %q; want %q", tc.name, err.Error(), tc.text)
	}
	if !tc.own {
		return
	}
	if !errors.Is(err, row) {
		t.Errorf("%s: err = %v; want it to match the LoadFunc's own error too", tc.name, err)
	}
	if got, ok := errors.AsType[*missingRow](err); !ok || got != row {
		t.Errorf("%s: errors.As found %v, %v; want the LoadFunc's own *missingRow", tc.name, got, ok)
	}
}

// notFoundPaths are the paths of TestEveryNotFoundMatchesErrNotFound.
func notFoundPaths(row, wrapped error, ownText string) []notFoundPath {
	get := func(ctx context.Context, l *Loader[string, string]) error { _, err := l.Get(ctx, "gone"); return err }
	cached := Options[string, string]{NotFoundTTL: time.Minute}
	failingMany := Options[string, string]{NotFoundTTL: time.Minute,
		LoadMany: func(context.Context, []string) (map[string]string, error) { return nil, row }}
	// hit: after first, a Get of "gone" answered by its cached not-found.
	hit := func(first func(ctx context.Context, l *Loader[string, string]) error) func(context.Context, *Loader[string, string]) error {
		return func(ctx context.Context, l *Loader[string, string]) error {
			if err := first(ctx, l); err != nil {
				return fmt.Errorf("the first call: %v", err)
			}
			before := l.Stats().Hits
			err := get(ctx, l)
			if l.Stats().Hits != before+1 {
				return fmt.Errorf("the Get was no hit (%v)", err)
			}
			return err
		}
	}
	getMany := func(ctx context.Context, l *Loader[string, string]) error {
		if m, err := l.GetMany(ctx, []string{"gone"}); err != nil || len(m) != 0 {
			return fmt.Errorf("GetMany = %v, %v; want the key absent, no error (rule 15)", m, err)
		}
		return nil
	}
	return []notFoundPath{
		{"Get, fresh load", Options[string, string]{}, get, ownText, true, nil},
		{"Get, cached not-found", cached, hit(func(ctx context.Context, l *Loader[string, string]) error {
			if err := get(ctx, l); !errors.Is(err, row) {
				return fmt.Errorf("Get = %v", err)
			}
			return nil
		}), ownText, true, nil},
		{"GetInfo", Options[string, string]{}, func(ctx context.Context, l *Loader[string, string]) error {
			_, info, err := l.GetInfo(ctx, "gone")
			if info.Source != SourceLoaded {
				return fmt.Errorf("GetInfo source %v (%v)", info.Source, err)
			}
			return err
		}, ownText, true, nil},
		{"Reload", Options[string, string]{StaleIfError: time.Hour, Reload: func(context.Context, string, string) (string, error) { return "", row }},
			func(ctx context.Context, l *Loader[string, string]) error {
				l.Set("gone", "old")
				time.Sleep(2 * time.Second) // stale, still held: the next Get reloads it
				return get(ctx, l)
			}, ownText, true, errBoom}, // a LoadFunc call would fail it
		{"Get after GetMany through the LoadFunc", cached, hit(getMany), ownText, true, nil},
		{"Get after GetMany, LoadMany failing whole", failingMany, hit(getMany), ownText, true, nil},
		{"Get after GetMany, key missing from LoadMany's map", Options[string, string]{NotFoundTTL: time.Minute,
			LoadMany: func(context.Context, []string) (map[string]string, error) { return map[string]string{}, nil }},
			hit(getMany), ErrNotFound.Error(), false, nil},
		{"LoadFunc wrapping ErrNotFound itself", Options[string, string]{}, get, wrapped.Error(), true, wrapped},
	}
}

// The wrapping of a not-found is made once, by its load: a Get answered by
// the cached not-found returns that same error and allocates nothing, as
// any hit. Outside a bubble: AllocsPerRun reads the real allocator.
func TestCachedNotFoundHitAllocatesNothing(t *testing.T) {
	row := &missingRow{table: "products"}
	d := &downstream{fail: func(int64, string) error { return row }}
	l := newLoader(t, d, Options[string, string]{TTL: time.Hour, NotFoundTTL: time.Hour, IsNotFound: isMissingRow})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, first := l.Get(ctx, "gone")
	if _, again := l.Get(ctx, "gone"); again != first || !errors.Is(again, ErrNotFound) {
		t.Fatalf(`Get("gone") again = %v; want the load's own not-found, %v, the same value`, again, first)
	}
	if n := testing.AllocsPerRun(1000, func() { l.Get(ctx, "gone") }); n != 0 {
		t.Errorf("a hit of a cached not-found allocates %v times; want 0", n)
	}
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

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

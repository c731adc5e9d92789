package flightcache

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A LoadFunc that Gets its own key (directly or through another key's load)
// gets ErrRecursiveLoad at once instead of waiting on itself.
func TestRecursiveGetFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l *Loader[string, string]
		var inner error
		var err error
		l, err = New(func(ctx context.Context, key string) (string, error) {
			switch key {
			case "a":
				return l.Get(ctx, "b") // another key: fine
			case "b":
				_, inner = l.Get(ctx, "a") // a cycle back to a
				return "b-value", nil
			}
			return "", nil
		}, Options[string, string]{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if v, err := l.Get(t.Context(), "a"); v != "b-value" || err != nil {
			t.Errorf("Get(a) = %q, %v; want b's value", v, err)
		}
		if !errors.Is(inner, ErrRecursiveLoad) {
			t.Errorf("inner Get(a) = %v; want ErrRecursiveLoad", inner)
		}
	})
}

// Set, Invalidate and Get of another key from inside a LoadFunc and OnLoad
// work; Close from inside either starts the shutdown and returns, and the
// Loader finishes closing when the callback returns (docs/design.md rule
// 28: a callback may call its Loader).
func TestCallbacksMayUseTheLoader(t *testing.T) {
	for _, where := range []string{"LoadFunc", "OnLoad"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var l *Loader[string, string]
				closed := make(chan error, 1)
				use := func(ctx context.Context, key string) {
					if key != "main" {
						return
					}
					l.Set("side", "set-inside")
					l.Invalidate("other")
					if v, err := l.Get(ctx, "side"); v != "set-inside" || err != nil {
						t.Errorf("Get(side) inside %s = %q, %v", where, v, err)
					}
					if _, err := l.Get(ctx, "fresh"); err != nil {
						t.Errorf("Get(fresh) inside %s = %v", where, err)
					}
					closed <- l.Close()
				}
				var err error
				l, err = New(func(ctx context.Context, key string) (string, error) {
					if where == "LoadFunc" {
						use(ctx, key)
					}
					return key + "-value", nil
				}, Options[string, string]{TTL: time.Minute, OnLoad: func(ev LoadEvent[string]) {
					if where == "OnLoad" {
						use(context.Background(), ev.Key)
					}
				}})
				if err != nil {
					t.Fatal(err)
				}
				_, getErr := l.Get(t.Context(), "main")
				if err := <-closed; err != nil {
					t.Errorf("Close inside %s = %v", where, err)
				}
				if where == "OnLoad" && getErr != nil {
					t.Errorf("Get(main) = %v; the result was delivered before OnLoad", getErr)
				}
				if where == "LoadFunc" && !errors.Is(getErr, ErrClosed) && getErr != nil {
					t.Errorf("Get(main) = %v; want the value or ErrClosed", getErr)
				}
				if err := l.Close(); err != nil { // from outside: waits for the rest
					t.Errorf("Close = %v", err)
				}
				if _, err := l.Get(t.Context(), "x"); !errors.Is(err, ErrClosed) {
					t.Errorf("Get after Close = %v; want ErrClosed", err)
				}
			})
		})
	}
}

// A panicking Cost or OnLoad does not escape: the value still reaches its
// callers, and Stats counts the panic.
func TestPanicsInUserCallbacksAreContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{
			MaxCost: 100,
			Cost:    func(v string) int64 { panic("cost") },
			OnLoad:  func(LoadEvent[string]) { panic("onload") },
		})
		for range 2 {
			if v, err := l.Get(t.Context(), "k"); err != nil || v == "" {
				t.Fatalf("Get = %q, %v; want the value", v, err)
			}
		}
		synctest.Wait()
		l.Set("k", "x")
		if s := l.Stats(); s.Panics != 5 || d.calls.Load() != 2 {
			t.Errorf("Panics = %d, calls %d; want 5 panics (2 Cost, 2 OnLoad, 1 Cost in Set) and 2 calls (nothing cached)", s.Panics, d.calls.Load())
		}
	})
}

// A Hash that panics goes through the user-code guard (docs/internals.md,
// "One guard for user code"): the Get returns a *PanicError, Set and
// Invalidate of the key do nothing, no Get is left half-counted and Close
// still returns.
func TestPanickingHashDoesNotWedgeClose(t *testing.T) {
	l, err := New(func(_ context.Context, k string) (string, error) { return k, nil },
		Options[string, string]{TTL: time.Minute, Hash: func(k string) uint64 {
			if k == "bad" {
				panic("unhashable")
			}
			return uint64(len(k))
		}})
	if err != nil {
		t.Fatal(err)
	}
	var pe *PanicError
	if _, err := l.Get(t.Context(), "bad"); !errors.As(err, &pe) || pe.Value != "unhashable" {
		t.Errorf("Get with a panicking Hash = %v; want a *PanicError with the panic value", err)
	}
	l.Set("bad", "x")
	l.Invalidate("bad")
	if s := l.Stats(); s.Panics != 3 || s.Gets != 0 {
		t.Errorf("Stats after three calls with a panicking Hash: Panics %d, Gets %d; want 3, 0", s.Panics, s.Gets)
	}
	if v, err := l.Get(t.Context(), "ok"); v != "ok" || err != nil {
		t.Errorf("Get(ok) = %q, %v", v, err)
	}
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after a Get panicked in Hash")
	}
	if s := l.Stats(); s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed {
		t.Errorf("Stats do not add up: %+v", s)
	}
}

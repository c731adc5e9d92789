package flightcache

import (
	"context"
	"errors"
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

package flightcache

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 31: with a BatchWindow, every load goes out as a
// LoadMany call, so the LoadFunc given to New is never called: not for a
// miss, a revalidating Get, Refresh, a background refresh, a value held
// past its stale window, nor GetMany. (Only a key not equal to itself,
// and a load through a Remote that is not a RemoteMany, use it.)
func TestBatchWindowNeverCallsTheLoadFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var loadFuncCalls atomic.Int64
		m := &many{}
		l, err := New(func(ctx context.Context, key string) (string, error) {
			loadFuncCalls.Add(1)
			return "from the LoadFunc", nil
		}, Options[string, string]{
			TTL: time.Second, StaleWhileRevalidate: time.Second, StaleIfError: time.Hour,
			LoadMany: m.load, BatchWindow: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()

		get := func(ctx context.Context, key string) {
			t.Helper()
			if v, err := l.Get(ctx, key); err != nil || v == "from the LoadFunc" {
				t.Fatalf("Get(%q) = %q, %v; want LoadMany's value", key, v, err)
			}
		}
		get(ctx, "miss")
		get(WithRevalidate(ctx), "miss")
		l.Refresh(ctx, "miss")
		time.Sleep(1500 * time.Millisecond) // stale: the Get refreshes in the background
		get(ctx, "miss")
		synctest.Wait()
		time.Sleep(3 * time.Second) // past the stale window, within StaleIfError: a Get loads
		get(ctx, "miss")
		if _, err := l.GetMany(ctx, []string{"a", "b"}); err != nil {
			t.Fatalf("GetMany = %v", err)
		}
		synctest.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		if n := loadFuncCalls.Load(); n != 0 {
			t.Errorf("the LoadFunc was called %d times; want 0 (LoadMany calls: %v)", n, m.calls)
		}
		if len(m.calls) < 6 {
			t.Errorf("LoadMany calls %v; want a call for each load", m.calls)
		}
	})
}

// The exception: a key not equal to itself (a NaN) is loaded alone,
// through the LoadFunc, window or not.
func TestBatchWindowLoadsANaNKeyThroughTheLoadFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var loadFuncCalls atomic.Int64
		l, err := New(func(ctx context.Context, key float64) (string, error) {
			loadFuncCalls.Add(1)
			return "alone", nil
		}, Options[float64, string]{
			TTL: time.Minute, BatchWindow: 10 * time.Millisecond,
			LoadMany: func(ctx context.Context, keys []float64) (map[float64]string, error) {
				return map[float64]string{}, nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if v, err := l.Get(ctx, math.NaN()); err != nil || v != "alone" {
			t.Fatalf("Get(NaN) = %q, %v; want the LoadFunc's value", v, err)
		}
		if n := loadFuncCalls.Load(); n != 1 {
			t.Errorf("the LoadFunc was called %d times; want 1", n)
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 15: a Loader made with a nil LoadFunc and a LoadMany
// loads every key it loads alone (Get, GetInfo, Refresh, a revalidating
// Get, a refresh) as a LoadMany call of that one key; a key missing from
// the map does not exist. GetMany still batches.
func TestNilLoadFuncLoadsThroughLoadMany(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{absent: map[string]bool{"gone": true, "gone2": true}}
		l, err := New(nil, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Minute, LoadMany: m.load})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx := t.Context()

		if v, err := l.Get(ctx, "a"); err != nil || v != "a@1" {
			t.Errorf("Get(a) = %q, %v; want a@1", v, err)
		}
		if v, info, err := l.GetInfo(ctx, "b"); err != nil || v != "b@2" || info.Source != SourceLoaded {
			t.Errorf("GetInfo(b) = %q, %+v, %v; want b@2, loaded", v, info, err)
		}
		if _, err := l.Get(ctx, "gone"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(gone) = %v; want ErrNotFound", err)
		}
		l.Refresh(ctx, "a")
		synctest.Wait()
		if v, info, err := l.GetInfo(ctx, "a"); err != nil || v != "a@4" || info.Source != SourceHit {
			t.Errorf("GetInfo(a) after Refresh = %q, %+v, %v; want a@4, a hit", v, info, err)
		}
		if v, info, err := l.GetInfo(WithRevalidate(ctx), "a"); err != nil || v != "a@5" || info.Source != SourceLoaded {
			t.Errorf("revalidating GetInfo(a) = %q, %+v, %v; want a@5, loaded", v, info, err)
		}
		time.Sleep(2 * time.Second) // a is stale: a Get serves it and refreshes it
		if v, info, _ := l.GetInfo(ctx, "a"); v != "a@5" || info.Source != SourceStale {
			t.Errorf("GetInfo(a) when stale = %q, %+v; want a@5, stale", v, info)
		}
		synctest.Wait()
		if v, _ := l.Get(ctx, "a"); v != "a@6" {
			t.Errorf("Get(a) after its refresh = %q; want a@6", v)
		}
		got, err := l.GetMany(ctx, []string{"c", "d", "gone2"})
		if err != nil || len(got) != 2 {
			t.Errorf("GetMany = %v, %v; want c and d", got, err)
		}
		want := [][]string{{"a"}, {"b"}, {"gone"}, {"a"}, {"a"}, {"a"}, {"c", "d", "gone2"}}
		if calls := m.all(); !slices.EqualFunc(calls, want, slices.Equal) {
			t.Errorf("LoadMany calls %v; want %v", calls, want)
		}
		if s := l.Stats(); s.BatchLoads != 1 || s.Loads != 7 {
			t.Errorf("Stats = %+v; want 7 loads, 1 of them a batch", s)
		}
	})
}

// A Loader without a LoadFunc still reloads through Reload, and its
// LoadMany calls go through the retries and the breaker.
func TestNilLoadFuncWithReloadAndRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		var reloads []string
		l, err := New(nil, Options[string, string]{
			TTL: time.Minute, LoadMany: m.load,
			Reload: func(ctx context.Context, key, old string) (string, error) {
				reloads = append(reloads, old)
				return old + "+r", nil
			},
			Retry:   Retry{MaxAttempts: 2, InitialInterval: time.Millisecond},
			Breaker: Breaker{ConsecutiveFailures: 2},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx := t.Context()
		if v, _ := l.Get(ctx, "a"); v != "a@1" {
			t.Fatalf("Get(a) = %q; want a@1", v)
		}
		l.Refresh(ctx, "a")
		synctest.Wait()
		if v, _ := l.Get(WithRevalidate(ctx), "a"); v != "a@1+r+r" {
			t.Errorf("revalidating Get(a) = %q; want a@1+r+r (two reloads)", v)
		}
		if !slices.Equal(reloads, []string{"a@1", "a@1+r"}) || len(m.all()) != 1 {
			t.Errorf("reloads of %v, LoadMany calls %v; want 2 reloads and the first load only", reloads, m.all())
		}

		m.fail = func(int) error { return errBoom }
		if _, err := l.Get(ctx, "b"); !errors.Is(err, errBoom) {
			t.Errorf("Get(b) = %v; want errBoom", err)
		}
		if n := len(m.all()); n != 3 {
			t.Errorf("LoadMany calls = %d; want 3: the failing one retried once", n)
		}
		if s := l.Stats(); s.Breaker != BreakerOpen {
			t.Errorf("breaker %v; want open after 2 failed calls", s.Breaker)
		}
	})
}

// New without a LoadFunc needs a LoadMany, and says so, naming both.
func TestNewWithoutLoadFuncNorLoadMany(t *testing.T) {
	_, err := New[string, string](nil, Options[string, string]{TTL: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "Options.LoadMany") || !strings.Contains(err.Error(), "LoadFunc") {
		t.Errorf("New(nil, no LoadMany) error = %v; want one naming Options.LoadMany and the LoadFunc", err)
	}
}

package flightcache

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Values whose Cost exceeds MaxCost reach their callers but are never
// cached, and what the cache holds never costs more than MaxCost (rule 10),
// however a value arrives: a first load, a reload of a key whose old entry
// is still in ristretto, or Set over an existing entry.
func TestCostAboveMaxCost(t *testing.T) {
	const maxCost = 1000
	small, big := "s", strings.Repeat("b", 5*maxCost)
	build := func(t *testing.T, load LoadFunc[string, string]) *Loader[string, string] {
		l, err := New(load, Options[string, string]{
			TTL: time.Second, MaxCost: maxCost,
			Cost: func(v string) int64 { return int64(len(v)) },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}

	t.Run("first load", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			l := build(t, func(context.Context, string) (string, error) { calls++; return big, nil })
			for i := range 2 {
				synctest.Wait() // the first load's write is settled (refused)
				v, info, err := l.GetInfo(t.Context(), "k")
				if v != big || info.Source != SourceLoaded || err != nil {
					t.Fatalf("Get %d = %d bytes, %v, %v; want the big value, loaded (never cached)", i, len(v), info.Source, err)
				}
			}
			synctest.Wait()
			if s := l.Stats(); calls != 2 || s.SetsRejected != 2 {
				t.Errorf("calls %d, SetsRejected %d; want 2 and 2", calls, s.SetsRejected)
			}
		})
	})

	t.Run("reload of an expired key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			calls := 0
			l := build(t, func(context.Context, string) (string, error) {
				calls++
				if calls == 1 {
					return small, nil
				}
				return big, nil
			})
			if v, _ := l.Get(t.Context(), "k"); v != small {
				t.Fatalf("first Get = %q; want %q", v, small)
			}
			time.Sleep(2 * time.Second) // expired: the old entry is still in ristretto
			if v, info, _ := l.GetInfo(t.Context(), "k"); v != big || info.Source != SourceLoaded {
				t.Fatalf("Get after expiry = %d bytes, %v; want the big value, loaded", len(v), info.Source)
			}
			synctest.Wait() // the reload's write is settled
			if v, info, _ := l.GetInfo(t.Context(), "k"); info.Source == SourceHit {
				t.Errorf("Get after the big reload = %d bytes, %v; a value of cost %d > MaxCost %d was cached",
					len(v), info.Source, len(big), maxCost)
			}
		})
	})

	t.Run("Set over an entry", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := build(t, func(context.Context, string) (string, error) { return "", ErrNotFound })
			l.Set("k", small)
			l.Set("k", big)
			if v, info, _ := l.GetInfo(t.Context(), "k"); info.Source == SourceHit {
				t.Errorf("Get after Set of the big value = %d bytes, %v; a value of cost %d > MaxCost %d was cached",
					len(v), info.Source, len(big), maxCost)
			}
		})
	})

	t.Run("total cost", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Loads fail without caching anything, so the Gets below only look.
			l := build(t, func(context.Context, string) (string, error) { return "", ErrNotFound })
			const keys = 500
			for i := range keys {
				l.Set(fmt.Sprint("k", i), small)
			}
			grown := strings.Repeat("g", maxCost/10) // each fits; all of them do not
			for i := range keys {
				l.Set(fmt.Sprint("k", i), grown)
			}
			var total int
			for i := range keys {
				if v, info, err := l.GetInfo(t.Context(), fmt.Sprint("k", i)); info.Source == SourceHit && err == nil {
					total += len(v)
				}
			}
			if total > maxCost {
				t.Errorf("cached values cost %d in all; want at most MaxCost %d (Stats %+v)", total, maxCost, l.Stats())
			}
		})
	})
}

// These tests check that flightcache.gets tells every answer apart as its
// Info.Source did, and that flightcache.reloads counts how reloads ended.

package otelflightcache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
)

// getsResult is the data point of flightcache.gets for result r.
func getsResult(r string) string {
	return `flightcache.gets{flightcache.get.result=` + r + `,flightcache.name=test}`
}

// reloadsResult is the data point of flightcache.reloads for result r.
func reloadsResult(r string) string {
	return `flightcache.reloads{flightcache.name=test,flightcache.reload.result=` + r + `}`
}

// Through an outage, a Get answered with the stale value is exported as
// stale-on-error, never as a miss: the counter says what the callers got.
func TestStaleOnErrorIsItsOwnResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		load := func(ctx context.Context, key string) (string, error) {
			if calls.Add(1) == 1 {
				return "v1", nil
			}
			return "", errBoom // the downstream is down from the second call on
		}
		r, l := wired(t, load, flightcache.Options[string, string]{
			TTL: time.Second, StaleIfError: time.Hour, Breaker: flightcache.Breaker{Disabled: true},
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, info, err := l.GetInfo(ctx, "a"); err != nil || info.Source != flightcache.SourceLoaded {
			t.Fatalf(`GetInfo("a") = %v, %v; want loaded`, info, err)
		}
		time.Sleep(2 * time.Second) // past TTL: the next Gets wait on a load, which fails
		for range 3 {
			v, info, err := l.GetInfo(ctx, "a")
			if err != nil || v != "v1" || info.Source != flightcache.SourceStaleOnError {
				t.Fatalf(`GetInfo("a") = %q, %v, %v; want "v1", stale-on-error`, v, info, err)
			}
		}
		synctest.Wait()

		got := collect(t, r.reader)
		wantValue(t, got, getsResult("stale-on-error"), 3)
		wantValue(t, got, getsResult("loaded"), 1)
		wantValue(t, got, getsResult("shared"), 0)
		if p, ok := got[getsResult("miss")]; ok {
			t.Errorf("%s = %v; a stale-on-error Get is not a miss", getsResult("miss"), p.value)
		}
	})
}

// A Reload that answers ErrNotModified (an HTTP 304) is counted as such;
// a Reload with a new value and one that fails are counted apart.
func TestReloadResultsAreCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reloads atomic.Int64
		reload := func(ctx context.Context, key, old string) (string, error) {
			switch reloads.Add(1) {
			case 1, 2:
				return "", flightcache.ErrNotModified
			case 3:
				return old + "+", nil
			}
			return "", errBoom
		}
		r, l := wired(t, func(ctx context.Context, key string) (string, error) { return "v", nil },
			flightcache.Options[string, string]{
				TTL: time.Second, StaleIfError: time.Hour, Reload: reload, Breaker: flightcache.Breaker{Disabled: true},
			})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for range 5 { // one load, then four reloads, each after the value expired
			if _, err := l.Get(ctx, "a"); err != nil {
				t.Fatalf(`Get("a") = %v`, err)
			}
			time.Sleep(2 * time.Second)
		}
		synctest.Wait()

		got := collect(t, r.reader)
		wantValue(t, got, reloadsResult("not_modified"), 2)
		wantValue(t, got, reloadsResult("modified"), 1)
		wantValue(t, got, reloadsResult("error"), 1)
		wantValue(t, got, reloadsResult("not_found"), 0)
		wantValue(t, got, getsResult("stale-on-error"), 1) // the failed reload's Get
		wantValue(t, got, getsResult("loaded"), 4)
	})
}

// Every Source a Get can say is a result of its own, and the results add
// up to the Gets answered: a partition of Stats.Gets.
func TestGetResultsArePartition(t *testing.T) {
	r := newRig(t)
	st := flightcache.Stats{
		Gets: 47, Hits: 10, StaleHits: 9, StaleLimited: 2, Misses: 27, Closed: 1,
		Loaded: 6, Shared: 12, StaleOnError: 5, Canceled: 4,
	}
	r.obs.ObserveStats(func() flightcache.Stats { return st })
	got := collect(t, r.reader)
	want := map[string]float64{
		"hit": 10, "stale": 7, "stale-limited": 2, "stale-on-error": 5,
		"loaded": 6, "shared": 12, "canceled": 4, "closed": 1,
	}
	var sum float64
	for result, v := range want {
		wantValue(t, got, getsResult(result), v)
		sum += got[getsResult(result)].value
	}
	if sum != float64(st.Gets) {
		t.Errorf("the results add up to %v; want Stats.Gets, %d", sum, st.Gets)
	}
	// Every Source there is, up to the first that String calls "none".
	for s := flightcache.SourceNone + 1; s.String() != "none"; s++ {
		if _, ok := got[getsResult(s.String())]; !ok {
			t.Errorf("Source %v has no result of its own", s)
		}
	}
}

// Concurrent Gets of one cold key: one is loaded, the others shared; the
// Gets still waiting are in flightcache.get.active, not yet a result.
func TestSharedAndLoadedResults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, l := wired(t, slow{delay: 50 * time.Millisecond}.load, flightcache.Options[string, string]{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if _, err := l.Get(ctx, "a"); err != nil {
					t.Errorf(`Get("a") = %v`, err)
				}
			})
		}
		synctest.Wait() // every Get waits on the one load
		got := collect(t, r.reader)
		wantValue(t, got, `flightcache.get.active{flightcache.name=test}`, 4)
		wantValue(t, got, getsResult("loaded"), 0)
		wantValue(t, got, getsResult("shared"), 0)
		wg.Wait()
		got = collect(t, r.reader)
		wantValue(t, got, getsResult("loaded"), 1)
		wantValue(t, got, getsResult("shared"), 3)
		wantValue(t, got, `flightcache.get.active{flightcache.name=test}`, 0)
	})
}

// The reload results from LoadEvent: a not-modified reload is not an
// error, and a load that was no reload is not counted.
func TestReloadResult(t *testing.T) {
	for _, tc := range []struct {
		ev   flightcache.LoadEvent[string]
		want string
	}{
		{flightcache.LoadEvent[string]{Reload: true, NotModified: true}, "not_modified"},
		{flightcache.LoadEvent[string]{Reload: true}, "modified"},
		{flightcache.LoadEvent[string]{Reload: true, Err: errBoom, NotFound: true}, "not_found"},
		{flightcache.LoadEvent[string]{Reload: true, Err: errBoom}, "error"},
		{flightcache.LoadEvent[string]{Reload: true, Err: fmt.Errorf("%w: open", flightcache.ErrBreakerOpen)}, "breaker_open"},
		{flightcache.LoadEvent[string]{Reload: true, Err: context.Canceled, Abandoned: true}, "canceled"},
		{flightcache.LoadEvent[string]{}, ""},
		{flightcache.LoadEvent[string]{Err: errBoom}, ""},
	} {
		if got := reloadResult(tc.ev); got != tc.want {
			t.Errorf("reloadResult(%+v) = %q; want %q", tc.ev, got, tc.want)
		}
	}
}

package flightcache

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 5: in the stale window every Get returns at once, and
// exactly one background refresh runs per key.
func TestStaleWhileRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		var log eventLog
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Second, StaleWhileRevalidate: 10 * time.Second, OnLoad: log.add,
		})
		l.Set("k", "old")
		time.Sleep(1500 * time.Millisecond)
		for range 50 {
			v, info, err := l.GetInfo(t.Context(), "k")
			if v != "old" || info.Source != SourceStale || err != nil || info.Age != 1500*time.Millisecond {
				t.Fatalf("Get = %q, %+v, %v; want the stale value at once, aged 1.5s", v, info, err)
			}
		}
		synctest.Wait()
		if got := d.calls.Load(); got != 1 {
			t.Fatalf("refreshes = %d; want exactly 1", got)
		}
		close(d.gate)
		synctest.Wait()
		if v, info, _ := l.GetInfo(t.Context(), "k"); v != "k#1" || info.Source != SourceHit {
			t.Errorf("Get after refresh = %q, %v; want the refreshed value as a hit", v, info.Source)
		}
		if events := log.all(); len(events) != 1 || !events[0].Background || events[0].Callers != 0 || !events[0].Stored {
			t.Errorf("events = %+v; want one stored background load with no callers", log.all())
		}
		if s := l.Stats(); s.StaleHits != 50 || s.Refreshes != 1 || s.Misses != 0 {
			t.Errorf("Stats = %+v; want 50 stale hits, 1 refresh, no misses", s)
		}
	})
}

// docs/design.md rule 5: a failed refresh is not retried for that key before
// a jittered backoff delay (Retry.InitialInterval, doubling per failure).
func TestFailedRefreshBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Second, StaleWhileRevalidate: time.Hour,
			Retry:   Retry{InitialInterval: time.Second, MaxInterval: 4 * time.Second},
			Breaker: Breaker{Disabled: true},
		})
		l.Set("k", "old")
		time.Sleep(2 * time.Second)
		get := func() {
			t.Helper()
			if v, info, err := l.GetInfo(t.Context(), "k"); v != "old" || info.Source != SourceStale || err != nil {
				t.Fatalf("Get = %q, %v, %v; want the stale value", v, info.Source, err)
			}
			synctest.Wait()
		}
		get()
		if d.calls.Load() != 1 {
			t.Fatalf("calls = %d; want the first refresh", d.calls.Load())
		}
		// The first delay is in [0.5s, 1s): nothing before 0.5s.
		for range 4 {
			time.Sleep(100 * time.Millisecond)
			get()
		}
		if d.calls.Load() != 1 {
			t.Errorf("calls = %d within the backoff; want 1", d.calls.Load())
		}
		time.Sleep(600 * time.Millisecond) // past 1s: the delay is over
		get()
		if d.calls.Load() != 2 {
			t.Errorf("calls = %d after the backoff; want 2", d.calls.Load())
		}
		// The second delay is in [1s, 2s).
		time.Sleep(900 * time.Millisecond)
		get()
		if d.calls.Load() != 2 {
			t.Errorf("calls = %d within the doubled backoff; want 2", d.calls.Load())
		}
		time.Sleep(1200 * time.Millisecond)
		get()
		if d.calls.Load() != 3 {
			t.Errorf("calls = %d after the doubled backoff; want 3", d.calls.Load())
		}
	})
}

// StaleIfError: past the SWR window a Get waits for a load, and a failure
// (the breaker refusing included) returns the stale value instead. The
// blast radius of one failure drops to zero.
func TestStaleIfError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{}), fail: func(n int64, _ string) error {
			if n > 1 {
				return errBoom
			}
			return nil
		}}
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Second, StaleIfError: time.Minute,
			Breaker: Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour},
		})
		first := getAsync(t.Context(), l, "k")
		synctest.Wait()
		d.gate <- struct{}{}
		if r := <-first; r.v != "k#1" {
			t.Fatalf("first Get = %q, %v", r.v, r.err)
		}
		time.Sleep(2 * time.Second)
		var results []<-chan result
		for range 5 {
			results = append(results, getAsync(t.Context(), l, "k"))
		}
		synctest.Wait()
		d.gate <- struct{}{}
		for _, ch := range results {
			if r := <-ch; r.v != "k#1" || r.err != nil || r.info.Source != SourceStaleOnError || r.info.Age != 2*time.Second {
				t.Errorf("Get = %q, %+v, %v; want the stale value, stale-on-error, aged 2s", r.v, r.info, r.err)
			}
		}
		// The breaker is open now: still the stale value, without a call.
		if v, info, err := l.GetInfo(t.Context(), "k"); v != "k#1" || info.Source != SourceStaleOnError || err != nil {
			t.Errorf("Get with breaker open = %q, %v, %v; want stale-on-error", v, info.Source, err)
		}
		if d.calls.Load() != 2 {
			t.Errorf("downstream calls = %d; want 2", d.calls.Load())
		}
		s := l.Stats()
		if s.StaleOnError != 6 || s.SharedErrors != 0 || s.BreakerRejected != 1 {
			t.Errorf("Stats = %+v; want StaleOnError 6, SharedErrors 0, BreakerRejected 1", s)
		}
		// Past the window the error comes through.
		time.Sleep(time.Minute)
		if _, err := l.Get(t.Context(), "k"); !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("Get past StaleIfError = %v; want ErrBreakerOpen", err)
		}
	})
}

// WithMaxStale bounds the staleness one Get accepts; 0 demands fresh.
func TestWithMaxStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Hour, StaleIfError: time.Hour})
		l.Set("k", "old")
		time.Sleep(3 * time.Second) // stale for 2s
		ctx := t.Context()
		if v, info, _ := l.GetInfo(WithMaxStale(ctx, 5*time.Second), "k"); v != "old" || info.Source != SourceStale {
			t.Errorf("max-stale 5s: %q, %v; want the stale value", v, info.Source)
		}
		synctest.Wait() // let that Get's refresh finish: k is fresh again
		l.Set("k", "old")
		time.Sleep(3 * time.Second)
		if v, info, _ := l.GetInfo(WithMaxStale(ctx, time.Second), "k"); v != "k#2" || info.Source != SourceLoaded {
			t.Errorf("max-stale 1s: %q, %v; want a fresh load", v, info.Source)
		}
		l.Set("k", "old")
		time.Sleep(1001 * time.Millisecond)
		if v, info, _ := l.GetInfo(WithMaxStale(ctx, 0), "k"); v != "k#3" || info.Source != SourceLoaded {
			t.Errorf("no-cache: %q, %v; want a fresh load", v, info.Source)
		}
		// A failing load must not fall back to a value the caller refused.
		d.fail = func(int64, string) error { return errBoom }
		l.Set("k", "old")
		time.Sleep(3 * time.Second)
		if _, err := l.Get(WithMaxStale(ctx, time.Second), "k"); !errors.Is(err, errBoom) {
			t.Errorf("max-stale 1s with failing load: %v; want errBoom, not the refused stale value", err)
		}
		if v, info, _ := l.GetInfo(ctx, "k"); v != "old" || info.Source != SourceStale {
			t.Errorf("no max-stale: %q, %v; want the stale value", v, info.Source)
		}
	})
}

// EarlyRefresh (XFetch): a fresh entry close to expiry is refreshed in the
// background before it expires, so readers never see it stale, and the
// number of refreshes does not grow with the request rate.
func TestEarlyRefresh(t *testing.T) {
	for _, rate := range []time.Duration{time.Millisecond, 10 * time.Millisecond} {
		t.Run("every "+rate.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// A load takes half a read interval more than 100ms, so that
				// it never ends at the instant of a read: which of two
				// things runs first at one instant is the scheduler's choice.
				d := &downstream{delay: 100*time.Millisecond + rate/2}
				l := newLoader(t, d, Options[string, string]{TTL: time.Second, EarlyRefresh: 1})
				if _, err := l.Get(t.Context(), "k"); err != nil {
					t.Fatal(err)
				}
				sources := map[Source]int{}
				gets := int(6 * time.Second / rate)
				for range gets {
					time.Sleep(rate)
					_, info, err := l.GetInfo(t.Context(), "k")
					if err != nil {
						t.Fatal(err)
					}
					sources[info.Source]++
				}
				// A load starts at least δ before expiry and takes δ. Reads
				// happen every rate, so a refresh may start up to one rate
				// late: a read meets the expiry when the entry's random lead
				// is under half a rate (about 1% of refreshes at 10ms). Three
				// such reads in 6s are allowed (four: about one run in
				// 250,000); without early refresh every expiry (six in 6s)
				// makes the next read wait.
				if sources[SourceHit] < gets-3 {
					t.Errorf("sources = %v; want (almost) every Get a hit: refreshed before expiry", sources)
				}
				// Each cycle lasts 1s minus the random lead (capped at 0.5s):
				// 6 to 12 refreshes in 6s at any request rate.
				if n := d.calls.Load(); n < 7 || n > 13 {
					t.Errorf("downstream calls = %d over 6s with TTL 1s; want 7 to 13", n)
				}
			})
		})
	}
}

// Negative caching: a not-found is cached for NotFoundTTL, is never a
// breaker failure, and is never covered by a stale value.
func TestNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(_ int64, key string) error {
			if key == "gone" {
				return errors.Join(ErrNotFound, errors.New("no row"))
			}
			return nil
		}}
		l := newLoader(t, d, Options[string, string]{NotFoundTTL: 10 * time.Second, Breaker: Breaker{ConsecutiveFailures: 1}})
		for range 3 {
			_, info, err := l.GetInfo(t.Context(), "gone")
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get(gone) = %v; want ErrNotFound", err)
			}
			_ = info
		}
		if d.count("gone") != 1 {
			t.Errorf("calls for gone = %d; want 1 (cached)", d.count("gone"))
		}
		if _, info, err := l.GetInfo(t.Context(), "gone"); info.Source != SourceHit || err.Error() != "flightcache: not found\nno row" {
			t.Errorf("cached not-found = %v, %v; want a hit returning the original error", info.Source, err)
		}
		if l.Stats().Breaker != BreakerClosed {
			t.Errorf("breaker = %v; want closed: not-found is not a failure", l.Stats().Breaker)
		}
		time.Sleep(11 * time.Second)
		l.Get(t.Context(), "gone")
		if d.count("gone") != 2 {
			t.Errorf("calls after NotFoundTTL = %d; want 2", d.count("gone"))
		}
	})
}

func TestNotFoundNotCachedByDefault(t *testing.T) {
	d := &downstream{fail: func(int64, string) error { return ErrNotFound }}
	l := newLoader(t, d, Options[string, string]{})
	for range 3 {
		if _, err := l.Get(context.Background(), "gone"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get = %v; want ErrNotFound", err)
		}
	}
	if d.calls.Load() != 3 {
		t.Errorf("calls = %d; want 3 with NotFoundTTL 0", d.calls.Load())
	}
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Stats.DownstreamCalls counts what the downstream saw: every LoadFunc,
// LoadMany and Reload call made, retries included, and no call that the
// breaker or the Limit refused. Each case's downstream counts its own
// calls, and Stats must agree with it.

func TestDownstreamCallsCountsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(n int64, key string) error {
			if n <= 2 {
				return errBoom
			}
			return nil
		}}
		l := newLoader(t, d, Options[string, string]{Retry: Retry{MaxAttempts: 3}, Breaker: Breaker{Disabled: true}})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if _, err := l.Get(ctx, "k"); err != nil {
			t.Fatalf("Get(%q) = %v; want its value on the third attempt", "k", err)
		}
		s := l.Stats()
		if s.DownstreamCalls != uint64(d.calls.Load()) || s.DownstreamCalls != 3 || s.Retries != 2 || s.Loads != 1 {
			t.Errorf("DownstreamCalls %d, Retries %d, Loads %d; the downstream saw %d calls; want 3, 2, 1",
				s.DownstreamCalls, s.Retries, s.Loads, d.calls.Load())
		}
	})
}

func TestDownstreamCallsCountsReloads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reloads atomic.Int64
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{
			TTL:          time.Second,
			StaleIfError: time.Hour, // the value is held past TTL: the next Get reloads it
			Reload: func(ctx context.Context, key, old string) (string, error) {
				if reloads.Add(1) == 1 {
					return "", ErrNotModified
				}
				return old + "+", nil
			},
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		for range 3 {
			if _, err := l.Get(ctx, "k"); err != nil {
				t.Fatalf("Get(%q) = %v", "k", err)
			}
			time.Sleep(2 * time.Second)
		}
		s := l.Stats()
		if d.calls.Load() != 1 || reloads.Load() != 2 {
			t.Fatalf("LoadFunc calls %d, Reload calls %d; want 1 and 2", d.calls.Load(), reloads.Load())
		}
		if s.DownstreamCalls != 3 || s.Reloads != 2 || s.NotModified != 1 {
			t.Errorf("DownstreamCalls %d, Reloads %d, NotModified %d; want 3 (1 LoadFunc + 2 Reload), 2, 1",
				s.DownstreamCalls, s.Reloads, s.NotModified)
		}
	})
}

// The breaker opens on the first failure: the load's retry is refused,
// and so is every load after it. Loads counts them all; DownstreamCalls
// only the one call made.
func TestDownstreamCallsLeavesOutBreakerRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{
			Retry:   Retry{MaxAttempts: 3},
			Breaker: Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour},
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if _, err := l.Get(ctx, "a"); !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, errBoom) {
			t.Fatalf("Get(%q) = %v; want errBoom or ErrBreakerOpen", "a", err)
		}
		for _, key := range []string{"b", "c"} {
			if _, err := l.Get(ctx, key); !errors.Is(err, ErrBreakerOpen) {
				t.Fatalf("Get(%q) = %v; want ErrBreakerOpen", key, err)
			}
		}
		s := l.Stats()
		if d.calls.Load() != 1 || s.DownstreamCalls != 1 || s.Loads != 3 || s.BreakerRejected != 3 || s.Breaker != BreakerOpen {
			t.Errorf("downstream saw %d calls; DownstreamCalls %d, Loads %d, BreakerRejected %d, Breaker %v; want 1, 1, 3, 3, open",
				d.calls.Load(), s.DownstreamCalls, s.Loads, s.BreakerRejected, s.Breaker)
		}
	})
}

// Two loads the Limit refuses with ErrLimited (a full queue, MaxWait) are
// loads, but no downstream call.
func TestDownstreamCallsLeavesOutLimitRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{Limit: Limit{MaxLoads: 1, MaxQueue: 1, MaxWait: time.Second}})
		held := holdSlot(t, l, "a")
		queued := getAsync(t.Context(), l, "q1")
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if _, err := l.Get(ctx, "q2"); !errors.Is(err, ErrLimited) {
			t.Errorf("Get(%q) past MaxQueue = %v; want ErrLimited", "q2", err)
		}
		if r := <-queued; !errors.Is(r.err, ErrLimited) {
			t.Errorf("Get(%q) queued past MaxWait = %v; want ErrLimited", "q1", r.err)
		}
		close(d.gate)
		if r := <-held; r.err != nil {
			t.Fatalf("Get(%q) = %v; want its value", "a", r.err)
		}
		s := l.Stats()
		if d.calls.Load() != 1 || s.DownstreamCalls != 1 || s.Loads != 3 || s.Limited != 2 {
			t.Errorf("downstream saw %d calls; DownstreamCalls %d, Loads %d, Limited %d; want 1, 1, 3, 2",
				d.calls.Load(), s.DownstreamCalls, s.Loads, s.Limited)
		}
	})
}

// A GetMany of 5 keys, MaxBatch 2: three LoadMany calls, one of which
// fails once and is retried.
func TestDownstreamCallsCountsLoadManyCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{
			MaxBatch: 2,
			Retry:    Retry{MaxAttempts: 2},
			Breaker:  Breaker{Disabled: true},
			LoadMany: func(ctx context.Context, keys []string) (map[string]string, error) {
				if calls.Add(1) == 1 {
					return nil, errBoom
				}
				m := make(map[string]string, len(keys))
				for _, k := range keys {
					m[k] = "v" + k
				}
				return m, nil
			},
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		m, err := l.GetMany(ctx, []string{"a", "b", "c", "d", "e"})
		if err != nil || len(m) != 5 {
			t.Fatalf("GetMany = %v, %v; want 5 values", m, err)
		}
		s := l.Stats()
		if calls.Load() != 4 || s.DownstreamCalls != 4 || s.Retries != 1 || s.BatchLoads != 3 || s.Loads != 3 || d.calls.Load() != 0 {
			t.Errorf("LoadMany saw %d calls, LoadFunc %d; DownstreamCalls %d, Retries %d, BatchLoads %d, Loads %d; want 4, 0, 4, 1, 3, 3",
				calls.Load(), d.calls.Load(), s.DownstreamCalls, s.Retries, s.BatchLoads, s.Loads)
		}
	})
}

// Stats.NotFounds counts the keys a load answered not-found, by the
// Loader's rule: ErrNotFound, Options.IsNotFound, a key missing from a
// LoadMany map. LoadNotFounds is the part of LoadErrors that are
// not-founds: a failure is in neither.
func TestNotFounds(t *testing.T) {
	errNoRow := errors.New("no row")
	loadFn := func(ctx context.Context, key string) (string, error) {
		switch key {
		case "gone":
			return "", fmt.Errorf("key %q: %w", key, ErrNotFound)
		case "norow":
			return "", errNoRow
		case "fail":
			return "", errBoom
		}
		return "v", nil
	}
	loadMany := func(ctx context.Context, keys []string) (map[string]string, error) {
		m := map[string]string{}
		for _, k := range keys {
			if k == "all-gone" {
				return nil, ErrNotFound
			}
			if !strings.HasPrefix(k, "missing") {
				m[k] = "v"
			}
		}
		return m, nil
	}
	type counts struct{ notFounds, loadNotFounds, loadErrors uint64 }
	for _, tc := range []struct {
		name string
		keys []string // one key: Get; more: GetMany
		many bool     // with LoadMany
		want counts
	}{
		{"ErrNotFound", []string{"gone"}, false, counts{1, 1, 1}},
		{"IsNotFound", []string{"norow"}, false, counts{1, 1, 1}},
		{"a failure", []string{"fail"}, false, counts{0, 0, 1}},
		{"a value", []string{"k"}, false, counts{0, 0, 0}},
		{"GetMany without LoadMany", []string{"gone", "k", "fail"}, false, counts{1, 1, 2}},
		{"keys missing from LoadMany's map", []string{"a", "missing1", "b", "missing2"}, true, counts{2, 0, 0}},
		{"LoadMany's not-found", []string{"x", "all-gone", "y"}, true, counts{3, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := Options[string, string]{TTL: time.Minute, IsNotFound: func(err error) bool { return errors.Is(err, errNoRow) }}
				if tc.many {
					opts.LoadMany = loadMany
				}
				l, err := New(loadFn, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				if len(tc.keys) == 1 {
					l.Get(ctx, tc.keys[0])
				} else {
					l.GetMany(ctx, tc.keys)
				}
				s := l.Stats()
				if got, want := (counts{s.NotFounds, s.LoadNotFounds, s.LoadErrors}), tc.want; got != want {
					t.Errorf("NotFounds, LoadNotFounds, LoadErrors = %+v; want %+v", got, want)
				}
			})
		})
	}
}

// A cached not-found answers from the cache: it is not counted again.
func TestNotFoundsCountsLoadsNotHits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return ErrNotFound }}
		l := newLoader(t, d, Options[string, string]{NotFoundTTL: time.Minute})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		for range 3 {
			if _, err := l.Get(ctx, "gone"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get(%q) = %v; want ErrNotFound", "gone", err)
			}
		}
		if s := l.Stats(); s.NotFounds != 1 || s.Hits != 2 || s.DownstreamCalls != 1 {
			t.Errorf("NotFounds %d, Hits %d, DownstreamCalls %d; want 1, 2, 1", s.NotFounds, s.Hits, s.DownstreamCalls)
		}
	})
}

// LoadEvent.Attempts is "the number of LoadFunc calls the load made", and
// Stats.Retries counts the calls after a load's first. A call that panics,
// or ends its goroutine with runtime.Goexit, is a call too; it used to go
// uncounted, so a load whose only call panicked reported 0 attempts, as if
// the breaker had refused it.
func TestAttemptsCountCallsThatPanicOrGoexit(t *testing.T) {
	cases := []struct {
		name  string
		fault func(call int) // called with 1, 2, ... for each LoadFunc call
		calls int
	}{
		{"panic", func(int) { panic("boom") }, 1},
		{"Goexit", func(int) { runtime.Goexit() }, 1},
		{"error, then panic", func(n int) {
			if n == 2 {
				panic("boom")
			}
		}, 2},
		{"error, then Goexit", func(n int) {
			if n == 2 {
				runtime.Goexit()
			}
		}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				calls := 0
				var events eventLog
				l, err := New(func(context.Context, string) (string, error) {
					calls++
					tc.fault(calls)
					return "", errBoom // retryable: a second call follows
				}, Options[string, string]{
					TTL: time.Minute, OnLoad: events.add,
					Retry: Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
				})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				l.Get(t.Context(), "k")
				synctest.Wait()
				evs := events.all()
				if calls != tc.calls || len(evs) != 1 {
					t.Fatalf("%d calls, %d LoadEvents; want %d and 1", calls, len(evs), tc.calls)
				}
				if evs[0].Attempts != calls {
					t.Errorf("LoadEvent.Attempts = %d; want %d: every LoadFunc call counts", evs[0].Attempts, calls)
				}
				if s := l.Stats(); s.Retries != uint64(calls-1) {
					t.Errorf("Stats.Retries = %d; want %d", s.Retries, calls-1)
				}
			})
		})
	}
}

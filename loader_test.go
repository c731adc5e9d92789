package flightcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
	"go.uber.org/goleak"
)

// docs/design.md rule 1: N concurrent Gets of one cold key make exactly one
// LoadFunc call, and all N get the same value.
func TestCoalescing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		var log eventLog
		l := newLoader(t, d, Options[string, string]{OnLoad: log.add})
		const n = 100
		var results []<-chan result
		for range n {
			results = append(results, getAsync(t.Context(), l, "k"))
		}
		synctest.Wait() // every Get is waiting on the one load
		close(d.gate)
		sources := map[Source]int{}
		for _, ch := range results {
			r := <-ch
			if r.err != nil || r.v != "k#1" {
				t.Fatalf("Get(%q) = %q, %v; want %q, nil", "k", r.v, r.err, "k#1")
			}
			sources[r.info.Source]++
		}
		synctest.Wait()
		if got := d.calls.Load(); got != 1 {
			t.Errorf("downstream calls = %d; want 1", got)
		}
		if sources[SourceLoaded] != 1 || sources[SourceShared] != n-1 {
			t.Errorf("sources = %v; want 1 loaded, %d shared", sources, n-1)
		}
		if events := log.all(); len(events) != 1 || events[0].Callers != n || !events[0].Stored {
			t.Errorf("LoadEvents = %+v; want one with Callers %d, Stored", log.all(), n)
		}
		s := l.Stats()
		if s.Loads != 1 || s.Misses != n || s.Shared != n-1 || s.MaxCallersPerLoad != n {
			t.Errorf("Stats = %+v; want Loads 1, Misses %d, Shared %d, MaxCallersPerLoad %d", s, n, n-1, n)
		}
	})
}

// docs/design.md rule 2: a Get that begins after a load returned is a hit;
// so is a Get after Set. Many readers race the first load of many keys.
func TestNoGapAfterLoad(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{MaxCost: 100_000})
	const keys, readers = 200, 8
	var wg sync.WaitGroup
	var misses atomic.Int64
	for r := range readers {
		wg.Go(func() {
			for i := range keys {
				key := fmt.Sprintf("k%d", (i+r*17)%keys)
				if _, err := l.Get(t.Context(), key); err != nil {
					t.Errorf("Get(%q): %v", key, err)
					return
				}
				// This Get begins after the one above returned.
				_, info, err := l.GetInfo(t.Context(), key)
				if err != nil || info.Source != SourceHit {
					misses.Add(1)
					t.Errorf("second Get(%q) = %v, %v; want a hit", key, info.Source, err)
				}
			}
		})
	}
	waitGroup(t, "the readers", &wg)
	s := l.Stats()
	if got := d.calls.Load(); got != keys {
		t.Errorf("downstream calls = %d; want %d (one per key), stats %+v", got, keys, s)
	}
	if s.SetsDropped != 0 || s.SetsRejected != 0 {
		t.Errorf("ristretto dropped %d, rejected %d fills; want none with room for all", s.SetsDropped, s.SetsRejected)
	}

	l.Set("k1", "set")
	if v, info, err := l.GetInfo(t.Context(), "k1"); v != "set" || info.Source != SourceHit || err != nil {
		t.Errorf("Get after Set = %q, %v, %v; want %q, hit", v, info.Source, err, "set")
	}
}

// docs/design.md rule 2, its exception made visible: a cache too small to
// keep everything shows its evictions and refusals in Stats.
func TestFullCacheIsVisible(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{MaxCost: 10})
	for i := range 500 {
		if _, err := l.Get(t.Context(), fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	s := l.Stats()
	if s.Evicted+s.SetsRejected+s.SetsDropped+s.FillsDropped == 0 {
		t.Errorf("Stats = %+v; want evictions or refusals from a 10-entry cache given 500 keys", s)
	}
}

// docs/design.md rule 3: concurrent waiters see the one error; the next Get
// calls again.
func TestFailuresSharedAndForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{}), fail: func(int64, string) error { return errBoom }}
		var log eventLog
		l := newLoader(t, d, Options[string, string]{OnLoad: log.add})
		var results []<-chan result
		for range 5 {
			results = append(results, getAsync(t.Context(), l, "bad"))
		}
		synctest.Wait()
		close(d.gate)
		for _, ch := range results {
			if r := <-ch; !errors.Is(r.err, errBoom) {
				t.Fatalf("Get(%q) error = %v; want errBoom", "bad", r.err)
			}
		}
		if d.calls.Load() != 1 {
			t.Fatalf("downstream calls = %d; want 1", d.calls.Load())
		}
		if _, err := l.Get(t.Context(), "bad"); !errors.Is(err, errBoom) {
			t.Fatalf("later Get error = %v; want errBoom", err)
		}
		if d.calls.Load() != 2 {
			t.Errorf("downstream calls after a later Get = %d; want 2 (failures are not cached)", d.calls.Load())
		}
		synctest.Wait()
		s := l.Stats()
		callers := map[int]int{}
		for _, ev := range log.all() {
			callers[ev.Callers]++
		}
		if s.SharedErrors != 4 || s.LoadErrors != 2 || callers[5] != 1 || callers[1] != 1 {
			t.Errorf("Stats = %+v, callers per load %v; want SharedErrors 4, LoadErrors 2, loads reaching 5 and 1", s, callers)
		}
	})
}

type traceKey struct{}

// docs/design.md rule 4: a caller that leaves gets ctx.Err(); the others
// still get the value; the load's context keeps the first caller's values
// but never its cancellation.
func TestCancellationIsIsolated(t *testing.T) {
	for _, policy := range []Policy{FinishAndFill, CancelAtZero} {
		t.Run(policy.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gate := make(chan struct{})
				var sawTrace any
				var sawErr error
				l, err := New(func(ctx context.Context, key string) (string, error) {
					sawTrace = ctx.Value(traceKey{})
					<-gate
					sawErr = ctx.Err()
					return "v", nil
				}, Options[string, string]{TTL: time.Minute, Policy: policy})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				impatientCtx, cancel := context.WithCancel(context.WithValue(t.Context(), traceKey{}, "trace-1"))
				impatient := getAsync(impatientCtx, l, "k")
				synctest.Wait() // the impatient caller started the load
				patient := getAsync(t.Context(), l, "k")
				synctest.Wait()
				cancel()
				if r := <-impatient; !errors.Is(r.err, context.Canceled) || r.info.Source != SourceNone {
					t.Errorf("impatient Get = %v, %v; want context.Canceled", r.info.Source, r.err)
				}
				close(gate)
				if r := <-patient; r.err != nil || r.v != "v" || r.info.Source != SourceShared {
					t.Errorf("patient Get = %q, %v, %v; want %q, shared, nil", r.v, r.info.Source, r.err, "v")
				}
				if sawTrace != "trace-1" || sawErr != nil {
					t.Errorf("load saw trace %v and ctx error %v; want trace-1 and no cancellation", sawTrace, sawErr)
				}
				if s := l.Stats(); s.Canceled != 1 || s.Abandoned != 0 {
					t.Errorf("Stats = %+v; want Canceled 1, Abandoned 0", s)
				}
			})
		})
	}
}

// docs/design.md rule 4, CancelAtZero: the last waiter's exit cancels the
// load and takes it out of the map at once, so a later Get starts a fresh
// load even while the cancelled one is still running.
func TestCancelAtZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := make(chan struct{}) // the first load ignores cancellation until closed
		var cause error
		var calls atomic.Int32
		var mu sync.Mutex
		var events []LoadEvent[string]
		l, err := New(func(ctx context.Context, key string) (string, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done()
				cause = context.Cause(ctx)
				<-first
				return "stale result", nil
			}
			return "fresh", nil
		}, Options[string, string]{TTL: time.Minute, Policy: CancelAtZero,
			OnLoad: func(ev LoadEvent[string]) { mu.Lock(); events = append(events, ev); mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(t.Context())
		lonely := getAsync(ctx, l, "k")
		synctest.Wait()
		cancel()
		if r := <-lonely; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("lonely Get error = %v; want context.Canceled", r.err)
		}
		synctest.Wait()
		if !errors.Is(cause, errAbandoned) {
			t.Errorf("load context cause = %v; want errAbandoned", cause)
		}
		// The abandoned load is still running, but no longer in flight.
		v, info, err := l.GetInfo(t.Context(), "k")
		if v != "fresh" || info.Source != SourceLoaded || err != nil {
			t.Errorf("Get after abandon = %q, %v, %v; want a fresh load", v, info.Source, err)
		}
		close(first)
		synctest.Wait()
		if v, info, _ := l.GetInfo(t.Context(), "k"); v != "fresh" || info.Source != SourceHit {
			t.Errorf("Get = %q, %v; want the fresh value as a hit: the abandoned load must not fill", v, info.Source)
		}
		var abandoned, stored int
		for _, ev := range events {
			if ev.Abandoned && !ev.Stored && ev.Callers == 0 {
				abandoned++
			}
			if !ev.Abandoned && ev.Stored && ev.Callers == 1 {
				stored++
			}
		}
		if len(events) != 2 || abandoned != 1 || stored != 1 {
			t.Errorf("events = %+v; want one abandoned load, unstored, with 0 callers, and one stored", events)
		}
		if s := l.Stats(); s.Abandoned != 1 || s.InFlight != 0 {
			t.Errorf("Stats = %+v; want Abandoned 1, InFlight 0", s)
		}
	})
}

// docs/design.md rule 4, FinishAndFill: the load outlives its only caller
// and fills.
func TestFinishAndFill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{delay: time.Second}
		l := newLoader(t, d, Options[string, string]{})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if _, err := l.Get(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get error = %v; want context.DeadlineExceeded", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if v, info, err := l.GetInfo(t.Context(), "k"); v != "k#1" || info.Source != SourceHit || err != nil {
			t.Errorf("next Get = %q, %v, %v; want %q as a hit", v, info.Source, err, "k#1")
		}
	})
}

// docs/design.md rule 6: Invalidate and Set win over a load in flight: its
// waiters get its result, the cache does not.
func TestInvalidateAndSetWinOverInflightLoad(t *testing.T) {
	for _, op := range []string{"Invalidate", "Set"} {
		t.Run(op, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &downstream{gate: make(chan struct{}, 1)}
				l := newLoader(t, d, Options[string, string]{})
				waiter := getAsync(t.Context(), l, "k")
				synctest.Wait()
				if op == "Set" {
					l.Set("k", "newer")
				} else {
					l.Invalidate("k")
				}
				d.gate <- struct{}{}
				if r := <-waiter; r.v != "k#1" || r.err != nil {
					t.Errorf("waiter got %q, %v; want the load's own result k#1", r.v, r.err)
				}
				synctest.Wait()
				d.gate <- struct{}{} // let a second load through, if any
				v, _, err := l.GetInfo(t.Context(), "k")
				want := map[string]string{"Set": "newer", "Invalidate": "k#2"}[op]
				if v != want || err != nil {
					t.Errorf("Get after %s = %q, %v; want %q", op, v, err, want)
				}
			})
		})
	}
}

// docs/design.md rule 7: a panicking LoadFunc gives every waiter a
// *PanicError, caches nothing, and counts as a breaker failure.
func TestPanicIsSharedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var calls atomic.Int32
		l, err := New(func(ctx context.Context, key string) (string, error) {
			calls.Add(1)
			<-gate
			panic("kaboom")
		}, Options[string, string]{TTL: time.Minute, Breaker: Breaker{ConsecutiveFailures: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		a, b := getAsync(t.Context(), l, "k"), getAsync(t.Context(), l, "k")
		synctest.Wait()
		close(gate)
		for _, ch := range []<-chan result{a, b} {
			r := <-ch
			var pe *PanicError
			if !errors.As(r.err, &pe) || pe.Value != "kaboom" || !strings.Contains(string(pe.Stack), "loader_test.go") {
				t.Fatalf("Get error = %v; want *PanicError with value and stack", r.err)
			}
		}
		_, err = l.Get(t.Context(), "k")
		if !errors.Is(err, ErrBreakerOpen) || !errors.Is(err, gobreaker.ErrOpenState) || calls.Load() != 1 {
			t.Errorf("Get after panic = %v with %d calls; want ErrBreakerOpen, nothing cached, 1 call", err, calls.Load())
		}
		if s := l.Stats(); s.Panics != 1 || s.BreakerRejected != 1 || s.Breaker != BreakerOpen {
			t.Errorf("Stats = %+v; want Panics 1, BreakerRejected 1, breaker open", s)
		}
	})
}

// docs/design.md rule 8: Close cancels loads and refreshes in flight, waits
// for every goroutine, and later Gets return ErrClosed.
func TestCloseStopsEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l, err := New(d.load, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		// A stale entry with a background refresh stuck in the downstream.
		l.Set("stale", "old")
		time.Sleep(2 * time.Second)
		if v, info, _ := l.GetInfo(t.Context(), "stale"); v != "old" || info.Source != SourceStale {
			t.Fatalf("Get = %q, %v; want the stale value", v, info.Source)
		}
		waiter := getAsync(t.Context(), l, "cold")
		synctest.Wait()
		if s := l.Stats(); s.InFlight != 2 {
			t.Fatalf("InFlight = %d; want a refresh and a load", s.InFlight)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if r := <-waiter; !errors.Is(r.err, ErrClosed) {
			t.Errorf("waiter error = %v; want ErrClosed", r.err)
		}
		if _, err := l.Get(t.Context(), "stale"); !errors.Is(err, ErrClosed) {
			t.Errorf("Get after Close = %v; want ErrClosed", err)
		}
		l.Set("x", "y") // no-ops, no panics
		l.Invalidate("x")
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if s := l.Stats(); s.InFlight != 0 || s.Closed != 1 {
			t.Errorf("Stats = %+v; want InFlight 0, Closed 1", s)
		}
	})
	goleak.VerifyNone(t)
}

// docs/design.md rule 9: keys are compared exactly; colliding hashes share a
// slot, never a value.
func TestHashCollisionsNeverMixValues(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{Hash: func(string) uint64 { return 42 }})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				key := fmt.Sprintf("k%d", (g+i)%5)
				v, err := l.Get(t.Context(), key)
				if err != nil || !strings.HasPrefix(v, key+"#") {
					t.Errorf("Get(%q) = %q, %v; want a value of %q", key, v, err, key)
					return
				}
			}
		})
	}
	waitGroup(t, "the colliding Gets", &wg)
	l.Invalidate("k-other") // another key in the same slot: must not drop it
	v1, _ := l.Get(t.Context(), "k1")
	if _, info, _ := l.GetInfo(t.Context(), "k1"); info.Source != SourceHit {
		t.Errorf("Get(k1) after Invalidate of a colliding key = %v (%q); want hit", info.Source, v1)
	}
}

// docs/design.md rule 10: a load is bounded by LoadTimeout (retries
// included), and retries by MaxAttempts.
func TestLoadTimeoutAndMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{delay: time.Hour}
		l := newLoader(t, d, Options[string, string]{LoadTimeout: 2 * time.Second})
		start := time.Now()
		_, err := l.Get(t.Context(), "slow")
		if !errors.Is(err, ErrLoadTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get error = %v; want ErrLoadTimeout and DeadlineExceeded", err)
		}
		if took := time.Since(start); took != 2*time.Second {
			t.Errorf("Get took %v of virtual time; want exactly LoadTimeout", took)
		}

		f := &downstream{fail: func(int64, string) error { return errBoom }}
		var attempts int
		lr := newLoader(t, f, Options[string, string]{
			Retry:   Retry{MaxAttempts: 3},
			Breaker: Breaker{Disabled: true},
			OnLoad:  func(ev LoadEvent[string]) { attempts = ev.Attempts },
		})
		if _, err := lr.Get(t.Context(), "k"); !errors.Is(err, errBoom) {
			t.Errorf("Get error = %v; want errBoom", err)
		}
		synctest.Wait()
		if f.calls.Load() != 3 || attempts != 3 || lr.Stats().Retries != 2 {
			t.Errorf("calls %d, attempts %d, retries %d; want 3, 3, 2", f.calls.Load(), attempts, lr.Stats().Retries)
		}
	})
}

// docs/design.md rule 10: MaxRefreshes bounds background refreshes; a stale
// value is served either way.
func TestMaxRefreshes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Hour, MaxRefreshes: 1})
		l.Set("a", "a0")
		l.Set("b", "b0")
		time.Sleep(2 * time.Second)
		for _, k := range []string{"a", "b", "a", "b"} {
			if v, info, err := l.GetInfo(t.Context(), k); v != k+"0" || info.Source != SourceStale || err != nil {
				t.Fatalf("Get(%q) = %q, %v, %v; want the stale value", k, v, info.Source, err)
			}
		}
		synctest.Wait()
		if got := d.calls.Load(); got != 1 {
			t.Errorf("refreshes running = %d; want 1 (MaxRefreshes)", got)
		}
		close(d.gate)
		synctest.Wait()
		l.Get(t.Context(), "b") // now there is room
		synctest.Wait()
		if got := d.calls.Load(); got != 2 {
			t.Errorf("downstream calls = %d; want 2 once the first refresh ended", got)
		}
	})
}

// With a TTL shorter than ristretto's write delay, a Get may find the last
// load finished but its value already expired: it loads again, and the new
// value is applied after the old one (never lost behind it).
func TestTinyTTLLoadsEveryTime(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{TTL: time.Nanosecond, StaleIfError: time.Hour})
	seen := map[string]bool{}
	for i := range 300 {
		v, err := l.Get(t.Context(), "k")
		if err != nil || seen[v] {
			t.Fatalf("Get %d = %q, %v; want a new value each time", i, v, err)
		}
		seen[v] = true
	}
	if got := d.calls.Load(); got != 300 {
		t.Errorf("calls = %d; want 300", got)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				if v, err := l.Get(t.Context(), "k"); err != nil || !strings.HasPrefix(v, "k#") {
					t.Errorf("Get = %q, %v", v, err)
					return
				}
			}
		})
	}
	waitGroup(t, "the concurrent Gets", &wg)
	// The last value stored is the newest: a fresh Get sees it as stale.
	l.Set("k", "set")
	if v, _ := l.Get(t.Context(), "k"); v != "set" && !strings.HasPrefix(v, "k#") {
		t.Errorf("Get after Set = %q", v)
	}
}

package flightcache

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

// The breaker opens after ConsecutiveFailures, refuses without calling the
// downstream, lets a probe through after OpenTimeout, and closes on success.
func TestBreakerOpensAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		healthy := false
		d := &downstream{fail: func(int64, string) error {
			if healthy {
				return nil
			}
			return errBoom
		}}
		l := newLoader(t, d, Options[string, string]{Breaker: Breaker{ConsecutiveFailures: 3, OpenTimeout: 10 * time.Second}})
		for i := range 3 {
			if _, err := l.Get(t.Context(), "k"); !errors.Is(err, errBoom) {
				t.Fatalf("Get %d = %v; want errBoom", i, err)
			}
		}
		_, err := l.Get(t.Context(), "k")
		if !errors.Is(err, ErrBreakerOpen) || !errors.Is(err, gobreaker.ErrOpenState) {
			t.Fatalf("Get with breaker open = %v; want ErrBreakerOpen wrapping gobreaker.ErrOpenState", err)
		}
		if d.calls.Load() != 3 {
			t.Errorf("calls = %d; want 3: an open breaker calls nothing", d.calls.Load())
		}
		time.Sleep(11 * time.Second)
		healthy = true
		if v, err := l.Get(t.Context(), "k"); err != nil || v != "k#4" {
			t.Errorf("probe Get = %q, %v; want the probe's value", v, err)
		}
		if s := l.Stats(); s.Breaker != BreakerClosed || s.BreakerRejected != 1 {
			t.Errorf("Stats = %+v; want breaker closed again, 1 rejection", s)
		}
	})
}

// A caller leaving, Close, abandonment and not-found never count as
// breaker failures; IsFailure can exclude more.
func TestBreakerIgnoresCancellationAndNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var notFailure = errors.New("bad request")
		l, err := New(func(ctx context.Context, key string) (string, error) {
			switch key {
			case "gone":
				return "", ErrNotFound
			case "bad":
				return "", notFailure
			}
			<-ctx.Done()
			return "", ctx.Err()
		}, Options[string, string]{TTL: time.Minute, Policy: CancelAtZero, Breaker: Breaker{
			ConsecutiveFailures: 1,
			IsFailure:           func(err error) bool { return !errors.Is(err, notFailure) },
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 3 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			l.Get(ctx, "slow") // abandoned at the deadline: excluded
			cancel()
			l.Get(t.Context(), "gone")
			l.Get(t.Context(), "bad")
		}
		synctest.Wait()
		if s := l.Stats(); s.Breaker != BreakerClosed || s.BreakerRejected != 0 {
			t.Errorf("Stats = %+v; want the breaker still closed", s)
		}
	})
}

// Retries: a transient error is retried with backoff inside the load; a
// Retryable that says no stops at once; not-found is never retried.
func TestRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(n int64, key string) error {
			switch {
			case key == "gone":
				return ErrNotFound
			case key == "fatal":
				return errBoom
			case n%3 != 0:
				return errors.New("transient")
			}
			return nil
		}}
		l := newLoader(t, d, Options[string, string]{
			Retry: Retry{MaxAttempts: 5, InitialInterval: 100 * time.Millisecond,
				Retryable: func(err error) bool { return !errors.Is(err, errBoom) }},
			Breaker: Breaker{Disabled: true},
		})
		start := time.Now()
		if v, err := l.Get(t.Context(), "k"); err != nil || v != "k#3" {
			t.Fatalf("Get = %q, %v; want success on the third attempt", v, err)
		}
		if waited := time.Since(start); waited < 100*time.Millisecond || waited > time.Second {
			t.Errorf("two retries took %v; want jittered backoff of about 100ms+150ms", waited)
		}
		before := d.calls.Load()
		l.Get(t.Context(), "fatal")
		l.Get(t.Context(), "gone")
		if got := d.calls.Load() - before; got != 2 {
			t.Errorf("calls for a non-retryable error and a not-found = %d; want 2", got)
		}
	})
}

// Retries stop at the load's deadline, and the error says so while keeping
// the last real error.
func TestRetriesStopAtLoadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{
			LoadTimeout: time.Second,
			Retry:       Retry{MaxAttempts: 100, InitialInterval: 300 * time.Millisecond, MaxInterval: 300 * time.Millisecond},
			Breaker:     Breaker{Disabled: true},
		})
		_, err := l.Get(t.Context(), "k")
		if !errors.Is(err, ErrLoadTimeout) || !errors.Is(err, errBoom) {
			t.Errorf("Get = %v; want ErrLoadTimeout wrapping the last errBoom", err)
		}
		if n := d.calls.Load(); n < 2 || n > 8 {
			t.Errorf("calls = %d; want a handful within 1s", n)
		}
	})
}

// A LoadFunc that calls runtime.Goexit ends its goroutine; waiters get an
// error instead of hanging, and the breaker counts a failure (a half-open
// probe must not stay taken forever).
func TestGoexitInLoadFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := New(func(ctx context.Context, key string) (string, error) {
			runtime.Goexit()
			return "", nil
		}, Options[string, string]{TTL: time.Minute, Breaker: Breaker{ConsecutiveFailures: 2, OpenTimeout: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for range 2 {
			if _, err := l.Get(t.Context(), "k"); !errors.Is(err, ErrGoexit) {
				t.Fatalf("Get = %v; want ErrGoexit", err)
			}
		}
		if s := l.Stats(); s.Breaker != BreakerOpen {
			t.Fatalf("breaker = %v; want open after two Goexits", s.Breaker)
		}
		time.Sleep(2 * time.Second)
		for range 2 { // each half-open probe Goexits and reopens the breaker
			l.Get(t.Context(), "k")
			time.Sleep(2 * time.Second)
		}
		if s := l.Stats(); s.Loads != 4 {
			t.Errorf("Loads = %d; want 4: the half-open probe is released each time", s.Loads)
		}
	})
}

// ConsecutiveFailures counts failures in a row of the calls the downstream
// saw, in the order they completed. A burst of cold Gets is admitted at
// once, while the breaker is healthy; their successes used to be dropped
// and only their failures reported, so a downstream failing one call in 20
// (never two in a row) opened the breaker in a burst of 100, and every Get
// after it failed with ErrBreakerOpen.
func TestBreakerCountsOnlyFailuresInARow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const burst = 100
		gates := make([]chan struct{}, burst)
		for i := range gates {
			gates[i] = make(chan struct{})
		}
		var calls atomic.Int64
		l, err := New(func(ctx context.Context, key int) (int, error) {
			calls.Add(1)
			if key < burst {
				select {
				case <-gates[key]:
				case <-ctx.Done(): // Close, after a failed check
					return 0, ctx.Err()
				}
			}
			if key%20 == 19 {
				return 0, errBoom
			}
			return key, nil
		}, Options[int, int]{TTL: time.Minute, Breaker: Breaker{ConsecutiveFailures: 5}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		results := make(chan error, burst)
		for k := range burst {
			go func() { _, err := l.Get(t.Context(), k); results <- err }()
		}
		synctest.Wait() // every call is admitted and waits at its gate
		if n := calls.Load(); n != burst {
			t.Fatalf("%d downstream calls running; want all %d", n, burst)
		}
		failures := 0
		for k := range burst { // they complete in key order: 19 successes, one failure, ...
			close(gates[k])
			synctest.Wait()
			if err := <-results; err != nil {
				failures++
				if !errors.Is(err, errBoom) {
					t.Errorf("Get(%d) = %v; want errBoom", k, err)
				}
			}
		}
		if failures != burst/20 {
			t.Errorf("%d Gets failed; want %d", failures, burst/20)
		}
		if s := l.Stats(); s.Breaker != BreakerClosed {
			t.Errorf("breaker %v after %d scattered failures, never two in a row; want closed", s.Breaker, failures)
		}
		for k := burst; k < burst+10; k++ {
			if v, err := l.Get(t.Context(), k); err != nil && k%20 != 19 || err == nil && v != k {
				t.Errorf("Get(%d) after the burst = %d, %v; want %d", k, v, err, k)
			}
		}
	})
}

// Failures in a row still open the breaker, those of calls admitted
// together included, and a success between them starts the count again.
func TestBreakerOpensOnFailuresInARowOfConcurrentCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 8
		gates := make([]chan struct{}, n)
		for i := range gates {
			gates[i] = make(chan struct{})
		}
		fail := func(k int) bool { return k != 3 } // 0-2 fail, 3 succeeds, 4-7 fail
		l, err := New(func(ctx context.Context, key int) (int, error) {
			select {
			case <-gates[key]:
			case <-ctx.Done(): // Close, after a failed check
				return 0, ctx.Err()
			}
			if fail(key) {
				return 0, errBoom
			}
			return key, nil
		}, Options[int, int]{TTL: time.Minute, Breaker: Breaker{ConsecutiveFailures: 4, OpenTimeout: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		results := make(chan error, n)
		for k := range n {
			go func() { _, err := l.Get(t.Context(), k); results <- err }()
		}
		synctest.Wait()
		for k := range n {
			close(gates[k])
			synctest.Wait()
			<-results
			want := BreakerClosed
			if k == n-1 {
				want = BreakerOpen // 4-7: four in a row
			}
			if s := l.Stats(); s.Breaker != want {
				t.Fatalf("after call %d: breaker %v; want %v", k, s.Breaker, want)
			}
		}
		if _, err := l.Get(t.Context(), n); !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("Get with the breaker open = %v; want ErrBreakerOpen", err)
		}
	})
}

// While closed, the built-in breaker admits a call and takes its outcome
// without allocating, failures short of a run included.
func TestBreakerClosedPathAllocatesNothing(t *testing.T) {
	b := newBreaker(Breaker{ConsecutiveFailures: 3, OpenTimeout: time.Hour, HalfOpenRequests: 1})
	outcomes := []Outcome{OutcomeSuccess, OutcomeFailure, OutcomeIgnored, OutcomeFailure, OutcomeSuccess}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		done, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		done(outcomes[i%len(outcomes)])
		i++
	})
	if allocs != 0 || b.State() != BreakerClosed {
		t.Errorf("closed path: %v allocs per call, breaker %v; want 0, closed", allocs, b.State())
	}
}

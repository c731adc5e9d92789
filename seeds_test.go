package flightcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The scenarios of the two documents the project grew from, as tests.

// Step 1 and 2: 100 concurrent identical requests make 100 downstream calls
// with no coordination, and 1 through a Loader.
func TestSeedBurstOfIdenticalRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{delay: 50 * time.Millisecond}
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() { d.load(t.Context(), "u1") })
		}
		wg.Wait()
		if got := d.calls.Load(); got != 100 {
			t.Fatalf("uncoordinated calls = %d; want 100", got)
		}

		c := &downstream{delay: 50 * time.Millisecond}
		l := newLoader(t, c, Options[string, string]{})
		values := make([]string, 100)
		for i := range values {
			wg.Go(func() { values[i], _ = l.Get(t.Context(), "u1") })
		}
		wg.Wait()
		if got := c.calls.Load(); got != 1 {
			t.Errorf("calls through a Loader = %d; want 1", got)
		}
		for _, v := range values {
			if v != values[0] {
				t.Fatalf("values differ: %q and %q; want every caller to get the one result", v, values[0])
			}
		}
	})
}

// Step 3: five concurrent callers of a failing key see one error from one
// call; the next caller makes a fresh call.
func TestSeedFailuresSharedNotCached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{delay: 50 * time.Millisecond, fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{})
		var wg sync.WaitGroup
		var errs atomic.Int32
		for range 5 {
			wg.Go(func() {
				if _, err := l.Get(t.Context(), "bad"); errors.Is(err, errBoom) {
					errs.Add(1)
				}
			})
		}
		wg.Wait()
		if errs.Load() != 5 || d.calls.Load() != 1 {
			t.Fatalf("%d errors from %d calls; want 5 from 1", errs.Load(), d.calls.Load())
		}
		l.Get(t.Context(), "bad")
		if d.calls.Load() != 2 {
			t.Errorf("calls after a later Get = %d; want 2", d.calls.Load())
		}
	})
}

// Step 4: an impatient caller's cancellation does not cancel the patient
// one; under CancelAtZero a lone caller's exit leaves nothing in flight.
func TestSeedCancellation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{delay: 50 * time.Millisecond}
		l := newLoader(t, d, Options[string, string]{Policy: CancelAtZero})
		ctx, cancel := context.WithCancel(t.Context())
		impatient := getAsync(ctx, l, "u2")
		patient := getAsync(t.Context(), l, "u2")
		time.Sleep(10 * time.Millisecond)
		cancel()
		if r := <-impatient; !errors.Is(r.err, context.Canceled) {
			t.Errorf("impatient = %v; want context.Canceled", r.err)
		}
		if r := <-patient; r.v != "u2#1" || r.err != nil || d.calls.Load() != 1 {
			t.Errorf("patient = %q, %v after %d calls; want u2#1 from 1 call", r.v, r.err, d.calls.Load())
		}

		ctx, cancel = context.WithCancel(t.Context())
		lonely := getAsync(ctx, l, "u3")
		time.Sleep(10 * time.Millisecond)
		cancel()
		<-lonely
		synctest.Wait()
		if s := l.Stats(); s.InFlight != 0 || s.Abandoned != 1 {
			t.Errorf("after the lone caller left: InFlight %d, Abandoned %d; want 0 and 1", s.InFlight, s.Abandoned)
		}
	})
}

// Step 5: 300 requests in 3 bursts 50 ms apart behind a 200 ms TTL make 1
// call; with a 10 ms TTL, 3 (one per burst).
func TestSeedBurstsBehindATTL(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want int64
	}{{200 * time.Millisecond, 1}, {10 * time.Millisecond, 3}} {
		t.Run(tc.ttl.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &downstream{delay: 50 * time.Millisecond}
				l := newLoader(t, d, Options[string, string]{TTL: tc.ttl})
				for range 3 {
					var wg sync.WaitGroup
					for range 100 {
						wg.Go(func() {
							if _, err := l.Get(t.Context(), "u1"); err != nil {
								t.Error(err)
							}
						})
					}
					wg.Wait()
					time.Sleep(50 * time.Millisecond)
				}
				if got := d.calls.Load(); got != tc.want {
					t.Errorf("calls for 300 requests = %d; want %d", got, tc.want)
				}
			})
		})
	}
}

// The second document in miniature: readers share loads of three hot keys;
// every tenth load times out. One timeout reaches everyone queued behind it,
// and LoadEvent.Callers, Stats.SharedErrors and MaxCallersPerLoad say how
// many. With StaleIfError the same failures reach no reader that had a
// value to fall back on.
func TestSeedBlastRadius(t *testing.T) {
	run := func(t *testing.T, staleIfError time.Duration) (failedCallers, readerErrors, errorsWithStale int, s Stats, maxFailedCallers int) {
		synctest.Test(t, func(t *testing.T) {
			var n atomic.Int64
			errTimeout := errors.New("db: query timeout")
			load := func(ctx context.Context, key string) (string, error) {
				i := n.Add(1)
				time.Sleep(100*time.Millisecond + time.Duration(i%21)*time.Millisecond)
				if i%10 == 0 {
					return "", errTimeout
				}
				return fmt.Sprint(key, "#", i), nil
			}
			var mu sync.Mutex
			l, err := New(load, Options[string, string]{
				TTL: time.Nanosecond, StaleIfError: staleIfError, Breaker: Breaker{Disabled: true},
				OnLoad: func(ev LoadEvent[string]) {
					if ev.Err != nil {
						mu.Lock()
						failedCallers += ev.Callers
						maxFailedCallers = max(maxFailedCallers, ev.Callers)
						mu.Unlock()
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var loaded [3]atomic.Bool
			for r := range 8 {
				wg.Go(func() {
					for i := range 60 {
						k := (r + i) % 3
						_, err := l.Get(t.Context(), fmt.Sprint("user:", k))
						mu.Lock()
						if err != nil {
							readerErrors++
							if loaded[k].Load() {
								errorsWithStale++
							}
						} else {
							loaded[k].Store(true)
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			synctest.Wait()
			s = l.Stats()
			l.Close()
		})
		return
	}

	t.Run("no stale", func(t *testing.T) {
		failedCallers, readerErrors, _, s, maxCallers := run(t, 0)
		if readerErrors == 0 || failedCallers != readerErrors {
			t.Errorf("readers with errors = %d, callers of failed loads = %d; want equal and > 0", readerErrors, failedCallers)
		}
		if s.SharedErrors == 0 || s.SharedErrors >= uint64(readerErrors) {
			t.Errorf("SharedErrors = %d of %d reader errors; want the queued share, > 0", s.SharedErrors, readerErrors)
		}
		if maxCallers < 2 || s.MaxCallersPerLoad < uint64(maxCallers) {
			t.Errorf("max callers of a failed load = %d (MaxCallersPerLoad %d); want a timeout reaching several readers", maxCallers, s.MaxCallersPerLoad)
		}
		t.Logf("8 readers: %d loads, %d failed reaching %d readers (max %d per load)", s.Loads, s.LoadErrors, readerErrors, maxCallers)
	})
	t.Run("stale-if-error", func(t *testing.T) {
		_, _, errorsWithStale, s, _ := run(t, time.Hour)
		if errorsWithStale != 0 {
			t.Errorf("readers that saw an error while a stale value existed = %d; want 0", errorsWithStale)
		}
		if s.StaleOnError == 0 {
			t.Errorf("StaleOnError = 0; want the failures covered by stale values")
		}
	})
}

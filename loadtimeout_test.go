package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// errDial is a driver's own error at the deadline it took from the load's
// context: a dial that never connected.
var errDial = errors.New("dial tcp 10.0.0.7:3306: i/o timeout")

// untilDeadline returns errDial once ctx's deadline has passed, as a
// driver does, without waiting for ctx to end: how a dial deadline beats
// the timer that ends the load's context. With sleep it waits on a timer
// of its own (the driver's), else it spins (LoadTimeout 1ns: past at
// once).
func untilDeadline(ctx context.Context, sleep bool) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return errors.New("the load's context has no deadline")
	}
	if sleep {
		time.Sleep(time.Until(dl))
	}
	for time.Now().Before(dl) {
		runtime.Gosched()
	}
	return errDial
}

// afterDone returns errDial once ctx has ended: a LoadFunc that notices
// the end and answers with an error of its own.
func afterDone(ctx context.Context, _ bool) error {
	<-ctx.Done()
	return errDial
}

// A load that ran to its LoadTimeout is a timeout whatever error its
// LoadFunc (or Reload, or LoadMany) returned, and whichever fired first,
// the LoadFunc's own deadline or the timer that ends the load's context:
// its callers' error matches ErrLoadTimeout and the LoadFunc's error, and
// keeps its text (docs/design.md rule 32). 20 loads of each shape, at
// LoadTimeout 1ns (the deadline past before the LoadFunc runs) and at
// 20ms (the LoadFunc's own timer at the deadline), all at once.
func TestLoadTimeoutMatchesOwnError(t *testing.T) {
	for _, path := range []string{"LoadFunc", "Reload", "LoadMany"} {
		for _, timeout := range []time.Duration{time.Nanosecond, 20 * time.Millisecond} {
			for _, shape := range []struct {
				name string
				fail func(context.Context, bool) error
			}{{"own deadline", untilDeadline}, {"after Done", afterDone}} {
				t.Run(fmt.Sprintf("%s/%v/%s", path, timeout, shape.name), func(t *testing.T) {
					testLoadTimeoutOwnError(t, path, timeout, shape.fail)
				})
			}
		}
	}
}

func testLoadTimeoutOwnError(t *testing.T, path string, timeout time.Duration, fail func(context.Context, bool) error) {
	sleep := timeout > time.Nanosecond
	opts := Options[string, string]{
		TTL:         time.Minute,
		LoadTimeout: timeout,
		Breaker:     Breaker{Disabled: true}, // 20 timeouts in a row: every one must reach the LoadFunc
	}
	load := func(ctx context.Context, key string) (string, error) { return "", fail(ctx, sleep) }
	switch path {
	case "Reload":
		opts.Reload = func(ctx context.Context, key, old string) (string, error) { return "", fail(ctx, sleep) }
	case "LoadMany":
		opts.LoadMany = func(ctx context.Context, keys []string) (map[string]string, error) { return nil, fail(ctx, sleep) }
	}
	l, err := New(load, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		key := fmt.Sprint("k", i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		switch path {
		case "Reload":
			l.Set(key, "v1")
			ctx = WithRevalidate(ctx) // a load of the value held: through Reload
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if path == "LoadMany" {
				_, errs[i] = l.GetMany(ctx, []string{key, key + "b"})
				return
			}
			_, errs[i] = l.Get(ctx, key)
		}()
	}
	waitGroup(t, "the Gets", &wg)
	for i, err := range errs {
		if !errors.Is(err, ErrLoadTimeout) || !errors.Is(err, errDial) || !strings.Contains(fmt.Sprint(err), errDial.Error()) {
			t.Errorf("load %d of %d: error %v; want one matching ErrLoadTimeout and the LoadFunc's own error, with its text", i+1, n, err)
		}
	}
	if s := l.Stats(); s.DownstreamCalls != n {
		t.Errorf("DownstreamCalls = %d; want %d, one per load", s.DownstreamCalls, n)
	}
}

// A retry interval near math.MaxInt64 means "wait about forever", so a
// load whose first attempt fails ends at its LoadTimeout, not in a burst of
// retries. backoff/v4 spreads each interval to up to 1.5× in floating point
// and converts it back unchecked: past about MaxInt64/1.5 the wait
// overflowed into a negative one, and the retry ran at once (half the
// time, for an interval of MaxInt64: ten loads make a miss unlikely).
func TestHugeRetryIntervalWaitsUntilLoadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{
			LoadTimeout: time.Hour,
			Retry:       Retry{MaxAttempts: 3, InitialInterval: time.Duration(math.MaxInt64)},
			Breaker:     Breaker{Disabled: true},
		})
		for i := range 10 {
			k := fmt.Sprintf("k%d", i)
			if _, err := l.Get(t.Context(), k); !errors.Is(err, ErrLoadTimeout) || !errors.Is(err, errBoom) {
				t.Errorf("Get(%s) = %v; want ErrLoadTimeout with the first attempt's errBoom", k, err)
			}
			if n := d.count(k); n != 1 {
				t.Errorf("Get(%s): %d attempts; want 1: the retry waits past the LoadTimeout", k, n)
			}
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// downstream is a fake slow service: it counts calls and, when gated, blocks
// each call until the test releases it.
type downstream struct {
	calls   atomic.Int64
	mu      sync.Mutex
	perKey  map[string]int
	gate    chan struct{}                   // if non-nil, each call waits to receive from it (or ctx)
	started chan string                     // if non-nil, each call sends its key here first
	delay   time.Duration                   // if > 0, each call sleeps this long (virtual time in synctest)
	fail    func(n int64, key string) error // if non-nil, the call's error
	inside  atomic.Int64                    // calls running now
	peak    atomic.Int64                    // most calls running at once
}

func (d *downstream) load(ctx context.Context, key string) (string, error) {
	n := d.calls.Add(1)
	d.mu.Lock()
	if d.perKey == nil {
		d.perKey = map[string]int{}
	}
	d.perKey[key]++
	d.mu.Unlock()
	in := d.inside.Add(1)
	defer d.inside.Add(-1)
	for {
		p := d.peak.Load()
		if in <= p || d.peak.CompareAndSwap(p, in) {
			break
		}
	}
	if d.started != nil {
		d.started <- key
	}
	if d.gate != nil {
		select {
		case <-d.gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if d.delay > 0 {
		select {
		case <-time.After(d.delay):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	if d.fail != nil {
		if err := d.fail(n, key); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("%s#%d", key, n), nil
}

func (d *downstream) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.perKey[key]
}

// newLoader builds a string Loader on d and closes it when the test ends.
func newLoader(t testing.TB, d *downstream, opts Options[string, string]) *Loader[string, string] {
	t.Helper()
	if opts.TTL == 0 {
		opts.TTL = time.Minute
	}
	l, err := New(d.load, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

var errBoom = errors.New("boom")

// waitFor polls cond every millisecond until it holds, and fails the test
// if it does not within d, saying what it waited for: a polling loop that
// never ends would otherwise become the whole run's timeout. Call it from
// the test's (or benchmark's) own goroutine. In a synctest bubble d is
// virtual time.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: it did not happen", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// patience bounds a real-clock wait on a channel or a WaitGroup (recv,
// send, waitGroup): generous for a loaded machine under -race, and still a
// deadlock fails in well under a minute, not at the package's timeout.
// Call them from the test's own goroutine. A synctest bubble needs none:
// synctest reports a deadlock there.
const patience = 30 * time.Second

// recv receives from ch, and fails the test if nothing comes within
// patience, saying what it waited for.
func recv[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
	}
	t.Fatalf("waited %v for %s: it did not come", patience, what)
	panic("unreachable")
}

// send sends v on ch, and fails the test if no one takes it within
// patience, saying what it offered.
func send[T any](t testing.TB, what string, ch chan<- T, v T) {
	t.Helper()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case ch <- v:
	case <-timer.C:
		t.Fatalf("waited %v to hand over %s: no one took it", patience, what)
	}
}

// waitGroup waits for wg, and fails the test if it has not finished
// within patience, saying what it waited for.
func waitGroup(t testing.TB, what string, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(patience)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("waited %v for %s: it did not finish", patience, what)
	}
}

// waitProgress waits until left() is 0. Its deadline grows with progress:
// it fails only when left() has not fallen for stall, so a slow machine
// that drains steadily passes, and a drain that stopped fails in stall.
func waitProgress(t testing.TB, what string, stall time.Duration, left func() int64) {
	t.Helper()
	best := left()
	deadline := time.Now().Add(stall)
	for best > 0 {
		if n := left(); n < best {
			best, deadline = n, time.Now().Add(stall)
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %s: none done in the last %v", best, what, stall)
		}
		time.Sleep(time.Millisecond)
	}
}

// deadline is the context a test's Get runs under: the test's own
// context, ended a minute from now (virtual time in a synctest bubble), so
// a Get that would wait for good fails the test instead of hanging the
// run. It is the one helper for that; a minute is generous for a loaded
// machine under -race.
func deadline(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// result is one Get's outcome, gathered from goroutines.
type result struct {
	v    string
	info Info
	err  error
}

// getAsync starts a GetInfo on its own goroutine.
func getAsync(ctx context.Context, l *Loader[string, string], key string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		v, info, err := l.GetInfo(ctx, key)
		ch <- result{v, info, err}
	}()
	return ch
}

// eventLog collects LoadEvents; OnLoad runs on load goroutines, several
// of which may report at once.
type eventLog struct {
	mu  sync.Mutex
	evs []LoadEvent[string]
}

func (g *eventLog) add(ev LoadEvent[string]) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.evs = append(g.evs, ev)
}

func (g *eventLog) all() []LoadEvent[string] {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]LoadEvent[string](nil), g.evs...)
}

// pending reports whether key has a load in flight or a write not yet
// applied.
func (l *Loader[K, V]) pending(key K) bool { return l.flights.pending(key, l.mustHash(key)) }

package flightcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/internal/life"
)

// Close called from a callback on a load goroutine must not wait for
// itself, and the only way to tell is the goroutine's stack (loader.go).
// The lookup is by the address of a marking function, not by its name: this
// test fails if the lookup stops finding it (a rename that left a string
// behind, an inlined frame), and if it finds it where it is not.
func TestCloseFromLoaderGoroutine(t *testing.T) {
	if life.OnPool() {
		t.Fatal("life.OnPool() = true on a test goroutine")
	}
	inLoad, inOnLoad := make(chan bool, 1), make(chan bool, 1)
	closed := make(chan error, 1)
	var l *Loader[string, string]
	l, err := New(func(ctx context.Context, k string) (string, error) {
		inLoad <- life.OnPool()
		if k == "close" {
			closed <- l.Close() // must return at once
		}
		return k, nil
	}, Options[string, string]{TTL: time.Minute, OnLoad: func(LoadEvent[string]) { inOnLoad <- life.OnPool() }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if !recv(t, "the LoadFunc's report", inLoad) || !recv(t, "OnLoad's report", inOnLoad) {
		t.Fatal("life.OnPool() = false inside a LoadFunc or OnLoad")
	}
	if v, err := l.Get(t.Context(), "close"); v != "close" || err != nil {
		t.Errorf(`Get("close") = %q, %v; want the value: Close only starts the shutdown`, v, err)
	}
	recv(t, "the closing LoadFunc's report", inLoad)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close from a LoadFunc = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close from a LoadFunc did not return")
	}
	if err := l.Close(); err != nil { // from outside: waits for the rest
		t.Fatal(err)
	}
	if _, err := l.Get(t.Context(), "b"); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %v; want ErrClosed", err)
	}
}

// Shutdown waits at most until its context ends (docs/design.md rule 8,
// bounded): with a LoadFunc that ignores its context, Shutdown returns
// ctx.Err(), the Loader is closed for new work, and a later Shutdown or
// Close returns once the load has ended.
func TestShutdownBoundedByContext(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	l, err := New(func(ctx context.Context, k string) (string, error) {
		close(started)
		<-release // ignores ctx
		return k, nil
	}, Options[string, string]{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := l.Get(context.Background(), "k"); got <- err }()
	recv(t, "the load to start", started)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a load running = %v; want DeadlineExceeded", err)
	}
	if _, err := l.Get(context.Background(), "other"); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Shutdown = %v; want ErrClosed", err)
	}
	close(release)
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown = %v; want nil once the load ended", err)
	}
	if err := recv(t, "the Get whose LoadFunc ignored Close", got); err != nil {
		t.Errorf("the Get whose LoadFunc ignored Close = %v; want its value", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close after Shutdown = %v", err)
	}
}

// Load goroutines are reused (loader.go): a stream of misses does not
// start a goroutine per load, a burst leaves at most maxIdle of them
// waiting, a LoadFunc that ends its goroutine costs only that worker, and
// Close leaves none behind (rule 8).
func TestLoadGoroutinesAreReused(t *testing.T) {
	d := &downstream{}
	l, err := New(func(ctx context.Context, k string) (string, error) {
		if k == "goexit" {
			runtime.Goexit()
		}
		return d.load(ctx, k)
	}, Options[string, string]{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	for i := range 2000 { // one miss at a time: a few workers serve them all
		if _, err := l.Get(t.Context(), fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := l.pool.Started(); n > uint64(l.pool.MaxIdle())+1 {
		t.Fatalf("%d load goroutines started for 2000 misses one at a time; want at most %d", n, l.pool.MaxIdle()+1)
	}

	// A burst of concurrent loads: more workers, then at most maxIdle stay.
	d.gate = make(chan struct{})
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() { defer wg.Done(); l.Get(t.Context(), fmt.Sprint("burst", i)) }()
	}
	waitFor(t, "200 loads running at once", 10*time.Second, func() bool { return d.inside.Load() >= 200 })
	close(d.gate)
	waitGroup(t, "the burst's Gets", &wg)
	waitFor(t, "no load in flight after the burst", 10*time.Second, func() bool { return l.Stats().InFlight == 0 })
	time.Sleep(10 * time.Millisecond) // the workers go back to waiting, or leave
	if n := l.pool.Idle(); n > l.pool.MaxIdle() {
		t.Fatalf("%d idle workers after a burst; want at most %d", n, l.pool.MaxIdle())
	}
	if n := runtime.NumGoroutine() - base; n > l.pool.MaxIdle()+4 {
		t.Fatalf("%d more goroutines after the burst; want at most maxIdle (%d) and a few", n, l.pool.MaxIdle())
	}

	// A LoadFunc that calls Goexit ends its worker; the next load runs.
	if _, err := l.Get(t.Context(), "goexit"); !errors.Is(err, ErrGoexit) {
		t.Fatalf("Get(goexit) = %v; want ErrGoexit", err)
	}
	if v, err := l.Get(t.Context(), "after"); err != nil || v == "" {
		t.Fatalf("Get after a Goexit = %q, %v", v, err)
	}

	l.Close()
	for i := 0; runtime.NumGoroutine() > base && i < 100; i++ {
		time.Sleep(time.Millisecond) // the goroutines Close waited for are exiting
	}
	if n := runtime.NumGoroutine() - base; n > 0 {
		t.Fatalf("%d goroutines left after Close", n)
	}
}

// A reused load goroutine runs each load with the profiler labels of the
// Get that started it, not those of the Get it was first started for.
func TestLoadsTakeTheirCallersLabels(t *testing.T) {
	labels := make(chan string, 2)
	l := newLoader(t, &downstream{}, Options[string, string]{})
	l.loadFn = func(ctx context.Context, k string) (string, error) {
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 1)
		for _, rec := range strings.Split(buf.String(), "\n\n") {
			if strings.Contains(rec, "TestLoadsTakeTheirCallersLabels.func1") {
				_, after, _ := strings.Cut(rec, "# labels: ")
				first, _, _ := strings.Cut(after, "\n")
				labels <- first
				return k, nil
			}
		}
		labels <- "(not found)"
		return k, nil
	}
	for _, who := range []string{"A", "B"} {
		pprof.Do(t.Context(), pprof.Labels("caller", who), func(ctx context.Context) {
			if _, err := l.Get(ctx, who); err != nil {
				t.Fatal(err)
			}
		})
		if got, want := recv(t, "the load's labels", labels), `{"caller":"`+who+`"}`; got != want {
			t.Fatalf("the load for caller %s ran with labels %s; want %s", who, got, want)
		}
		for deadline := time.Now().Add(10 * time.Second); l.pool.Idle() != 1; { // B's load goes to A's goroutine
			if time.Now().After(deadline) {
				t.Fatal("the load goroutine did not go back to waiting")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := l.pool.Started(); n != 1 {
		t.Fatalf("%d load goroutines for two loads one after the other; want 1 (reused)", n)
	}
}

// Of the load goroutines a burst leaves idle, all but life.Kept leave after
// life.IdleFor: a Loader that is not loading keeps few goroutines.
func TestIdleLoadGoroutinesLeave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{})
		const burst = 6
		for i := range burst {
			go l.Get(t.Context(), fmt.Sprint("k", i))
		}
		synctest.Wait()
		close(d.gate)
		synctest.Wait()
		if n := l.pool.Idle(); n != burst {
			t.Fatalf("%d idle load goroutines after a burst of %d loads; want %d", n, burst, burst)
		}
		time.Sleep(life.IdleFor + time.Second)
		synctest.Wait()
		// Exactly Kept, as life.Kept's doc says: the burst's goroutines
		// are all new and none took a job while another went idle, so
		// each counted the others exactly (internal/life's
		// TestPoolReusesAndShrinks builds its burst the same way).
		if n := l.pool.Idle(); n != life.Kept {
			t.Fatalf("%d idle load goroutines after %v; want %d", n, life.IdleFor, life.Kept)
		}
		l.Get(t.Context(), "next") // goes to one that stayed
		if n := l.pool.Started(); n != burst {
			t.Fatalf("load goroutines started = %d; want %d", n, burst)
		}
	})
}

// labelsPanic is a context whose Value panics when the profiler labels are
// read from it, and only then: the Get path itself gets through.
type labelsPanic struct{ context.Context }

func (c labelsPanic) Value(key any) any {
	if strings.HasSuffix(fmt.Sprintf("%T", key), "labelContextKey") {
		panic("no labels here")
	}
	return c.Context.Value(key)
}

// The load goroutine reads the profiler labels through the caller's
// context, which is user code: a panic there is counted, the load goes on
// without labels, and neither the process nor the waiters notice (a single
// load and a batch).
func TestLabelsPanicIsContained(t *testing.T) {
	d, m := &downstream{}, &many{}
	l := newManyLoader(t, d, m, Options[string, string]{})
	ctx := labelsPanic{context.Background()}
	if v, err := l.Get(ctx, "k"); err != nil || v == "" {
		t.Fatalf("Get = %q, %v; want the value", v, err)
	}
	if got, err := l.GetMany(ctx, []string{"a", "b"}); err != nil || len(got) != 2 {
		t.Fatalf("GetMany = %v, %v; want both values", got, err)
	}
	if s := l.Stats(); s.Panics != 2 || s.Loads != 2 || s.LoadErrors != 0 {
		t.Fatalf("Stats = %+v; want 2 panics (the labels, once per goroutine's load), 2 loads, no error", s)
	}
}

// Close and Shutdown finish while callers keep calling Set, Invalidate
// and Refresh after them (each does nothing once the Loader is closed),
// as they do while callers keep calling Peek. A call after Close is
// refused before it touches a stripe, as a Get is (the gate): counted in
// and out on the stripes, a stream of them kept Close from seeing every
// stripe balance, and Shutdown did not finish. Once it has, the callers'
// calls leave the stripes as they are (docs/design.md rule 28: Set,
// Invalidate and Refresh after Close are refused at the door).
func TestCloseWhileWritesKeepComing(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func(l *Loader[string, string], i int)
	}{
		{"Peek", func(l *Loader[string, string], i int) { l.Peek(fmt.Sprint(i % 16)) }},
		{"Set, Invalidate, Refresh", func(l *Loader[string, string], i int) {
			k := fmt.Sprint(i % 16)
			switch i % 3 {
			case 0:
				l.Set(k, k)
			case 1:
				l.Invalidate(k)
			default:
				l.Refresh(context.Background(), k)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoader(t, &downstream{}, Options[string, string]{})
			calls, stop := hammer(t, 64, func(i int) { tc.call(l, i) })
			defer stop()
			waitFor(t, "the callers to be at it", 10*time.Second, func() bool { return calls.Load() > 1000 })
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			start := time.Now()
			if err := l.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown with 64 callers of %s still calling = %v after %v; want nil",
					tc.name, err, time.Since(start))
			}
			t.Logf("closed in %v", time.Since(start))
			in, from := opsCounted(l), calls.Load()
			waitFor(t, "more calls after Close", 10*time.Second, func() bool { return calls.Load() > from+1000 })
			if now := opsCounted(l); now != in {
				t.Errorf("%d calls after Close counted %d operations in on the stripes; want none", calls.Load()-from, now-in)
			}
		})
	}
}

// hammer calls call(i) in a loop on each of n goroutines, i counting up
// from the goroutine's number, until stop is called; calls counts the
// calls made. stop waits for the goroutines to end, and fails t if they
// have not within patience: call it on t's goroutine.
func hammer(t testing.TB, n int, call func(i int)) (calls *atomic.Int64, stop func()) {
	calls = new(atomic.Int64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := g; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				call(i)
				calls.Add(1)
			}
		})
	}
	return calls, func() { close(done); waitGroup(t, "the hammering goroutines", &wg) }
}

// opsCounted is how many operations other than Gets have counted in on
// l's stripes.
func opsCounted(l *Loader[string, string]) uint64 {
	return l.gate.OpsIn()
}

// Close called from another Loader's load goroutine cannot tell that it is
// not one of its own: while this Loader has loads running it starts the
// shutdown and returns at once (documented on Close). It never deadlocks,
// and a Close from outside afterwards waits for every goroutine
// (docs/design.md rule 8). In a bubble, b's cleanup sleep ends only once
// everything else has blocked: a Close from outside that does not wait
// returns first.
func TestCloseOfOtherLoaderFromLoadFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var bReturned atomic.Bool
		bIn := make(chan struct{})
		b, err := New(func(ctx context.Context, k string) (string, error) {
			close(bIn)
			<-ctx.Done()                       // honours Close...
			time.Sleep(100 * time.Millisecond) // ...after a little cleanup
			bReturned.Store(true)
			return "", ctx.Err()
		}, Options[string, string]{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close() // after a Fatal; idempotent
		bGet := make(chan error, 1)
		go func() { _, err := b.Get(context.Background(), "x"); bGet <- err }()
		<-bIn

		a, err := New(func(ctx context.Context, k string) (string, error) {
			b.Close() // from A's load goroutine: shutdown starts, no deadlock
			return "ok", nil
		}, Options[string, string]{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if _, err := a.Get(context.Background(), "y"); err != nil {
			t.Fatal(err)
		}
		if err := <-bGet; !errors.Is(err, ErrClosed) {
			t.Errorf("b's waiter got %v; want ErrClosed once b.Close started", err)
		}
		b.Close() // from the test goroutine: waits for b's load goroutine
		if !bReturned.Load() {
			t.Errorf("b.Close() from outside returned before b's load goroutine finished")
		}
	})
}

// Close must return while Gets keep coming (docs/design.md rule 8). Close
// waits until no Get is inside a cache lookup; refused Gets used to be
// counted on the same stripes, so with goroutines calling Get in a loop that
// moment rarely or never came (on 2 cores, 8 goroutines held Close ~0.4s and
// 64 held it past 20s). Gets after Close are now refused before they touch
// a stripe.
//
// Real clock: the starvation is a race between Close and Gets running truly
// at once, and the Gets never block, so a bubble's clock would never move.
// With 64 goroutines spinning on 2 cores under -race, Close takes about 1s
// to be scheduled through (the Close goroutine, the writer, ristretto's
// goroutines), and many times that with the machine's cores busy
// elsewhere: the bound is a minute, wide enough for a loaded CI machine
// and still short of "never". The strict twin is internal/life's
// TestGateRefusedCallsDoNotHoldClose: refused calls never touch the
// stripes, so the gate balances as soon as the last call let in leaves.
func TestCloseReturnsWhileGetsKeepComing(t *testing.T) {
	const bound = time.Minute
	l, err := New(func(_ context.Context, k int) (int, error) { return k, nil }, Options[int, int]{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var gets, running sync.WaitGroup
	running.Add(64)
	for range 64 {
		gets.Go(func() {
			l.Get(context.Background(), 1)
			running.Done()
			for !stop.Load() {
				l.Get(context.Background(), 1) // a hit, then ErrClosed once Close has begun
			}
		})
	}
	waitGroup(t, "every goroutine to call Get", &running)
	closed := make(chan struct{})
	start := time.Now()
	go func() { l.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("Close returned after %v with 64 goroutines calling Get", time.Since(start))
	case <-time.After(bound):
		t.Errorf("Close did not return within %v while 64 goroutines kept calling Get (each refused at once with ErrClosed)", bound)
	}
	stop.Store(true)
	waitGroup(t, "the Gets, once stopped", &gets)
	recv(t, "Close", closed)
	t.Logf("Close returned %v after it was called", time.Since(start))
}

// Close waits for every load, one started as another load goroutine exits
// included (docs/design.md rule 8). The first core read "no load left" and
// "closed" at two moments in a load goroutine's exit: in between, a Get
// could start a load and Close begin, and Close returned while the new
// LoadFunc ran. Here the load of "b" starts from the OnLoad of "a", on a's
// goroutine as it ends, and Close begins while b runs. (The fix for the
// first core forced the gap itself with a test hook, gone with that core;
// this test pins the order around it and catches it only by chance.)
func TestCloseReturnsWhileLoadStartedDuringExit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered := make(chan struct{})
		release := make(chan struct{})
		var wg sync.WaitGroup
		defer wg.Wait()
		var l *Loader[string, string]
		l, err := New(func(ctx context.Context, k string) (string, error) {
			if k == "b" {
				close(entered)
				<-release
			}
			return k, nil
		}, Options[string, string]{TTL: time.Minute, Breaker: Breaker{Disabled: true}, OnLoad: func(ev LoadEvent[string]) {
			if ev.Key != "a" {
				return
			}
			wg.Go(func() {
				if v, err := l.Get(context.Background(), "b"); err != nil || v != "b" {
					t.Errorf(`Get("b") = %q, %v; want "b", nil`, v, err)
				}
			})
			<-entered
		}})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := l.Get(context.Background(), "a"); err != nil || v != "a" {
			t.Fatalf(`Get("a") = %q, %v; want "a", nil`, v, err)
		}
		<-entered // b's load runs; a's goroutine is on its way out
		closeReturned := make(chan struct{})
		wg.Go(func() {
			l.Close()
			close(closeReturned)
		})
		synctest.Wait() // Close has returned, or blocked waiting for b
		select {
		case <-closeReturned:
			t.Error("Close returned while the load of b was running")
		default:
		}
		close(release)
		<-closeReturned
	})
}

// A closed Loader is garbage as soon as nothing refers to it: the next GC
// frees it, with its cache. Two things the runtime holds referred to it for
// longer. Its counter stripes' sync.Pool lived inside the Loader, and the
// runtime keeps every pool in use until the GC after next; and the function
// of its LoadTimeout timer referred to it, and the runtime may keep a
// stopped timer until it cleans its timer heap. So a closed Loader survived
// the next GC (1,000 of them kept 89 MB).
//
// Real clock: the collection is the runtime's, outside any bubble; the
// deadline is thousands of times what the cleanups take to run.
func TestClosedLoaderIsFreedByNextGC(t *testing.T) {
	const loaders = 10
	collected := make(chan int, loaders)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range loaders {
		l, err := New(func(_ context.Context, k int) ([]byte, error) { return make([]byte, 64<<10), nil },
			Options[int, []byte]{TTL: time.Hour, MaxCost: 100})
		if err != nil {
			t.Fatal(err)
		}
		for k := range 16 {
			if _, err := l.Get(context.Background(), k); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()
		runtime.AddCleanup(l, func(i int) { collected <- i }, i)
	}
	runtime.GC() // one GC
	runtime.ReadMemStats(&after)
	t.Logf("heap %d KB before the Loaders, %d KB after they were closed and one GC ran", before.HeapAlloc>>10, after.HeapAlloc>>10)
	deadline := time.After(10 * time.Second)
	for n := 0; n < loaders; n++ {
		select {
		case <-collected:
		case <-deadline:
			t.Fatalf("%d of %d closed Loaders collected by one GC; want all", n, loaders)
		}
	}
}

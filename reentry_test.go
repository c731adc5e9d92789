package flightcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Every way a callback can call back into the Loader, from a LoadFunc and
// from OnLoad: Set, Invalidate and Get of another key and of the key being
// loaded, Close of the Loader itself and of another Loader with a load
// running. None may deadlock, and each does what docs/reliability.md says:
//
//   - Set and Invalidate work; of the key being loaded, they win over its
//     load (docs/design.md rule 6): its waiters get its result, the cache
//     does not.
//   - Get of another key works (a nested load, waited for).
//   - Get of the key being loaded, from its LoadFunc under the load's
//     context, fails at once with ErrRecursiveLoad. Under an unrelated
//     context it cannot be recognised: it waits on its own load until that
//     context ends. From OnLoad the load has finished: a hit if it was
//     stored, else a new load.
//   - Close starts the shutdown and returns without waiting for the
//     callback; the load's context is cancelled (cause ErrClosed), later
//     calls are refused, and a Close from outside waits for everything.
//   - Close of another Loader returns at once while that Loader has loads
//     running (it cannot tell that it is not on one of them); a later
//     Close from outside waits for them.
//
// The callback runs once, in the first load of "k" (or its OnLoad); a Get
// of "k" from the test starts that load. Results read "value source error".
func TestCallbacksReenterTheLoader(t *testing.T) {
	type row struct {
		where string // "LoadFunc" or "OnLoad"
		op    string
		inner string // what the callback's calls returned, if anything
		outer string // the Get of k that started the load
		after string // "key: value source error" of Gets from the test afterwards
		calls int    // downstream calls in all
	}
	rows := []row{
		{"LoadFunc", "Set other", "", "k#1 loaded", "o: set hit", 1},
		{"LoadFunc", "Set same", "", "k#1 loaded", "k: set hit", 1},
		{"LoadFunc", "Invalidate other", "", "k#1 loaded", "o: o#1 loaded", 2},
		{"LoadFunc", "Invalidate same", "", "k#1 loaded", "k: k#2 loaded", 2},
		{"LoadFunc", "Get other", "o#1 loaded", "k#1 loaded", "o: o#1 hit", 2},
		{"LoadFunc", "Get same", " none ErrRecursiveLoad", "k#1 loaded", "k: k#1 hit", 1},
		{"LoadFunc", "Get same, unrelated context", " none DeadlineExceeded", "k#1 loaded", "k: k#1 hit", 1},
		{"LoadFunc", "Close", "Close nil; cause ErrClosed; Get(o)  none ErrClosed", " loaded ErrClosed", "k:  none ErrClosed", 1},
		{"LoadFunc", "Close other Loader", "Close nil", "k#1 loaded", "k: k#1 hit", 1},

		{"OnLoad", "Set other", "", "k#1 loaded", "o: set hit", 1},
		{"OnLoad", "Set same", "", "k#1 loaded", "k: set hit", 1},
		{"OnLoad", "Invalidate other", "", "k#1 loaded", "o: o#1 loaded", 2},
		{"OnLoad", "Invalidate same", "", "k#1 loaded", "k: k#2 loaded", 2},
		{"OnLoad", "Get other", "o#1 loaded", "k#1 loaded", "o: o#1 hit", 2},
		{"OnLoad", "Get same", "k#1 hit", "k#1 loaded", "k: k#1 hit", 1},
		{"OnLoad", "Get same, failed load", "k#2 loaded", " loaded boom", "k: k#2 hit", 2},
		{"OnLoad", "Close", "Close nil; Get(o)  none ErrClosed", "k#1 loaded", "k:  none ErrClosed", 1},
		{"OnLoad", "Close other Loader", "Close nil", "k#1 loaded", "k: k#1 hit", 1},
	}
	for _, r := range rows {
		t.Run(r.where+"/"+r.op, func(t *testing.T) {
			failIfStuck(t, 30*time.Second, func() {
				synctest.Test(t, func(t *testing.T) {
					var (
						l       *Loader[string, string]
						other   *otherLoader
						mu      sync.Mutex
						perKey  = map[string]int{}
						inner   string
						fired   = make(chan struct{})
						once    sync.Once
						calls   int
						failing = r.op == "Get same, failed load"
					)
					callback := func(ctx context.Context) {
						switch r.op {
						case "Set other":
							l.Set("o", "set")
						case "Set same":
							l.Set("k", "set")
						case "Invalidate other":
							l.Invalidate("o")
						case "Invalidate same":
							l.Invalidate("k")
						case "Get other":
							inner = outcomeOf(l.GetInfo(ctx, "o"))
						case "Get same", "Get same, failed load":
							inner = outcomeOf(l.GetInfo(ctx, "k"))
						case "Get same, unrelated context":
							c, cancel := context.WithTimeout(context.Background(), time.Second)
							defer cancel()
							inner = outcomeOf(l.GetInfo(c, "k"))
						case "Close":
							inner = "Close " + nilOr(l.Close())
							if r.where == "LoadFunc" {
								<-ctx.Done() // Close cancels the load's context
								inner += "; cause " + errName(context.Cause(ctx))
							}
							inner += "; Get(o) " + outcomeOf(l.GetInfo(ctx, "o"))
						case "Close other Loader":
							inner = "Close " + nilOr(other.l.Close())
						default:
							t.Errorf("unknown op %q", r.op)
						}
					}
					load := func(ctx context.Context, key string) (string, error) {
						mu.Lock()
						calls++
						perKey[key]++
						n := perKey[key]
						mu.Unlock()
						if key == "k" && n == 1 && r.where == "LoadFunc" {
							once.Do(func() { callback(ctx); close(fired) })
							if r.op == "Close" {
								return "", ctx.Err() // honours its context
							}
						}
						if failing && key == "k" && n == 1 {
							return "", errBoom
						}
						return fmt.Sprintf("%s#%d", key, n), nil
					}
					var err error
					l, err = New(load, Options[string, string]{TTL: time.Minute, OnLoad: func(ev LoadEvent[string]) {
						if ev.Key == "k" && r.where == "OnLoad" {
							once.Do(func() { callback(context.Background()); close(fired) })
						}
					}})
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
					if r.op == "Invalidate other" {
						l.Set("o", "old")
					}
					if r.op == "Close other Loader" {
						other = startOtherLoader(t)
					}

					if got := outcomeOf(l.GetInfo(t.Context(), "k")); got != r.outer {
						t.Errorf("Get(k) = %q; want %q", got, r.outer)
					}
					<-fired // OnLoad may still run after its load's waiters returned
					if inner != r.inner {
						t.Errorf("inside %s: %q; want %q", r.where, inner, r.inner)
					}
					if other != nil {
						other.closeFromOutside(t)
					}
					key, want, _ := strings.Cut(r.after, ": ")
					if got := outcomeOf(l.GetInfo(t.Context(), key)); got != want {
						t.Errorf("Get(%s) afterwards = %q; want %q", key, got, want)
					}
					if err := l.Close(); err != nil { // from outside: waits for everything
						t.Errorf("Close = %v", err)
					}
					s := l.Stats()
					mu.Lock()
					defer mu.Unlock()
					if calls != r.calls || s.Loads != uint64(calls) {
						t.Errorf("%d downstream calls, Stats.Loads %d; want %d", calls, s.Loads, r.calls)
					}
					if s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed || s.InFlight != 0 || s.Waiting != 0 || s.Panics != 0 {
						t.Errorf("Stats do not add up after Close: %+v", s)
					}
				})
			})
		})
	}
}

// otherLoader is a second Loader with one load running: its LoadFunc waits
// for its context to end (Close), then for release.
type otherLoader struct {
	l        *Loader[string, string]
	release  chan struct{}
	returned chan struct{} // closed as the LoadFunc returns
	get      <-chan result // the Get waiting on the load
}

func startOtherLoader(t *testing.T) *otherLoader {
	o := &otherLoader{release: make(chan struct{}), returned: make(chan struct{})}
	in := make(chan struct{})
	var err error
	o.l, err = New(func(ctx context.Context, key string) (string, error) {
		close(in)
		<-ctx.Done()
		<-o.release
		close(o.returned)
		return "", ctx.Err()
	}, Options[string, string]{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	o.get = getAsync(context.Background(), o.l, "x")
	<-in
	return o
}

// closeFromOutside checks what follows a Close of o's Loader from another
// Loader's callback: o refuses Gets; its load runs on; a Close from outside
// waits for that load, whose waiter then gets ErrClosed.
func (o *otherLoader) closeFromOutside(t *testing.T) {
	if _, err := o.l.Get(t.Context(), "y"); !errors.Is(err, ErrClosed) {
		t.Errorf("other Loader: Get after Close = %v; want ErrClosed", err)
	}
	closed := make(chan struct{})
	go func() { o.l.Close(); close(closed) }()
	synctest.Wait()
	select {
	case <-closed:
		t.Errorf("other Loader: Close from outside returned while its load was still running")
	default:
	}
	close(o.release)
	<-closed
	select {
	case <-o.returned:
	default:
		t.Errorf("other Loader: Close returned before its LoadFunc did")
	}
	if r := <-o.get; !errors.Is(r.err, ErrClosed) {
		t.Errorf("other Loader: its waiter got %q, %v; want ErrClosed", r.v, r.err)
	}
}

// outcomeOf formats a GetInfo result as "value source error", without the
// error when it is nil.
func outcomeOf(v string, info Info, err error) string {
	return strings.TrimSuffix(fmt.Sprintf("%s %v %s", v, info.Source, errName(err)), " ")
}

func nilOr(err error) string {
	if err == nil {
		return "nil"
	}
	return errName(err)
}

// errName names the errors these tests expect.
func errName(err error) string {
	for _, e := range []struct {
		err  error
		name string
	}{
		{ErrRecursiveLoad, "ErrRecursiveLoad"},
		{ErrClosed, "ErrClosed"},
		{context.DeadlineExceeded, "DeadlineExceeded"},
		{context.Canceled, "Canceled"},
	} {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// failIfStuck runs f and, if it has not returned within d, prints every
// goroutine's stack and ends the test binary. synctest reports a deadlock
// on its channels and timers, but a goroutine blocked on a mutex is not
// durably blocked to it, so such a deadlock would otherwise hang until
// -timeout.
func failIfStuck(t *testing.T, d time.Duration, f func()) {
	name := t.Name()
	tm := time.AfterFunc(d, func() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "%s: stuck for %v (a deadlock?); goroutines:\n%s\n", name, d, buf)
		os.Exit(2)
	})
	defer tm.Stop()
	f()
}

// A background refresh started by a Get made from inside A's LoadFunc must
// not inherit A's load marker: nothing waits on the refresh, so its Get of A
// is no cycle and must not fail with ErrRecursiveLoad.
func TestBackgroundRefreshDoesNotInheritRecursionMarker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		phase := 0
		gotB := make(chan error, 1)
		var l *Loader[string, string]
		l, err := New(func(ctx context.Context, k string) (string, error) {
			switch {
			case k == "B" && phase == 1: // B's background refresh
				_, err := l.Get(ctx, "A")
				gotB <- err
				return "B2", nil
			case k == "A" && phase == 1:
				l.Get(ctx, "B") // stale B: returned at once, refresh starts in the background
				select {
				case <-time.After(200 * time.Millisecond): // A is still in flight while B refreshes
				case <-ctx.Done():
				}
				return "A1", nil
			}
			return k + "0", nil
		}, Options[string, string]{TTL: 20 * time.Millisecond, StaleWhileRevalidate: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx := t.Context()
		l.Get(ctx, "B")
		time.Sleep(40 * time.Millisecond) // B stale
		phase = 1
		go l.Get(ctx, "A")
		select {
		case err := <-gotB:
			if errors.Is(err, ErrRecursiveLoad) {
				t.Errorf("background refresh of B, Get(A) = %v: nothing waits on this refresh, so no cycle", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("refresh of B never ran")
		}
	})
}

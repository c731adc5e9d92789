package flightcache

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Tests of what a batch window's call counts, holds and recognises
// (docs/design.md rule 31).

// keysAttemptObserver is a keysObserver that also records the Keys of
// each AttemptEvent.
type keysAttemptObserver struct {
	keysObserver
	amu      sync.Mutex
	attempts []int
}

func (o *keysAttemptObserver) Attempt(_ context.Context, ev AttemptEvent[string]) {
	o.amu.Lock()
	o.attempts = append(o.attempts, ev.Keys)
	o.amu.Unlock()
}

// Rule 31: a window that holds two calls for one key (an Invalidate
// detached the first, a later Get started the second) asks LoadMany for
// the key once, and its LoadStart, AttemptEvents, LoadEnd, LoadEvent and
// Stats.BatchKeys all count that one key.
func TestBatchWindowCountsDistinctKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{fail: func(n int) error {
			if n == 1 {
				return errors.New("first call fails")
			}
			return nil
		}}
		o := &keysAttemptObserver{}
		var events eventLog
		l := windowLoader(t, m, Options[string, string]{
			Observer: o, OnLoad: events.add,
			Retry: Retry{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
		})
		first := getAsync(t.Context(), l, "a")
		synctest.Wait()
		l.Invalidate("a") // detaches the first call, still in the window
		second := getAsync(t.Context(), l, "a")
		synctest.Wait()
		time.Sleep(time.Second)
		for i, ch := range []<-chan result{first, second} {
			if r := <-ch; r.err != nil || r.v != "a@2" {
				t.Errorf("Get %d of a = %q, %v; want %q", i+1, r.v, r.err, "a@2")
			}
		}
		synctest.Wait() // LoadEnd and OnLoad come once the waiters have the result
		if calls := m.all(); len(calls) != 2 || !slices.Equal(calls[0], []string{"a"}) || !slices.Equal(calls[1], []string{"a"}) {
			t.Fatalf("LoadMany calls %v; want [a] twice (one retry)", calls)
		}
		o.mu.Lock()
		starts, ends := slices.Clone(o.starts), slices.Clone(o.ends)
		o.mu.Unlock()
		o.amu.Lock()
		attempts := slices.Clone(o.attempts)
		o.amu.Unlock()
		if !slices.Equal(starts, []int{1}) || !slices.Equal(ends, []int{1}) || !slices.Equal(attempts, []int{1}) {
			t.Errorf("Keys: LoadStart %v, Attempt %v, LoadEnd %v; want [1] each", starts, attempts, ends)
		}
		if evs := events.all(); len(evs) != 1 || evs[0].Keys != 1 || evs[0].Callers != 2 {
			t.Errorf("load events %+v; want one, of 1 key and 2 callers", evs)
		}
		if s := l.Stats(); s.BatchLoads != 1 || s.BatchKeys != 1 {
			t.Errorf("Stats BatchLoads %d, BatchKeys %d; want 1 and 1", s.BatchLoads, s.BatchKeys)
		}
	})
}

// Rule 31 and ErrRecursiveLoad: a Get made inside a window's LoadMany
// that joins a window another key opened is still recognised as part of
// the first window's load. Window 1 loads a; its LoadMany Gets x, which
// joins window 2, opened by an unrelated Get of y; window 2's LoadMany,
// for x, Gets a: a cycle, which fails at once with ErrRecursiveLoad
// instead of waiting LoadTimeout, and so y's Get is not held for it.
func TestBatchWindowCycleThroughJoinedWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l *Loader[string, string]
		proceed := make(chan struct{})
		load := func(ctx context.Context, keys []string) (map[string]string, error) {
			out := map[string]string{}
			for _, k := range keys {
				switch k {
				case "a": // window 1: wait until y opened window 2, then Get x
					<-proceed
					v, err := l.Get(ctx, "x")
					if err != nil {
						return nil, err
					}
					out[k] = "a+" + v
				case "x": // window 2: Get a, whose load waits on this one
					v, err := l.Get(ctx, "a")
					if err != nil {
						return nil, err
					}
					out[k] = "x+" + v
				default:
					out[k] = k
				}
			}
			return out, nil
		}
		l = windowLoader(t, nil, Options[string, string]{
			LoadMany: load, BatchWindow: 100 * time.Millisecond, LoadTimeout: 10 * time.Second,
		})
		start := time.Now()
		a := getAsync(t.Context(), l, "a")
		time.Sleep(150 * time.Millisecond) // window 1 went out; its LoadMany waits for proceed
		y := getAsync(t.Context(), l, "y")
		synctest.Wait() // y opened window 2
		close(proceed)
		r := <-a
		if !errors.Is(r.err, ErrRecursiveLoad) {
			t.Errorf("Get(a) = %q, %v; want ErrRecursiveLoad", r.v, r.err)
		}
		if took := time.Since(start); took >= time.Second {
			t.Errorf("Get(a) took %v; want the cycle found at once (two windows, 250ms), not at LoadTimeout", took)
		}
		<-y
		if took := time.Since(start); took >= time.Second {
			t.Errorf("Get(y) returned after %v; want it no later than its window's call (250ms)", took)
		}
	})
}

// refreshSetup builds a Loader under a Limit of one load with a window of
// a second, whose LoadMany goes through load, and a stale value for
// "old" (Set, then past its TTL of a second, within a minute of
// stale-while-revalidate).
func refreshSetup(t *testing.T, load LoadManyFunc[string, string]) *Loader[string, string] {
	t.Helper()
	l := windowLoader(t, nil, Options[string, string]{
		LoadMany: load, TTL: time.Second, StaleWhileRevalidate: time.Minute,
		Limit: Limit{MaxLoads: 1},
	})
	l.Set("old", "old-v0")
	time.Sleep(2 * time.Second)
	return l
}

// Rule 31: a window of background refreshes holds no Limit slot while it
// waits. Under MaxLoads 1: a cold Get opens a window at 0; a stale Get at
// 500ms opens a window of refreshes; the cold Get's call goes out at 1s
// and finds the slot free, so the cold Get waits its window, 1s, not
// 1.5s behind the idle refresh window. The refresh then goes out at 1.5s
// with a slot of its own.
func TestBatchWindowRefreshesHoldNoSlotWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var calls []string
		l := refreshSetup(t, func(_ context.Context, keys []string) (map[string]string, error) {
			mu.Lock()
			calls = append(calls, strings.Join(keys, ","))
			mu.Unlock()
			out := map[string]string{}
			for _, k := range keys {
				out[k] = k + "-v1"
			}
			return out, nil
		})
		cold := getAsync(t.Context(), l, "cold")
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		if v, info, err := l.GetInfo(t.Context(), "old"); v != "old-v0" || info.Source != SourceStale || err != nil {
			t.Fatalf("GetInfo(old) = %q, %+v, %v; want the stale value", v, info, err)
		}
		r := <-cold
		if r.err != nil || r.v != "cold-v1" || r.info.Waited != time.Second {
			t.Errorf("Get(cold) = %q, %+v, %v; want %q after its window, 1s", r.v, r.info, r.err, "cold-v1")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		got := slices.Clone(calls)
		mu.Unlock()
		if !slices.Equal(got, []string{"cold", "old"}) {
			t.Errorf("LoadMany calls %q; want [cold old]", got)
		}
		if v, err := l.Get(t.Context(), "old"); v != "old-v1" || err != nil {
			t.Errorf("Get(old) after the refresh = %q, %v; want %q", v, err, "old-v1")
		}
		if s := l.Stats(); s.Refreshes != 1 || s.RefreshesLimited != 0 || s.QueuedLoads != 0 || s.InFlight != 0 {
			t.Errorf("Stats Refreshes %d, RefreshesLimited %d, QueuedLoads %d, InFlight %d; want 1, 0, 0, 0", s.Refreshes, s.RefreshesLimited, s.QueuedLoads, s.InFlight)
		}
	})
}

// gatedLoad is a LoadMany that records its calls and holds a call of
// "cold" until gate closes.
type gatedLoad struct {
	gate  chan struct{}
	mu    sync.Mutex
	calls []string
}

func (g *gatedLoad) load(ctx context.Context, keys []string) (map[string]string, error) {
	g.mu.Lock()
	g.calls = append(g.calls, strings.Join(keys, ","))
	g.mu.Unlock()
	out := map[string]string{}
	for _, k := range keys {
		if k == "cold" {
			select {
			case <-g.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		out[k] = k + "-v1"
	}
	return out, nil
}

func (g *gatedLoad) all() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// Rules 22 and 31: a window of refreshes that finds no background slot
// free as its call goes out (the one slot held by a miss's call) is
// dropped, as a refresh refused at its start is: no call, counted in
// RefreshesLimited, the stale value still served, nothing left in flight.
func TestBatchWindowRefreshesRefusedAtCallAreDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gatedLoad{gate: make(chan struct{})}
		l := refreshSetup(t, g.load)
		cold := getAsync(t.Context(), l, "cold") // its call goes out at 1s and holds the slot
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		if v, info, _ := l.GetInfo(t.Context(), "old"); info.Source != SourceStale {
			t.Fatalf("GetInfo(old) = %q, %+v; want the stale value", v, info)
		}
		time.Sleep(time.Second) // 1.5s: the refresh window goes out, and finds no slot
		synctest.Wait()
		if s := l.Stats(); s.RefreshesLimited != 1 || s.Refreshes != 0 || s.InFlight != 1 {
			t.Errorf("Stats RefreshesLimited %d, Refreshes %d, InFlight %d; want 1, 0 and 1 (the cold call)", s.RefreshesLimited, s.Refreshes, s.InFlight)
		}
		close(g.gate)
		if r := <-cold; r.err != nil || r.v != "cold-v1" {
			t.Errorf("Get(cold) = %q, %v; want %q", r.v, r.err, "cold-v1")
		}
		synctest.Wait()
		if got := g.all(); !slices.Equal(got, []string{"cold"}) {
			t.Errorf("LoadMany calls %q; want [cold]", got)
		}
		if v, info, err := l.GetInfo(t.Context(), "old"); v != "old-v0" || info.Source != SourceStale || err != nil {
			t.Errorf("GetInfo(old) after the dropped refresh = %q, %+v, %v; want the stale value", v, info, err)
		}
		if s := l.Stats(); s.Loads != 1 || s.LoadErrors != 0 {
			t.Errorf("Stats Loads %d, LoadErrors %d; want 1 (cold) and 0", s.Loads, s.LoadErrors)
		}
	})
}

// Rules 22 and 31: a window of refreshes refused a background slot as it
// goes out, one of whose keys a Get waits on (a revalidating Get joined
// the refresh), is that Get's load: it waits its turn for the slot, as
// the Get's own load would have, and answers it.
func TestBatchWindowRefreshesRefusedAtCallQueueForAWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &gatedLoad{gate: make(chan struct{})}
		l := refreshSetup(t, g.load)
		cold := getAsync(t.Context(), l, "cold")
		synctest.Wait()
		time.Sleep(500 * time.Millisecond)
		if _, info, _ := l.GetInfo(t.Context(), "old"); info.Source != SourceStale {
			t.Fatalf("GetInfo(old) = %+v; want the stale value", info)
		}
		time.Sleep(100 * time.Millisecond)
		reval := getAsync(WithRevalidate(t.Context()), l, "old") // joins the refresh
		time.Sleep(900 * time.Millisecond)                       // 1.5s: the refresh window goes out, and finds no slot
		synctest.Wait()
		if got := g.all(); !slices.Equal(got, []string{"cold"}) {
			t.Fatalf("LoadMany calls %q while the cold call holds the slot; want [cold]", got)
		}
		time.Sleep(500 * time.Millisecond)
		close(g.gate) // 2s: the cold call gives the slot back
		if r := <-cold; r.err != nil || r.v != "cold-v1" {
			t.Errorf("Get(cold) = %q, %v; want %q", r.v, r.err, "cold-v1")
		}
		r := <-reval
		if r.err != nil || r.v != "old-v1" || r.info.Waited != 1400*time.Millisecond {
			t.Errorf("revalidating Get(old) = %q, %+v, %v; want %q after 1.4s", r.v, r.info, r.err, "old-v1")
		}
		synctest.Wait()
		if got := g.all(); !slices.Equal(got, []string{"cold", "old"}) {
			t.Errorf("LoadMany calls %q; want [cold old]", got)
		}
		if s := l.Stats(); s.Loads != 2 || s.Refreshes != 1 || s.InFlight != 0 {
			t.Errorf("Stats Loads %d, Refreshes %d, InFlight %d; want 2, 1, 0", s.Loads, s.Refreshes, s.InFlight)
		}
	})
}

// Rules 22 and 31 under a storm: with MaxLoads 1 and small windows, 30
// stale keys (each Get starting a refresh, some revalidating), and 30
// cold keys, asked from their own goroutines at staggered times, 5 runs:
// the downstream never runs two calls at once, every cold and every
// revalidating Get gets its key's new value, every other Get of a stale
// key its old or new value, and nothing is left in flight or queued.
func TestBatchWindowRefreshesAndMissesStorm(t *testing.T) {
	for run := range 5 {
		synctest.Test(t, func(t *testing.T) {
			var running, most atomic.Int32
			load := func(_ context.Context, keys []string) (map[string]string, error) {
				n := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(30 * time.Millisecond)
				out := map[string]string{}
				for _, k := range keys {
					out[k] = k + "-v1"
				}
				return out, nil
			}
			l := windowLoader(t, nil, Options[string, string]{
				LoadMany: load, TTL: time.Second, StaleWhileRevalidate: time.Minute,
				Limit: Limit{MaxLoads: 1}, BatchWindow: 100 * time.Millisecond, MaxBatch: 3,
			})
			stale := keyRange("s", 30)
			for _, k := range stale {
				l.Set(k, k+"-v0")
			}
			time.Sleep(2 * time.Second)
			var wg sync.WaitGroup
			for i, k := range append(slices.Clone(stale), keyRange("c", 30)...) {
				wg.Go(func() {
					time.Sleep(time.Duration((i*7+run*13)%50) * 10 * time.Millisecond)
					ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
					defer cancel()
					coldKey, reval := k[0] == 'c', k[0] == 's' && i%4 == 0
					if reval {
						ctx = WithRevalidate(ctx)
					}
					v, err := l.Get(ctx, k)
					switch {
					case err != nil:
						t.Errorf("run %d: Get(%q) = %v", run, k, err)
					case (coldKey || reval) && v != k+"-v1":
						t.Errorf("run %d: Get(%q) = %q; want %q", run, k, v, k+"-v1")
					case v != k+"-v0" && v != k+"-v1":
						t.Errorf("run %d: Get(%q) = %q; want its old or new value", run, k, v)
					}
				})
			}
			wg.Wait()
			time.Sleep(time.Second) // the last refresh windows go out
			synctest.Wait()
			if m := most.Load(); m != 1 {
				t.Errorf("run %d: %d downstream calls at once; want 1", run, m)
			}
			if s := l.Stats(); s.InFlight != 0 || s.QueuedLoads != 0 {
				t.Errorf("run %d: Stats InFlight %d, QueuedLoads %d; want 0, 0", run, s.InFlight, s.QueuedLoads)
			}
		})
	}
}

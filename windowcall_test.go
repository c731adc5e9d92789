package flightcache

import (
	"context"
	"errors"
	"slices"
	"sync"
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

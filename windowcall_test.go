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

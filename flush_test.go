package flightcache

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 39: Flush sends an open window's keys at once. Five
// cold Gets wait in an hour's window; Flush sends them in one LoadMany
// call, and no virtual time passes: no Get waits out the window.
func TestFlushSendsOpenWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{BatchWindow: time.Hour})
		keys := keyRange("k", 5)
		start := time.Now()
		res := getAll(t, l, keys, nil)
		synctest.Wait()
		if calls := m.all(); len(calls) != 0 {
			t.Fatalf("LoadMany calls %v before Flush; want none", calls)
		}
		l.Flush()
		for _, k := range keys {
			if r := <-res[k]; r.err != nil || r.v != k+"@1" || r.info.Waited != 0 {
				t.Errorf("Get(%q) = %q, %v, waited %v; want %q at once", k, r.v, r.err, r.info.Waited, k+"@1")
			}
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the Gets took %v of virtual time after Flush; want 0 (the window was an hour)", waited)
		}
		synctest.Wait()
		calls := m.all()
		if len(calls) != 1 || !slices.Equal(slices.Sorted(slices.Values(calls[0])), keys) {
			t.Fatalf("LoadMany calls %v; want one call of the 5 keys", calls)
		}
	})
}

// After Flush, a new miss opens a new window, which goes out at its time
// (or at the next Flush): Flush closes the windows open, not the option.
func TestFlushThenNewWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{BatchWindow: time.Second})
		first := getAsync(t.Context(), l, "a")
		synctest.Wait()
		l.Flush()
		if r := <-first; r.err != nil || r.v != "a@1" {
			t.Fatalf("Get(a) = %q, %v; want a@1", r.v, r.err)
		}
		start := time.Now()
		second := getAsync(deadline(t), l, "b")
		synctest.Wait()
		if calls := m.all(); len(calls) != 1 {
			t.Fatalf("LoadMany calls %v after the second Get; want the first alone (b waits in a new window)", calls)
		}
		if r := <-second; r.err != nil || r.v != "b@2" {
			t.Fatalf("Get(b) = %q, %v; want b@2", r.v, r.err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("Get(b) took %v; want the window, 1s", waited)
		}
	})
}

// Flush also sends a window of refreshes at once: a stale hit's refresh
// waits in the background window until Flush, and the next Get is fresh.
func TestFlushSendsRefreshWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{BatchWindow: time.Hour, TTL: time.Minute, StaleWhileRevalidate: 2 * time.Hour})
		res := getAsync(t.Context(), l, "k")
		synctest.Wait()
		l.Flush()
		if r := <-res; r.v != "k@1" {
			t.Fatalf("Get(k) = %q, %v; want k@1", r.v, r.err)
		}
		time.Sleep(2 * time.Minute)
		if v, info, err := l.GetInfo(t.Context(), "k"); v != "k@1" || info.Source != SourceStale || err != nil {
			t.Fatalf("Get(k) = %q, %v, %v; want the stale k@1", v, info.Source, err)
		}
		synctest.Wait()
		if calls := m.all(); len(calls) != 1 {
			t.Fatalf("LoadMany calls %v before Flush; want the refresh waiting in its window", calls)
		}
		l.Flush()
		synctest.Wait()
		if v, info, _ := l.GetInfo(t.Context(), "k"); v != "k@2" || info.Source != SourceHit {
			t.Fatalf("Get(k) after Flush = %q, %v; want the refreshed k@2, a hit", v, info.Source)
		}
	})
}

// Without a BatchWindow, and with no window open, Flush does nothing; after
// Close it does nothing either.
func TestFlushNothingOpen(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{})
	l.Flush()
	if v, err := l.Get(deadline(t), "k"); err != nil || v != "k#1" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	m := &many{}
	w := windowLoader(t, m, Options[string, string]{})
	w.Flush()
	w.Flush()
	w.Close()
	w.Flush()
	if calls := m.all(); len(calls) != 0 {
		t.Fatalf("LoadMany calls %v; want none", calls)
	}
}

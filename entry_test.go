package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/internal/timing"
	"github.com/flightcache/flightcache/remote"
)

// An entry keeps its early refresh to the microsecond, rounded up: the lead
// of a load faster than a millisecond does not vanish, and is never
// shorter than the load took (what timing.EarlyRefreshAt promises).
func TestEntryKeepsItsEarlyRefreshLead(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{EarlyRefresh: 1})
	took := 300 * time.Microsecond
	for range 1000 {
		e := l.newEntry("k", "v", lifetime{ttl: time.Minute}, born{at: time.Hour, took: took})
		if lead := e.freshUntil - e.refreshAt(); lead < took || e.refreshAt() < e.loadedAt {
			t.Fatalf("early refresh %v before expiry (at %v, loaded at %v); want at least the load's %v, after the load",
				lead, e.refreshAt(), e.loadedAt, took)
		}
	}
}

// The failed-refresh count saturates in its 4 bits without touching the
// gone bit or the fleet generation, and a saturated count means the
// backoff's limit, whatever the ratio of MaxInterval to InitialInterval.
func TestFailedRefreshCountSaturates(t *testing.T) {
	e := &entry[string, string]{}
	e.mark.Store(3 * genUnit)
	e.setGone()
	n := 0
	for range 40 {
		n = e.failedRefresh()
	}
	if n != maxRefreshFails || !e.isGone() || e.mark.Load()&^(goneBit|failsMask) != 3*genUnit {
		t.Fatalf("after 40 failures: count %d, gone %v, mark %#x", n, e.isGone(), e.mark.Load())
	}
	if d := timing.RefreshDelay(math.MaxInt, time.Millisecond, time.Minute, 1); d != time.Minute {
		t.Fatalf("RefreshDelay at the saturated count = %v, want the limit (1m)", d)
	}
}

// A TTL (or a stale window) of math.MaxInt64, a natural "never expires",
// must not overflow into an entry born expired.
func TestHugeTTLDoesNotOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Duration(math.MaxInt64)})
		ctx := t.Context()
		time.Sleep(time.Millisecond) // now > 0
		l.Get(ctx, "k")
		_, info, _ := l.GetInfo(ctx, "k")
		if d.count("k") != 1 || info.Source != SourceHit {
			t.Errorf("TTL=MaxInt64: second Get source %v, %d downstream calls (want hit, 1)", info.Source, d.count("k"))
		}
	})
}

func TestHugeStaleWindowDoesNotOverflow(t *testing.T) {
	w := remote.Windows{StaleWhileRevalidate: time.Duration(math.MaxInt64)}
	if p := w.PhaseAt(61*time.Second, 60*time.Second); p != remote.PhaseStale {
		t.Errorf("SWR=MaxInt64: phase %d one second after expiry, want phaseStale (%d)", p, remote.PhaseStale)
	}
}

// A Retry.MaxInterval of math.MaxInt64 (a natural "no cap") must not hang
// the Loader once an entry's background refreshes have failed 15 times in a
// row, where the failure count saturates and the backoff goes to its
// limit: timing.RefreshDelay doubled the delay until it overflowed to 0 and then
// looped about 2^63 times, on the load goroutine, before delivering, and
// Close never returned. Every background refresh here is a Refresh of a
// held value through a failing Reload, which counts as a failed refresh
// and needs no wait for the backoff.
//
// Real clock: the bug is a goroutine that spins without ever blocking, so
// a bubble's clock would never move and no deadline in it would fire. The
// deadlines are thousands of times what a refresh takes.
func TestHugeMaxIntervalRefreshBackoffDoesNotHang(t *testing.T) {
	events := make(chan LoadEvent[string], 1)
	l, err := New(func(context.Context, string) (string, error) { return "v", nil }, Options[string, string]{
		TTL:     time.Hour,
		Reload:  func(context.Context, string, string) (string, error) { return "", errBoom },
		Retry:   Retry{InitialInterval: 365 * 24 * time.Hour, MaxInterval: time.Duration(math.MaxInt64)},
		Breaker: Breaker{Disabled: true},
		OnLoad:  func(ev LoadEvent[string]) { events <- ev },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown after the failed refreshes: %v; the Loader does not close", err)
		}
	})
	next := func(what string) LoadEvent[string] {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no LoadEvent after 10s: the load goroutine never delivered (Stats %+v)", what, l.Stats())
		}
		panic("unreachable")
	}
	if v, err := l.Get(context.Background(), "k"); err != nil || v != "v" {
		t.Fatalf("Get = %q, %v; want v", v, err)
	}
	next("the first load")
	for i := 1; i <= 20; i++ {
		l.Refresh(context.Background(), "k")
		if ev := next(fmt.Sprintf("failed refresh %d", i)); !ev.Background || !errors.Is(ev.Err, errBoom) {
			t.Fatalf("refresh %d: LoadEvent %+v; want a background load failing with errBoom", i, ev)
		}
	}
	if v, info, err := l.GetInfo(context.Background(), "k"); err != nil || v != "v" || info.Source != SourceHit {
		t.Errorf("Get after 20 failed refreshes = %q, %v, %v; want the value held, a hit", v, info.Source, err)
	}
}

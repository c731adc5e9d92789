package flightcache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeRemote is a shared tier in memory: what another process stored, and
// what this one asked of it.
type fakeRemote struct {
	ttl         time.Duration // the Loader's TTL, to honour MaxStale; 0 = ignore it
	gate        chan struct{} // if set, each Load waits for it
	mu          sync.Mutex
	shared      map[string]RemoteValue[string]
	loads       int
	sets        []string
	invalidated []string
}

func (r *fakeRemote) Load(ctx context.Context, key string, load func(context.Context) (string, error)) (RemoteValue[string], error) {
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	rv, ok := r.shared[key]
	r.mu.Unlock()
	if d, bounded := MaxStale(ctx); ok && r.ttl > 0 && bounded && (d == 0 || time.Since(rv.LoadedAt)-r.ttl > d) {
		ok = false // stale beyond the caller's bound: load
	}
	if ok && time.Since(rv.LoadedAt) < time.Minute {
		return rv, nil // another process loaded it less than a minute ago
	}
	r.mu.Lock()
	r.loads++
	r.mu.Unlock()
	v, err := load(ctx)
	if err != nil {
		if ok { // offer the older value to cover the failure
			return rv, err
		}
		return RemoteValue[string]{}, err
	}
	return RemoteValue[string]{Value: v, LoadedAt: time.Now(), Loaded: true}, nil
}

func (r *fakeRemote) Set(_ context.Context, key string, v RemoteValue[string]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sets = append(r.sets, key+"="+v.Value)
}

func (r *fakeRemote) Invalidate(_ context.Context, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.invalidated = append(r.invalidated, key)
}

// A value another process loaded is used without a downstream call, and is
// as old here as it is there: the Loader's windows apply to its real age.
func TestRemoteValuesKeepTheirAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemote{shared: map[string]RemoteValue[string]{}}
		r.shared["k"] = RemoteValue[string]{Value: "from-peer", LoadedAt: time.Now().Add(-5 * time.Second), Took: time.Second}
		d := &downstream{}
		var log eventLog
		l := newLoader(t, d, Options[string, string]{TTL: 10 * time.Second, StaleWhileRevalidate: time.Hour, Remote: r, OnLoad: log.add})
		v, info, err := l.GetInfo(t.Context(), "k")
		if v != "from-peer" || err != nil || info.Source != SourceLoaded || info.Age != 5*time.Second {
			t.Fatalf("Get = %q, %+v, %v; want the peer's value, 5s old", v, info, err)
		}
		synctest.Wait()
		if evs := log.all(); len(evs) != 1 || !evs[0].Remote || evs[0].Attempts != 0 || d.calls.Load() != 0 {
			t.Errorf("events %+v, %d downstream calls; want one remote load and no call", evs, d.calls.Load())
		}
		time.Sleep(6 * time.Second) // 11s old: stale here, as it would be there
		if _, info, _ := l.GetInfo(t.Context(), "k"); info.Source != SourceStale {
			t.Errorf("Get at age 11s = %v; want stale (TTL 10s)", info.Source)
		}
		l.Set("k", "local")
		l.Invalidate("k")
		if len(r.sets) != 1 || r.sets[0] != "k=local" || len(r.invalidated) != 1 {
			t.Errorf("remote saw sets %v, invalidations %v; want both passed on", r.sets, r.invalidated)
		}
	})
}

// A process with no local copy is covered by the older value the fleet
// holds when the load fails, within StaleIfError and the caller's MaxStale.
func TestRemoteFallbackCoversAFailedLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemote{shared: map[string]RemoteValue[string]{}}
		r.shared["k"] = RemoteValue[string]{Value: "old", LoadedAt: time.Now().Add(-2 * time.Minute)}
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute, StaleIfError: 5 * time.Minute, Remote: r,
			Breaker: Breaker{Disabled: true}})
		v, info, err := l.GetInfo(t.Context(), "k")
		if v != "old" || err != nil || info.Source != SourceStaleOnError || info.Age != 2*time.Minute {
			t.Errorf("Get = %q, %+v, %v; want the fleet's old value as stale-on-error", v, info, err)
		}
		if _, err := l.Get(WithMaxStale(t.Context(), 30*time.Second), "k"); !errors.Is(err, errBoom) {
			t.Errorf("Get with max-stale 30s = %v; want the error: the value went stale 60s ago", err)
		}
		if d, ok := MaxStale(WithMaxStale(t.Context(), -time.Second)); !ok || d != 0 {
			t.Errorf("MaxStale = %v, %v; want 0, true", d, ok)
		}
		time.Sleep(5 * time.Minute) // past the window
		if _, err := l.Get(t.Context(), "k"); !errors.Is(err, errBoom) {
			t.Errorf("Get past StaleIfError = %v; want the error", err)
		}
		if _, info, _ := l.GetInfo(t.Context(), "k"); info.Source == SourceHit {
			t.Errorf("the fallback was cached; it must never be")
		}
	})
}

// A Remote may hand a load a value already stale; a caller that joined
// that load with a max-stale refusing it loads once more, and its bound
// reaches the Remote.
func TestJoinerMaxStaleRefusesAStaleRemoteValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemote{ttl: 30 * time.Second, gate: make(chan struct{}), shared: map[string]RemoteValue[string]{}}
		r.shared["k"] = RemoteValue[string]{Value: "stale", LoadedAt: time.Now().Add(-45 * time.Second)}
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: 30 * time.Second, StaleWhileRevalidate: time.Hour, Remote: r})
		starter := getAsync(t.Context(), l, "k") // accepts any staleness
		synctest.Wait()                          // its load waits in the Remote
		joiner := getAsync(WithMaxStale(t.Context(), 0), l, "k")
		synctest.Wait() // the joiner waits on the starter's load
		close(r.gate)
		if s := <-starter; s.v != "stale" || s.err != nil {
			t.Fatalf("starter = %q, %v; want the shared stale value", s.v, s.err)
		}
		j := <-joiner
		if j.err != nil || j.v == "stale" {
			t.Errorf("joiner with max-stale 0 = %q (%v), %v; want a freshly loaded value", j.v, j.info.Source, j.err)
		}
	})
}

// When the second load of a joiner that refused a stale Remote value gets
// a value just as stale (a Remote that ignores the bound), the joiner takes
// it as that load's result, with its Age: it does not load a third time.
func TestJoinerTakesTheSecondStaleRemoteValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemote{gate: make(chan struct{}), shared: map[string]RemoteValue[string]{}}
		r.shared["k"] = RemoteValue[string]{Value: "stale", LoadedAt: time.Now().Add(-45 * time.Second)}
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: 30 * time.Second, StaleWhileRevalidate: time.Hour, Remote: r})
		starter := getAsync(t.Context(), l, "k")
		synctest.Wait()
		joiner := getAsync(WithMaxStale(t.Context(), 0), l, "k")
		synctest.Wait()
		close(r.gate)
		<-starter
		j := <-joiner
		if j.err != nil || j.v != "stale" || j.info.Source != SourceLoaded || j.info.Age != 45*time.Second {
			t.Errorf("joiner = %q, %+v, %v; want the stale value as its own load's result, 45s old", j.v, j.info, j.err)
		}
		if s := l.Stats(); s.Loads != 2 || s.Shared != 0 || s.Misses != 2 {
			t.Errorf("Loads, Shared, Misses = %d, %d, %d; want 2, 0, 2", s.Loads, s.Shared, s.Misses)
		}
	})
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// windowLoader builds a Loader without a LoadFunc whose loads go through
// m, with opts (a BatchWindow of a second unless set), closed when the
// test ends.
func windowLoader(t testing.TB, m *many, opts Options[string, string]) *Loader[string, string] {
	t.Helper()
	if opts.TTL == 0 {
		opts.TTL = time.Minute
	}
	if opts.BatchWindow == 0 {
		opts.BatchWindow = time.Second
	}
	if opts.LoadMany == nil {
		opts.LoadMany = m.load
	}
	l, err := New(nil, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// getAll starts a Get of each key on its own goroutine, each under ctxOf
// its key (the test's context if nil), and returns the channels of their
// results.
func getAll(t *testing.T, l *Loader[string, string], keys []string, ctxOf func(string) context.Context) map[string]<-chan result {
	t.Helper()
	res := make(map[string]<-chan result, len(keys))
	for _, k := range keys {
		ctx := t.Context()
		if ctxOf != nil {
			ctx = ctxOf(k)
		}
		res[k] = getAsync(ctx, l, k)
	}
	return res
}

// docs/design.md rule 31: 20 concurrent cold Gets of distinct keys wait
// out the window and go out as one LoadMany call of the 20 keys; each Get
// gets its own key's value, and its wait (Info.Waited) holds the window.
func TestBatchWindowColdGets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		var events eventLog
		l := windowLoader(t, m, Options[string, string]{OnLoad: events.add})
		keys := keyRange("k", 20)
		res := getAll(t, l, keys, nil)
		synctest.Wait()
		if calls := m.all(); len(calls) != 0 {
			t.Fatalf("LoadMany calls %v before the window ended; want none", calls)
		}
		time.Sleep(time.Second)
		for _, k := range keys {
			if r := <-res[k]; r.err != nil || r.v != k+"@1" {
				t.Errorf("Get(%q) = %q, %v; want %q", k, r.v, r.err, k+"@1")
			}
		}
		synctest.Wait() // the batch reports after its callers have their answers
		calls := m.all()
		if len(calls) != 1 || !slices.Equal(slices.Sorted(slices.Values(calls[0])), slices.Sorted(slices.Values(keys))) {
			t.Fatalf("LoadMany calls %v; want one call of the 20 keys", calls)
		}
		if s := l.Stats(); s.Loads != 1 || s.BatchLoads != 1 || s.BatchKeys != 20 || s.Misses != 20 || s.InFlight != 0 {
			t.Errorf("Stats = %+v; want 1 load, a batch of 20 keys, 20 misses, nothing in flight", s)
		}
		evs := events.all()
		if len(evs) != 1 || evs[0].Keys != 20 || evs[0].Callers != 20 || evs[0].Duration != 0 {
			t.Errorf("load events %+v; want one, of 20 keys and 20 callers, its Duration the call's (0 here)", evs)
		}
		if _, info, _ := l.GetInfo(t.Context(), "k3"); info.Source != SourceHit {
			t.Errorf("GetInfo(k3) after the window = %+v; want a hit", info)
		}
	})
}

// Rule 31: a Get's Info.Waited holds its wait in the window; the Get
// that opened the window is SourceLoaded, one that joined a key already
// waiting SourceShared, and that key is in the call once.
func TestBatchWindowCoalescesPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{BatchWindow: 100 * time.Millisecond})
		type got struct {
			info Info
			err  error
		}
		out := make(chan got, 3)
		for _, k := range []string{"a", "a", "b"} {
			go func() {
				_, info, err := l.GetInfo(t.Context(), k)
				out <- got{info, err}
			}()
			synctest.Wait()
		}
		var srcs []Source
		for range 3 {
			g := <-out
			if g.err != nil || g.info.Waited != 100*time.Millisecond {
				t.Errorf("GetInfo = %+v, %v; want a wait of the window, 100ms", g.info, g.err)
			}
			srcs = append(srcs, g.info.Source)
		}
		slices.Sort(srcs)
		if want := []Source{SourceLoaded, SourceLoaded, SourceShared}; !slices.Equal(srcs, want) {
			t.Errorf("sources %v; want %v", srcs, want)
		}
		if calls := m.all(); len(calls) != 1 || !slices.Equal(calls[0], []string{"a", "b"}) {
			t.Errorf("LoadMany calls %v; want [[a b]]", calls)
		}
	})
}

// Rule 31: the background refreshes of 20 stale keys wait in one window
// and go out as one LoadMany call, which holds one MaxRefreshes permit
// (MaxRefreshes 1 here) and counts as one refresh.
func TestBatchWindowStaleRefreshes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Hour, MaxRefreshes: 1, BatchWindow: time.Millisecond})
		keys := keyRange("k", 20)
		if _, err := l.GetMany(t.Context(), keys); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		for _, k := range keys {
			if v, info, err := l.GetInfo(t.Context(), k); err != nil || v != k+"@1" || info.Source != SourceStale {
				t.Fatalf("GetInfo(%q) = %q, %+v, %v; want the stale value", k, v, info, err)
			}
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		calls := m.all()
		if len(calls) != 2 || len(calls[1]) != 20 {
			t.Fatalf("LoadMany calls %v; want the 20 refreshes in one call", calls)
		}
		if s := l.Stats(); s.Refreshes != 1 || s.RefreshesDropped != 0 || s.Loads != 2 {
			t.Errorf("Stats = %+v; want 1 refresh (the window), none dropped, 2 loads", s)
		}
		if v, _ := l.Get(t.Context(), "k7"); v != "k7@2" {
			t.Errorf("Get(k7) after the refresh = %q; want k7@2", v)
		}
	})
}

// Rule 31: a window that reaches MaxBatch keys goes out at once, without
// waiting for its end, and the next keys open a new window.
func TestBatchWindowMaxBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{MaxBatch: 5, BatchWindow: time.Hour})
		keys := keyRange("k", 7)
		res := getAll(t, l, keys[:5], nil)
		synctest.Wait()
		if calls := m.all(); len(calls) != 1 || len(calls[0]) != 5 {
			t.Fatalf("LoadMany calls %v once 5 keys wait; want one call of 5 at once", calls)
		}
		for _, k := range keys[:5] {
			if r := <-res[k]; r.err != nil {
				t.Errorf("Get(%q) = %v", k, r.err)
			}
		}
		more := getAll(t, l, keys[5:], nil)
		synctest.Wait()
		if calls := m.all(); len(calls) != 1 {
			t.Fatalf("LoadMany calls %v; want the last 2 keys waiting in a new window", calls)
		}
		time.Sleep(time.Hour)
		for _, k := range keys[5:] {
			if r := <-more[k]; r.err != nil || r.v != k+"@2" {
				t.Errorf("Get(%q) = %q, %v; want %q", k, r.v, r.err, k+"@2")
			}
		}
		if calls := m.all(); len(calls) != 2 || !slices.Equal(slices.Sorted(slices.Values(calls[1])), keys[5:]) {
			t.Errorf("LoadMany calls %v; want a second call of %v", calls, keys[5:])
		}
	})
}

// Rule 31 under CancelAtZero: a key whose callers all left before the
// window went out is dropped from the call (here the window's first key,
// whose context the call still runs under); when every key's callers
// left, no call is made at all and nothing counts as a load.
func TestBatchWindowCancelAtZeroDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		var events eventLog
		l := windowLoader(t, m, Options[string, string]{Policy: CancelAtZero, OnLoad: events.add})
		ctxA, cancelA := context.WithCancel(t.Context())
		resA := getAsync(ctxA, l, "a")
		synctest.Wait()
		resB := getAsync(t.Context(), l, "b")
		synctest.Wait()
		cancelA()
		if r := <-resA; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Get(a) after its context ended = %v; want context.Canceled", r.err)
		}
		time.Sleep(time.Second)
		if r := <-resB; r.err != nil || r.v != "b@1" {
			t.Fatalf("Get(b) = %q, %v; want b@1", r.v, r.err)
		}
		if calls := m.all(); len(calls) != 1 || !slices.Equal(calls[0], []string{"b"}) {
			t.Fatalf("LoadMany calls %v; want [[b]]: a dropped", calls)
		}
		synctest.Wait() // the batch reports after its callers have their answers
		if evs := events.all(); len(evs) != 1 || evs[0].Key != "b" || evs[0].Keys != 1 {
			t.Fatalf("load events %+v; want one, of b alone", evs)
		}

		ctx, cancel := context.WithCancel(t.Context())
		res := getAll(t, l, []string{"c", "d"}, func(string) context.Context { return ctx })
		synctest.Wait()
		cancel()
		for k, ch := range res {
			if r := <-ch; !errors.Is(r.err, context.Canceled) {
				t.Errorf("Get(%q) = %v; want context.Canceled", k, r.err)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if calls := m.all(); len(calls) != 1 {
			t.Errorf("LoadMany calls %v; want no call for a window every caller left", calls)
		}
		if s := l.Stats(); s.Loads != 1 || s.InFlight != 0 {
			t.Errorf("Stats = %+v; want 1 load, nothing in flight", s)
		}
	})
}

// Rule 31 under FinishAndFill: a key whose callers all left stays in the
// window's call, and its value is stored.
func TestBatchWindowFinishKeepsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{})
		ctx, cancel := context.WithCancel(t.Context())
		res := getAsync(ctx, l, "a")
		synctest.Wait()
		cancel()
		if r := <-res; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Get(a) = %v; want context.Canceled", r.err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if calls := m.all(); len(calls) != 1 || !slices.Equal(calls[0], []string{"a"}) {
			t.Fatalf("LoadMany calls %v; want [[a]]", calls)
		}
		if _, info, _ := l.GetInfo(t.Context(), "a"); info.Source != SourceHit {
			t.Errorf("GetInfo(a) = %+v; want a hit: the load filled the cache", info)
		}
	})
}

// Rule 31: a window's call is retried as one call, and the breaker counts
// calls, not keys: a window of 10 keys whose call fails is split, and at
// ConsecutiveFailures 2 its second call (the first half's try) opens the
// breaker, which answers the rest: 2 calls, one load, not one per key.
func TestBatchWindowRetriesAndBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{fail: func(n int) error {
			if n == 1 {
				return errBoom
			}
			return nil
		}}
		l := windowLoader(t, m, Options[string, string]{Retry: Retry{MaxAttempts: 2}})
		res := getAll(t, l, keyRange("k", 10), nil)
		time.Sleep(time.Second)
		for k, ch := range res {
			if r := <-ch; r.err != nil {
				t.Errorf("Get(%q) = %v; want the retried call's value", k, r.err)
			}
		}
		if s := l.Stats(); len(m.all()) != 2 || s.Loads != 1 || s.DownstreamCalls != 2 || s.Retries != 1 {
			t.Errorf("calls %v, Stats %+v; want one load of 2 calls (1 retry)", m.all(), s)
		}

		m2 := &many{fail: func(int) error { return errBoom }}
		l2 := windowLoader(t, m2, Options[string, string]{Breaker: Breaker{ConsecutiveFailures: 2}})
		res = getAll(t, l2, keyRange("k", 10), nil)
		time.Sleep(time.Second)
		for k, ch := range res {
			if r := <-ch; !errors.Is(r.err, errBoom) && !errors.Is(r.err, ErrBreakerOpen) {
				t.Errorf("Get(%q) = %v; want errBoom, or the breaker's refusal", k, r.err)
			}
		}
		if s := l2.Stats(); s.Breaker != BreakerOpen || s.LoadErrors != 1 || s.DownstreamCalls != 2 || len(m2.all()) != 2 {
			t.Errorf("calls %v, Stats = %+v; want 2 calls, one failed load, the breaker open", m2.all(), s)
		}
	})
}

// Rule 31: a window's call holds one Options.Limit slot: 20 Gets under a
// bound of one load and a queue of one go out together, none limited.
func TestBatchWindowOneLimitSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{Limit: Limit{MaxLoads: 1, MaxQueue: 1}})
		res := getAll(t, l, keyRange("k", 20), nil)
		time.Sleep(time.Second)
		for k, ch := range res {
			if r := <-ch; r.err != nil {
				t.Errorf("Get(%q) = %v; want its value", k, r.err)
			}
		}
		if s := l.Stats(); s.Limited != 0 || s.Loads != 1 {
			t.Errorf("Stats = %+v; want 1 load, none limited", s)
		}
	})
}

// Rule 31: LoadTimeout counts from when the window's call goes out, not
// from when its first key joined: a call of 600ms under a LoadTimeout of
// 1s, after a window of 1s, succeeds.
func TestBatchWindowLoadTimeoutFromCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		slow := func(ctx context.Context, keys []string) (map[string]string, error) {
			select {
			case <-time.After(600 * time.Millisecond):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			return m.load(ctx, keys)
		}
		l := windowLoader(t, m, Options[string, string]{LoadTimeout: time.Second, LoadMany: slow})
		res := getAll(t, l, []string{"a", "b"}, nil)
		time.Sleep(2 * time.Second)
		for k, ch := range res {
			if r := <-ch; r.err != nil {
				t.Errorf("Get(%q) = %v; want its value", k, r.err)
			}
		}
	})
}

// Rule 31: Refresh, a revalidating Get and an early refresh each wait in
// a window, and go out together with the others of their kind.
func TestBatchWindowRefreshRevalidateEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{TTL: time.Hour, BatchWindow: time.Millisecond})
		ctx := t.Context()
		if _, err := l.GetMany(ctx, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
		l.Refresh(ctx, "a")
		l.Refresh(ctx, "b")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		res := getAll(t, l, []string{"a", "b"}, func(string) context.Context { return WithRevalidate(ctx) })
		time.Sleep(time.Millisecond)
		for k, ch := range res {
			if r := <-ch; r.err != nil || r.v != k+"@3" {
				t.Errorf("revalidating Get(%q) = %q, %v; want %q", k, r.v, r.err, k+"@3")
			}
		}
		want := [][]string{{"a", "b"}, {"a", "b"}, {"a", "b"}}
		calls := m.all()
		for _, c := range calls {
			slices.Sort(c)
		}
		if !slices.EqualFunc(calls, want, slices.Equal) {
			t.Errorf("LoadMany calls %v; want %v", calls, want)
		}
		if s := l.Stats(); s.Refreshes != 1 {
			t.Errorf("Stats.Refreshes = %d; want 1 (the window)", s.Refreshes)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		slow := func(ctx context.Context, keys []string) (map[string]string, error) {
			time.Sleep(100 * time.Millisecond) // refreshes due 100ms to 500ms before expiry
			return m.load(ctx, keys)
		}
		l := windowLoader(t, m, Options[string, string]{TTL: time.Second, EarlyRefresh: 1, LoadMany: slow, BatchWindow: time.Millisecond})
		ctx := t.Context()
		if _, err := l.GetMany(ctx, []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(950 * time.Millisecond) // every early refresh is due, the values fresh
		for _, k := range []string{"a", "b"} {
			if _, info, _ := l.GetInfo(ctx, k); info.Source != SourceHit {
				t.Fatalf("GetInfo(%q) = %+v; want a hit", k, info)
			}
		}
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if calls := m.all(); len(calls) != 2 || len(calls[1]) != 2 {
			t.Errorf("LoadMany calls %v; want both early refreshes in one call", calls)
		}
	})
}

// Rule 31: a key the Loader holds, reloaded through Options.Reload, goes
// alone: it needs its old value.
func TestBatchWindowReloadGoesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		var reloads atomic.Int32
		reload := func(_ context.Context, key, old string) (string, error) {
			reloads.Add(1)
			return old + "+", nil
		}
		l := windowLoader(t, m, Options[string, string]{Reload: reload, BatchWindow: time.Hour})
		if _, err := l.GetMany(t.Context(), []string{"a"}); err != nil {
			t.Fatal(err)
		}
		if v, err := l.Get(WithRevalidate(t.Context()), "a"); err != nil || v != "a@1+" {
			t.Errorf("revalidating Get(a) = %q, %v; want a@1+ at once, through Reload", v, err)
		}
		if reloads.Load() != 1 || len(m.all()) != 1 {
			t.Errorf("%d reloads, LoadMany calls %v; want 1 reload, the first call only", reloads.Load(), m.all())
		}
	})
}

// Rule 31 and rule 8: Close sends an open window out at once, under a
// cancelled context: its Gets get ErrClosed, Close does not wait out the
// window, and nothing is left running (goleak).
func TestBatchWindowClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{gate: make(chan struct{})}
		l := windowLoader(t, m, Options[string, string]{BatchWindow: time.Hour})
		res := getAll(t, l, []string{"a", "b"}, nil)
		synctest.Wait()
		start := time.Now()
		l.Close()
		if d := time.Since(start); d != 0 {
			t.Errorf("Close took %v; want it not to wait out the window", d)
		}
		for k, ch := range res {
			if r := <-ch; !errors.Is(r.err, ErrClosed) {
				t.Errorf("Get(%q) across Close = %v; want ErrClosed", k, r.err)
			}
		}
		if _, err := l.Get(t.Context(), "c"); !errors.Is(err, ErrClosed) {
			t.Errorf("Get after Close = %v; want ErrClosed", err)
		}
	})
}

// Rule 31: Options.BatchWindow is validated.
func TestBatchWindowValidation(t *testing.T) {
	m := &many{}
	for _, c := range []struct {
		opts Options[string, string]
		want string
	}{
		{Options[string, string]{TTL: time.Second, LoadMany: m.load, BatchWindow: -1}, "Options.BatchWindow must be >= 0"},
		{Options[string, string]{TTL: time.Second, BatchWindow: time.Millisecond}, "Options.BatchWindow needs LoadMany"},
	} {
		l, err := New((&downstream{}).load, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			if l != nil {
				l.Close()
			}
			t.Errorf("New(%+v) = %v; want an error containing %q", c.opts, err, c.want)
		}
	}
}

// Rule 31 under -race: many goroutines Get many keys with deadlines (some
// very short), under both policies, while others Set, Invalidate and
// Refresh; Close comes while Gets are running. Every Get returns, every
// value is its key's, no key is asked twice in one LoadMany call, and
// nothing is left running (goleak).
func TestBatchWindowStorm(t *testing.T) {
	for _, p := range []Policy{FinishAndFill, CancelAtZero} {
		t.Run(fmt.Sprint(p), func(t *testing.T) { stormWindow(t, p) })
	}
}

func stormWindow(t *testing.T, p Policy) {
	var twice atomic.Int32
	load := func(ctx context.Context, keys []string) (map[string]string, error) {
		seen := map[string]bool{}
		out := map[string]string{}
		for _, k := range keys {
			if seen[k] {
				twice.Add(1)
			}
			seen[k] = true
			out[k] = k + "=v"
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		return out, ctx.Err()
	}
	l, err := New(nil, Options[string, string]{TTL: 5 * time.Millisecond, StaleWhileRevalidate: 5 * time.Millisecond, Policy: p,
		LoadMany: load, BatchWindow: 500 * time.Microsecond, MaxBatch: 8, MaxRefreshes: 4})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("k%d", rand.IntN(40))
				switch i % 10 {
				case 0:
					l.Set(k, k+"=v")
				case 1:
					l.Invalidate(k)
				case 2:
					l.Refresh(context.Background(), k)
				default:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(2000)+g)*time.Microsecond)
					if v, err := l.Get(ctx, k); err == nil && v != k+"=v" {
						t.Errorf("Get(%q) = %q", k, v)
					}
					cancel()
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return")
	}
	close(stop)
	waitGroup(t, "the workers, once stopped", &wg)
	if n := twice.Load(); n != 0 {
		t.Errorf("%d keys asked twice in one LoadMany call", n)
	}
	if s := l.Stats(); s.InFlight != 0 || s.Loads == 0 {
		t.Errorf("Stats = %+v; want loads made, none in flight", s)
	}
}

// Rule 31 with a Remote: a window goes through a RemoteMany as a GetMany's
// batch does (the keys the tier has come from it, the others go down in
// one LoadMany call); with a Remote that is not a RemoteMany, each key
// goes alone through Remote.Load, without waiting, as a GetMany's would.
func TestBatchWindowRemote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemoteMany{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{
			"peer": {Value: "from-peer", LoadedAt: time.Now()},
		}}}
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{Remote: r})
		res := getAll(t, l, []string{"peer", "a", "b"}, nil)
		time.Sleep(time.Second)
		for k, ch := range res {
			if want := map[string]string{"peer": "from-peer", "a": "a@1", "b": "b@1"}[k]; (<-ch).v != want {
				t.Errorf("Get(%q) != %q", k, want)
			}
		}
		if len(r.batches) != 1 || len(r.batches[0]) != 2 || len(m.all()) != 1 {
			t.Errorf("RemoteMany batches %v, LoadMany calls %v; want one of each, for a and b", r.batches, m.all())
		}
	})
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemote{shared: map[string]RemoteValue[string]{}}
		m := &many{}
		l := windowLoader(t, m, Options[string, string]{Remote: r, BatchWindow: time.Hour})
		for _, k := range []string{"a", "b"} {
			if v, err := l.Get(t.Context(), k); err != nil || v == "" {
				t.Errorf("Get(%q) = %q, %v; want it loaded at once", k, v, err)
			}
		}
		if calls := m.all(); len(calls) != 2 {
			t.Errorf("LoadMany calls %v; want one per key", calls)
		}
	})
}

// Rule 31: an Observer sees one LoadStart and one LoadEnd per window's
// call, with its Keys.
func TestBatchWindowObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &keysObserver{}
		l := windowLoader(t, &many{}, Options[string, string]{Observer: o})
		res := getAll(t, l, keyRange("k", 5), nil)
		time.Sleep(time.Second)
		for _, ch := range res {
			<-ch
		}
		synctest.Wait() // LoadEnd comes once the waiters have the result, not before
		o.mu.Lock()
		defer o.mu.Unlock()
		if !slices.Equal(o.starts, []int{5}) || !slices.Equal(o.ends, []int{5}) {
			t.Errorf("LoadStart Keys %v, LoadEnd Keys %v; want [5] and [5]", o.starts, o.ends)
		}
	})
}

// keysObserver records the Keys of each LoadStart and LoadEnd.
type keysObserver struct {
	mu           sync.Mutex
	starts, ends []int
}

func (o *keysObserver) LoadStart(ctx context.Context, ev LoadStartEvent[string]) context.Context {
	o.mu.Lock()
	o.starts = append(o.starts, ev.Keys)
	o.mu.Unlock()
	return ctx
}

func (o *keysObserver) LoadEnd(_ context.Context, ev LoadEvent[string]) {
	o.mu.Lock()
	o.ends = append(o.ends, ev.Keys)
	o.mu.Unlock()
}

func (o *keysObserver) Waited(context.Context, WaitEvent[string]) {}

// BenchmarkMissBatchWindow: a Get of a never-seen key per op through an
// instant LoadMany, without a window and with one of 1ms; serial (every
// miss waits out its window alone: the latency cost) and from 32
// goroutines per core (the misses of a window share one call).
func BenchmarkMissBatchWindow(b *testing.B) {
	loadMany := func(_ context.Context, keys []uint64) (map[uint64]uint64, error) {
		m := make(map[uint64]uint64, len(keys))
		for _, k := range keys {
			m[k] = k
		}
		return m, nil
	}
	for _, w := range []time.Duration{0, time.Millisecond} {
		for _, parallel := range []bool{false, true} {
			b.Run(fmt.Sprintf("window=%v/parallel=%v", w, parallel), func(b *testing.B) {
				l, err := New(nil, Options[uint64, uint64]{TTL: time.Hour, MaxCost: 1 << 16, LoadMany: loadMany, BatchWindow: w})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				var next atomic.Uint64
				b.ReportAllocs()
				if !parallel {
					for b.Loop() {
						if _, err := l.Get(context.Background(), next.Add(1)); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism(32)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, err := l.Get(context.Background(), next.Add(1)); err != nil {
								b.Error(err)
							}
						}
					})
				}
				s := l.Stats()
				b.ReportMetric(float64(s.Misses)/float64(max(s.Loads, 1)), "keys/load")
			})
		}
	}
}

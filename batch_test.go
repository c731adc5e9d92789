package flightcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// many is a fake batch endpoint: it records the keys of each call, and
// answers every key but those in absent with "key@n" (n: the call's
// number), plus the keys of extra.
type many struct {
	mu      sync.Mutex
	calls   [][]string
	gate    chan struct{} // if non-nil, each call waits for it (or ctx)
	started chan []string // if non-nil, each call sends its keys here first
	absent  map[string]bool
	extra   []string
	fail    func(n int) error
	ctxErr  chan error // if non-nil, receives ctx.Err() when the call returns
}

func (m *many) load(ctx context.Context, keys []string) (map[string]string, error) {
	m.mu.Lock()
	m.calls = append(m.calls, slices.Clone(keys))
	n := len(m.calls)
	m.mu.Unlock()
	if m.started != nil {
		m.started <- keys
	}
	if m.gate != nil {
		select {
		case <-m.gate:
		case <-ctx.Done():
			if m.ctxErr != nil {
				m.ctxErr <- ctx.Err()
			}
			return nil, ctx.Err()
		}
	}
	if m.fail != nil {
		if err := m.fail(n); err != nil {
			return nil, err
		}
	}
	out := map[string]string{}
	for _, k := range append(slices.Clone(keys), m.extra...) {
		if !m.absent[k] {
			out[k] = fmt.Sprintf("%s@%d", k, n)
		}
	}
	return out, nil
}

func (m *many) all() [][]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// keysLoaded counts, per key, the LoadMany calls that asked for it.
func (m *many) keysLoaded() map[string]int {
	n := map[string]int{}
	for _, call := range m.all() {
		for _, k := range call {
			n[k]++
		}
	}
	return n
}

func newManyLoader(t testing.TB, d *downstream, m *many, opts Options[string, string]) *Loader[string, string] {
	t.Helper()
	opts.LoadMany = m.load
	return newLoader(t, d, opts)
}

func keyRange(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return keys
}

// docs/design.md rule 15: duplicate keys count and load once, on both of
// GetMany's ways of finding them (a table on the stack up to dedupeOnStack
// keys, duplicates included, a map beyond or with a custom Hash), also
// when every key has the same hash.
func TestGetManyDuplicates(t *testing.T) {
	for _, n := range []int{10, dedupeOnStack/2 - 1, dedupeOnStack, dedupeOnStack + 44} {
		for _, collide := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d/collide=%v", n, collide), func(t *testing.T) {
				opts := Options[string, string]{MaxBatch: 1000}
				if collide {
					opts.Hash = func(string) uint64 { return 42 }
				}
				d, m := &downstream{}, &many{}
				l := newManyLoader(t, d, m, opts)
				distinct := keyRange("k", n)
				var keys []string
				for i, k := range distinct { // each twice, the second after some others
					keys = append(keys, k)
					if i >= 3 {
						keys = append(keys, distinct[i-3])
					}
				}
				keys = append(keys, distinct[n-3:]...)
				got, err := l.GetMany(context.Background(), keys)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != n {
					t.Fatalf("GetMany returned %d keys; want %d", len(got), n)
				}
				for _, k := range distinct {
					if got[k] == "" {
						t.Fatalf("%s missing", k)
					}
				}
				loaded := m.keysLoaded()
				for k, c := range loaded {
					if c != 1 {
						t.Errorf("key %s loaded %d times", k, c)
					}
				}
				if len(loaded) != n {
					t.Errorf("%d keys loaded; want %d", len(loaded), n)
				}
				if s := l.Stats(); s.Gets != uint64(n) || s.Misses != uint64(n) {
					t.Errorf("Gets = %d, Misses = %d; want %d each", s.Gets, s.Misses, n)
				}
			})
		}
	}
}

// A custom Hash need not give equal keys equal hashes (+0 and -0 are equal
// float64 keys): GetMany still counts and loads them as one key.
func TestGetManyDuplicatesUnderCustomHash(t *testing.T) {
	var mu sync.Mutex
	var asked [][]float64
	l, err := New(func(_ context.Context, k float64) (string, error) { return "one", nil },
		Options[float64, string]{
			TTL:  time.Minute,
			Hash: func(k float64) uint64 { b := math.Float64bits(k); return b ^ b>>58 },
			LoadMany: func(_ context.Context, keys []float64) (map[float64]string, error) {
				mu.Lock()
				asked = append(asked, slices.Clone(keys))
				mu.Unlock()
				m := make(map[float64]string, len(keys))
				for _, k := range keys {
					m[k] = "many"
				}
				return m, nil
			},
		})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	negZero := math.Copysign(0, -1)
	got, err := l.GetMany(context.Background(), []float64{0, negZero, 1})
	if err != nil || len(got) != 2 {
		t.Fatalf("GetMany = %v, %v; want 2 keys (0 and 1)", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || len(asked[0]) != 2 {
		t.Errorf("LoadMany calls %v; want one, of 2 keys", asked)
	}
	if s := l.Stats(); s.Gets != 2 {
		t.Errorf("Gets = %d; want 2", s.Gets)
	}
}

// docs/design.md rule 15: hits answer from the cache; the misses go out
// in ⌈misses / MaxBatch⌉ LoadMany calls, each key in exactly one;
// duplicates are allowed; each distinct key is one Get.
func TestGetManyBatchesMisses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, m := &downstream{}, &many{}
		var events eventLog
		l := newManyLoader(t, d, m, Options[string, string]{MaxBatch: 10, OnLoad: events.add})
		ctx := context.Background()
		for _, k := range keyRange("k", 5) {
			l.Set(k, "set-"+k)
		}
		keys := keyRange("k", 30)
		got, err := l.GetMany(ctx, append(keys, "k3", "k17", "k17"))
		if err != nil {
			t.Fatalf("GetMany: %v", err)
		}
		if len(got) != 30 {
			t.Fatalf("GetMany returned %d keys; want 30: %v", len(got), got)
		}
		for i, k := range keys {
			if i < 5 && got[k] != "set-"+k {
				t.Errorf("%s = %q; want the value Set", k, got[k])
			}
			if i >= 5 && got[k] == "" {
				t.Errorf("%s missing", k)
			}
		}
		calls := m.all()
		if len(calls) != 3 { // 25 misses, 10 per call
			t.Fatalf("LoadMany calls: %v; want 3", calls)
		}
		for k, n := range m.keysLoaded() {
			if n != 1 {
				t.Errorf("key %s in %d LoadMany calls", k, n)
			}
		}
		if len(m.keysLoaded()) != 25 || d.calls.Load() != 0 {
			t.Errorf("%d keys loaded by LoadMany, %d LoadFunc calls; want 25 and 0", len(m.keysLoaded()), d.calls.Load())
		}
		s := l.Stats()
		if s.Gets != 30 || s.Hits != 5 || s.Misses != 25 || s.Loads != 3 || s.BatchLoads != 3 || s.BatchKeys != 25 {
			t.Errorf("Stats = %+v; want 30 Gets = 5 hits + 25 misses, 3 loads, all batches, of 25 keys", s)
		}
		synctest.Wait() // OnLoad runs after the waiters wake
		evs := events.all()
		if len(evs) != 3 {
			t.Fatalf("%d LoadEvents; want one per batch: %+v", len(evs), evs)
		}
		keysReported := 0
		for _, ev := range evs {
			keysReported += ev.Keys
			if ev.Callers != ev.Keys || ev.Err != nil || !ev.Stored || ev.Attempts != 1 {
				t.Errorf("LoadEvent %+v; want one caller per key, stored, one attempt", ev)
			}
		}
		if keysReported != 25 {
			t.Errorf("LoadEvents report %d keys; want 25", keysReported)
		}
		// Now every key is a hit.
		if _, err := l.GetMany(ctx, keys); err != nil || len(m.all()) != 3 {
			t.Fatalf("second GetMany: %v, %d LoadMany calls; want no new call", err, len(m.all()))
		}
	})
}

// Without LoadMany, GetMany loads each missing key through the LoadFunc,
// all at once.
func TestGetManyWithoutLoadMany(t *testing.T) {
	d := &downstream{gate: make(chan struct{})}
	l := newLoader(t, d, Options[string, string]{})
	done := make(chan error, 1)
	go func() {
		_, err := l.GetMany(context.Background(), keyRange("k", 8))
		done <- err
	}()
	// All 8 loads must run at once.
	waitFor(t, "8 loads running at once", 10*time.Second, func() bool { return d.inside.Load() == 8 })
	close(d.gate)
	if err := recv(t, "GetMany", done); err != nil {
		t.Fatal(err)
	}
	if d.calls.Load() != 8 || l.Stats().BatchLoads != 0 {
		t.Fatalf("%d LoadFunc calls, %d batches; want 8 and 0", d.calls.Load(), l.Stats().BatchLoads)
	}
}

// Rule 15: a key missing from LoadMany's map does not exist: absent from
// GetMany's result, no error, cached as a not-found with NotFoundTTL; a
// key returned that was not asked for is not stored.
func TestGetManyAbsentAndExtraKeys(t *testing.T) {
	d := &downstream{}
	m := &many{absent: map[string]bool{"gone": true}, extra: []string{"uninvited"}}
	l := newManyLoader(t, d, m, Options[string, string]{NotFoundTTL: time.Minute})
	ctx := context.Background()
	got, err := l.GetMany(ctx, []string{"a", "gone"})
	if err != nil || len(got) != 1 || got["a"] != "a@1" {
		t.Fatalf("GetMany = %v, %v; want only a", got, err)
	}
	if _, info, err := l.GetInfo(ctx, "gone"); !errors.Is(err, ErrNotFound) || info.Source != SourceHit {
		t.Fatalf("Get(gone) = %v, %v; want a cached ErrNotFound", info.Source, err)
	}
	if _, _, ok := l.Peek("uninvited"); ok {
		t.Fatal("a key LoadMany returned unasked was stored")
	}
	if _, info, _ := l.GetInfo(ctx, "uninvited"); info.Source != SourceLoaded || d.calls.Load() != 1 {
		t.Fatalf("Get(uninvited): %v after %d LoadFunc calls; want a load", info.Source, d.calls.Load())
	}
}

// Rules 3 and 15: an error fails every key of the call, is shared and not
// cached; ManyError holds each key's error, unwraps to it, and a key
// covered by a stale value under StaleIfError is not failed.
func TestGetManyErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		failing := atomic.Bool{}
		m := &many{fail: func(int) error {
			if failing.Load() {
				return errBoom
			}
			return nil
		}}
		l := newManyLoader(t, d, m, Options[string, string]{TTL: time.Second, StaleIfError: time.Hour})
		ctx := context.Background()
		if _, err := l.GetMany(ctx, []string{"old"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // old is past its TTL, within StaleIfError
		failing.Store(true)
		got, err := l.GetMany(ctx, []string{"old", "new1", "new2"})
		var me *ManyError[string]
		if !errors.As(err, &me) {
			t.Fatalf("GetMany error %v (%T); want a *ManyError", err, err)
		}
		if len(me.Errs) != 2 || !errors.Is(me.Errs["new1"], errBoom) || !errors.Is(me.Errs["new2"], errBoom) {
			t.Fatalf("ManyError.Errs = %v; want boom for new1 and new2 only", me.Errs)
		}
		if !errors.Is(err, errBoom) || len(me.Unwrap()) != 1 {
			t.Fatalf("errors.Is(err, boom) = %v, Unwrap() = %v; want true and one distinct error", errors.Is(err, errBoom), me.Unwrap())
		}
		if got["old"] != "old@1" || len(got) != 1 {
			t.Fatalf("GetMany values %v; want old's stale value only", got)
		}
		if s := l.Stats(); s.StaleOnError != 1 || s.LoadErrors != 1 {
			t.Fatalf("Stats = %+v; want 1 stale-on-error, 1 failed load (the batch)", s)
		}
		failing.Store(false)
		if got, err := l.GetMany(ctx, []string{"new1"}); err != nil || got["new1"] == "" {
			t.Fatalf("after the failure: %v, %v; want a fresh load (failures are not cached)", got, err)
		}
	})
}

// Rule 7 per key: a panic in LoadMany is a *PanicError for each key.
func TestGetManyPanic(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{
		LoadMany: func(context.Context, []string) (map[string]string, error) { panic("batch bug") },
	})
	_, err := l.GetMany(context.Background(), []string{"a", "b"})
	var me *ManyError[string]
	var pe *PanicError
	if !errors.As(err, &me) || len(me.Errs) != 2 || !errors.As(me.Errs["a"], &pe) || !errors.As(me.Errs["b"], &pe) || pe.Value != "batch bug" {
		t.Fatalf("GetMany error %v; want a *PanicError for a and b", err)
	}
}

// A Goexit in LoadMany reaches every key as ErrGoexit.
func TestGetManyGoexit(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{
		LoadMany: func(context.Context, []string) (map[string]string, error) { runtime.Goexit(); return nil, nil },
	})
	_, err := l.GetMany(context.Background(), []string{"a", "b"})
	var me *ManyError[string]
	if !errors.As(err, &me) || !errors.Is(me.Errs["a"], ErrGoexit) || !errors.Is(me.Errs["b"], ErrGoexit) {
		t.Fatalf("GetMany error %v; want ErrGoexit for a and b", err)
	}
}

// Rule 15: coalescing is per key across single and batch Gets. A Get of a
// key a batch is loading joins it; a GetMany overlapping a running batch
// loads only the keys nobody loads; a key whose single load is in flight is
// joined by a GetMany.
func TestGetManyCoalescesPerKey(t *testing.T) {
	d := &downstream{gate: make(chan struct{}), started: make(chan string, 1)}
	m := &many{gate: make(chan struct{}), started: make(chan []string, 2)}
	l := newManyLoader(t, d, m, Options[string, string]{})
	ctx := context.Background()

	single := getAsync(ctx, l, "s") // a single load of s, held
	recv(t, "the load of s", d.started)
	first := make(chan map[string]string, 1)
	go func() {
		got, err := l.GetMany(ctx, []string{"a", "b", "s"})
		if err != nil {
			t.Error(err)
		}
		first <- got
	}()
	if keys := recv(t, "the first batch", m.started); !slices.Equal(keys, []string{"a", "b"}) {
		t.Fatalf("first batch asked for %v; want [a b] (s is in flight)", keys)
	}
	joinB := getAsync(ctx, l, "b")
	second := make(chan map[string]string, 1)
	go func() {
		got, err := l.GetMany(ctx, []string{"b", "c", "a"})
		if err != nil {
			t.Error(err)
		}
		second <- got
	}()
	if keys := recv(t, "the second batch", m.started); !slices.Equal(keys, []string{"c"}) {
		t.Fatalf("second batch asked for %v; want [c]", keys)
	}
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Waiting != 8; { // s: single + first; a: first + second; b: first + Get + second; c: second
		if time.Now().After(deadline) {
			t.Fatalf("Stats.Waiting = %d after 10s; want 8", l.Stats().Waiting)
		}
		time.Sleep(time.Millisecond)
	}
	close(m.gate)
	close(d.gate)
	g1, g2 := recv(t, "the first GetMany", first), recv(t, "the second GetMany", second)
	rb, rs := recv(t, "Get(b)", joinB), recv(t, "Get(s)", single)
	if g1["a"] != "a@1" || g1["b"] != "b@1" || g1["s"] != "s#1" {
		t.Errorf("first GetMany = %v", g1)
	}
	if g2["a"] != "a@1" || g2["b"] != "b@1" || g2["c"] != "c@2" {
		t.Errorf("second GetMany = %v", g2)
	}
	if rb.v != "b@1" || rb.info.Source != SourceShared || rs.v != "s#1" {
		t.Errorf("Get(b) = %+v, Get(s) = %+v", rb, rs)
	}
	if d.calls.Load() != 1 || len(m.all()) != 2 {
		t.Errorf("%d LoadFunc calls, LoadMany calls %v; want 1 and 2", d.calls.Load(), m.all())
	}
	// The batch reports itself (and its callers) after its waiters wake:
	// wait for it, within a deadline.
	for deadline := time.Now().Add(10 * time.Second); l.Stats().MaxCallersPerLoad < 5 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if s := l.Stats(); s.MaxCallersPerLoad != 5 { // batch 1: a 2 + b 3
		t.Errorf("MaxCallersPerLoad = %d; want 5 (the first batch's callers over its keys)", s.MaxCallersPerLoad)
	}
}

// Rules 6 and 15: a Set or Invalidate during a batch wins for its key; the
// batch's callers still get its result, and the other keys are stored.
func TestGetManySetDuringBatch(t *testing.T) {
	d := &downstream{}
	m := &many{gate: make(chan struct{}), started: make(chan []string, 1)}
	l := newManyLoader(t, d, m, Options[string, string]{})
	ctx := context.Background()
	done := make(chan map[string]string, 1)
	go func() {
		got, _ := l.GetMany(ctx, []string{"a", "b", "c"})
		done <- got
	}()
	recv(t, "the batch", m.started)
	l.Set("a", "set")
	l.Invalidate("b")
	close(m.gate)
	if got := recv(t, "GetMany", done); got["a"] != "a@1" || got["b"] != "b@1" || got["c"] != "c@1" {
		t.Fatalf("GetMany = %v; want the batch's values", got)
	}
	if v, _ := l.Get(ctx, "a"); v != "set" {
		t.Errorf("Get(a) = %q; want the value Set during the batch", v)
	}
	if v, info, _ := l.GetInfo(ctx, "b"); info.Source != SourceLoaded || v != "b#1" {
		t.Errorf("Get(b) = %q, %v; want a new load (Invalidate won)", v, info.Source)
	}
	if v, info, _ := l.GetInfo(ctx, "c"); info.Source != SourceHit || v != "c@1" {
		t.Errorf("Get(c) = %q, %v; want the batch's value cached", v, info.Source)
	}
}

// Rule 4 and 15: under CancelAtZero a batch is cancelled only when no
// caller waits on any of its keys; a GetMany whose context ends returns
// ctx.Err().
func TestGetManyCancelAtZero(t *testing.T) {
	d := &downstream{}
	m := &many{gate: make(chan struct{}), started: make(chan []string, 1), ctxErr: make(chan error, 1)}
	var events eventLog
	l := newManyLoader(t, d, m, Options[string, string]{Policy: CancelAtZero, OnLoad: events.add})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.GetMany(ctx, []string{"a", "b"})
		done <- err
	}()
	recv(t, "the batch", m.started)
	getCtx, getCancel := context.WithCancel(context.Background())
	defer getCancel()
	joinB := getAsync(getCtx, l, "b")
	waitFor(t, "3 waiters (the GetMany's 2 keys, the Get of b)", 10*time.Second, func() bool { return l.Stats().Waiting == 3 })
	cancel()
	if err := recv(t, "GetMany", done); !errors.Is(err, context.Canceled) {
		t.Fatalf("GetMany after its ctx ended: %v; want context.Canceled", err)
	}
	select {
	case err := <-m.ctxErr:
		t.Fatalf("the batch was cancelled (%v) while a Get still waits on b", err)
	case <-time.After(50 * time.Millisecond):
	}
	getCancel()
	if r := recv(t, "Get(b)", joinB); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Get(b) = %+v; want context.Canceled", r)
	}
	select {
	case err := <-m.ctxErr:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("LoadMany's ctx ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was not cancelled once nobody waited on any of its keys")
	}
	waitFor(t, "the abandoned batch's LoadEvent", 10*time.Second, func() bool { return len(events.all()) != 0 })
	if ev := events.all()[0]; !ev.Abandoned || ev.Keys != 2 || ev.Callers != 0 {
		t.Fatalf("LoadEvent %+v; want abandoned, 2 keys, no callers", ev)
	}
	if s := l.Stats(); s.Abandoned != 1 {
		t.Fatalf("Stats.Abandoned = %d; want 1", s.Abandoned)
	}
}

// Retries wrap each LoadMany call as they wrap a LoadFunc call.
func TestGetManyRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{fail: func(n int) error {
			if n == 1 {
				return errBoom
			}
			return nil
		}}
		var events eventLog
		l := newManyLoader(t, &downstream{}, m, Options[string, string]{
			Retry: Retry{MaxAttempts: 2, InitialInterval: time.Millisecond}, OnLoad: events.add,
		})
		got, err := l.GetMany(context.Background(), []string{"a", "b"})
		if err != nil || got["a"] != "a@2" || got["b"] != "b@2" {
			t.Fatalf("GetMany = %v, %v; want the second attempt's values", got, err)
		}
		synctest.Wait() // OnLoad runs after the waiters wake
		if evs := events.all(); len(evs) != 1 || evs[0].Attempts != 2 || evs[0].Keys != 2 {
			t.Fatalf("LoadEvents %+v; want one, with 2 attempts and 2 keys", evs)
		}
	})
}

// Rule 5 and 15: the stale keys one GetMany finds are returned at once and
// refreshed by one background LoadMany call.
func TestGetManyRefreshesStaleInOneBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		l := newManyLoader(t, &downstream{}, m, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Hour})
		ctx := context.Background()
		keys := keyRange("k", 5)
		if _, err := l.GetMany(ctx, keys); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		got, err := l.GetMany(ctx, keys)
		if err != nil || got["k0"] != "k0@1" {
			t.Fatalf("GetMany of stale keys = %v, %v; want the stale values at once", got, err)
		}
		synctest.Wait()
		calls := m.all()
		if len(calls) != 2 || len(calls[1]) != 5 {
			t.Fatalf("LoadMany calls %v; want the refresh of all 5 keys in one", calls)
		}
		if s := l.Stats(); s.StaleHits != 5 || s.Refreshes != 1 || s.BatchLoads != 2 {
			t.Fatalf("Stats = %+v; want 5 stale hits, 1 refresh (the batch), 2 batches", s)
		}
		if v, _ := l.Get(ctx, "k3"); v != "k3@2" {
			t.Fatalf("Get(k3) = %q after the refresh; want k3@2", v)
		}
	})
}

// EarlyRefresh in a GetMany: fresh keys with no refresh due are answered
// as hits with their age, and load nothing; once their refresh is due they
// are still answered as hits, at once, and refreshed by one background
// LoadMany call.
func TestGetManyEarlyRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &many{}
		d := &downstream{}
		// A load takes 100ms, so each key's refresh starts between 100ms
		// and half its life (500ms) before it expires.
		slow := func(ctx context.Context, keys []string) (map[string]string, error) {
			time.Sleep(100 * time.Millisecond)
			return m.load(ctx, keys)
		}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, EarlyRefresh: 1, LoadMany: slow})
		ctx := context.Background()
		keys := []string{"a", "b"}
		if _, err := l.GetMany(ctx, keys); err != nil {
			t.Fatal(err)
		}
		time.Sleep(450 * time.Millisecond) // 450ms old, fresh until 1s: no refresh due yet
		vals, infos, err := l.GetManyInfo(ctx, keys)
		if err != nil || vals["a"] != "a@1" || vals["b"] != "b@1" {
			t.Fatalf("GetManyInfo = %v, %v; want the values of the first call", vals, err)
		}
		for _, k := range keys {
			if infos[k] != (Info{Source: SourceHit, Age: 450 * time.Millisecond}) {
				t.Fatalf("Info[%s] = %+v; want a hit 450ms old", k, infos[k])
			}
		}
		synctest.Wait()
		if s := l.Stats(); s.Refreshes != 0 || s.InFlight != 0 {
			t.Fatalf("Stats = %+v before any refresh is due; want no refresh, nothing in flight", s)
		}
		time.Sleep(500 * time.Millisecond) // 950ms old: every refresh is due, the values still fresh
		vals, infos, err = l.GetManyInfo(ctx, keys)
		if err != nil || vals["a"] != "a@1" || infos["b"].Source != SourceHit {
			t.Fatalf("GetManyInfo = %v, %v, %v; want the fresh values at once, as hits", vals, infos, err)
		}
		time.Sleep(150 * time.Millisecond) // the refresh takes 100ms
		synctest.Wait()
		if calls := m.all(); len(calls) != 2 || len(calls[1]) != 2 {
			t.Fatalf("LoadMany calls %v; want the early refresh of both keys in one", calls)
		}
		if s := l.Stats(); s.Hits != 4 || s.Refreshes != 1 || s.BatchLoads != 2 {
			t.Fatalf("Stats = %+v; want 4 hits, 1 refresh (the batch), 2 batches", s)
		}
		if v, _ := l.Get(ctx, "b"); v != "b@2" {
			t.Fatalf("Get(b) = %q after the refresh; want b@2", v)
		}
	})
}

// A Get from inside LoadMany of a key of its own batch fails at once.
func TestGetManyRecursive(t *testing.T) {
	var l *Loader[string, string]
	var inner error
	l = newLoader(t, &downstream{}, Options[string, string]{
		LoadMany: func(ctx context.Context, keys []string) (map[string]string, error) {
			_, inner = l.Get(ctx, keys[len(keys)-1])
			return map[string]string{keys[0]: "v"}, nil
		},
	})
	if _, err := l.GetMany(context.Background(), []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, ErrRecursiveLoad) {
		t.Fatalf("Get inside LoadMany = %v; want ErrRecursiveLoad", inner)
	}
}

// Rule 8: Close stops a running batch; its keys get ErrClosed; GetMany
// after Close returns ErrClosed.
func TestGetManyClose(t *testing.T) {
	m := &many{gate: make(chan struct{}), started: make(chan []string, 1)}
	l := newManyLoader(t, &downstream{}, m, Options[string, string]{})
	done := make(chan error, 1)
	go func() {
		_, err := l.GetMany(context.Background(), []string{"a", "b"})
		done <- err
	}()
	recv(t, "the batch", m.started)
	l.Close()
	err := recv(t, "GetMany", done)
	var me *ManyError[string]
	if !errors.As(err, &me) || !errors.Is(me.Errs["a"], ErrClosed) || !errors.Is(me.Errs["b"], ErrClosed) {
		t.Fatalf("GetMany across Close: %v; want ErrClosed for each key", err)
	}
	if _, err := l.GetMany(context.Background(), []string{"a"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetMany after Close: %v; want ErrClosed", err)
	}
}

// Rule 16: Peek returns fresh and stale values, nothing else, never loads,
// sees a value a Get returned at once (the writer held), and counts only
// in Stats.Peeks.
func TestPeek(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Second, NotFoundTTL: time.Minute})
		ctx := context.Background()
		if _, _, ok := l.Peek("a"); ok {
			t.Fatal("Peek of an unknown key found something")
		}
		release := holdWriter(t)
		v, _ := l.Get(ctx, "a")
		if pv, info, ok := l.Peek("a"); !ok || pv != v || info.Source != SourceHit {
			t.Fatalf("Peek after Get = %q, %v, %v; want %q, a hit (the write is still pending)", pv, info.Source, ok, v)
		}
		release()
		time.Sleep(1500 * time.Millisecond)
		if pv, info, ok := l.Peek("a"); !ok || pv != v || info.Source != SourceStale {
			t.Fatalf("Peek of a stale value = %q, %v, %v; want it, stale", pv, info.Source, ok)
		}
		time.Sleep(time.Second)
		if _, _, ok := l.Peek("a"); ok {
			t.Fatal("Peek returned a value past StaleWhileRevalidate")
		}
		synctest.Wait()
		if d.calls.Load() != 1 {
			t.Fatalf("%d loads; Peek must never load or refresh", d.calls.Load())
		}
		d.fail = func(int64, string) error { return ErrNotFound }
		l.Get(ctx, "missing")
		if _, _, ok := l.Peek("missing"); ok {
			t.Fatal("Peek returned a cached not-found as a value")
		}
		if s := l.Stats(); s.Peeks != 5 || s.Gets != 2 {
			t.Fatalf("Stats = %+v; want 5 Peeks, 2 Gets", s)
		}
	})
}

// ManyError's message names the count and the distinct errors, in a stable
// order.
func TestManyErrorMessage(t *testing.T) {
	e := &ManyError[int]{Errs: map[int]error{1: errBoom, 2: errBoom, 3: ErrBreakerOpen}}
	want := "flightcache: 3 of the keys failed: boom; flightcache: circuit breaker open"
	if e.Error() != want {
		t.Fatalf("Error() = %q; want %q", e.Error(), want)
	}
	if !errors.Is(e, ErrBreakerOpen) || !errors.Is(e, errBoom) {
		t.Fatal("errors.Is does not see the keys' errors")
	}
	if got := len(slices.Collect(maps.Keys(e.Errs))); got != 3 {
		t.Fatal(got)
	}
}

// fakeRemoteMany is fakeRemote with a batch path: the keys it shares are
// answered from it, the others loaded in one call, with the older value
// offered on a failure.
type fakeRemoteMany struct {
	fakeRemote
	batches [][]string // the keys each LoadMany passed to load
}

func (r *fakeRemoteMany) LoadMany(ctx context.Context, keys []string, load func(context.Context, []string) (map[string]string, error)) map[string]RemoteResult[string] {
	out := map[string]RemoteResult[string]{}
	var need []string
	r.mu.Lock()
	for _, k := range keys {
		if rv, ok := r.shared[k]; ok && time.Since(rv.LoadedAt) < time.Minute {
			out[k] = RemoteResult[string]{RemoteValue: rv}
		} else {
			need = append(need, k)
		}
	}
	r.batches = append(r.batches, need)
	r.mu.Unlock()
	if len(need) == 0 {
		return out
	}
	m, err := load(ctx, need)
	for _, k := range need {
		switch v, ok := m[k]; {
		case err != nil:
			r.mu.Lock()
			out[k] = RemoteResult[string]{RemoteValue: r.shared[k], Err: err} // an older value, if any, covers it
			r.mu.Unlock()
		case ok:
			out[k] = RemoteResult[string]{RemoteValue: RemoteValue[string]{Value: v, LoadedAt: time.Now(), Loaded: true}}
		default:
			out[k] = RemoteResult[string]{Err: ErrNotFound}
		}
	}
	return out
}

// A Remote that implements RemoteMany serves GetMany's batches: the keys
// the tier has come from it, the others go down in one LoadMany call, and
// a failure is covered by the tier's older value under StaleIfError.
func TestGetManyThroughRemoteMany(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRemoteMany{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{
			"peer": {Value: "from-peer", LoadedAt: time.Now().Add(-2 * time.Second)},
			"old":  {Value: "old-value", LoadedAt: time.Now().Add(-2 * time.Minute)},
		}}}
		fail := false
		m := &many{absent: map[string]bool{"gone": true}, fail: func(int) error {
			if fail {
				return errBoom
			}
			return nil
		}}
		l := newManyLoader(t, &downstream{}, m, Options[string, string]{TTL: time.Minute, StaleIfError: time.Hour, Remote: r})
		ctx := context.Background()
		got, err := l.GetMany(ctx, []string{"peer", "a", "gone"})
		if err != nil || got["peer"] != "from-peer" || got["a"] != "a@1" || len(got) != 2 {
			t.Fatalf("GetMany = %v, %v; want peer from the tier, a loaded, gone absent", got, err)
		}
		if _, info, _ := l.GetInfo(ctx, "peer"); info.Age != 2*time.Second {
			t.Errorf("the tier's value is %v old here; want its age in the tier, 2s", info.Age)
		}
		if calls := m.all(); len(calls) != 1 || !slices.Equal(calls[0], []string{"a", "gone"}) {
			t.Fatalf("LoadMany calls %v; want one, for a and gone", calls)
		}
		fail = true
		got, err = l.GetMany(ctx, []string{"old", "b"})
		var me *ManyError[string]
		if got["old"] != "old-value" || !errors.As(err, &me) || len(me.Errs) != 1 || !errors.Is(me.Errs["b"], errBoom) {
			t.Fatalf("GetMany with a failing batch = %v, %v; want old covered by the tier's value, b failed", got, err)
		}
		if s := l.Stats(); s.BatchLoads != 2 || s.StaleOnError != 1 {
			t.Fatalf("Stats = %+v; want 2 batches, 1 stale-on-error", s)
		}
	})
}

// With Options.Reload, the stale keys one GetMany finds are reloaded one by
// one (each needs its own value held), each taking its own MaxRefreshes
// place: here one place, so one reload and two refreshes dropped.
func TestGetManyRefreshWithReloadHonoursMaxRefreshes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var release sync.Once
		defer release.Do(func() { close(gate) }) // before Close, which waits for the reloads
		var reloads atomic.Int32
		l := newManyLoader(t, &downstream{}, &many{}, Options[string, string]{
			TTL: time.Second, StaleWhileRevalidate: time.Minute, MaxRefreshes: 1,
			Reload: func(ctx context.Context, key, old string) (string, error) {
				reloads.Add(1)
				<-gate
				return old + "+", nil
			},
		})
		ctx := context.Background()
		keys := keyRange("k", 3)
		if _, err := l.GetMany(ctx, keys); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if got, err := l.GetMany(ctx, keys); err != nil || len(got) != 3 {
			t.Fatalf("GetMany of stale keys = %v, %v", got, err)
		}
		synctest.Wait()
		if n, s := reloads.Load(), l.Stats(); n != 1 || s.RefreshesDropped != 2 || s.Refreshes != 1 {
			t.Fatalf("%d reloads running, Stats %+v; want 1 (MaxRefreshes), 2 dropped", n, s)
		}
		release.Do(func() { close(gate) })
		synctest.Wait()
		if s := l.Stats(); s.InFlight != 0 {
			t.Fatalf("Stats = %+v after the reload", s)
		}
	})
}

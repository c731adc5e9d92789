package flightcache

// Regression tests: the caller's context is the caller's code, and its
// Value, Done or Err may panic (a caller that recovers, as net/http does,
// goes on using the Loader). The panic must reach the caller and leave
// nothing of the Loader's behind (docs/design.md rule 23). Each test failed
// before its fix: a Get or a GetMany left counted in (Close waited for it
// forever), a GetMany's loads left published and never launched (Gets of
// those keys waited for them until their deadline), a shard lock left held
// (start called Done under it: Gets of every key of the shard hung, and so
// did Close), a waiter left counted (Stats.Waiting).
//
// Real clock, like TestPanickingKeyReleasesShardLock: before the fixes, Gets
// blocked on a shard mutex the panic had left locked, which a synctest
// bubble does not count as durably blocked, so a bubble's clock would never
// end the wait. Every bound is many times what a quiet run needs; it only
// runs out when something hangs.

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// trapped is what a trapCtx panics with.
const trapped = "trapped context"

// trapCtx is a caller's context whose Value (of one key), Done or Err
// panics from the call after the first pass such calls on, as a context
// type of the caller's own may.
type trapCtx struct {
	context.Context
	key   any   // Value(key) panics; nil: Value never does
	done  bool  // Done panics
	err   bool  // Err panics
	pass  int32 // trapped calls that get through first
	calls atomic.Int32
}

// keyRead returns the first key read asks a context for: the key of a
// context value that another package keeps unexported.
func keyRead(read func(context.Context)) any {
	rec := &keyRecorder{Context: context.Background()}
	read(rec)
	return rec.key
}

// keyRecorder records the first key a reader asks it for.
type keyRecorder struct {
	context.Context
	key any
}

func (c *keyRecorder) Value(key any) any {
	if c.key == nil {
		c.key = key
	}
	return c.Context.Value(key)
}

func (c *trapCtx) trip() {
	if c.calls.Add(1) > c.pass {
		panic(trapped)
	}
}

func (c *trapCtx) Value(key any) any {
	if c.key != nil && key == c.key {
		c.trip()
	}
	return c.Context.Value(key)
}

func (c *trapCtx) Done() <-chan struct{} {
	if c.done {
		c.trip()
	}
	return c.Context.Done()
}

func (c *trapCtx) Err() error {
	if c.err {
		c.trip()
	}
	return c.Context.Err()
}

// trapRig is a Loader for these tests. Values are "v:" + key. A key that
// starts with "held" loads only once release is closed; one that starts
// with "stale" is fresh for a nanosecond, then stale for an hour. With
// aged, a Remote serves a key that starts with "early" as loaded 40
// minutes ago (fresh for 20 more, and past its early refresh); with
// batched, GetMany loads through LoadMany. MaxRefreshes is 1, so a
// refresh place left taken stops every refresh.
type trapRig struct {
	l       *Loader[string, string]
	release chan struct{}
	once    sync.Once
	entered chan string     // the "held" keys whose load has begun
	first   []<-chan result // Gets of the setup still waiting: checkWhole waits for them
}

type rigOptions struct{ aged, batched bool }

func newTrapRig(t *testing.T, o rigOptions) *trapRig {
	t.Helper()
	r := &trapRig{release: make(chan struct{}), entered: make(chan string, 64)}
	hold := func(ctx context.Context, key string) error {
		if !strings.HasPrefix(key, "held") {
			return nil
		}
		select {
		case r.entered <- key:
		default:
		}
		select {
		case <-r.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	opts := Options[string, string]{
		TTL:                  time.Hour,
		StaleWhileRevalidate: time.Hour,
		MaxRefreshes:         1,
		Breaker:              Breaker{Disabled: true},
		Freshness: func(key, _ string) Freshness {
			if strings.HasPrefix(key, "stale") {
				return Freshness{TTL: time.Nanosecond}
			}
			return Freshness{}
		},
	}
	if o.aged {
		opts.EarlyRefresh = 1
		opts.Remote = agedRemote{}
	}
	if o.batched {
		opts.LoadMany = func(ctx context.Context, keys []string) (map[string]string, error) {
			m := make(map[string]string, len(keys))
			for _, k := range keys {
				if err := hold(ctx, k); err != nil {
					return nil, err
				}
				m[k] = "v:" + k
			}
			return m, nil
		}
	}
	l, err := New(func(ctx context.Context, key string) (string, error) {
		if err := hold(ctx, key); err != nil {
			return "", err
		}
		return "v:" + key, nil
	}, opts)
	if err != nil {
		t.Fatal(err)
	}
	r.l = l
	t.Cleanup(func() {
		r.free()
		closeWithin(t, l)
	})
	return r
}

// free lets the loads of the "held" keys finish.
func (r *trapRig) free() { r.once.Do(func() { close(r.release) }) }

// agedRemote serves the "early" keys as loaded 40 minutes ago, by a load
// that took an hour: with a TTL of an hour and EarlyRefresh, such a value
// is fresh for 20 more minutes and due its early refresh (whose lead is
// capped at half the TTL). It loads every other key as it stands.
type agedRemote struct{}

func (agedRemote) Load(ctx context.Context, key string, load func(context.Context) (string, error)) (RemoteValue[string], error) {
	v, err := load(ctx)
	if strings.HasPrefix(key, "early") {
		return RemoteValue[string]{Value: v, LoadedAt: time.Now().Add(-40 * time.Minute), Took: time.Hour}, err
	}
	return RemoteValue[string]{Value: v, LoadedAt: time.Now(), Loaded: true}, err
}

func (agedRemote) Set(context.Context, string, RemoteValue[string]) {}
func (agedRemote) Invalidate(context.Context, string)               {}

// closeWithin closes l, and fails the test if Close has not returned
// within 10s.
func closeWithin(t *testing.T, l *Loader[string, string]) {
	t.Helper()
	closed := make(chan struct{})
	go func() { l.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Errorf("Close has not returned after 10s: something is left counted in, or a shard lock held")
	}
}

// load fills key with a Get and waits until the cache holds it, so that
// the next Get of key finds it in the cache.
func (r *trapRig) load(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := r.l.Get(ctx, k)
		cancel()
		if err != nil {
			t.Fatalf("Get(%q): %v", k, err)
		}
		writesApplied(t, r.l, k)
	}
}

// trapCase is one call under a trapped context.
type trapCase struct {
	name  string
	rig   rigOptions
	setup func(t *testing.T, r *trapRig)
	ctx   *trapCtx
	call  func(l *Loader[string, string], ctx context.Context)
	keys  []string // the keys the call was for: Gets of them must work after
	// mayReturn: the call may return rather than panic (after the fix the
	// Loader reads nothing from the context at the point trapped).
	mayReturn bool
}

func get(key string) func(*Loader[string, string], context.Context) {
	return func(l *Loader[string, string], ctx context.Context) { l.Get(ctx, key) }
}

func getMany(keys ...string) func(*Loader[string, string], context.Context) {
	return func(l *Loader[string, string], ctx context.Context) { l.GetMany(ctx, keys) }
}

func runTrapCases(t *testing.T, cases []trapCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newTrapRig(t, tc.rig)
			if tc.setup != nil {
				tc.setup(t, r)
			}
			panicked := make(chan any, 1)
			go func() {
				defer func() { panicked <- recover() }()
				tc.call(r.l, tc.ctx)
			}()
			var got any
			select {
			case got = <-panicked:
			case <-time.After(10 * time.Second):
				t.Fatal("the call has neither returned nor panicked after 10s")
			}
			switch {
			case got == nil && !tc.mayReturn:
				t.Errorf("the call returned; want the context's panic to reach the caller")
			case got != nil && got != trapped:
				t.Errorf("the call panicked with %v; want the context's own panic (%q)", got, trapped)
			}
			r.checkWhole(t, tc.keys)
		})
	}
}

// checkWhole checks that nothing of the Loader's was left behind: Gets of
// keys and of 256 other keys, cold, each with a deadline, all return their
// values (no shard lock held, no load left unlaunched); the Stats balance
// (Gets = Hits + StaleHits + Misses + Closed, nobody Waiting); a background
// refresh can still start (none left holding the one MaxRefreshes permit,
// nor an entry marked as refreshing); Close returns.
func (r *trapRig) checkWhole(t *testing.T, keys []string) {
	t.Helper()
	r.free()
	l := r.l
	for _, ch := range r.first {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("a Get of the setup has not returned 10s after the loads were let go")
		}
	}
	refreshes := l.Stats().Refreshes
	all := append(keyRange("other", 256), keys...)
	type got struct {
		key, v string
		err    error
	}
	results := make(chan got, len(all))
	for _, k := range all {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			v, err := l.Get(ctx, k)
			results <- got{k, v, err}
		}()
	}
	timeout := time.After(15 * time.Second)
	for n := range all {
		select {
		case g := <-results:
			if g.err != nil || g.v != "v:"+g.key {
				t.Errorf("Get(%q) = %q, %v; want %q", g.key, g.v, g.err, "v:"+g.key)
			}
		case <-timeout:
			t.Fatalf("%d of %d Gets (each with a 5s deadline) have not returned after 15s", len(all)-n, len(all))
		}
	}
	for _, k := range keys {
		l.Refresh(context.Background(), k)
	}
	s := l.Stats()
	if s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed || s.Waiting != 0 || s.Canceled > s.Misses {
		t.Errorf("Stats = %+v; want Gets = Hits + StaleHits + Misses + Closed, Canceled <= Misses, nobody Waiting", s)
	}
	if len(keys) > 0 && s.Refreshes == refreshes {
		t.Errorf("no background refresh started (Refreshes %d, RefreshesDropped %d): the MaxRefreshes permit, or an entry, is left reserved",
			s.Refreshes, s.RefreshesDropped)
	}
	closeWithin(t, l)
}

// A context whose Value panics, read by a Get or a GetMany after it had
// counted itself in (WithRevalidate on the hit path, the max-stale of a
// stale value, the load marker), left it counted in: Close then waited for
// it forever, and a GetMany left the loads it had already published never
// launched, so Gets of those keys waited for them until their deadline.
// Each case ends in checkWhole (docs/design.md rules 8 and 19).
func TestContextValuePanicCountsGetOut(t *testing.T) {
	_ = WithRevalidate(context.Background()) // Gets look for WithRevalidate once it has been used
	bg := context.Background()
	trap := func(ctx context.Context, key any, pass int32) *trapCtx {
		return &trapCtx{Context: ctx, key: key, pass: pass}
	}
	maxStaleKey := keyRead(func(ctx context.Context) { remote.MaxStale(ctx) }) // the key WithMaxStale sets
	loadHit := func(t *testing.T, r *trapRig) { r.load(t, "hit") }
	loadStale := func(t *testing.T, r *trapRig) { r.load(t, "stale1", "stale2") }
	runTrapCases(t, []trapCase{
		{name: "Get/hit", setup: loadHit, ctx: trap(bg, revalidateKey{}, 0), call: get("hit"), keys: []string{"hit"}},
		{name: "Get/revalidating", setup: loadHit, ctx: trap(WithRevalidate(bg), loadKey{}, 0), call: get("hit"), keys: []string{"hit"}},
		{name: "Get/max-stale", setup: loadStale, ctx: trap(bg, maxStaleKey, 0), call: get("stale1"), keys: []string{"stale1"}},
		{name: "Get/miss", ctx: trap(bg, loadKey{}, 0), call: get("cold"), keys: []string{"cold"}},
		{name: "GetMany/revalidating", setup: loadHit, ctx: trap(bg, revalidateKey{}, 0), call: getMany("hit", "a"), keys: []string{"hit", "a"}},
		{name: "GetMany/max-stale", setup: loadStale, ctx: trap(bg, maxStaleKey, 0), call: getMany("stale1", "stale2", "a"), keys: []string{"stale1", "stale2", "a"}},
		{name: "GetMany/miss", ctx: trap(bg, loadKey{}, 0), call: getMany("a", "b", "c"), keys: []string{"a", "b", "c"}},
		{name: "GetMany/LoadMany/miss", rig: rigOptions{batched: true}, ctx: trap(bg, loadKey{}, 0), call: getMany("a", "b", "c"), keys: []string{"a", "b", "c"}},
		// The first key's load is published in the batch before the
		// second key's join reads the marker again; after the fix the
		// marker is read once, before anything is published, and the
		// call returns.
		{name: "GetMany/LoadMany/published", rig: rigOptions{batched: true}, ctx: trap(bg, loadKey{}, 1), call: getMany("a", "b", "c"), keys: []string{"a", "b", "c"}, mayReturn: true},
		{name: "GetMany/LoadMany/max-stale", rig: rigOptions{batched: true}, setup: loadStale, ctx: trap(bg, maxStaleKey, 0), call: getMany("a", "stale1", "stale2"), keys: []string{"a", "stale1", "stale2"}},
	})
}

// A context whose Done panics: start read Done under the shard lock, to
// know whether the load's context must drop the caller's cancellation, and
// the panic left the lock held, so every Get of a key of that shard hung
// whatever its deadline, and so did Close (docs/design.md rules 17 and
// 19); a Get joining a load in flight read Done after counting itself as
// waiting (Stats.Waiting stayed one too high). The early refresh of a hit,
// the refresh of a stale value, a GetMany's loads and Refresh all went
// through start.
func TestContextDonePanicReleasesShardLock(t *testing.T) {
	bg := context.Background()
	trap := func() *trapCtx { return &trapCtx{Context: bg, done: true} }
	runTrapCases(t, []trapCase{
		{name: "Get/miss", ctx: trap(), call: get("cold"), keys: []string{"cold"}},
		{name: "Get/joined", setup: func(t *testing.T, r *trapRig) {
			r.first = append(r.first, getAsync(bg, r.l, "held"))
			select {
			case <-r.entered: // the load the trapped Get joins is in flight
			case <-time.After(10 * time.Second):
				t.Fatal("the load of held has not begun after 10s")
			}
		}, ctx: trap(), call: get("held"), keys: []string{"held"}},
		{name: "Get/early-refresh", rig: rigOptions{aged: true}, setup: func(t *testing.T, r *trapRig) { r.load(t, "early") },
			ctx: trap(), call: get("early"), keys: []string{"early"}},
		{name: "Get/stale", setup: func(t *testing.T, r *trapRig) { r.load(t, "stale") }, ctx: trap(), call: get("stale"), keys: []string{"stale"}},
		{name: "GetMany/miss", ctx: trap(), call: getMany("a", "b", "c"), keys: []string{"a", "b", "c"}},
		{name: "GetMany/LoadMany/miss", rig: rigOptions{batched: true}, ctx: trap(), call: getMany("a", "b", "c"), keys: []string{"a", "b", "c"}},
		{name: "GetMany/LoadMany/stale", rig: rigOptions{batched: true}, setup: func(t *testing.T, r *trapRig) { r.load(t, "stale1", "stale2") },
			ctx: trap(), call: getMany("stale1", "stale2"), keys: []string{"stale1", "stale2"}},
		{name: "Refresh/cold", ctx: trap(), call: func(l *Loader[string, string], ctx context.Context) { l.Refresh(ctx, "cold") }, keys: []string{"cold"}},
		{name: "Refresh/held", setup: func(t *testing.T, r *trapRig) { r.load(t, "hit") },
			ctx: trap(), call: func(l *Loader[string, string], ctx context.Context) { l.Refresh(ctx, "hit") }, keys: []string{"hit"}},
	})
}

// A context whose Err panics, read by a Get or GetMany that left its wait
// because the context had ended: a GetMany read it after leaving its first
// key's load and before the others', and left the rest counted in (Close
// waited for them forever) and counted as waiting (docs/design.md rule
// 19).
func TestContextErrPanicCountsGetManyOut(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	trap := func() *trapCtx { return &trapCtx{Context: ended, err: true} }
	runTrapCases(t, []trapCase{
		{name: "Get", ctx: trap(), call: get("held"), keys: []string{"held"}},
		{name: "GetMany", ctx: trap(), call: getMany("held1", "held2", "held3"), keys: []string{"held1", "held2", "held3"}},
		{name: "GetMany/LoadMany", rig: rigOptions{batched: true}, ctx: trap(), call: getMany("held1", "held2", "held3"), keys: []string{"held1", "held2", "held3"}},
	})
}

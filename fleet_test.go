package flightcache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// watchingRemote is a Remote that passes every load through and keeps the
// LocalCache the Loader hands it, as a tier that hears the fleet's writes does.
type watchingRemote struct {
	mu          sync.Mutex
	local       LocalCache[string]
	watches     int
	invalidated []string
	panicWatch  bool
}

func (r *watchingRemote) Watch(local LocalCache[string]) {
	if r.panicWatch {
		panic("watch")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.local = local
	r.watches++
}

func (r *watchingRemote) Load(ctx context.Context, _ string, load func(context.Context) (string, error)) (RemoteValue[string], error) {
	v, err := load(ctx)
	return RemoteValue[string]{Value: v, LoadedAt: time.Now(), Loaded: true}, err
}

func (r *watchingRemote) LoadMany(ctx context.Context, keys []string, load func(context.Context, []string) (map[string]string, error)) map[string]RemoteResult[string] {
	m, err := load(ctx, keys)
	out := make(map[string]RemoteResult[string], len(keys))
	for _, k := range keys {
		v, ok := m[k]
		switch {
		case err != nil:
			out[k] = RemoteResult[string]{Err: err}
		case ok:
			out[k] = RemoteResult[string]{RemoteValue: RemoteValue[string]{Value: v, LoadedAt: time.Now(), Loaded: true}}
		}
	}
	return out
}

func (r *watchingRemote) Set(context.Context, string, RemoteValue[string]) {}

func (r *watchingRemote) Invalidate(_ context.Context, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.invalidated = append(r.invalidated, key)
}

func (r *watchingRemote) the() LocalCache[string] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.local
}

func newWatched(t *testing.T, d *downstream, opts Options[string, string]) (*Loader[string, string], *watchingRemote) {
	t.Helper()
	r := &watchingRemote{}
	opts.Remote = r
	l := newLoader(t, d, opts)
	if r.watches != 1 || r.the() == nil {
		t.Fatalf("New called Watch %d times, want 1 with a LocalCache", r.watches)
	}
	return l, r
}

// Rule 18: a Drop from the Remote forgets the local copy, without telling
// the Remote (the write came from it); the next Get loads.
func TestRemoteDropForgetsTheLocalCopy(t *testing.T) {
	d := &downstream{}
	l, r := newWatched(t, d, Options[string, string]{})
	ctx := context.Background()
	v1, _ := l.Get(ctx, "k")
	r.the().Drop("k")
	v2, info, err := l.GetInfo(ctx, "k")
	if err != nil || v2 == v1 || info.Source != SourceLoaded {
		t.Fatalf("Get after Drop = %q, %v, %v; want a new load (was %q)", v2, info.Source, err, v1)
	}
	if n := d.count("k"); n != 2 {
		t.Fatalf("downstream calls = %d, want 2", n)
	}
	if len(r.invalidated) != 0 {
		t.Fatalf("Drop told the Remote: Invalidate(%v)", r.invalidated)
	}
	if s := l.Stats(); s.RemoteDrops != 1 {
		t.Fatalf("RemoteDrops = %d, want 1", s.RemoteDrops)
	}
	l.Invalidate("k") // the Loader's own Invalidate still reaches the Remote
	if len(r.invalidated) != 1 {
		t.Fatalf("Invalidate reached the Remote %d times, want 1", len(r.invalidated))
	}
}

// Rule 18 with rule 6: a load in flight when the Drop comes answers its own
// waiters but does not fill the cache.
func TestRemoteDropDetachesTheLoadInFlight(t *testing.T) {
	d := &downstream{gate: make(chan struct{}), started: make(chan string, 4)}
	l, r := newWatched(t, d, Options[string, string]{})
	ctx := context.Background()
	first := getAsync(ctx, l, "k")
	recv(t, "the first load", d.started)
	r.the().Drop("k")
	send(t, "the first load's release", d.gate, struct{}{})
	if res := recv(t, "the first Get", first); res.err != nil {
		t.Fatalf("the waiter of the dropped load got %v", res.err)
	}
	next := getAsync(ctx, l, "k")
	recv(t, "the second load", d.started)
	send(t, "the second load's release", d.gate, struct{}{})
	if res := recv(t, "the second Get", next); res.err != nil || res.info.Source != SourceLoaded {
		t.Fatalf("Get after the dropped load = %+v; want a new load", res)
	}
	if n := d.count("k"); n != 2 {
		t.Fatalf("downstream calls = %d, want 2", n)
	}
}

// Rule 18: after Distrust, no copy held before it is served as it stands:
// each key's next Get waits for one load (Rereads), Peek does not see it,
// and what is loaded or Set afterwards is trusted again.
func TestDistrustRereadsEveryCopy(t *testing.T) {
	d := &downstream{}
	l, r := newWatched(t, d, Options[string, string]{StaleWhileRevalidate: time.Hour})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		l.Get(ctx, k)
	}
	if _, _, ok := l.Peek("a"); !ok {
		t.Fatal("Peek(a) before Distrust found nothing")
	}
	r.the().Distrust()
	if _, _, ok := l.Peek("a"); ok {
		t.Fatal("Peek(a) served a distrusted copy")
	}
	l.Set("c", "set") // after Distrust: trusted
	for range 3 {
		l.Get(ctx, "a")
	}
	_, info, _ := l.GetInfo(ctx, "b")
	if info.Source != SourceLoaded {
		t.Fatalf("first Get(b) after Distrust: %v, want loaded", info.Source)
	}
	if v, info, _ := l.GetInfo(ctx, "c"); v != "set" || info.Source != SourceHit {
		t.Fatalf("Get(c) after a Set that followed Distrust = %q, %v; want the Set value, a hit", v, info.Source)
	}
	if d.count("a") != 2 || d.count("b") != 2 || d.count("c") != 1 {
		t.Fatalf("downstream calls a, b, c = %d, %d, %d; want 2, 2, 1", d.count("a"), d.count("b"), d.count("c"))
	}
	s := l.Stats()
	if s.Distrusts != 1 || s.Rereads != 2 {
		t.Fatalf("Distrusts, Rereads = %d, %d; want 1, 2", s.Distrusts, s.Rereads)
	}
	if s.Gets != s.Hits+s.StaleHits+s.Misses+s.Closed {
		t.Fatalf("Gets %d != Hits %d + StaleHits %d + Misses %d + Closed %d", s.Gets, s.Hits, s.StaleHits, s.Misses, s.Closed)
	}
}

// Rule 18: a load that started before Distrust may carry what the fleet
// has since overwritten: its waiters get it, but the copy it leaves is
// distrusted too.
func TestDistrustCoversTheLoadInFlight(t *testing.T) {
	d := &downstream{gate: make(chan struct{}), started: make(chan string, 4)}
	l, r := newWatched(t, d, Options[string, string]{})
	ctx := context.Background()
	first := getAsync(ctx, l, "k")
	recv(t, "the first load", d.started)
	r.the().Distrust()
	send(t, "the first load's release", d.gate, struct{}{})
	if res := recv(t, "the first Get", first); res.err != nil {
		t.Fatalf("the waiter got %v", res.err)
	}
	next := getAsync(ctx, l, "k")
	recv(t, "a second load", d.started) // a second load: the first one's copy is distrusted
	send(t, "the second load's release", d.gate, struct{}{})
	if res := recv(t, "the second Get", next); res.err != nil || res.info.Source != SourceLoaded {
		t.Fatalf("Get after the distrusted load = %+v; want a new load", res)
	}
	if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceHit {
		t.Fatalf("third Get: %v, want a hit", info.Source)
	}
}

// Rule 18 with rules 13 and 14: the reread of a distrusted copy is
// revalidated by Reload with the old value, and the old value covers its
// failure within StaleIfError.
func TestDistrustedCopyIsReloadedAndCovers(t *testing.T) {
	d := &downstream{}
	var olds []string
	var mu sync.Mutex
	fail := false
	l, r := newWatched(t, d, Options[string, string]{
		StaleIfError: time.Hour,
		Reload: func(ctx context.Context, key, old string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			olds = append(olds, old)
			if fail {
				return "", errBoom
			}
			return "", ErrNotModified
		},
	})
	ctx := context.Background()
	v, _ := l.Get(ctx, "k")
	r.the().Distrust()
	if got, _ := l.Get(ctx, "k"); got != v {
		t.Fatalf("Get after Distrust = %q, want %q kept (not modified)", got, v)
	}
	mu.Lock()
	fail = true
	mu.Unlock()
	r.the().Distrust()
	got, info, err := l.GetInfo(ctx, "k")
	if err != nil || got != v || info.Source != SourceStaleOnError {
		t.Fatalf("Get after a failed reread = %q, %v, %v; want %q stale-on-error", got, info.Source, err, v)
	}
	if len(olds) != 2 || olds[0] != v || olds[1] != v {
		t.Fatalf("Reload got old values %q, want [%q %q]", olds, v, v)
	}
}

// Rule 18 with rule 15: GetMany rereads distrusted keys through one batch.
func TestGetManyRereadsDistrustedKeys(t *testing.T) {
	var mu sync.Mutex
	var batches [][]string
	loadMany := func(_ context.Context, keys []string) (map[string]string, error) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, append([]string(nil), keys...))
		m := map[string]string{}
		for _, k := range keys {
			m[k] = k + "!"
		}
		return m, nil
	}
	l, r := newWatched(t, &downstream{}, Options[string, string]{LoadMany: loadMany})
	ctx := context.Background()
	keys := []string{"a", "b", "c"}
	if _, err := l.GetMany(ctx, keys); err != nil {
		t.Fatal(err)
	}
	r.the().Distrust()
	m, err := l.GetMany(ctx, keys)
	if err != nil || len(m) != 3 {
		t.Fatalf("GetMany after Distrust = %v, %v", m, err)
	}
	if len(batches) != 2 || len(batches[1]) != 3 {
		t.Fatalf("LoadMany calls = %v; want a second one with all 3 keys", batches)
	}
	if s := l.Stats(); s.Rereads != 3 {
		t.Fatalf("Rereads = %d, want 3", s.Rereads)
	}
}

// A LocalCache outlives its Loader harmlessly, and a Watch that panics fails New.
func TestLocalAfterCloseAndPanickingWatch(t *testing.T) {
	d := &downstream{}
	r := &watchingRemote{}
	l, err := New(d.load, Options[string, string]{TTL: time.Minute, Remote: r})
	if err != nil {
		t.Fatal(err)
	}
	l.Get(context.Background(), "k")
	l.Close()
	r.the().Drop("k")
	r.the().Distrust()
	if s := l.Stats(); s.RemoteDrops != 0 || s.Distrusts != 0 {
		t.Fatalf("after Close: RemoteDrops %d, Distrusts %d; want 0, 0", s.RemoteDrops, s.Distrusts)
	}

	_, err = New(d.load, Options[string, string]{TTL: time.Minute, Remote: &watchingRemote{panicWatch: true}})
	var pe *PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("New with a panicking Watch: %v, want a *PanicError", err)
	}
}

// Rule 18: a Get that starts after Distrust does not join a load that
// started before it (which may carry what the fleet has overwritten): it
// starts its own; the old load's waiters keep theirs.
func TestGetAfterDistrustDoesNotJoinAnOlderLoad(t *testing.T) {
	d := &downstream{gate: make(chan struct{}), started: make(chan string, 4)}
	l, r := newWatched(t, d, Options[string, string]{})
	ctx := context.Background()
	old := getAsync(ctx, l, "k")
	recv(t, "the old load", d.started)
	r.the().Distrust()
	fresh := getAsync(ctx, l, "k")
	recv(t, "a second load", d.started) // a second load, not a join
	send(t, "a load's release", d.gate, struct{}{})
	send(t, "the other load's release", d.gate, struct{}{})
	a, b := recv(t, "the old waiter's Get", old), recv(t, "the Get after Distrust", fresh)
	if a.err != nil || b.err != nil || a.v == b.v {
		t.Fatalf("old waiter %+v, new Get %+v; want two values from two loads", a, b)
	}
	if b.info.Source != SourceLoaded {
		t.Fatalf("the Get after Distrust: %v, want loaded (its own load)", b.info.Source)
	}
	if v, info, _ := l.GetInfo(ctx, "k"); v != b.v || info.Source != SourceHit {
		t.Fatalf("next Get = %q, %v; want the new load's %q, a hit", v, info.Source, b.v)
	}
	if s := l.Stats(); s.Rereads != 1 || s.Loads != 2 {
		t.Fatalf("Rereads %d, Loads %d; want 1, 2", s.Rereads, s.Loads)
	}
}

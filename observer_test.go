package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// journal is the calls the test observers made, in order, shared by the
// members of one Observers.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lines = append(j.lines, fmt.Sprintf(format, args...))
}

func (j *journal) String() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return strings.Join(j.lines, "; ")
}

// tagKey is the context key under which a test observer leaves its tag.
type tagKey string

// tagOf is the tag name left in ctx, or "-".
func tagOf(ctx context.Context, name string) string {
	if ctx == nil {
		return "nil"
	}
	if v, ok := ctx.Value(tagKey(name)).(string); ok {
		return v
	}
	return "-"
}

// noted is a plain Observer: it notes every call in its journal, and its
// LoadStart returns start(ctx), or ctx with its tag by default. It panics
// in the method named panics.
type noted struct {
	name   string
	j      *journal
	start  func(ctx context.Context) context.Context
	panics string
}

func (o *noted) maybePanic(method string) {
	if o.panics == method {
		panic(o.name + " panics in " + method)
	}
}

func (o *noted) LoadStart(ctx context.Context, ev LoadStartEvent[string]) context.Context {
	o.j.add("%s.LoadStart(%s)", o.name, ev.Key)
	o.maybePanic("LoadStart")
	if o.start != nil {
		return o.start(ctx)
	}
	return context.WithValue(ctx, tagKey(o.name), o.name)
}

func (o *noted) LoadEnd(ctx context.Context, ev LoadEvent[string]) {
	o.j.add("%s.LoadEnd(%s) own=%s", o.name, ev.Key, tagOf(ctx, o.name))
	o.maybePanic("LoadEnd")
}

func (o *noted) Waited(ctx context.Context, ev WaitEvent[string]) {
	o.j.add("%s.Waited(%s) own=%s", o.name, ev.Key, tagOf(ev.Load, o.name))
	o.maybePanic("Waited")
}

// capable is a noted with every optional capability.
type capable struct {
	noted
	stats func() Stats
}

func (o *capable) Attempt(ctx context.Context, ev AttemptEvent[string]) {
	o.j.add("%s.Attempt(%s, %d) own=%s", o.name, ev.Key, ev.Attempt, tagOf(ctx, o.name))
	o.maybePanic("Attempt")
}

func (o *capable) Evicted(ev EvictionEvent[string]) {
	o.j.add("%s.Evicted(%s, %v)", o.name, ev.Key, ev.Cause)
	o.maybePanic("Evicted")
}

func (o *capable) ObserveStats(stats func() Stats) {
	o.j.add("%s.ObserveStats", o.name)
	o.stats = stats
	o.maybePanic("ObserveStats")
}

// guarded returns a Loader whose guard the tests call observers through,
// closed at the end of the test.
func guarded(t *testing.T) *Loader[string, string] {
	t.Helper()
	l, err := New(func(ctx context.Context, key string) (string, error) { return key, nil }, Options[string, string]{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// loadContext returns a context standing for a load's: a marker and a
// deadline, as a load's context has.
func loadContext(t *testing.T) context.Context {
	ctx := context.WithValue(context.Background(), loadKey{}, &loadMarker{id: t.Name()})
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	t.Cleanup(cancel)
	return ctx
}

func TestObserversSkipsNilsAndFlattens(t *testing.T) {
	j := &journal{}
	a, b, c := &noted{name: "a", j: j}, &noted{name: "b", j: j}, &noted{name: "c", j: j}
	var typedNil *noted
	if o := Observers[string](); o != nil {
		t.Errorf("Observers() = %v; want nil", o)
	}
	if o := Observers[string](nil, typedNil, Observers[string]()); o != nil {
		t.Errorf("Observers(nil, (*noted)(nil), Observers()) = %v; want nil", o)
	}
	if o := Observers[string](nil, a, typedNil); o != a {
		t.Errorf("Observers(nil, a, nil) = %v; want a itself", o)
	}
	o := Observers[string](a, Observers[string](b, nil, c), nil)
	f, ok := o.(*fanout[string])
	if !ok {
		t.Fatalf("Observers(a, Observers(b, c)) is a %T; want a *fanout", o)
	}
	var names []string
	for _, m := range f.members {
		names = append(names, m.o.(*noted).name)
	}
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Errorf("members = %v; want [a b c], flattened", names)
	}
	if newObserving[string](nil, unguarded, nil) != nil || newObserving[string](typedNil, unguarded, nil) != nil {
		t.Errorf("newObserving of a nil Observer is not nil")
	}
}

// Each member is called in turn; LoadStart is chained, so the load's
// context holds every member's value, but every member gets back the
// context it returned itself.
func TestObserversFanOut(t *testing.T) {
	j := &journal{}
	a := &capable{noted: noted{name: "a", j: j}}
	b := &noted{name: "b", j: j} // no capabilities
	c := &capable{noted: noted{name: "c", j: j}}
	ob := newObserving(Observers[string](a, b, c), guarded(t).user.guard, func() Stats { return Stats{Gets: 7} })
	if got, want := j.String(), "a.ObserveStats; c.ObserveStats"; got != want {
		t.Errorf("at New: %s; want %s", got, want)
	}
	if a.stats == nil || a.stats().Gets != 7 {
		t.Fatalf("a was not handed the Stats")
	}
	j.lines = nil

	in := loadContext(t)
	ctx := ob.loadStart(in, LoadStartEvent[string]{Key: "k", Keys: 1})
	for _, name := range []string{"a", "b", "c"} {
		if tagOf(ctx, name) != name {
			t.Errorf("the load's context lacks %s's value", name)
		}
	}
	if ctx.Value(loadKey{}) != in.Value(loadKey{}) {
		t.Errorf("the load's context lost the load's marker")
	}
	ob.attempt(ctx, AttemptEvent[string]{Key: "k", Attempt: 1, Err: errors.New("boom"), Delay: time.Millisecond})
	ob.loadEnd(ctx, LoadEvent[string]{Key: "k"})
	ob.waited(context.Background(), WaitEvent[string]{Key: "k", Load: ctx})
	ob.waited(context.Background(), WaitEvent[string]{Key: "k"}) // left before the load started
	ob.evicted(EvictionEvent[string]{Key: "k", Cause: EvictionPolicy})
	want := strings.Join([]string{
		"a.LoadStart(k)", "b.LoadStart(k)", "c.LoadStart(k)",
		"a.Attempt(k, 1) own=a", "c.Attempt(k, 1) own=c",
		"a.LoadEnd(k) own=a", "b.LoadEnd(k) own=b", "c.LoadEnd(k) own=c",
		"a.Waited(k) own=a", "b.Waited(k) own=b", "c.Waited(k) own=c",
		"a.Waited(k) own=nil", "b.Waited(k) own=nil", "c.Waited(k) own=nil",
		"a.Evicted(k, policy)", "c.Evicted(k, policy)",
	}, "; ")
	if got := j.String(); got != want {
		t.Errorf("calls:\n%s\nwant:\n%s", got, want)
	}

	// a's own context has its value, not the values of the members after
	// it: b's LoadEnd must not see c's span as its own.
	f := ob.f
	if own := f.own(ctx, 0); tagOf(own, "a") != "a" || tagOf(own, "c") != "-" {
		t.Errorf("a's own context: a=%s c=%s; want a=a c=-", tagOf(own, "a"), tagOf(own, "c"))
	}
}

// The combined Observer, held as an Observer by a caller of its own,
// forwards the capabilities and calls its members unguarded.
func TestObserversExportedMethods(t *testing.T) {
	j := &journal{}
	a := &capable{noted: noted{name: "a", j: j}}
	b := &noted{name: "b", j: j}
	o := Observers[string](a, b)
	if _, ok := o.(StatsObserver); !ok {
		t.Fatalf("Observers(a, b) is no StatsObserver")
	}
	o.(StatsObserver).ObserveStats(func() Stats { return Stats{} })
	ctx := o.LoadStart(loadContext(t), LoadStartEvent[string]{Key: "k"})
	o.(AttemptObserver[string]).Attempt(ctx, AttemptEvent[string]{Key: "k", Attempt: 2})
	o.LoadEnd(ctx, LoadEvent[string]{Key: "k"})
	o.Waited(context.Background(), WaitEvent[string]{Key: "k", Load: ctx})
	o.(EvictionObserver[string]).Evicted(EvictionEvent[string]{Key: "k", Cause: EvictionExpired})
	want := "a.ObserveStats; a.LoadStart(k); b.LoadStart(k); a.Attempt(k, 2) own=a; " +
		"a.LoadEnd(k) own=a; b.LoadEnd(k) own=b; a.Waited(k) own=a; b.Waited(k) own=b; a.Evicted(k, expired)"
	if got := j.String(); got != want {
		t.Errorf("calls:\n%s\nwant:\n%s", got, want)
	}

	b.panics = "LoadEnd"
	defer func() {
		if r := recover(); r == nil {
			t.Errorf("a panicking member of an unguarded Observers did not panic")
		}
	}()
	o.LoadEnd(ctx, LoadEvent[string]{Key: "k"})
}

// LoadStart's context is used only if it derives from the load's: nil, a
// panic and a context of its own mean the load's context.
func TestLoadStartContextRules(t *testing.T) {
	l := guarded(t)
	in := loadContext(t)
	marker := in.Value(loadKey{})
	deadline, _ := in.Deadline()
	for _, tc := range []struct {
		name   string
		start  func(ctx context.Context) context.Context
		panics bool
		kept   bool // the returned context is the load's
	}{
		{"WithValue", func(ctx context.Context) context.Context { return context.WithValue(ctx, tagKey("x"), "x") }, false, true},
		{"ctx itself", func(ctx context.Context) context.Context { return ctx }, false, false},
		{"shorter deadline", func(ctx context.Context) context.Context {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			t.Cleanup(cancel)
			return context.WithValue(ctx, tagKey("x"), "x")
		}, false, true},
		{"nil", func(context.Context) context.Context { return nil }, false, false},
		{"panic", nil, true, false},
		{"Background", func(context.Context) context.Context {
			return context.WithValue(context.Background(), tagKey("x"), "x")
		}, false, false},
		{"WithoutCancel", func(ctx context.Context) context.Context {
			return context.WithValue(context.WithoutCancel(ctx), tagKey("x"), "x")
		}, false, false},
		{"marker, no deadline", func(context.Context) context.Context {
			return context.WithValue(context.WithValue(context.Background(), loadKey{}, marker), tagKey("x"), "x")
		}, false, false},
		{"deadline, other marker", func(context.Context) context.Context {
			ctx, cancel := context.WithDeadline(context.WithValue(context.Background(), loadKey{}, &loadMarker{}), deadline)
			t.Cleanup(cancel)
			return context.WithValue(ctx, tagKey("x"), "x")
		}, false, false},
		{"later deadline", func(ctx context.Context) context.Context {
			later, cancel := context.WithDeadline(context.WithValue(context.Background(), loadKey{}, marker), deadline.Add(time.Hour))
			t.Cleanup(cancel)
			return context.WithValue(later, tagKey("x"), "x")
		}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &noted{name: "o", j: &journal{}, start: tc.start}
			if tc.panics {
				o.panics = "LoadStart"
			}
			before := l.Stats().Panics
			got := newObserving[string](o, l.user.guard, l.Stats).loadStart(in, LoadStartEvent[string]{Key: "k"})
			if tc.kept != (tagOf(got, "x") == "x") {
				t.Errorf("returned context used: %v; want %v", !tc.kept, tc.kept)
			}
			if !tc.kept && got != in {
				t.Errorf("loadStart = %v; want the load's own context", got)
			}
			if n := l.Stats().Panics - before; n != boolInt(tc.panics) {
				t.Errorf("Stats.Panics grew by %d; want %d", n, boolInt(tc.panics))
			}
		})
	}
}

func boolInt(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// A panicking member is counted in Stats.Panics and keeps none of the
// others from being called; after a panic in LoadStart, the next member
// starts from the context before it.
func TestObserversPanicsAreContained(t *testing.T) {
	l := guarded(t)
	j := &journal{}
	methods := []string{"LoadStart", "Attempt", "LoadEnd", "Waited", "Evicted"}
	var obs []Observer[string]
	for _, m := range methods {
		obs = append(obs, &capable{noted: noted{name: m, j: j, panics: m}})
	}
	ob := newObserving(Observers(obs...), l.user.guard, l.Stats)
	before := l.Stats().Panics
	in := loadContext(t)
	ctx := ob.loadStart(in, LoadStartEvent[string]{Key: "k"})
	ob.attempt(ctx, AttemptEvent[string]{Key: "k", Attempt: 1})
	ob.loadEnd(ctx, LoadEvent[string]{Key: "k"})
	ob.waited(context.Background(), WaitEvent[string]{Key: "k", Load: ctx})
	ob.evicted(EvictionEvent[string]{Key: "k", Cause: EvictionReplaced})
	if n := l.Stats().Panics - before; n != uint64(len(methods)) {
		t.Errorf("Stats.Panics grew by %d; want %d", n, len(methods))
	}
	for _, m := range methods {
		// ObserveStats, then LoadStart, Attempt, LoadEnd, Waited, Evicted.
		if got := strings.Count(j.String(), m+"."); got != 1+len(methods) {
			t.Errorf("%s was called %d times; want %d", m, got, 1+len(methods))
		}
	}
	if own := ob.f.own(ctx, 0); own != in {
		t.Errorf("the member that panicked in LoadStart owns %v; want the load's context", own)
	}
	if tagOf(ctx, "Attempt") != "Attempt" {
		t.Errorf("the member after the one that panicked left no value")
	}
}

// A nil *observing, a Loader's without an Observer, does nothing.
func TestNilObserving(t *testing.T) {
	var ob *observing[string]
	ctx := context.Background()
	if got := ob.loadStart(ctx, LoadStartEvent[string]{}); got != ctx {
		t.Errorf("loadStart = %v; want ctx", got)
	}
	if ob.observesAttempts() || ob.observesEvictions() {
		t.Errorf("a nil observing observes something")
	}
	ob.loadEnd(ctx, LoadEvent[string]{})
	ob.waited(ctx, WaitEvent[string]{})
	ob.attempt(ctx, AttemptEvent[string]{})
	ob.evicted(EvictionEvent[string]{})
	ob.close()

	plain := newObserving[string](&noted{name: "p", j: &journal{}}, unguarded, nil)
	if plain.observesAttempts() || plain.observesEvictions() || plain.stats != nil {
		t.Errorf("an Observer without capabilities observes attempts, evictions or Stats")
	}
}

// The stats function reads the Loader's Stats until close, and the final
// ones after, without calling the Loader again.
func TestStatsFreezeAtClose(t *testing.T) {
	var mu sync.Mutex
	live := Stats{Gets: 1}
	calls := 0
	read := func() Stats {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return live
	}
	o := &capable{noted: noted{name: "s", j: &journal{}}}
	ob := newObserving[string](o, unguarded, read)
	if got := o.stats().Gets; got != 1 {
		t.Errorf("stats().Gets = %d; want 1", got)
	}
	mu.Lock()
	live.Gets = 5
	mu.Unlock()
	ob.close()
	ob.close()
	mu.Lock()
	live.Gets, calls = 99, 0
	mu.Unlock()
	for range 3 {
		if got := o.stats().Gets; got != 5 {
			t.Errorf("stats().Gets after close = %d; want the final 5", got)
		}
	}
	if calls != 0 {
		t.Errorf("the frozen stats function called the Loader %d times", calls)
	}
}

func TestEvictionCauseString(t *testing.T) {
	for c, want := range map[EvictionCause]string{
		0: "unknown", EvictionPolicy: "policy", EvictionExpired: "expired", EvictionRejected: "rejected",
		EvictionReplaced: "replaced", EvictionInvalidated: "invalidated", 200: "unknown",
	} {
		if got := c.String(); got != want {
			t.Errorf("EvictionCause(%d).String() = %q; want %q", c, got, want)
		}
	}
}

// An Observer is never called on a hit, and a hit with one set allocates
// nothing.
func TestHitWithObserverAllocatesNothing(t *testing.T) {
	j := &journal{}
	l, err := New(func(ctx context.Context, key string) (string, error) { return key, nil },
		Options[string, string]{TTL: time.Hour, Observer: &capable{noted: noted{name: "o", j: j}}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if _, err := l.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, info, err := l.GetInfo(ctx, "k"); err != nil || info.Source != SourceHit {
		t.Fatalf(`GetInfo("k") = %v, %v; want a hit`, info, err)
	}
	j.mu.Lock()
	j.lines = nil
	j.mu.Unlock()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := l.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("a hit with an Observer allocates %v times; want 0", allocs)
	}
	if got := j.String(); strings.Contains(got, "LoadStart") || strings.Contains(got, "Waited") {
		t.Errorf("the Observer was called on hits: %s", got)
	}
}

// quiet is an Observer with every capability that does nothing: what the
// Loader itself costs with an Observer set, without the Observer's own
// work (a journal of every call would grow the heap the GC scans).
type quiet struct{}

func (quiet) LoadStart(context.Context, LoadStartEvent[string]) context.Context { return nil }
func (quiet) LoadEnd(context.Context, LoadEvent[string])                        {}
func (quiet) Waited(context.Context, WaitEvent[string])                         {}
func (quiet) Attempt(context.Context, AttemptEvent[string])                     {}
func (quiet) Evicted(EvictionEvent[string])                                     {}
func (quiet) ObserveStats(func() Stats)                                         {}

// BenchmarkGetHitObserved is BenchmarkGetHit's flightcache case with an
// Observer set: it must stay at 0 allocations and within noise of it.
func BenchmarkGetHitObserved(b *testing.B) {
	trace := zipfTrace(1 << 16)
	ctx := context.Background()
	var obs Observer[string] = quiet{}
	b.Run("mode=serial", func(b *testing.B) {
		l := newBenchLoader(b, Options[string, string]{Observer: obs})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
			i++
		}
		reportHitRatio(b, l)
	})
	b.Run("mode=parallel", func(b *testing.B) {
		l := newBenchLoader(b, Options[string, string]{Observer: obs})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(trace))
			for pb.Next() {
				l.Get(ctx, benchNames[trace[i&(len(trace)-1)]])
				i++
			}
		})
		reportHitRatio(b, l)
	})
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The Observer as a real Loader calls it (docs/design.md rule 21): every
// load start and end, every Get that waited, never a hit.

// loadID is the value a recorder's LoadStart leaves in the load's context:
// which load of the recorder, from 1.
type loadID struct {
	rec *recorder
	n   int
}

type loadIDKey struct{ rec *recorder }

// idOf is the number of rec's load whose context ctx is (or derives
// from): 0 for none, -1 for a nil ctx.
func (rec *recorder) idOf(ctx context.Context) int {
	if ctx == nil {
		return -1
	}
	if id, ok := ctx.Value(loadIDKey{rec}).(loadID); ok {
		return id.n
	}
	return 0
}

// recorder is an Observer with every capability that records each call.
// Its LoadStart numbers the loads and leaves the number in the context it
// returns; with hold set, it waits for hold first.
type recorder struct {
	hold chan struct{} // if set, each LoadStart receives from it first

	mu        sync.Mutex
	starts    []LoadStartEvent[string]
	ends      []endCall
	waits     []waitCall
	attempts  []attemptCall
	evictions []EvictionEvent[string]
	stats     func() Stats
}

type endCall struct {
	id int
	ev LoadEvent[string]
}

type waitCall struct {
	caller string // the callerKey value of the Get's own context
	id     int    // idOf(ev.Load)
	ev     WaitEvent[string]
}

type attemptCall struct {
	id int
	ev AttemptEvent[string]
}

// callerKey marks a Get's own context, so that Waited's can be told apart.
type callerKey struct{}

func (rec *recorder) LoadStart(ctx context.Context, ev LoadStartEvent[string]) context.Context {
	if rec.hold != nil {
		<-rec.hold
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.starts = append(rec.starts, ev)
	return context.WithValue(ctx, loadIDKey{rec}, loadID{rec, len(rec.starts)})
}

func (rec *recorder) LoadEnd(ctx context.Context, ev LoadEvent[string]) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.ends = append(rec.ends, endCall{rec.idOf(ctx), ev})
}

func (rec *recorder) Waited(ctx context.Context, ev WaitEvent[string]) {
	caller, _ := ctx.Value(callerKey{}).(string)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.waits = append(rec.waits, waitCall{caller, rec.idOf(ev.Load), ev})
}

func (rec *recorder) Attempt(ctx context.Context, ev AttemptEvent[string]) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.attempts = append(rec.attempts, attemptCall{rec.idOf(ctx), ev})
}

func (rec *recorder) Evicted(ev EvictionEvent[string]) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.evictions = append(rec.evictions, ev)
}

func (rec *recorder) ObserveStats(stats func() Stats) { rec.stats = stats }

// counts returns how many starts, ends and waits rec has seen.
func (rec *recorder) counts() (starts, ends, waits int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.starts), len(rec.ends), len(rec.waits)
}

// reset forgets every call seen so far (the load numbers go on).
func (rec *recorder) reset() (starts int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := len(rec.starts)
	rec.ends, rec.waits, rec.attempts, rec.evictions = nil, nil, nil, nil
	return n
}

// waitsBy returns the waits seen, sorted by caller, then key.
func (rec *recorder) waitsBy() []waitCall {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	w := slices.Clone(rec.waits)
	slices.SortFunc(w, func(a, b waitCall) int {
		return strings.Compare(a.caller+"\x00"+a.ev.Key, b.caller+"\x00"+b.ev.Key)
	})
	return w
}

// panicker is an Observer with every capability that panics in every
// method.
type panicker struct{}

func (panicker) LoadStart(context.Context, LoadStartEvent[string]) context.Context {
	panic("LoadStart")
}
func (panicker) LoadEnd(context.Context, LoadEvent[string])    { panic("LoadEnd") }
func (panicker) Waited(context.Context, WaitEvent[string])     { panic("Waited") }
func (panicker) Attempt(context.Context, AttemptEvent[string]) { panic("Attempt") }
func (panicker) Evicted(EvictionEvent[string])                 { panic("Evicted") }
func (panicker) ObserveStats(func() Stats)                     { panic("ObserveStats") }

func asCaller(name string) context.Context {
	return context.WithValue(context.Background(), callerKey{}, name)
}

// docs/design.md rule 21: five Gets of a cold key make one LoadStart and
// one LoadEnd with the context LoadStart returned, and five Waiteds, each
// with its Get's own context, its Info, and the load's context; hits call
// nothing; a stale hit starts a background load whose Trigger is the Get's
// context, and is not a wait.
func TestObserverSeesLoadsAndWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Minute, Observer: rec})
		began := time.Now()
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				if _, err := l.Get(asCaller(fmt.Sprint("g", i)), "k"); err != nil {
					t.Errorf("Get = %v", err)
				}
			})
		}
		synctest.Wait()
		if s, e, w := rec.counts(); s != 1 || e != 0 || w != 0 {
			t.Fatalf("while the load runs: %d starts, %d ends, %d waits; want 1, 0, 0", s, e, w)
		}
		time.Sleep(10 * time.Millisecond)
		close(d.gate)
		wg.Wait()
		synctest.Wait() // LoadEnd comes after the waiters have the result

		if got := rec.starts[0]; got.Key != "k" || got.Keys != 1 || got.Background || got.Reload || got.Trigger != nil {
			t.Errorf("LoadStartEvent = %+v; want key k, 1 key, foreground, no Trigger", got)
		}
		if len(rec.ends) != 1 || rec.ends[0].id != 1 || rec.ends[0].ev.Callers != 5 || rec.ends[0].ev.Key != "k" {
			t.Fatalf("LoadEnd calls = %+v; want one, with load 1's context and 5 callers", rec.ends)
		}
		waits := rec.waitsBy()
		loaded := 0
		for i, w := range waits {
			if w.caller != fmt.Sprint("g", i) || w.id != 1 || w.ev.Key != "k" || w.ev.Err != nil {
				t.Errorf("wait %d: caller %q, load %d, %+v; want g%d, load 1, key k, no error", i, w.caller, w.id, w.ev, i)
			}
			if w.ev.Info.Waited != 10*time.Millisecond || !w.ev.Start.Equal(began) {
				t.Errorf("wait %d: Waited %v from %v; want 10ms from %v", i, w.ev.Info.Waited, w.ev.Start, began)
			}
			if w.ev.Info.Source == SourceLoaded {
				loaded++
			} else if w.ev.Info.Source != SourceShared {
				t.Errorf("wait %d: Source %v; want loaded or shared", i, w.ev.Info.Source)
			}
		}
		if len(waits) != 5 || loaded != 1 {
			t.Errorf("%d waits, %d loaded; want 5, 1", len(waits), loaded)
		}

		// Hits: nothing.
		rec.reset()
		for range 3 {
			if _, info, err := l.GetInfo(context.Background(), "k"); err != nil || info.Source != SourceHit {
				t.Fatalf("GetInfo = %v, %v; want a hit", info, err)
			}
		}
		synctest.Wait()
		if s, e, w := rec.counts(); s != 1 || e != 0 || w != 0 {
			t.Errorf("after hits: %d starts, %d ends, %d waits; want 1, 0, 0", s, e, w)
		}

		// A stale hit: a background load, no wait.
		time.Sleep(2 * time.Second)
		if _, info, err := l.GetInfo(asCaller("stale"), "k"); err != nil || info.Source != SourceStale {
			t.Fatalf("GetInfo = %v, %v; want a stale value", info, err)
		}
		synctest.Wait()
		if s, e, w := rec.counts(); s != 2 || e != 1 || w != 0 {
			t.Fatalf("after a stale hit: %d starts, %d ends, %d waits; want 2, 1, 0", s, e, w)
		}
		bg := rec.starts[1]
		if !bg.Background || bg.Trigger == nil || bg.Trigger.Value(callerKey{}) != "stale" {
			t.Errorf("refresh's LoadStartEvent = %+v; want background, triggered by the stale Get", bg)
		}
		if e := rec.ends[0]; e.id != 2 || !e.ev.Background || e.ev.Callers != 0 {
			t.Errorf("refresh's LoadEnd = %+v; want load 2, background, no callers", e)
		}
	})
}

// docs/design.md rule 21: Refresh and Reload. A Refresh's load is a
// background one triggered by its context; with Options.Reload it says
// Reload, and the ReloadFunc gets the context LoadStart returned.
func TestObserverSeesRefreshAndReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		var reloadID int
		l := newLoader(t, &downstream{}, Options[string, string]{
			Observer: rec,
			Reload: func(ctx context.Context, key, old string) (string, error) {
				reloadID = rec.idOf(ctx)
				return old + "+", nil
			},
		})
		if _, err := l.Get(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the Get's load has had its LoadEnd
		l.Refresh(asCaller("refresh"), "k")
		synctest.Wait()
		if s, e, w := rec.counts(); s != 2 || e != 2 || w != 1 {
			t.Fatalf("%d starts, %d ends, %d waits; want 2, 2, 1 (the Get's)", s, e, w)
		}
		ev := rec.starts[1]
		if !ev.Background || !ev.Reload || ev.Trigger == nil || ev.Trigger.Value(callerKey{}) != "refresh" {
			t.Errorf("Refresh's LoadStartEvent = %+v; want a background Reload triggered by Refresh's context", ev)
		}
		if reloadID != 2 {
			t.Errorf("the ReloadFunc ran under load %d's context; want 2", reloadID)
		}
		if e := rec.ends[1]; e.id != 2 || !e.ev.Reload {
			t.Errorf("the Reload's LoadEnd = %+v; want load 2's, a Reload", e)
		}
	})
}

// docs/design.md rules 15 and 21: one LoadMany call is one load, with one
// LoadStart and one LoadEnd (Keys 3); each key of the GetMany waited, and
// so did a Get that joined one of the batch's keys: all with the batch's
// context, which LoadManyFunc received.
func TestObserverSeesBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		m := &many{gate: make(chan struct{})}
		var manyID int
		load := m.load
		m2 := func(ctx context.Context, keys []string) (map[string]string, error) {
			manyID = rec.idOf(ctx)
			return load(ctx, keys)
		}
		l := newLoader(t, &downstream{}, Options[string, string]{Observer: rec, LoadMany: m2})
		done := make(chan error)
		go func() {
			_, err := l.GetMany(asCaller("many"), []string{"a", "b", "c"})
			done <- err
		}()
		synctest.Wait()
		joined := getAsync(asCaller("get"), l, "b")
		synctest.Wait()
		close(m.gate)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if r := <-joined; r.err != nil || r.info.Source != SourceShared {
			t.Fatalf("Get(b) = %v, %v; want shared", r.info, r.err)
		}
		synctest.Wait()
		if s, e, w := rec.counts(); s != 1 || e != 1 || w != 4 {
			t.Fatalf("%d starts, %d ends, %d waits; want 1, 1, 4", s, e, w)
		}
		if ev := rec.starts[0]; ev.Keys != 3 || ev.Key != "a" || ev.Background {
			t.Errorf("LoadStartEvent = %+v; want 3 keys from a, foreground", ev)
		}
		if e := rec.ends[0]; e.id != 1 || e.ev.Keys != 3 || e.ev.Callers != 4 {
			t.Errorf("LoadEnd = %+v; want load 1's, 3 keys, 4 callers", e)
		}
		if manyID != 1 {
			t.Errorf("LoadManyFunc ran under load %d's context; want 1", manyID)
		}
		var keys []string
		for _, w := range rec.waitsBy() {
			keys = append(keys, w.caller+":"+w.ev.Key)
			if w.id != 1 || w.ev.Err != nil {
				t.Errorf("wait of %s: load %d, error %v; want load 1, none", w.ev.Key, w.id, w.ev.Err)
			}
		}
		if want := []string{"get:b", "many:a", "many:b", "many:c"}; !slices.Equal(keys, want) {
			t.Errorf("waits %v; want %v", keys, want)
		}
		// A GetMany of the same keys now: hits, no wait.
		if _, err := l.GetMany(context.Background(), []string{"a", "b", "c"}); err != nil {
			t.Fatal(err)
		}
		if _, _, w := rec.counts(); w != 4 {
			t.Errorf("a GetMany of hits made %d more waits", w-4)
		}
	})
}

// docs/design.md rule 21: a late hit, a value a write left on its way into
// the cache, is a hit: no Waited. (With the writer held, the fill of a
// load stays pending, so the next Get finds it under the lock.)
func TestObserverLateHitIsNoWait(t *testing.T) {
	release := holdWriter(t)
	rec := &recorder{}
	l := newLoader(t, &downstream{}, Options[string, string]{Observer: rec})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, info, err := l.GetInfo(ctx, "k"); err != nil || info.Source != SourceLoaded {
		t.Fatalf("GetInfo = %v, %v; want loaded", info, err)
	}
	if _, info, err := l.GetInfo(ctx, "k"); err != nil || info.Source != SourceHit {
		t.Fatalf("GetInfo = %v, %v; want a (late) hit", info, err)
	}
	if s := l.Stats(); s.Misses != 1 || s.Hits != 1 {
		t.Errorf("Stats: %d misses, %d hits; want 1 of each (a late hit counts as a hit)", s.Misses, s.Hits)
	}
	release()
	l.Close()
	if s, e, w := rec.counts(); s != 1 || e != 1 || w != 1 {
		t.Errorf("%d starts, %d ends, %d waits; want 1, 1, 1 (the first Get's only)", s, e, w)
	}
}

// docs/design.md rules 4 and 21: a caller that leaves is a wait too, with
// Err its ctx.Err() and Source none; its Load is the load's context once
// the load has started, nil before. A GetMany's key that left has its
// GetMany's ctx.Err().
func TestObserverCallerThatLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{hold: make(chan struct{})}
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{Observer: rec, LoadMany: (&many{}).load})

		// Before the load started: LoadStart is held.
		early, cancel := context.WithTimeout(asCaller("early"), time.Second)
		defer cancel()
		if _, err := l.Get(early, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get = %v; want DeadlineExceeded", err)
		}
		// After: the load runs (the downstream is gated).
		rec.hold <- struct{}{}
		synctest.Wait()
		late, cancelLate := context.WithCancel(asCaller("late"))
		r := getAsync(late, l, "k")
		synctest.Wait()
		cancelLate()
		if res := <-r; !errors.Is(res.err, context.Canceled) {
			t.Fatalf("Get = %v; want Canceled", res.err)
		}
		manyCtx, cancelMany := context.WithTimeout(asCaller("many"), time.Second)
		defer cancelMany()
		if _, err := l.GetMany(manyCtx, []string{"k"}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("GetMany = %v; want DeadlineExceeded", err)
		}
		close(d.gate)
		synctest.Wait()

		waits := rec.waitsBy()
		want := []struct {
			caller string
			id     int
			err    error
		}{{"early", -1, context.DeadlineExceeded}, {"late", 1, context.Canceled}, {"many", 1, context.DeadlineExceeded}}
		if len(waits) != len(want) {
			t.Fatalf("%d waits; want %d", len(waits), len(want))
		}
		for i, w := range want {
			got := waits[i]
			if got.caller != w.caller || got.id != w.id || got.ev.Err != w.err || got.ev.Info.Source != SourceNone {
				t.Errorf("wait %d: %s, load %d, %v, %v; want %s, load %d, %v, none",
					i, got.caller, got.id, got.ev.Err, got.ev.Info.Source, w.caller, w.id, w.err)
			}
		}
		if s, e, _ := rec.counts(); s != 1 || e != 1 || rec.ends[0].id != 1 || rec.ends[0].ev.Callers != 0 {
			t.Errorf("%d starts, %d ends (%+v); want the one load, ended with no caller left", s, e, rec.ends)
		}
	})
}

// remoteTag is a Remote that records the context it is given and passes
// it to the Loader's load.
type remoteTag struct {
	fakeRemote
	rec *recorder
	ids []int
}

func (r *remoteTag) Load(ctx context.Context, key string, load func(context.Context) (string, error)) (RemoteValue[string], error) {
	r.ids = append(r.ids, r.rec.idOf(ctx))
	return r.fakeRemote.Load(ctx, key, load)
}

// docs/design.md rule 21: the context LoadStart returns is the load's
// context: the Remote and the LoadFunc receive it, with its deadline and
// its marker (a Get of the key from inside the load is recursive), and so
// do the Attempt events of its retries.
func TestObserverContextIsTheLoads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		remote := &remoteTag{fakeRemote: fakeRemote{shared: map[string]RemoteValue[string]{}}, rec: rec}
		var l *Loader[string, string]
		var loadIDs []int
		var recursive error
		var deadline time.Time
		calls := 0
		var err error
		l, err = New(func(ctx context.Context, key string) (string, error) {
			loadIDs = append(loadIDs, rec.idOf(ctx))
			deadline, _ = ctx.Deadline()
			_, recursive = l.Get(ctx, key)
			if calls++; calls == 1 {
				return "", errBoom // retried
			}
			return "v", nil
		}, Options[string, string]{TTL: time.Minute, LoadTimeout: time.Minute, Observer: rec, Remote: remote,
			Retry: Retry{MaxAttempts: 2, InitialInterval: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		start := time.Now()
		if v, err := l.Get(context.Background(), "k"); v != "v" || err != nil {
			t.Fatalf("Get = %q, %v; want v", v, err)
		}
		synctest.Wait()
		if !slices.Equal(remote.ids, []int{1}) || !slices.Equal(loadIDs, []int{1, 1}) {
			t.Errorf("the Remote saw loads %v, the LoadFunc %v; want [1], [1 1]", remote.ids, loadIDs)
		}
		if !errors.Is(recursive, ErrRecursiveLoad) {
			t.Errorf("Get from inside the load = %v; want ErrRecursiveLoad", recursive)
		}
		if !deadline.Equal(start.Add(time.Minute)) {
			t.Errorf("the LoadFunc's deadline is %v; want LoadTimeout after the start, %v", deadline, start.Add(time.Minute))
		}
		if len(rec.attempts) != 1 {
			t.Fatalf("%d Attempt calls; want 1 (the retry)", len(rec.attempts))
		}
		a := rec.attempts[0]
		if a.id != 1 || a.ev.Key != "k" || a.ev.Keys != 1 || a.ev.Attempt != 1 || a.ev.Err != errBoom || a.ev.Rejected ||
			a.ev.Delay < time.Second/2 || a.ev.Delay > 3*time.Second/2 {
			t.Errorf("Attempt = load %d, %+v; want load 1's, key k, attempt 1, boom, a delay about 1s", a.id, a.ev)
		}
		if e := rec.ends[0]; e.ev.Attempts != 2 {
			t.Errorf("LoadEnd's Attempts = %d; want 2", e.ev.Attempts)
		}
	})
}

// docs/design.md rule 21: a call the breaker refuses is an Attempt event,
// Rejected, numbered as the call it would have been; a batch's attempts
// carry the batch's Key and Keys.
func TestObserverSeesRefusedAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{Observer: rec, LoadMany: (&many{fail: func(int) error { return errBoom }}).load,
			Breaker: Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour}})
		if _, err := l.Get(context.Background(), "a"); !errors.Is(err, errBoom) {
			t.Fatalf("Get = %v; want boom", err)
		}
		if _, err := l.GetMany(context.Background(), []string{"x", "y"}); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("GetMany = %v; want ErrBreakerOpen", err)
		}
		synctest.Wait()
		if len(rec.attempts) != 1 {
			t.Fatalf("Attempt calls %+v; want 1, the batch's refusal", rec.attempts)
		}
		a := rec.attempts[0]
		if a.id != 2 || a.ev.Key != "x" || a.ev.Keys != 2 || a.ev.Attempt != 1 || !a.ev.Rejected || !errors.Is(a.ev.Err, ErrBreakerOpen) || a.ev.Delay != 0 {
			t.Errorf("Attempt = load %d, %+v; want load 2's, x, 2 keys, attempt 1, rejected, ErrBreakerOpen", a.id, a.ev)
		}
	})
}

// docs/design.md rule 21: every call of an Observer goes through the
// guard: one that panics in every method is counted in Stats.Panics once
// per call, and changes no result; OnLoad and the Observers beside it
// still see everything.
func TestObserverPanicsAreContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		var onLoad eventLog
		l := newLoader(t, &downstream{fail: func(n int64, _ string) error {
			if n == 1 {
				return errBoom
			}
			return nil
		}}, Options[string, string]{
			Observer: Observers[string](panicker{}, rec), OnLoad: onLoad.add,
			Retry: Retry{MaxAttempts: 2}, MaxCost: 1,
		})
		if v, err := l.Get(context.Background(), "k"); v != "k#2" || err != nil {
			t.Fatalf("Get = %q, %v; want k#2", v, err)
		}
		l.Set("k", "set") // replaces k: an eviction
		synctest.Wait()
		l.Close()
		// ObserveStats, LoadStart, Attempt, LoadEnd, Waited, Evicted.
		if got := l.Stats().Panics; got != 6 {
			t.Errorf("Stats.Panics = %d; want 6", got)
		}
		if s, e, w := rec.counts(); s != 1 || e != 1 || w != 1 || len(rec.attempts) != 1 || len(rec.evictions) != 1 {
			t.Errorf("the Observer beside: %d starts, %d ends, %d waits, %d attempts, %d evictions; want 1 each",
				s, e, w, len(rec.attempts), len(rec.evictions))
		}
		if evs := onLoad.all(); len(evs) != 1 || evs[0].Err != nil {
			t.Errorf("OnLoad saw %+v; want the one load", evs)
		}
	})
}

// Observers in a Loader: the load's context holds both members' values,
// and each member gets back, in LoadEnd and WaitEvent.Load, its own.
func TestObserversInALoader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := &recorder{}, &recorder{}
		var seen [2]int
		l, err := New(func(ctx context.Context, key string) (string, error) {
			seen = [2]int{a.idOf(ctx), b.idOf(ctx)}
			return key, nil
		}, Options[string, string]{TTL: time.Minute, Observer: Observers[string](a, b)})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := l.Get(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if seen != [2]int{1, 1} {
			t.Errorf("the LoadFunc saw loads %v of a and b; want both", seen)
		}
		for name, r := range map[string]*recorder{"a": a, "b": b} {
			if len(r.ends) != 1 || len(r.waits) != 1 {
				t.Fatalf("%s: %d ends, %d waits; want 1, 1", name, len(r.ends), len(r.waits))
			}
			if r.ends[0].id != 1 || r.waits[0].id != 1 {
				t.Errorf("%s: the load context it got back is not its own", name)
			}
		}
		// a comes first: its own context holds nothing of b's.
		if b.idOf(a.waits[0].ev.Load) != 0 {
			t.Errorf("a got back a context with b's value in it")
		}
	})
}

// A typed nil Observer is none: the Loader observes nothing and pays
// nothing.
func TestTypedNilObserverIsNone(t *testing.T) {
	var o *recorder
	l := newLoader(t, &downstream{}, Options[string, string]{Observer: o})
	if l.obs != nil {
		t.Errorf("a Loader given a nil *recorder observes")
	}
	if _, err := l.Get(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
}

// The Stats a StatsObserver is handed read the Loader's until Close, and
// its final ones after.
func TestObserverStatsFreezeAtClose(t *testing.T) {
	rec := &recorder{}
	l := newLoader(t, &downstream{}, Options[string, string]{Observer: rec})
	if rec.stats == nil {
		t.Fatal("no stats function at New")
	}
	for range 3 {
		if _, err := l.Get(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.stats().Gets; got != 3 {
		t.Errorf("stats().Gets = %d; want 3", got)
	}
	l.Close()
	l.Get(context.Background(), "k") // closed: counted in Stats, not in the frozen ones
	if got, live := rec.stats().Gets, l.Stats().Gets; got != 3 || live != 4 {
		t.Errorf("after Close: stats().Gets = %d, Stats().Gets = %d; want 3 (frozen), 4", got, live)
	}
}

// evictionsOf returns rec's evictions as "key cause cost", sorted.
func (rec *recorder) evictionsOf() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for _, ev := range rec.evictions {
		out = append(out, fmt.Sprintf("%s %v %d", ev.Key, ev.Cause, ev.Cost))
	}
	slices.Sort(out)
	return out
}

// An EvictionObserver hears of every entry that leaves, once, with its
// cause: a Set over a value replaces it, Invalidate invalidates, a newer
// value over one past its windows finds it expired, InvalidateAll
// invalidates every entry from before it (reported as the writer clears
// the cache), a value too big for the cache is rejected; a value that
// ErrNotModified renews has not left, and Close reports nothing.
func TestObserverSeesEvictions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l := newLoader(t, &downstream{}, Options[string, string]{
			TTL: time.Second, Observer: rec, MaxCost: 10,
			Cost: func(v string) int64 { return int64(len(v)) },
			Reload: func(ctx context.Context, key, old string) (string, error) {
				return "", ErrNotModified
			},
		})
		ctx := context.Background()
		step := func(what string, want ...string) {
			t.Helper()
			synctest.Wait() // the writer and the cache have applied everything
			if got := rec.evictionsOf(); !slices.Equal(got, want) {
				t.Errorf("%s: evictions %q; want %q", what, got, want)
			}
			rec.reset()
		}
		l.Set("a", "1")
		l.Set("a", "22") // replaces a value still fresh
		step("Set over a value", "a replaced 0")
		l.Invalidate("a")
		step("Invalidate", "a invalidated 0")
		l.Invalidate("a")
		step("Invalidate of nothing")

		if _, err := l.Get(ctx, "b"); err != nil { // "b#1"
			t.Fatal(err)
		}
		l.Refresh(ctx, "b") // ErrNotModified: renewed
		step("a value renewed by ErrNotModified")
		time.Sleep(2 * time.Second)
		l.Set("b", "3")
		step("Set over an expired value", "b expired 0")

		l.Set("big", "more than ten")
		step("a value too big", "big rejected 13")

		l.Set("c", "4")
		l.Set("d", "5")
		step("Sets of new keys")
		l.InvalidateAll()
		step("InvalidateAll", "b invalidated 0", "c invalidated 0", "d invalidated 0")
		l.Set("e", "6")
		step("Set after InvalidateAll")
		l.Close()
		step("Close")
	})
}

// What the cache's policy does is reported as Stats counts it: an entry
// evicted to make room (policy, or expired past its windows) for each of
// Stats.Evicted, one refused for each of Stats.SetsRejected, each entry
// once, with ristretto's cost.
func TestObserverEvictionsMatchStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l := newLoader(t, &downstream{}, Options[string, string]{Observer: rec, MaxCost: 4, NumCounters: 100})
		for i := range 50 {
			k := fmt.Sprint("k", i)
			if i%2 == 0 {
				l.Set(k, k)
			} else if _, err := l.Get(context.Background(), k); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		s := l.Stats()
		seen := map[string]bool{}
		var evicted, rejected uint64
		for _, ev := range rec.evictions {
			if seen[ev.Key] {
				t.Errorf("%s reported twice", ev.Key)
			}
			seen[ev.Key] = true
			switch ev.Cause {
			case EvictionPolicy, EvictionExpired:
				evicted++
			case EvictionRejected:
				rejected++
			default:
				t.Errorf("%s left by %v; want policy, expired or rejected", ev.Key, ev.Cause)
			}
			if ev.Cost != 1 {
				t.Errorf("%s reported with cost %d; want 1", ev.Key, ev.Cost)
			}
		}
		if evicted != s.Evicted || rejected != s.SetsRejected || evicted+rejected != 46 {
			t.Errorf("%d evicted, %d rejected; want Stats' %d and %d, 46 in all", evicted, rejected, s.Evicted, s.SetsRejected)
		}
	})
}

// docs/design.md rule 21 under load: Gets, GetManys and Invalidates of a
// few keys at once, many of them leaving early (every one has a deadline),
// against a downstream that is slow and sometimes fails, with stale
// values and their refreshes. Afterwards, every LoadStart had exactly one
// LoadEnd, with the context it returned, one per Stats.Loads and per
// OnLoad; every wait was a miss and every miss a wait; each wait's load
// context is one LoadStart returned, or nil for a caller that left before
// its load started; no wait was a hit.
func TestObserverStress(t *testing.T) {
	rec := &recorder{}
	var onLoad eventLog
	d := &downstream{delay: time.Millisecond, fail: func(n int64, _ string) error {
		if n%7 == 0 {
			return errBoom
		}
		return nil
	}}
	l := newLoader(t, d, Options[string, string]{
		TTL: 5 * time.Millisecond, StaleWhileRevalidate: 5 * time.Millisecond,
		Observer: rec, OnLoad: onLoad.add, LoadMany: (&many{}).load,
		Breaker: Breaker{Disabled: true},
	})
	keys := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 150 {
				ctx, cancel := context.WithTimeout(asCaller(fmt.Sprint(g)), time.Duration(i%4)*time.Millisecond)
				switch k := keys[(g+i)%len(keys)]; {
				case i%10 == 3:
					l.GetMany(ctx, keys[:2+i%3])
				case i%25 == 7:
					l.Invalidate(k)
				default:
					l.Get(ctx, k)
				}
				cancel()
			}
		})
	}
	waitGroup(t, "the callers", &wg)
	l.Close()

	s := l.Stats()
	starts, ends, waits := rec.counts()
	if uint64(starts) != s.Loads || ends != starts || len(onLoad.all()) != ends {
		t.Errorf("%d LoadStarts, %d LoadEnds, %d OnLoads, Stats.Loads %d; want all equal", starts, ends, len(onLoad.all()), s.Loads)
	}
	ended := map[int]bool{}
	for _, e := range rec.ends {
		if e.id < 1 || e.id > starts || ended[e.id] {
			t.Fatalf("a LoadEnd with load %d's context (of %d, ended before: %v)", e.id, starts, ended[e.id])
		}
		ended[e.id] = true
	}
	if uint64(waits) != s.Misses {
		t.Errorf("%d waits; want one per Stats.Misses, %d", waits, s.Misses)
	}
	var left int
	for _, w := range rec.waits {
		switch {
		case w.id == 0 || w.id > starts:
			t.Fatalf("a wait with load %d's context, of %d", w.id, starts)
		case w.ev.Info.Source == SourceHit || w.ev.Info.Source == SourceStale:
			t.Fatalf("a wait answered as %v", w.ev.Info.Source)
		case errors.Is(w.ev.Err, context.DeadlineExceeded):
			left++
			if w.ev.Info.Source != SourceNone {
				t.Errorf("a caller that left has Source %v; want none", w.ev.Info.Source)
			}
		case w.id < 0:
			t.Fatalf("a wait without its load's context that did not leave: %+v", w.ev)
		}
	}
	if uint64(left) != s.Canceled {
		t.Errorf("%d waits left; want Stats.Canceled, %d", left, s.Canceled)
	}
	t.Logf("%d loads, %d waits (%d left), %d hits, %d stale", starts, waits, left, s.Hits, s.StaleHits)
}

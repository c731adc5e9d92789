package flightcache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 20: after InvalidateAll, no value from before it
// serves a Get: not as a hit, a stale value, a stale-on-error fallback, a
// Reload's old value, nor through Peek or GetMany.
func TestInvalidateAllDropsEveryValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		var reloads atomic.Int64
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Minute, StaleWhileRevalidate: time.Minute, StaleIfError: time.Hour,
			Reload: func(ctx context.Context, k, old string) (string, error) {
				reloads.Add(1)
				return d.load(ctx, k)
			},
		})
		ctx := context.Background()
		for _, k := range []string{"a", "b", "c"} {
			if _, err := l.Get(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(90 * time.Second) // b's value is stale: it would serve, and cover a failure
		synctest.Wait()
		l.InvalidateAll()
		if v, _, ok := l.Peek("a"); ok {
			t.Fatalf("Peek(a) after InvalidateAll = %q; want nothing", v)
		}
		if v, info, err := l.GetInfo(ctx, "a"); err != nil || info.Source != SourceLoaded || v != "a#4" {
			t.Fatalf("Get(a) after InvalidateAll = %q, %v, %v; want a new load, a#4", v, info.Source, err)
		}
		boom := errors.New("boom")
		d.fail = func(int64, string) error { return boom }
		if v, info, err := l.GetInfo(ctx, "b"); !errors.Is(err, boom) || info.Source != SourceLoaded {
			t.Fatalf("Get(b) after InvalidateAll with the load failing = %q, %v, %v; want boom: the old value covers nothing", v, info.Source, err)
		}
		if m, err := l.GetMany(ctx, []string{"c"}); err == nil || len(m) != 0 {
			t.Fatalf("GetMany(c) after InvalidateAll with the load failing = %v, %v; want its error", m, err)
		}
		if n := reloads.Load(); n != 0 {
			t.Fatalf("%d Reloads after InvalidateAll; want none: no value is held", n)
		}
		if s := l.Stats(); s.InvalidateAlls != 1 || s.StaleOnError != 0 {
			t.Fatalf("Stats = %+v; want 1 InvalidateAll, no stale-on-error", s)
		}
	})
}

// Rule 20 for a load in flight: it delivers its result to its own waiters
// but writes nothing, and a Get that starts after InvalidateAll does not
// join it (docs/design.md rule 27: the load keeps its own waiters, the
// caller starts its own).
func TestInvalidateAllDetachesLoadsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute})
		ctx := context.Background()
		first := make(chan string, 1)
		go func() {
			v, info, err := l.GetInfo(ctx, "k")
			if err != nil || info.Source != SourceLoaded {
				t.Errorf("Get in flight across InvalidateAll = %q, %v, %v; want its own load's value", v, info.Source, err)
			}
			first <- v
		}()
		synctest.Wait()
		l.InvalidateAll()
		second := make(chan string, 1)
		go func() {
			v, _ := l.Get(ctx, "k")
			second <- v
		}()
		synctest.Wait()
		if n := d.calls.Load(); n != 2 {
			t.Fatalf("%d downstream calls; want 2: a Get after InvalidateAll starts its own load", n)
		}
		d.gate <- struct{}{} // the first load's call returns first
		if v := <-first; v != "k#1" {
			t.Fatalf("first Get = %q; want k#1", v)
		}
		d.gate <- struct{}{}
		if v := <-second; v != "k#2" {
			t.Fatalf("second Get = %q; want k#2", v)
		}
		synctest.Wait()
		if v, info, err := l.GetInfo(ctx, "k"); v != "k#2" || info.Source != SourceHit || err != nil {
			t.Fatalf("Get afterwards = %q, %v, %v; want k#2, a hit: the older load wrote nothing", v, info.Source, err)
		}
	})
}

// Rule 20 for writes still pending, and the writer's Clear: a pending value
// from before InvalidateAll is not served, a value Set after it survives
// the Clear that gives ristretto's memory back, and the old entries are
// gone from ristretto once the writer has caught up.
func TestInvalidateAllPendingWritesAndClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute})
		ctx := context.Background()
		l.Get(ctx, "applied")
		synctest.Wait()
		waitWriterIdle(t, l)
		release := holdWriter(t)
		l.Get(ctx, "pending") // its write waits for the held writer
		l.Set("set-before", "old")
		l.InvalidateAll()
		l.Set("set-after", "new")
		for _, k := range []string{"applied", "pending", "set-before"} {
			if v, _, ok := l.Peek(k); ok {
				t.Fatalf("Peek(%s) after InvalidateAll = %q; want nothing", k, v)
			}
		}
		if v, info, err := l.GetInfo(ctx, "set-after"); v != "new" || info.Source != SourceHit || err != nil {
			t.Fatalf("Get(set-after) = %q, %v, %v; want new, a hit", v, info.Source, err)
		}
		release()
		synctest.Wait()
		waitWriterIdle(t, l)
		for _, k := range []string{"applied", "pending", "set-before"} {
			if _, ok := l.cache.Get(l.mustHash(k)); ok {
				t.Errorf("ristretto still holds %s once the writer caught up after InvalidateAll", k)
			}
		}
		if v, info, err := l.GetInfo(ctx, "set-after"); v != "new" || info.Source != SourceHit || err != nil {
			t.Fatalf("Get(set-after) once the writer caught up = %q, %v, %v; want new, a hit: the Clear must not drop it", v, info.Source, err)
		}
		if _, ok := l.cache.Get(l.mustHash("set-after")); !ok {
			t.Error("ristretto does not hold the value Set after InvalidateAll")
		}
		if v, info, _ := l.GetInfo(ctx, "pending"); info.Source != SourceLoaded {
			t.Fatalf("Get(pending) = %q, %v; want a new load", v, info.Source)
		}
		if s := l.Stats(); s.Evicted != 0 {
			t.Errorf("Stats.Evicted = %d; the Clear is not an eviction", s.Evicted)
		}
	})
}

// InvalidateAll after Close does nothing, and is not counted.
func TestInvalidateAllAfterClose(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{TTL: time.Minute})
	l.Close()
	l.InvalidateAll()
	if s := l.Stats(); s.InvalidateAlls != 0 {
		t.Fatalf("Stats.InvalidateAlls = %d after Close; want 0", s.InvalidateAlls)
	}
}

// InvalidateAll racing loads, Sets, Invalidates and GetManys (rule 19 and
// 20): nothing stalls (every Get has a deadline), the heap stays bounded,
// and once the storm is over one more InvalidateAll leaves no value of
// before it: every key loads again and gets the new epoch's value.
func TestInvalidateAllStorm(t *testing.T) {
	var epoch atomic.Int64
	value := func(k int) string { return strconv.Itoa(k) + "@" + strconv.FormatInt(epoch.Load(), 10) }
	l, err := New(func(_ context.Context, k int) (string, error) { return value(k), nil },
		Options[int, string]{
			TTL: time.Hour, MaxCost: 2000, StaleIfError: time.Hour,
			LoadMany: func(_ context.Context, keys []int) (map[int]string, error) {
				m := make(map[int]string, len(keys))
				for _, k := range keys {
					m[k] = value(k)
				}
				return m, nil
			},
		})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const keys = 1000
	base := liveHeap()
	runFor(t, 4, stormFor(), func(g, i int) {
		ctx, cancel := context.WithTimeout(context.Background(), stormGetDeadline)
		defer cancel()
		k := (i*7 + g*131) % keys
		switch g {
		case 0:
			if _, err := l.Get(ctx, k); err != nil {
				t.Errorf("Get(%d): %v", k, err)
			}
		case 1:
			if _, err := l.GetMany(ctx, []int{k, (k + 1) % keys, (k + 2) % keys}); err != nil {
				t.Errorf("GetMany: %v", err)
			}
		case 2:
			if i%2 == 0 {
				l.Set(k, value(k))
			} else {
				l.Invalidate(k)
			}
		case 3:
			l.InvalidateAll()
		}
	})
	if grown := int64(liveHeap()) - int64(base); grown > 64<<20 {
		t.Errorf("live heap grew by %d MB; want well under 64 MB", grown>>20)
	}
	epoch.Store(1)
	l.InvalidateAll()
	ctx := context.Background()
	for k := range keys {
		if v, _ := l.Get(ctx, k); v != fmt.Sprintf("%d@1", k) {
			t.Fatalf("Get(%d) after the last InvalidateAll = %q; want %d@1", k, v, k)
		}
	}
	t.Logf("%d InvalidateAlls, %d loads, %d fills dropped", l.Stats().InvalidateAlls, l.Stats().Loads, l.Stats().FillsDropped)
}

// Rule 20 and rule 2 together: a Set after InvalidateAll whose value folds
// into a write the writer had already taken (before the InvalidateAll) must
// survive the Clear. The writer used to apply that batch, close the write,
// and clear the cache at its next batch, dropping the value a Get had to
// see.
func TestSetFoldedIntoATakenBatchSurvivesTheClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute})
		held, gate := make(chan struct{}), make(chan struct{})
		var once sync.Once
		hook := func() { once.Do(func() { close(held); <-gate }) }
		testHookIssue.Store(&hook)
		defer testHookIssue.Store(nil)
		l.Set("k", "old")
		<-held // the writer holds k's write in the batch it took
		l.InvalidateAll()
		l.Set("k", "new") // folds into that write
		close(gate)
		synctest.Wait()
		waitWriterIdle(t, l)
		if v, info, err := l.GetInfo(context.Background(), "k"); v != "new" || info.Source != SourceHit || err != nil {
			t.Fatalf("Get(k) once the writer caught up = %q, %v, %v; want new, a hit: the Clear dropped a value Set after InvalidateAll", v, info.Source, err)
		}
	})
}

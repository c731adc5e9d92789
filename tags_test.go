package flightcache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// byFirst tags a value with its key's first letter: "cat:a" for a1, a2...
func byFirst(key, _ string) []string { return []string{"cat:" + key[:1]} }

// docs/design.md rule 36: a value with the tag stored before InvalidateTag
// is absent to every Get, GetMany, Peek and Refresh after it: not a hit,
// not a stale value, not a stale-on-error fallback, not a Reload's old
// value. A value of another tag stays.
func TestInvalidateTagDropsItsValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(n int64, key string) error {
			if n > 5 && key == "a2" {
				return errBoom
			}
			return nil
		}}
		var reloads atomic.Int64
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Minute, StaleWhileRevalidate: time.Minute, StaleIfError: time.Hour, Tags: byFirst,
			Reload: func(ctx context.Context, k, old string) (string, error) {
				if strings.HasPrefix(old, "a") {
					reloads.Add(1)
				}
				return d.load(ctx, k)
			},
		})
		ctx := deadline(t)
		for _, k := range []string{"a1", "a2", "a3", "a4", "b1"} {
			if _, err := l.Get(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(90 * time.Second) // stale: each would serve, and cover a failure
		synctest.Wait()
		ctx = deadline(t)
		l.InvalidateTag("cat:a")
		if v, _, ok := l.Peek("a1"); ok {
			t.Fatalf("Peek(a1) after InvalidateTag = %q; want nothing", v)
		}
		if v, info, ok := l.Peek("b1"); !ok || v != "b1#5" || info.Source != SourceStale {
			t.Fatalf("Peek(b1) = %q, %v, %v; want b1#5, stale: another tag's value stays", v, info.Source, ok)
		}
		if v, info, err := l.GetInfo(ctx, "a1"); err != nil || info.Source != SourceLoaded || v != "a1#6" {
			t.Fatalf("Get(a1) after InvalidateTag = %q, %v, %v; want a new load, a1#6", v, info.Source, err)
		}
		if _, info, err := l.GetInfo(ctx, "a2"); !errors.Is(err, errBoom) || info.Source != SourceLoaded {
			t.Fatalf("Get(a2) = %v, %v; want the load's error: no stale-on-error fallback from before InvalidateTag", info.Source, err)
		}
		vals, infos, err := l.GetManyInfo(ctx, []string{"a3", "b1"})
		if err != nil || !strings.HasPrefix(vals["a3"], "a3#") || vals["a3"] == "a3#3" || infos["a3"].Source != SourceLoaded || infos["b1"].Source != SourceStale {
			t.Fatalf("GetMany(a3, b1) = %v, %v, %v; want a3 loaded anew, b1 stale", vals, infos, err)
		}
		l.Refresh(ctx, "a4")
		synctest.Wait()
		if v, info, _ := l.GetInfo(ctx, "a4"); !strings.HasPrefix(v, "a4#") || v == "a4#4" || info.Source != SourceHit {
			t.Fatalf("Get(a4) after Refresh = %q, %v; want a new load's value, a hit", v, info.Source)
		}
		if n := reloads.Load(); n != 0 {
			t.Fatalf("%d Reloads of an a value; want 0: no Reload is handed a value from before InvalidateTag", n)
		}
		if s := l.Stats(); s.TagInvalidations != 1 {
			t.Fatalf("Stats.TagInvalidations = %d; want 1", s.TagInvalidations)
		}
	})
}

// docs/design.md rule 37: a load in flight whose value carries the tag
// answers its own callers and fills nothing; a Get that starts after
// InvalidateTag and finds that load does not take its value: it loads
// again.
func TestInvalidateTagLoadInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{Tags: byFirst})
		ctx := deadline(t)
		first := getAsync(ctx, l, "k1")
		synctest.Wait()
		l.InvalidateTag("cat:k")
		second := getAsync(ctx, l, "k1")
		synctest.Wait()
		d.gate <- struct{}{}
		if r := <-first; r.err != nil || r.v != "k1#1" || r.info.Source != SourceLoaded {
			t.Fatalf("first Get = %q, %v, %v; want its own load's k1#1", r.v, r.info.Source, r.err)
		}
		synctest.Wait()
		if n := d.calls.Load(); n != 2 {
			t.Fatalf("%d downstream calls; want 2: the Get after InvalidateTag loads again", n)
		}
		d.gate <- struct{}{}
		if r := <-second; r.err != nil || r.v != "k1#2" {
			t.Fatalf("second Get = %q, %v; want k1#2, not the value loaded across InvalidateTag", r.v, r.err)
		}
		synctest.Wait()
		if v, info, err := l.GetInfo(ctx, "k1"); v != "k1#2" || info.Source != SourceHit || err != nil {
			t.Fatalf("third Get = %q, %v, %v; want the hit k1#2", v, info.Source, err)
		}
	})
}

// A load in flight across InvalidateTag fills nothing, also when nobody
// asks again meanwhile: the next Get loads.
func TestInvalidateTagFillRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		var events eventLog
		l := newLoader(t, d, Options[string, string]{Tags: byFirst, OnLoad: events.add})
		ctx := deadline(t)
		first := getAsync(ctx, l, "k1")
		synctest.Wait()
		l.InvalidateTag("cat:k")
		d.gate <- struct{}{}
		if r := <-first; r.v != "k1#1" {
			t.Fatalf("Get = %q, %v; want k1#1", r.v, r.err)
		}
		synctest.Wait()
		if ev := events.all(); len(ev) != 1 || ev[0].Stored {
			t.Fatalf("load events %+v; want one, not stored", ev)
		}
		if v, _, ok := l.Peek("k1"); ok {
			t.Fatalf("Peek = %q; want nothing", v)
		}
		second := getAsync(ctx, l, "k1")
		synctest.Wait()
		d.gate <- struct{}{}
		if r := <-second; r.v != "k1#2" || r.info.Source != SourceLoaded {
			t.Fatalf("Get = %q, %v; want a new load, k1#2", r.v, r.info.Source)
		}
	})
}

// docs/design.md rule 37: an InvalidateTag after entryOf asked Tags and
// before the fill (here from Options.Cost, asked between them) is caught
// under the key's lock (keyRules.mayFill): nothing is stored.
func TestInvalidateTagBeforeFill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		var events eventLog
		var l *Loader[string, string]
		var armed atomic.Bool
		cost := func(string) int64 {
			if armed.Load() {
				l.InvalidateTag("cat:k")
			}
			return 1
		}
		l = newLoader(t, d, Options[string, string]{Tags: byFirst, Cost: cost, MaxCost: 1 << 20, OnLoad: events.add})
		ctx := deadline(t)
		armed.Store(true)
		if v, err := l.Get(ctx, "k1"); v != "k1#1" || err != nil {
			t.Fatalf("Get = %q, %v; want k1#1", v, err)
		}
		synctest.Wait()
		if ev := events.all(); len(ev) != 1 || ev[0].Stored {
			t.Fatalf("load events %+v; want one, not stored", ev)
		}
		if v, _, ok := l.Peek("k1"); ok {
			t.Fatalf("Peek = %q; want nothing", v)
		}
		armed.Store(false)
		if v, info, err := l.GetInfo(ctx, "k1"); v != "k1#2" || info.Source != SourceLoaded || err != nil {
			t.Fatalf("Get = %q, %v, %v; want a new load, k1#2", v, info.Source, err)
		}
		synctest.Wait()
		if v, info, err := l.GetInfo(ctx, "k1"); v != "k1#2" || info.Source != SourceHit || err != nil {
			t.Fatalf("Get = %q, %v, %v; want the hit k1#2", v, info.Source, err)
		}
	})
}

// A Set before InvalidateTag is dropped by it; a Set after it stays.
func TestInvalidateTagSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{Tags: byFirst})
		ctx := deadline(t)
		l.Set("k1", "set")
		if v, info, _ := l.GetInfo(ctx, "k1"); v != "set" || info.Source != SourceHit {
			t.Fatalf("Get after Set = %q, %v", v, info.Source)
		}
		l.InvalidateTag("cat:k")
		if v, info, _ := l.GetInfo(ctx, "k1"); v != "k1#1" || info.Source != SourceLoaded {
			t.Fatalf("Get after InvalidateTag = %q, %v; want a load", v, info.Source)
		}
		l.Set("k1", "again")
		synctest.Wait()
		if v, info, _ := l.GetInfo(ctx, "k1"); v != "again" || info.Source != SourceHit {
			t.Fatalf("Get after a later Set = %q, %v; want the hit again", v, info.Source)
		}
		l.InvalidateTag("cat:other") // another tag: nothing changes
		if v, _, ok := l.Peek("k1"); !ok || v != "again" {
			t.Fatalf("Peek after another tag's InvalidateTag = %q, %v", v, ok)
		}
	})
}

// More than MaxTags tags is never a silent cut: a Set stores nothing and
// drops the value held; a load's callers get the value, which is not
// cached; a Tags that panics is the same. Each counts in Stats.TagErrors.
func TestTagsTooMany(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{Tags: func(key, v string) []string {
			switch {
			case v == "nine" || strings.HasPrefix(key, "big"):
				return keyRange("t", MaxTags+1)
			case key == "panics":
				panic("tags")
			case v == "eight":
				return keyRange("t", MaxTags)
			}
			return nil
		}})
		ctx := deadline(t)
		l.Set("k", "eight")
		if v, _, ok := l.Peek("k"); !ok || v != "eight" {
			t.Fatalf("Peek after a Set with MaxTags tags = %q, %v; want it stored", v, ok)
		}
		l.Set("k", "nine")
		if v, _, ok := l.Peek("k"); ok {
			t.Fatalf("Peek after a Set with MaxTags+1 tags = %q; want nothing, the value held dropped too", v)
		}
		for i := 1; i <= 2; i++ {
			if v, info, err := l.GetInfo(ctx, "big"); err != nil || v != fmt.Sprintf("big#%d", i) || info.Source != SourceLoaded {
				t.Fatalf("Get(big) = %q, %v, %v; want its load's value, never cached", v, info.Source, err)
			}
		}
		if v, err := l.Get(ctx, "panics"); err != nil || v != "panics#3" {
			t.Fatalf("Get(panics) = %q, %v; want its value", v, err)
		}
		if s := l.Stats(); s.TagErrors != 4 || s.Panics != 1 {
			t.Fatalf("Stats.TagErrors = %d, Panics = %d; want 4 and 1", s.TagErrors, s.Panics)
		}
	})
}

// docs/design.md rule 38: a cached not-found has the tags Tags gives for
// the zero V, and only those.
func TestTagsNotFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(_ int64, key string) error {
			if strings.HasPrefix(key, "gone") {
				return ErrNotFound
			}
			return nil
		}}
		l := newLoader(t, d, Options[string, string]{NotFoundTTL: time.Minute, Tags: func(key, v string) []string {
			if v == "" && key == "gone1" {
				return []string{"missing"}
			}
			return nil
		}})
		ctx := deadline(t)
		for _, k := range []string{"gone1", "gone2", "gone1", "gone2"} {
			if _, err := l.Get(ctx, k); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get(%s) = %v; want ErrNotFound", k, err)
			}
		}
		if n := d.calls.Load(); n != 2 {
			t.Fatalf("%d calls; want 2: the not-founds are cached", n)
		}
		l.InvalidateTag("missing")
		for _, k := range []string{"gone1", "gone2"} {
			if _, err := l.Get(ctx, k); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get(%s) = %v; want ErrNotFound", k, err)
			}
		}
		if n := d.calls.Load(); n != 3 {
			t.Fatalf("%d calls; want 3: gone1's not-found, tagged, is dropped; gone2's, untagged, stays", n)
		}
	})
}

// Entries yields each value's tags, and Restore stores them: an
// InvalidateTag in the restoring Loader drops a restored value. An Entry
// with more than MaxTags is an error naming the field.
func TestTagsEntriesRestore(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{Tags: func(key, _ string) []string { return []string{"cat:" + key[:1], "all"} }})
	ctx := deadline(t)
	for _, k := range []string{"a1", "b1"} {
		if _, err := l.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	var saved []Entry[string, string]
	waitFor(t, "both entries", time.Minute, func() bool {
		saved = slices.Collect(l.Entries())
		return len(saved) == 2
	})
	for _, en := range saved {
		if want := []string{"cat:" + en.Key[:1], "all"}; !slices.Equal(en.Tags, want) {
			t.Fatalf("Entry %q has Tags %v; want %v", en.Key, en.Tags, want)
		}
	}
	r := newLoader(t, &downstream{}, Options[string, string]{Tags: byFirst})
	if n, err := r.Restore(slices.Values(saved)); n != 2 || err != nil {
		t.Fatalf("Restore = %d, %v", n, err)
	}
	r.InvalidateTag("cat:a")
	if v, _, ok := r.Peek("a1"); ok {
		t.Fatalf("Peek(a1) = %q; want nothing: its restored tag was invalidated", v)
	}
	if _, _, ok := r.Peek("b1"); !ok {
		t.Fatal("Peek(b1) found nothing; want its restored value")
	}
	r.InvalidateTag("all")
	if _, _, ok := r.Peek("b1"); ok {
		t.Fatal("Peek(b1) found a value after its second tag's InvalidateTag")
	}
	bad := Entry[string, string]{Key: "x", Value: "x", LoadedAt: time.Now(), Tags: keyRange("t", MaxTags+1)}
	if n, err := r.Restore(slices.Values([]Entry[string, string]{bad})); n != 0 || !errors.Is(err, ErrTooManyTags) || !strings.Contains(err.Error(), "Entry.Tags") {
		t.Fatalf("Restore of an entry with %d tags = %d, %v; want an error naming Entry.Tags", MaxTags+1, n, err)
	}
}

// Tag states do not outlive the values that hold them: 20,000 values,
// each with a tag of its own, in a cache of 100, leave the table with
// about as many tags as values held once collected; InvalidateTag of tags
// nobody holds adds none.
func TestTagStatesBounded(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{MaxCost: 100, Tags: func(key, _ string) []string { return []string{"own:" + key} }})
	for i := range 20_000 {
		k := strconv.Itoa(i)
		l.Set(k, k)
		l.InvalidateTag("nobody:" + k)
	}
	waitFor(t, "tag states collected", time.Minute, func() bool {
		runtime.GC()
		return l.tags.len() <= 1_000
	})
}

// Without Tags a Loader has no tag table, its entries no extra, and a hit
// allocates nothing; with Tags a hit of a tagged value allocates nothing
// either.
func TestTagsHitAllocs(t *testing.T) {
	for _, tags := range []func(string, string) []string{nil, byFirst} {
		l := newLoader(t, &downstream{}, Options[string, string]{Tags: tags})
		ctx := deadline(t)
		l.Set("k1", "v")
		if _, err := l.Get(ctx, "k1"); err != nil {
			t.Fatal(err)
		}
		if (l.tags == nil) != (tags == nil) {
			t.Fatalf("tag table %v with Tags %v", l.tags != nil, tags != nil)
		}
		if e := l.flights.latest("k1", l.mustHash("k1")); e == nil || (e.extra == nil) != (tags == nil) {
			t.Fatalf("entry %+v; want an extra only with Tags", e)
		}
		if n := testing.AllocsPerRun(100, func() { l.Get(ctx, "k1") }); n != 0 {
			t.Fatalf("a hit allocates %v times; want 0", n)
		}
		if n := testing.AllocsPerRun(100, func() { l.InvalidateTag("cat:x") }); n != 0 {
			t.Fatalf("InvalidateTag allocates %v times; want 0", n)
		}
	}
}

// A storm of InvalidateTag over 64 tags while Gets, GetManys, Peeks, Sets
// and loads run: no Get, GetMany or Peek that starts after a tag's
// invalidation returned is served a value of a version before it, and the
// tag table and the heap stay bounded. A tag's version moves before its
// InvalidateTag; a load reads the version as it runs, a Set writes the
// version it reads under the tag's read lock (so it is wholly before or
// after an invalidation), and every read checks its value's version
// against the last invalidation returned before it started.
func TestInvalidateTagStorm(t *testing.T) {
	const keys, tags, rounds = 512, 64, 3000
	var ver, done [tags]atomic.Int64
	var locks [tags]sync.RWMutex
	tagOf := func(key string) int { n, _ := strconv.Atoi(key[1:]); return n % tags }
	name := func(t int) string { return "t" + strconv.Itoa(t) }
	load := func(ctx context.Context, key string) (string, error) {
		v := ver[tagOf(key)].Load()
		time.Sleep(100 * time.Microsecond) // the downstream's latency: a load in flight holds what it read
		return strconv.FormatInt(v, 10), nil
	}
	l, err := New(load, Options[string, string]{TTL: time.Hour, StaleWhileRevalidate: time.Hour, MaxCost: keys / 2,
		Tags: func(key, _ string) []string { return []string{name(tagOf(key)), "all"} }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var served, stale atomic.Int64
	check := func(key, v string, want int64) {
		served.Add(1)
		if got, _ := strconv.ParseInt(v, 10, 64); got < want {
			stale.Add(1)
			t.Errorf("%s served version %d after version %d's InvalidateTag returned", key, got, want)
		}
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for w := range 2 { // invalidators
		wg.Go(func() {
			for i := range rounds {
				tg := (i*7 + w) % tags
				locks[tg].Lock()
				v := ver[tg].Add(1)
				l.InvalidateTag(name(tg))
				done[tg].Store(v)
				locks[tg].Unlock()
				l.InvalidateTag("nobody" + strconv.Itoa(i)) // held by no value
			}
		})
	}
	wg.Go(func() { // setter
		for i := range rounds {
			k := "k" + strconv.Itoa(i*13%keys)
			tg := tagOf(k)
			locks[tg].RLock()
			l.Set(k, strconv.FormatInt(ver[tg].Load(), 10))
			locks[tg].RUnlock()
		}
	})
	for g := range 4 { // readers
		wg.Go(func() {
			for i := range rounds {
				k := "k" + strconv.Itoa((i*31+g*101)%keys)
				want := done[tagOf(k)].Load()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				switch i % 3 {
				case 0:
					v, err := l.Get(ctx, k)
					if err != nil {
						t.Errorf("Get(%s): %v", k, err)
					} else {
						check(k, v, want)
					}
				case 1:
					k2 := "k" + strconv.Itoa((i*17+g)%keys)
					want2 := done[tagOf(k2)].Load()
					vals, err := l.GetMany(ctx, []string{k, k2})
					if err != nil {
						t.Errorf("GetMany(%s, %s): %v", k, k2, err)
					} else {
						check(k, vals[k], want)
						check(k2, vals[k2], want2)
					}
				default:
					if v, _, ok := l.Peek(k); ok {
						check(k, v, want)
					}
				}
				cancel()
			}
		})
	}
	waitGroup(t, "the storm", &wg)
	var after runtime.MemStats
	waitFor(t, "tag states collected", time.Minute, func() bool {
		runtime.GC()
		return l.tags.len() <= tags+1
	})
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
		t.Errorf("heap grew by %d bytes over the storm; want it bounded (under 16 MiB)", grew)
	}
	s := l.Stats()
	t.Logf("%d values served, %d stale; %d tag invalidations; %d loads", served.Load(), stale.Load(), s.TagInvalidations, s.Loads)
	if s.TagInvalidations != 4*rounds {
		t.Fatalf("Stats.TagInvalidations = %d; want %d", s.TagInvalidations, 4*rounds)
	}
}

// A tagged value's tags are one allocation, its tag states and its stamp
// side by side, so that a hit's check of them (tagList.dropped) follows
// no pointer but one per tag, to the tag's state (docs/benchmarks.md, a
// hit's cost per tag). The states themselves are the tag table's, made
// once per tag.
func TestTagListOneAllocation(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{Tags: byFirst})
	for _, n := range []int{1, 3, MaxTags} {
		tags := keyRange("tag", n)
		if _, err := l.tags.list(tags, 0); err != nil { // the states, made once
			t.Fatal(err)
		}
		var tl *tagList
		if got := testing.AllocsPerRun(100, func() { tl, _ = l.tags.list(tags, 7) }); got != 1 {
			t.Errorf("list(%d tags) allocates %v times; want 1", n, got)
		}
		if got := tl.names(); !slices.Equal(got, tags) || tl.stamp != 7 {
			t.Errorf("list(%v, 7) = %v stamped %d; want the tags in order, stamped 7", tags, got, tl.stamp)
		}
	}
}

// A hit of a Loader without Tags asks nothing of an entry's tags: the
// check is the tag table's, and such a Loader has none (a Loader with
// Version holds an extra on every entry; its hit must not pay a tag
// check there).
func TestUntaggedLoaderSkipsTagCheck(t *testing.T) {
	kr := &keyRules[string, string]{}
	dropped := &tagState{}
	dropped.dropped.Store(2)
	e := &entry[string, string]{freshUntil: time.Hour, extra: &extra[string, string]{versioned: true, tags: &tagList{stamp: 1, states: []*tagState{dropped}}}}
	if src := kr.judge(&caller{ctx: context.Background()}, e, 0); src != SourceHit {
		t.Errorf("judge without a tag table = %v; want %v", src, SourceHit)
	}
	if kr.cleared(e) {
		t.Error("cleared without a tag table = true; want false")
	}
}

package flightcache

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// notFoundKeys makes d answer ErrNotFound for the keys starting with "nf".
func notFoundKeys(_ int64, key string) error {
	if strings.HasPrefix(key, "nf") {
		return ErrNotFound
	}
	return nil
}

// collect gathers what l.Entries yields, by key.
func collect(l *Loader[string, string]) map[string]Entry[string, string] {
	m := map[string]Entry[string, string]{}
	for en := range l.Entries() {
		m[en.Key] = en
	}
	return m
}

// warmLoader is a Loader holding 10 loaded keys, one Set and one cached
// not-found, with its downstream.
func warmLoader(t *testing.T) (*Loader[string, string], *downstream) {
	t.Helper()
	d := &downstream{fail: notFoundKeys}
	l := newLoader(t, d, Options[string, string]{TTL: time.Hour, Jitter: 0.5, StaleWhileRevalidate: time.Minute, NotFoundTTL: time.Hour})
	ctx := deadline(t)
	for i := range 10 {
		if _, err := l.Get(ctx, fmt.Sprint("k", i)); err != nil {
			t.Fatalf("Get(k%d): %v", i, err)
		}
	}
	l.Set("set", "by-set")
	if _, err := l.Get(ctx, "nf1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(nf1) = %v; want ErrNotFound", err)
	}
	return l, d
}

// TestRestoreRoundTrip: what Entries yields, encoded with gob and with
// json, restores into a new Loader whose Gets are then hits (a cached
// not-found among them) with no downstream call (docs/design.md rule 29).
func TestRestoreRoundTrip(t *testing.T) {
	src, _ := warmLoader(t)
	saved := collect(src)
	if len(saved) != 12 || src.Len() != 12 {
		t.Fatalf("Entries gave %d, Len %d; want 12 (10 loaded, 1 Set, 1 not-found)", len(saved), src.Len())
	}
	if en := saved["nf1"]; !en.NotFound || en.Freshness.TTL < 30*time.Minute || en.Freshness.TTL > time.Hour {
		t.Fatalf("Entries' nf1 = %+v; want a not-found with its jittered TTL (30m to 1h)", en)
	}
	if en := saved["set"]; en.Value != "by-set" || en.Freshness.StaleWhileRevalidate != time.Minute || en.Freshness.StaleIfError != -1 {
		t.Fatalf("Entries' set = %+v; want its value and windows (SIE none: -1)", en)
	}
	list := slices.Collect(maps.Values(saved))
	for _, codec := range []string{"gob", "json"} {
		t.Run(codec, func(t *testing.T) {
			back := roundTrip(t, codec, list)
			d := &downstream{fail: notFoundKeys}
			l := newLoader(t, d, Options[string, string]{TTL: time.Hour, StaleWhileRevalidate: time.Minute})
			n, err := l.Restore(slices.Values(back))
			if err != nil || n != 12 || l.Len() != 12 {
				t.Fatalf("Restore = %d, %v; Len %d; want 12, nil; 12", n, err, l.Len())
			}
			got := collect(l)
			ctx := deadline(t)
			for k, en := range saved {
				// LoadedAt goes through two clocks (wall and monotonic), read
				// a moment apart: equal within a wide margin.
				if g := got[k]; g.LoadedAt.Sub(en.LoadedAt).Abs() > 100*time.Millisecond || g.Freshness != en.Freshness || g.NotFound != en.NotFound {
					t.Errorf("restored %q = %+v; want %+v", k, g, en)
				}
				v, info, err := l.GetInfo(ctx, k)
				switch {
				case en.NotFound && (!errors.Is(err, ErrNotFound) || info.Source != SourceHit):
					t.Errorf("GetInfo(%q) = %v, %v; want a cached not-found", k, info.Source, err)
				case !en.NotFound && (err != nil || v != en.Value || info.Source != SourceHit):
					t.Errorf("GetInfo(%q) = %q, %v, %v; want %q, a hit", k, v, info.Source, err, en.Value)
				}
			}
			if c := d.calls.Load(); c != 0 {
				t.Fatalf("downstream calls after Restore = %d; want 0", c)
			}
		})
	}
}

// roundTrip encodes es with codec and decodes them.
func roundTrip(t *testing.T, codec string, es []Entry[string, string]) []Entry[string, string] {
	t.Helper()
	var buf bytes.Buffer
	var back []Entry[string, string]
	var err error
	if codec == "gob" {
		if err = gob.NewEncoder(&buf).Encode(es); err == nil {
			err = gob.NewDecoder(&buf).Decode(&back)
		}
	} else {
		if err = json.NewEncoder(&buf).Encode(es); err == nil {
			err = json.NewDecoder(&buf).Decode(&back)
		}
	}
	if err != nil || len(back) != len(es) {
		t.Fatalf("%s round trip: %d entries, %v; want %d", codec, len(back), err, len(es))
	}
	return back
}

// TestRestoreWindows: an entry past every window is skipped; one in its
// stale window is restored stale, its age counted from LoadedAt, and its
// Get starts the one background refresh; a restored not-found answers as
// a cached not-found (docs/design.md rule 29). It runs in a synctest
// bubble: the counters are read once the refresh has ended, never while
// it runs.
func TestRestoreWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute})
		now := time.Now()
		swr := Freshness{TTL: time.Minute, StaleWhileRevalidate: time.Hour, StaleIfError: -1}
		entries := []Entry[string, string]{
			{Key: "past", Value: "old", LoadedAt: now.Add(-3 * time.Hour), Freshness: swr},
			{Key: "stale", Value: "v", LoadedAt: now.Add(-30 * time.Minute), Freshness: swr},
			{Key: "nf", NotFound: true, LoadedAt: now, Freshness: Freshness{TTL: time.Hour}},
			{Key: "nf-past", NotFound: true, LoadedAt: now.Add(-2 * time.Hour), Freshness: Freshness{TTL: time.Hour}},
			{Key: "nf-no-ttl", NotFound: true, LoadedAt: now}, // NotFoundTTL is 0: nothing to restore it for
			{Key: "future", Value: "f", LoadedAt: now.Add(time.Hour), Freshness: Freshness{TTL: time.Minute}},
		}
		n, err := l.Restore(slices.Values(entries))
		if err != nil || n != 3 {
			t.Fatalf("Restore = %d, %v; want 3 (stale, nf, future), nil", n, err)
		}
		ctx := deadline(t)
		if v, _, ok := l.Peek("past"); ok {
			t.Errorf("Peek(past) = %q; want nothing: it was past its windows", v)
		}
		v, info, err := l.GetInfo(ctx, "stale")
		if err != nil || v != "v" || info.Source != SourceStale || info.Age != 30*time.Minute {
			t.Errorf("GetInfo(stale) = %q, %+v, %v; want v, stale, aged 30m", v, info, err)
		}
		if _, info, err := l.GetInfo(ctx, "nf"); !errors.Is(err, ErrNotFound) || info.Source != SourceHit {
			t.Errorf("GetInfo(nf) = %v, %v; want a cached not-found (hit, ErrNotFound)", info.Source, err)
		}
		if v, info, err := l.GetInfo(ctx, "future"); err != nil || v != "f" || info.Source != SourceHit || info.Age > time.Minute {
			t.Errorf("GetInfo(future) = %q, %+v, %v; want f, a hit loaded now", v, info, err)
		}
		synctest.Wait() // the stale key's background refresh has ended
		if c, s := d.calls.Load(), d.count("stale"); c != 1 || s != 1 {
			t.Fatalf("downstream calls = %d, %d of them the stale key's; want 1, its one refresh", c, s)
		}
	})
}

// TestRestoreKeepsHeld: Restore never replaces a key held (a Set's value,
// a loaded one) nor one whose load is in flight, whose value then wins
// (docs/design.md rule 29).
func TestRestoreKeepsHeld(t *testing.T) {
	d := &downstream{gate: make(chan struct{}), started: make(chan string, 1)}
	l := newLoader(t, d, Options[string, string]{TTL: time.Hour})
	l.Set("set", "new")
	ctx := deadline(t)
	loading := getAsync(ctx, l, "loading")
	recv(t, "the load of loading", d.started) // its load is in flight
	old := func(k string) Entry[string, string] {
		return Entry[string, string]{Key: k, Value: "old", LoadedAt: time.Now()}
	}
	n, err := l.Restore(slices.Values([]Entry[string, string]{old("set"), old("loading"), old("free")}))
	if err != nil || n != 1 {
		t.Fatalf("Restore = %d, %v; want 1 (free), nil", n, err)
	}
	close(d.gate)
	if r := recv(t, "Get(loading)", loading); r.err != nil || r.v != "loading#1" {
		t.Fatalf("Get(loading) = %q, %v; want loading#1", r.v, r.err)
	}
	for k, want := range map[string]string{"set": "new", "loading": "loading#1", "free": "old"} {
		if v, err := l.Get(ctx, k); err != nil || v != want {
			t.Errorf("Get(%q) = %q, %v; want %q", k, v, err, want)
		}
	}
	if n, _ := l.Restore(slices.Values([]Entry[string, string]{old("free")})); n != 0 {
		t.Errorf("Restore of a key restored already stored %d; want 0", n)
	}
}

// TestRestoreRacesSets: Restores race Sets and Gets of the same keys on
// many goroutines; every key Set ends with the Set's value, whichever came
// first, while the control keys nobody Sets end restored (docs/design.md
// rule 29).
func TestRestoreRacesSets(t *testing.T) {
	const keys, rounds = 64, 20
	for round := range rounds {
		d := &downstream{}
		l := newLoader(t, d, Options[string, string]{TTL: time.Hour, MaxPendingWrites: 8})
		var old []Entry[string, string]
		for i := range keys {
			old = append(old, Entry[string, string]{Key: fmt.Sprint("k", i), Value: "old", LoadedAt: time.Now()})
		}
		ctx := deadline(t)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() { // two restorers, two in the other order
				es := slices.Clone(old)
				if g%2 == 1 {
					slices.Reverse(es)
				}
				if _, err := l.Restore(slices.Values(es)); err != nil {
					t.Errorf("Restore: %v", err)
				}
			})
		}
		for i := 0; i < keys; i += 2 { // even keys are Set; odd keys are the control
			wg.Go(func() { l.Set(fmt.Sprint("k", i), "new") })
			wg.Go(func() { l.Get(ctx, fmt.Sprint("k", i)) })
		}
		waitGroup(t, "the Restores, Sets and Gets", &wg)
		for i := range keys {
			want := "old"
			if i%2 == 0 {
				want = "new"
			}
			v, err := l.Get(ctx, fmt.Sprint("k", i))
			if err != nil || v != want {
				t.Fatalf("round %d: Get(k%d) = %q, %v; want %q", round, i, v, err, want)
			}
		}
		l.Close()
	}
}

// TestLenEntriesAfterInvalidate: Len and Entries follow Invalidate and
// InvalidateAll, count nothing as a Get, load nothing, and let the loop's
// body write the Loader (docs/design.md rule 29).
func TestLenEntriesAfterInvalidate(t *testing.T) {
	l, d := warmLoader(t)
	before, calls := l.Stats(), d.calls.Load()
	l.Invalidate("k1")
	if n := l.Len(); n != 11 {
		t.Fatalf("Len after Invalidate = %d; want 11", n)
	}
	if _, ok := collect(l)["k1"]; ok {
		t.Fatal("Entries yields k1 after Invalidate")
	}
	for en := range l.Entries() { // the body writes the Loader: nothing waits on the iteration
		l.Set(en.Key, en.Value+"!")
	}
	if got := collect(l)["k2"].Value; got != "k2#3!" {
		t.Fatalf("Entries after Sets gives k2 = %q; want k2#3!", got)
	}
	after := l.Stats()
	if after.Gets != before.Gets || d.calls.Load() != calls {
		t.Fatalf("Len and Entries made Gets %d→%d, downstream calls %d→%d; want none", before.Gets, after.Gets, calls, d.calls.Load())
	}
	l.InvalidateAll()
	if n, es := l.Len(), collect(l); n != 0 || len(es) != 0 {
		t.Fatalf("after InvalidateAll: Len %d, Entries %d; want 0, 0", n, len(es))
	}
}

// TestRestoreClosedAndInvalid: Restore after Close returns ErrClosed,
// Entries and Len find nothing; an invalid entry stops Restore with an
// error naming its field, after the entries before it (docs/design.md
// rule 29).
func TestRestoreClosedAndInvalid(t *testing.T) {
	d := &downstream{}
	l := newLoader(t, d, Options[string, string]{TTL: time.Hour})
	good := Entry[string, string]{Key: "a", Value: "v", LoadedAt: time.Now()}
	for _, bad := range []struct {
		en    Entry[string, string]
		field string
	}{
		{Entry[string, string]{Key: "b"}, "LoadedAt"},
		{Entry[string, string]{Key: "c", LoadedAt: time.Now(), Freshness: Freshness{TTL: -1}}, "Freshness.TTL"},
	} {
		n, err := l.Restore(slices.Values([]Entry[string, string]{good, bad.en, {Key: "z", Value: "v", LoadedAt: time.Now()}}))
		if err == nil || !strings.Contains(err.Error(), bad.field) || !strings.Contains(err.Error(), "entry 1") {
			t.Errorf("Restore with a bad %s = %v; want an error naming entry 1's field", bad.field, err)
		}
		if good.Key += "+"; n != 1 {
			t.Errorf("Restore with a bad %s stored %d; want 1 (the entry before)", bad.field, n)
		}
	}
	l.Close()
	if n, err := l.Restore(slices.Values([]Entry[string, string]{{Key: "x", Value: "v", LoadedAt: time.Now()}})); n != 0 || !errors.Is(err, ErrClosed) {
		t.Fatalf("Restore after Close = %d, %v; want 0, ErrClosed", n, err)
	}
	if n, es := l.Len(), collect(l); n != 0 || len(es) != 0 {
		t.Fatalf("after Close: Len %d, Entries %d; want 0, 0", n, len(es))
	}
}

// TestRestoreBounded: a Restore far larger than MaxPendingWrites goes
// through the bounded write path, waiting its turns, and stores every
// entry (docs/design.md rule 29).
func TestRestoreBounded(t *testing.T) {
	const n = 2000
	l := newLoader(t, &downstream{}, Options[string, string]{TTL: time.Hour, MaxPendingWrites: 2})
	peak := int64(0)
	n2, err := l.Restore(func(yield func(Entry[string, string]) bool) {
		for i := range n {
			peak = max(peak, l.Stats().PendingWrites)
			if !yield(Entry[string, string]{Key: fmt.Sprint("k", i), Value: "v", LoadedAt: time.Now()}) {
				return
			}
		}
	})
	if err != nil || n2 != n {
		t.Fatalf("Restore = %d, %v; want %d, nil", n2, err, n)
	}
	if peak > 2*2 {
		t.Errorf("pending writes peaked at %d; want at most 2 × MaxPendingWrites", peak)
	}
	waitFor(t, "the cache to apply every restored entry", 10*time.Second, func() bool { return l.Stats().PendingWrites == 0 })
	if got := l.Len(); got != n {
		t.Fatalf("Len = %d; want %d", got, n)
	}
}

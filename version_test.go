package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// row is a versioned value: by tells two rows of one version apart.
type row struct {
	ver uint64
	by  string
}

func rowVersion(r row) uint64 { return r.ver }

// rowSource is a fake database replica for a Loader of rows: each load
// returns what next says (a row, or an error), counting its calls; with
// gate set, each load waits for it, announcing itself on started first.
type rowSource struct {
	mu      sync.Mutex
	next    row
	err     error
	calls   int
	gate    chan struct{}
	started chan struct{}
}

func (s *rowSource) set(r row, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next, s.err = r, err
}

func (s *rowSource) load(ctx context.Context, _ string) (row, error) {
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return row{}, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.next, s.err
}

func (s *rowSource) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// newRowLoader builds a Loader of rows on s, versioned by rowVersion unless
// opts says otherwise, and closes it when the test ends.
func newRowLoader(t testing.TB, s *rowSource, opts Options[string, row]) *Loader[string, row] {
	t.Helper()
	if opts.TTL == 0 {
		opts.TTL = time.Hour
	}
	if opts.Version == nil {
		opts.Version = rowVersion
	}
	l, err := New(s.load, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// peekRow returns the row held for key (ok false: none).
func peekRow(l *Loader[string, row], key string) (row, bool) {
	r, _, ok := l.Peek(key)
	return r, ok
}

// docs/design.md rule 30: a Set never replaces a held value of a higher
// version; an equal version wins, as without Version; each write dropped
// counts once in Stats.WritesOutdated.
func TestVersionSet(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sets     []row
		want     row
		outdated uint64
	}{
		{"newer wins", []row{{1, "a"}, {2, "b"}}, row{2, "b"}, 0},
		{"older loses", []row{{2, "b"}, {1, "a"}}, row{2, "b"}, 1},
		{"tie: the write wins", []row{{2, "a"}, {2, "b"}}, row{2, "b"}, 0},
		{"older twice, then newer", []row{{5, "a"}, {3, "b"}, {4, "c"}, {6, "d"}}, row{6, "d"}, 2},
		{"zero version under a higher", []row{{1, "a"}, {0, "b"}}, row{1, "a"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, applied := range []bool{false, true} { // the held value pending, or in the cache
				l := newRowLoader(t, &rowSource{}, Options[string, row]{})
				for _, r := range tc.sets {
					l.Set("k", r)
					if applied {
						waitFor(t, "the writer to apply it", 10*time.Second, func() bool { return !l.pending("k") })
					}
				}
				if got, ok := peekRow(l, "k"); !ok || got != tc.want {
					t.Errorf("applied=%v: Peek after Sets %v = %v, %v; want %v", applied, tc.sets, got, ok, tc.want)
				}
				if s := l.Stats(); s.WritesOutdated != tc.outdated {
					t.Errorf("applied=%v: Stats.WritesOutdated = %d; want %d", applied, s.WritesOutdated, tc.outdated)
				}
			}
		})
	}
}

// docs/design.md rule 30: a load that returns an older row than the one
// held (a replica lagging behind a Set) gives its callers what it read,
// while the cache keeps the newer row with its freshness; the load's event
// says it stored nothing. Each kind of load: a revalidating Get, Refresh,
// a Get past the stale window through Reload, GetMany.
func TestVersionFillKeepsNewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &rowSource{}
		var stored []bool
		var mu sync.Mutex
		l := newRowLoader(t, src, Options[string, row]{
			TTL:    time.Minute,
			Reload: func(ctx context.Context, k string, _ row) (row, error) { return src.load(ctx, k) },
			LoadMany: func(ctx context.Context, keys []string) (map[string]row, error) {
				r, err := src.load(ctx, keys[0])
				return map[string]row{keys[0]: r}, err
			},
			OnLoad: func(ev LoadEvent[string]) { mu.Lock(); stored = append(stored, ev.Stored); mu.Unlock() },
		})
		ctx := context.Background()
		l.Set("k", row{5, "set"})
		src.set(row{3, "replica"}, nil)
		time.Sleep(10 * time.Second)

		if got, err := l.Get(WithRevalidate(ctx), "k"); err != nil || got != (row{3, "replica"}) {
			t.Fatalf(`revalidating Get("k") = %v, %v; want the replica's row {3 replica}`, got, err)
		}
		l.Refresh(ctx, "k")
		synctest.Wait()
		if got, err := l.GetMany(WithRevalidate(ctx), []string{"k"}); err != nil || got["k"] != (row{3, "replica"}) {
			t.Fatalf(`revalidating GetMany("k") = %v, %v; want the replica's row`, got, err)
		}
		got, info, err := l.GetInfo(ctx, "k")
		if err != nil || got != (row{5, "set"}) || info.Source != SourceHit || info.Age != 10*time.Second {
			t.Fatalf(`GetInfo("k") = %v, %+v, %v; want the Set's row {5 set}, a hit 10s old`, got, info, err)
		}
		time.Sleep(time.Minute) // the Set's freshness ends: a Get reloads
		if got, info, err := l.GetInfo(ctx, "k"); err != nil || got != (row{3, "replica"}) || info.Source != SourceLoaded {
			t.Fatalf(`GetInfo("k") once expired = %v, %+v, %v; want the replica's row, loaded`, got, info, err)
		}
		// Expired, the Set's row holds no version: the older row replaces it.
		if got, ok := peekRow(l, "k"); !ok || got != (row{3, "replica"}) {
			t.Errorf(`Peek("k") after the reload of an expired row = %v, %v; want {3 replica}`, got, ok)
		}
		synctest.Wait() // the last load's OnLoad comes after its Get returned
		s := l.Stats()
		if s.WritesOutdated != 3 || src.count() != 4 {
			t.Errorf("Stats.WritesOutdated = %d, loads %d; want 3 outdated of 4", s.WritesOutdated, src.count())
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []bool{false, false, false, true}; fmt.Sprint(stored) != fmt.Sprint(want) {
			t.Errorf("LoadEvent.Stored = %v; want %v", stored, want)
		}
	})
}

// docs/design.md rule 30: a background refresh whose row is outdated
// leaves the stale row held and backs off like a failed one, so the stale
// window does not turn into one refresh after another; after the backoff
// the next stale Get refreshes again.
func TestVersionRefreshOutdatedBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &rowSource{}
		l := newRowLoader(t, src, Options[string, row]{
			TTL: time.Minute, StaleWhileRevalidate: time.Hour,
			Retry: Retry{InitialInterval: time.Second, MaxInterval: time.Second},
		})
		ctx := context.Background()
		l.Set("k", row{5, "set"})
		src.set(row{3, "replica"}, nil)
		time.Sleep(2 * time.Minute)
		for i := range 3 {
			if got, info, err := l.GetInfo(ctx, "k"); err != nil || got != (row{5, "set"}) || info.Source != SourceStale {
				t.Fatalf(`GetInfo("k") #%d = %v, %+v, %v; want the stale Set row`, i, got, info, err)
			}
			synctest.Wait()
		}
		if n := src.count(); n != 1 {
			t.Fatalf("refreshes during the backoff: %d loads; want 1", n)
		}
		time.Sleep(2 * time.Second) // past the backoff (at most MaxInterval)
		l.Get(ctx, "k")
		synctest.Wait()
		if n, s := src.count(), l.Stats(); n != 2 || s.WritesOutdated != 2 {
			t.Fatalf("after the backoff: %d loads, %d outdated; want 2 and 2", n, s.WritesOutdated)
		}
		src.set(row{6, "replica"}, nil) // the replica caught up
		time.Sleep(time.Hour)
		l.Get(ctx, "k")
		synctest.Wait()
		if got, ok := peekRow(l, "k"); !ok || got != (row{6, "replica"}) {
			t.Errorf(`Peek("k") once the replica caught up = %v, %v; want {6 replica}`, got, ok)
		}
	})
}

// docs/design.md rule 30: not-founds, Invalidate and InvalidateAll are not
// versioned: each drops the row held, whatever its version, and a write
// of any version after it is stored. So is a value not to be cached.
func TestVersionDropsAreNotVersioned(t *testing.T) {
	nf := func(l *Loader[string, row], src *rowSource) {
		src.set(row{}, ErrNotFound)
		l.Get(WithRevalidate(context.Background()), "k")
	}
	for _, tc := range []struct {
		name string
		drop func(l *Loader[string, row], src *rowSource)
		opts Options[string, row]
	}{
		{"not-found", nf, Options[string, row]{}},
		{"cached not-found", nf, Options[string, row]{NotFoundTTL: time.Hour}},
		{"Invalidate", func(l *Loader[string, row], _ *rowSource) { l.Invalidate("k") }, Options[string, row]{}},
		{"InvalidateAll", func(l *Loader[string, row], _ *rowSource) { l.InvalidateAll() }, Options[string, row]{}},
		{"a value not to be cached", func(l *Loader[string, row], _ *rowSource) { l.Set("k", row{1, "uncached"}) },
			Options[string, row]{Freshness: func(_ string, r row) Freshness {
				if r.by == "uncached" {
					return Freshness{TTL: -1}
				}
				return Freshness{}
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &rowSource{}
			l := newRowLoader(t, src, tc.opts)
			l.Set("k", row{5, "set"})
			tc.drop(l, src)
			if got, ok := peekRow(l, "k"); ok {
				t.Fatalf(`Peek("k") after the drop = %v; want nothing`, got)
			}
			l.Set("k", row{1, "after"})
			if got, ok := peekRow(l, "k"); !ok || got != (row{1, "after"}) {
				t.Errorf(`Peek("k") after Set of an older row = %v, %v; want {1 after}`, got, ok)
			}
			if s := l.Stats(); s.WritesOutdated != 0 {
				t.Errorf("Stats.WritesOutdated = %d; want 0", s.WritesOutdated)
			}
		})
	}
}

// A panic in Options.Version: the row reaches its callers but is not
// cached (and drops the row held, as any value not to be cached does),
// counted in Stats.Panics.
func TestVersionPanics(t *testing.T) {
	src := &rowSource{}
	l := newRowLoader(t, src, Options[string, row]{Version: func(r row) uint64 {
		if r.by == "bad" {
			panic("no version")
		}
		return r.ver
	}})
	l.Set("k", row{5, "set"})
	src.set(row{9, "bad"}, nil)
	if got, err := l.Get(WithRevalidate(context.Background()), "k"); err != nil || got != (row{9, "bad"}) {
		t.Fatalf(`revalidating Get("k") = %v, %v; want {9 bad}`, got, err)
	}
	if got, ok := peekRow(l, "k"); ok {
		t.Errorf(`Peek("k") = %v; want nothing`, got)
	}
	if s := l.Stats(); s.Panics != 1 {
		t.Errorf("Stats.Panics = %d; want 1", s.Panics)
	}
}

// docs/design.md rules 6 and 29, step by step: a Set and a load of an
// older row, in every order their steps can take (the writer held, so the
// held row is a pending write, or free, so it is cached); the Set never
// loses.
//
//	A: the load starts, Set(v2), the load ends with v1: detached (rule 6).
//	B: Set(v2), the load starts, ends with v1: outdated (rule 30).
//	C: the load starts, ends with v1, Set(v2): the Set replaces it.
func TestVersionSetRacingOlderLoad(t *testing.T) {
	steps := map[string]func(l *Loader[string, row], src *rowSource, get func()){
		"A": func(l *Loader[string, row], src *rowSource, get func()) {
			go get()
			<-src.started
			l.Set("k", row{2, "set"})
			src.gate <- struct{}{}
		},
		"B": func(l *Loader[string, row], src *rowSource, get func()) {
			l.Set("k", row{2, "set"})
			go get()
			<-src.started
			src.gate <- struct{}{}
		},
		"C": func(l *Loader[string, row], src *rowSource, get func()) {
			go get()
			<-src.started
			src.gate <- struct{}{}
			synctest.Wait() // the load has filled
			l.Set("k", row{2, "set"})
		},
	}
	for _, name := range []string{"A", "B", "C"} {
		for _, held := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/writer-held=%v", name, held), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					if held {
						defer holdWriter(t)() // released before the Loader closes
					}
					src := &rowSource{gate: make(chan struct{}), started: make(chan struct{})}
					src.set(row{1, "replica"}, nil)
					l := newRowLoader(t, src, Options[string, row]{})
					got := make(chan row, 1)
					get := func() {
						r, _ := l.Get(WithRevalidate(context.Background()), "k")
						got <- r
					}
					steps[name](l, src, get)
					if r := <-got; r != (row{1, "replica"}) {
						t.Errorf("the load's caller got %v; want what it read, {1 replica}", r)
					}
					synctest.Wait()
					if r, ok := peekRow(l, "k"); !ok || r != (row{2, "set"}) {
						t.Errorf(`Peek("k") = %v, %v; want the Set's row {2 set}`, r, ok)
					}
				})
			})
		}
	}
}

// docs/design.md rule 30 under -race: writers that each write the
// database (a version counter) and then Set the row, racing loads from a
// replica that returns any version up to the database's (revalidating
// Gets, Refresh, GetMany). A reader sees each key's version only grow, and
// once everyone is done every key holds the database's last version.
func TestVersionStorm(t *testing.T) {
	const keys, writers, readers = 4, 6, 4
	rounds := 3000
	if raceEnabled {
		rounds = 600
	}
	var db [keys]atomic.Uint64
	idx := func(k string) int { return int(k[1] - '0') }
	replica := func(k string) uint64 { return rand.Uint64N(db[idx(k)].Load() + 1) }
	l, err := New(func(_ context.Context, k string) (uint64, error) { return replica(k), nil },
		Options[string, uint64]{TTL: time.Hour, Version: func(v uint64) uint64 { return v },
			LoadMany: func(_ context.Context, ks []string) (map[string]uint64, error) {
				m := make(map[string]uint64, len(ks))
				for _, k := range ks {
					m[k] = replica(k)
				}
				return m, nil
			}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	names := []string{"k0", "k1", "k2", "k3"}
	ctx := WithRevalidate(context.Background())
	var wg, work sync.WaitGroup
	var left atomic.Int64 // rounds not done yet
	left.Store(int64((writers + readers) * rounds))
	stop := make(chan struct{})
	for w := range writers + readers {
		work.Go(func() {
			for i := range rounds {
				k := names[(w+i)%keys]
				switch {
				case w < writers:
					l.Set(k, db[idx(k)].Add(1))
				case i%3 == 0:
					l.Get(ctx, k)
				case i%3 == 1:
					l.Refresh(context.Background(), k)
				default:
					l.GetMany(ctx, names)
				}
				left.Add(-1)
			}
		})
	}
	wg.Go(func() { // the reader
		var last [keys]uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i, k := range names {
				if v, _, ok := l.Peek(k); ok {
					if v < last[i] {
						t.Errorf("Peek(%q) = %d after %d: the held version went back", k, v, last[i])
					}
					last[i] = v
				}
			}
		}
	})
	waitProgress(t, "rounds of the writers and readers", patience, left.Load)
	waitGroup(t, "the writers and readers", &work)
	close(stop)
	waitGroup(t, "the Peek reader", &wg)
	for i, k := range names {
		if v, _, ok := l.Peek(k); !ok || v != db[i].Load() {
			t.Errorf("Peek(%q) = %d, %v; want the last version written, %d", k, v, ok, db[i].Load())
		}
	}
	t.Logf("%d writes outdated", l.Stats().WritesOutdated)
}

// The lost update of cache-aside, measured: in each of 100 rounds two
// writers write one row in the database (each a new version) and then Set
// what they wrote; count the rounds where the cache ends with the older
// row. Without Version some rounds are lost; with it, none.
func TestVersionLostUpdate(t *testing.T) {
	lost := func(version func(uint64) uint64) int {
		l, err := New(func(context.Context, string) (uint64, error) { return 0, nil },
			Options[string, uint64]{TTL: time.Hour, Version: version})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var mu sync.Mutex
		var dbRow uint64
		n := 0
		for round := range 100 {
			var wg sync.WaitGroup
			for range 2 {
				wg.Go(func() {
					mu.Lock()
					dbRow++ // the database write: the newer row of the two
					v := dbRow
					mu.Unlock()
					time.Sleep(time.Duration(rand.IntN(50)) * time.Microsecond) // the reply's way back
					l.Set("row", v)
				})
			}
			waitGroup(t, "the two writers", &wg)
			if v, _, _ := l.Peek("row"); v != uint64(2*(round+1)) {
				n++
			}
		}
		return n
	}
	without, with := lost(nil), lost(func(v uint64) uint64 { return v })
	t.Logf("rounds of 100 that left the older row cached: %d without Version, %d with", without, with)
	if with != 0 {
		t.Errorf("with Version, %d rounds of 100 left the older row cached; want 0", with)
	}
}

// A hit allocates nothing with Version either: the version is read only
// by writes.
func TestVersionHitAllocatesNothing(t *testing.T) {
	l := newRowLoader(t, &rowSource{}, Options[string, row]{})
	l.Set("k", row{1, "set"})
	ctx := context.Background()
	if _, info, err := l.GetInfo(ctx, "k"); err != nil || info.Source != SourceHit {
		t.Fatalf(`GetInfo("k") = %v, %v; want a hit`, info.Source, err)
	}
	if n := testing.AllocsPerRun(1000, func() { l.Get(ctx, "k") }); n != 0 {
		t.Errorf("a hit with Version allocates %v times; want 0", n)
	}
}

// BenchmarkSetVersion: Set of one key, with and without Version (a
// versioned entry carries its version apart, one allocation more).
func BenchmarkSetVersion(b *testing.B) {
	for _, versioned := range []bool{false, true} {
		b.Run(fmt.Sprintf("version=%v", versioned), func(b *testing.B) {
			opts := Options[string, uint64]{TTL: time.Hour}
			if versioned {
				opts.Version = func(v uint64) uint64 { return v }
			}
			l, err := New(func(context.Context, string) (uint64, error) { return 0, errors.New("unused") }, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ReportAllocs()
			var v uint64
			for b.Loop() {
				v++
				l.Set(benchNames[v%benchKeys], v)
			}
		})
	}
}

// BenchmarkGetHitVersion: BenchmarkGetHit's Loader with Version: the hit
// path must stay at 0 allocs/op.
func BenchmarkGetHitVersion(b *testing.B) {
	trace := zipfTrace(1 << 16)
	opts := Options[string, string]{Version: func(s string) uint64 { return uint64(len(s)) }}
	b.Run("mode=serial", func(b *testing.B) { loaderHits(b, opts, trace, false) })
	b.Run("mode=parallel", func(b *testing.B) { loaderHits(b, opts, trace, true) })
}

// docs/design.md rules 29 and 30: a restored value carries its version (asked
// of Version, as a Set's is), so an older write after Restore loses to it; a
// restored entry never replaces a key held, whatever the versions.
func TestVersionRestore(t *testing.T) {
	l := newRowLoader(t, &rowSource{}, Options[string, row]{})
	l.Set("held", row{1, "set"})
	at := time.Now()
	saved := []Entry[string, row]{
		{Key: "k", Value: row{5, "restored"}, LoadedAt: at},
		{Key: "held", Value: row{9, "restored"}, LoadedAt: at},
	}
	n, err := l.Restore(slices.Values(saved))
	if err != nil || n != 1 {
		t.Fatalf("Restore = %d, %v; want 1 stored (the held key skipped)", n, err)
	}
	l.Set("k", row{4, "older"})
	if got, ok := peekRow(l, "k"); !ok || got != (row{5, "restored"}) {
		t.Errorf(`Peek("k") after an older Set = %v, %v; want the restored {5 restored}`, got, ok)
	}
	if got, ok := peekRow(l, "held"); !ok || got != (row{1, "set"}) {
		t.Errorf(`Peek("held") = %v, %v; want the Set's {1 set}: Restore never replaces`, got, ok)
	}
	if s := l.Stats(); s.WritesOutdated != 1 {
		t.Errorf("Stats.WritesOutdated = %d; want 1 (the older Set)", s.WritesOutdated)
	}
}

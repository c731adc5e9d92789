package flightcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// infoKeys are the situations GetManyInfo is compared with GetInfo in: a
// fresh hit, a stale value served at once, a load this call starts, one
// it shares with another caller's, a stale value covering a failed load,
// a not-found, a failure, and a cached not-found.
var infoKeys = []string{"hit", "stale", "loaded", "shared", "soe", "gone", "bad", "nf-hit"}

// infoSide is one Loader of the comparison, with every key of infoKeys set
// up in its situation, and the answers it gave.
type infoSide struct {
	l     *Loader[string, string]
	vals  map[string]string
	errs  map[string]error
	infos map[string]Info
}

// newInfoSide builds a Loader whose downstream takes 50ms per call and
// answers each key of infoKeys as its situation needs: through a LoadFunc,
// or (batched) through a LoadMany alone, one key per call, so that each
// key's outcome is its own in a GetMany too.
func newInfoSide(t *testing.T, batched bool) *infoSide {
	one := func(ctx context.Context, key string) (string, error) {
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return "", ctx.Err()
		}
		switch key {
		case "gone", "nf-hit":
			return "", ErrNotFound
		case "bad", "soe":
			return "", errBoom
		}
		return "v-" + key, nil
	}
	opts := Options[string, string]{
		TTL: time.Second, StaleIfError: time.Hour, NotFoundTTL: time.Minute,
		Freshness: func(key, _ string) Freshness {
			if key == "stale" {
				return Freshness{StaleWhileRevalidate: time.Hour}
			}
			return Freshness{}
		},
		Breaker: Breaker{Disabled: true},
	}
	load := one
	if batched {
		load = nil
		opts.MaxBatch = 1
		opts.LoadMany = func(ctx context.Context, keys []string) (map[string]string, error) {
			v, err := one(ctx, keys[0])
			switch {
			case errors.Is(err, ErrNotFound):
				return nil, nil
			case err != nil:
				return nil, err
			}
			return map[string]string{keys[0]: v}, nil
		}
	}
	l, err := New(load, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &infoSide{l: l, vals: map[string]string{}, errs: map[string]error{}}
}

// docs/design.md rule 15: GetManyInfo gives each key the Info GetInfo
// gives it in the same situation (hit, stale, loaded, shared,
// stale-on-error, a not-found, a failure, a cached not-found), with
// GetMany's values and errors. Two Loaders live the same virtual time:
// one answers with a GetInfo per key, all at once, the other with one
// GetManyInfo.
func TestGetManyInfoMatchesGetInfo(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("LoadMany=%v", batched), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := deadline(t)
				single, many := newInfoSide(t, batched), newInfoSide(t, batched)
				sides := []*infoSide{single, many}
				var setup sync.WaitGroup
				for _, sd := range sides {
					setup.Go(func() { sd.l.Get(ctx, "nf-hit") }) // a not-found, cached for a minute
				}
				setup.Wait() // 50ms
				for _, sd := range sides {
					sd.l.Set("stale", "old-stale")
					sd.l.Set("soe", "old-soe")
				}
				time.Sleep(2 * time.Second) // stale and soe are past their TTL
				var others sync.WaitGroup
				for _, sd := range sides {
					sd.l.Set("hit", "v-hit")
					others.Go(func() { sd.l.Get(ctx, "shared") }) // another caller's load
				}
				time.Sleep(20 * time.Millisecond)

				var wg sync.WaitGroup
				var mu sync.Mutex
				single.infos = map[string]Info{}
				for _, k := range infoKeys {
					wg.Go(func() {
						v, info, err := single.l.GetInfo(ctx, k)
						mu.Lock()
						defer mu.Unlock()
						single.infos[k] = info
						if err != nil {
							single.errs[k] = err
						} else {
							single.vals[k] = v
						}
					})
				}
				wg.Go(func() {
					var err error
					many.vals, many.infos, err = many.l.GetManyInfo(ctx, infoKeys)
					var me *ManyError[string]
					if errors.As(err, &me) {
						many.errs = me.Errs
					} else if err != nil {
						t.Errorf("GetManyInfo error %v; want a ManyError", err)
					}
				})
				wg.Wait()
				others.Wait()

				want := map[string]Info{
					"hit":    {Source: SourceHit, Age: 20 * time.Millisecond},
					"stale":  {Source: SourceStale, Age: 2020 * time.Millisecond},
					"loaded": {Source: SourceLoaded, Waited: 50 * time.Millisecond},
					"shared": {Source: SourceShared, Waited: 30 * time.Millisecond},
					"soe":    {Source: SourceStaleOnError, Age: 2070 * time.Millisecond, Waited: 50 * time.Millisecond},
					"gone":   {Source: SourceLoaded, Waited: 50 * time.Millisecond},
					"bad":    {Source: SourceLoaded, Waited: 50 * time.Millisecond},
					"nf-hit": {Source: SourceHit, Age: 2020 * time.Millisecond},
				}
				for _, k := range infoKeys {
					if single.infos[k] != want[k] {
						t.Errorf("GetInfo(%s) info %+v; want %+v", k, single.infos[k], want[k])
					}
					if got, ok := many.infos[k]; !ok || got != single.infos[k] {
						t.Errorf("GetManyInfo info of %s = %+v (present %v); want GetInfo's %+v", k, got, ok, single.infos[k])
					}
				}
				if len(many.infos) != len(infoKeys) {
					t.Errorf("GetManyInfo gave %d infos; want one per key, %d", len(many.infos), len(infoKeys))
				}
				// The values are GetInfo's; its not-founds are absent, its
				// failures in the ManyError.
				if !maps.Equal(many.vals, single.vals) {
					t.Errorf("GetManyInfo values %v; want GetInfo's %v", many.vals, single.vals)
				}
				failed := slices.Sorted(maps.Keys(many.errs))
				if !slices.Equal(failed, []string{"bad"}) || !errors.Is(many.errs["bad"], errBoom) {
					t.Errorf("GetManyInfo failed %v (%v); want bad with errBoom", failed, many.errs)
				}
				for _, k := range []string{"gone", "nf-hit"} {
					if !errors.Is(single.errs[k], ErrNotFound) {
						t.Errorf("GetInfo(%s) error %v; want ErrNotFound", k, single.errs[k])
					}
				}
			})
		})
	}
}

// docs/design.md rule 15: a key whose wait the caller's context ended has
// GetInfo's Info too (no Source, Waited until the end), and GetManyInfo
// returns ctx's error.
func TestGetManyInfoWhenContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{delay: time.Second}
		a, b := newLoader(t, d, Options[string, string]{}), newLoader(t, d, Options[string, string]{})
		b.Set("hit", "v")
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		var wg sync.WaitGroup
		var info Info
		var err error
		wg.Go(func() { _, info, err = a.GetInfo(ctx, "k") })
		var vals map[string]string
		var infos map[string]Info
		var manyErr error
		wg.Go(func() { vals, infos, manyErr = b.GetManyInfo(ctx, []string{"k", "hit"}) })
		wg.Wait()
		want := Info{Waited: 100 * time.Millisecond}
		if info != want || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("GetInfo = %+v, %v; want %+v and the deadline", info, err, want)
		}
		if infos["k"] != info || infos["hit"].Source != SourceHit || vals["hit"] != "v" || !errors.Is(manyErr, context.DeadlineExceeded) {
			t.Errorf("GetManyInfo = %v, %+v, %v; want k's Info as GetInfo's, hit answered, the deadline", vals, infos, manyErr)
		}
	})
}

// GetManyInfo fails as GetMany does, with no Infos: a nil context, Close.
func TestGetManyInfoRefused(t *testing.T) {
	l := newLoader(t, &downstream{}, Options[string, string]{})
	//lint:ignore SA1012 a nil context is what this checks
	if v, infos, err := l.GetManyInfo(nil, []string{"k"}); v != nil || infos != nil || err == nil { //nolint:staticcheck
		t.Errorf("GetManyInfo(nil ctx) = %v, %v, %v; want nothing and an error", v, infos, err)
	}
	l.Close()
	if v, infos, err := l.GetManyInfo(t.Context(), []string{"k"}); v != nil || infos != nil || !errors.Is(err, ErrClosed) {
		t.Errorf("GetManyInfo after Close = %v, %v, %v; want nothing and ErrClosed", v, infos, err)
	}
}

package flightcache

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Every miss ends one way: loaded (the Get started the load), shared (it
// joined one), stale-on-error or canceled; Stats counts each, so that
// Misses = Loaded + Shared + StaleOnError + Canceled once no Get runs, as
// every Info.Source of a miss has its own count.
func TestMissesEndLoadedSharedStaleOrCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Second, StaleIfError: time.Hour, Breaker: Breaker{Disabled: true},
		})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()

		// Four Gets of one cold key: the first starts the load (loaded),
		// the three that come once it runs join it (shared); a fifth
		// joins and leaves before the load ends.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				if _, err := l.Get(ctx, "a"); err != nil {
					t.Errorf("Get(%q) = %v", "a", err)
				}
			})
			if i == 0 {
				synctest.Wait() // the load is running, held at the gate
			}
		}
		leaver, leave := context.WithCancel(ctx)
		wg.Go(func() { l.Get(leaver, "a") })
		synctest.Wait()
		leave()
		synctest.Wait()
		d.gate <- struct{}{}
		wg.Wait()

		// Past TTL the load fails: the Get that started it and one that
		// joined it both get the stale value.
		time.Sleep(2 * time.Second)
		d.fail = func(int64, string) error { return errBoom }
		for range 2 {
			wg.Go(func() {
				if _, info, err := l.GetInfo(ctx, "a"); err != nil || info.Source != SourceStaleOnError {
					t.Errorf("GetInfo(%q) = %v, %v; want stale-on-error", "a", info, err)
				}
			})
		}
		synctest.Wait()
		d.gate <- struct{}{}
		wg.Wait()

		s := l.Stats()
		if s.Misses != 7 || s.Loaded != 1 || s.Shared != 3 || s.StaleOnError != 2 || s.Canceled != 1 {
			t.Errorf("Misses %d, Loaded %d, Shared %d, StaleOnError %d, Canceled %d; want 7, 1, 3, 2, 1",
				s.Misses, s.Loaded, s.Shared, s.StaleOnError, s.Canceled)
		}
		if s.Loaded+s.Shared+s.StaleOnError+s.Canceled != s.Misses {
			t.Errorf("Loaded + Shared + StaleOnError + Canceled = %d; want Misses, %d",
				s.Loaded+s.Shared+s.StaleOnError+s.Canceled, s.Misses)
		}
	})
}

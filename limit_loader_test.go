package flightcache

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The tests of docs/design.md rule 22 through a Loader: each runs in a
// synctest bubble, so queues and MaxWait run in virtual time (but for the
// hits that TestLimitHitAllocatesNothing counts allocations of, which need
// no time at all).

// holdSlot starts a Get of key on l whose load waits on d's gate, and
// waits until it holds its downstream slot.
func holdSlot(t *testing.T, l *Loader[string, string], key string) <-chan result {
	t.Helper()
	r := getAsync(t.Context(), l, key)
	synctest.Wait()
	return r
}

func TestLimitBoundNeverExceededRetriesIncluded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tries sync.Map
		d := &downstream{delay: 10 * time.Millisecond, fail: func(_ int64, key string) error {
			if _, again := tries.LoadOrStore(key, true); !again {
				return errBoom // every key's first attempt fails: its retry keeps the slot
			}
			return nil
		}}
		l := newLoader(t, d, Options[string, string]{
			Limit:   Limit{MaxLoads: 5, MaxQueue: 100},
			Retry:   Retry{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
			Breaker: Breaker{ConsecutiveFailures: 1000},
		})
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range 50 {
			wg.Go(func() {
				if _, err := l.Get(t.Context(), string(rune('A'+i))); err != nil {
					t.Log(err)
					failed.Add(1)
				}
			})
		}
		wg.Wait()
		if failed.Load() != 0 || d.peak.Load() > 5 || d.peak.Load() < 5 {
			t.Errorf("failed %d, peak %d calls at once; want 0 failed and exactly the bound, 5", failed.Load(), d.peak.Load())
		}
		if s := l.Stats(); s.LoadLimit != 5 || s.Retries != 50 || s.Limited != 0 || s.QueuedLoads != 0 {
			t.Errorf("LoadLimit %d, Retries %d, Limited %d, QueuedLoads %d; want 5, 50, 0, 0", s.LoadLimit, s.Retries, s.Limited, s.QueuedLoads)
		}
	})
}

func TestLimitJoinersTakeNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{Limit: Limit{MaxLoads: 1}})
		first := holdSlot(t, l, "a")
		var joiners []<-chan result
		for range 10 {
			joiners = append(joiners, getAsync(t.Context(), l, "a"))
		}
		synctest.Wait()
		if s := l.Stats(); s.QueuedLoads != 0 || s.Waiting != 11 {
			t.Fatalf("QueuedLoads %d, Waiting %d; want 0 queued: joiners wait on the load, not for a slot", s.QueuedLoads, s.Waiting)
		}
		other := getAsync(t.Context(), l, "b")
		synctest.Wait()
		if s := l.Stats(); s.QueuedLoads != 1 {
			t.Fatalf("QueuedLoads %d; want 1: another key's load waits for the slot", s.QueuedLoads)
		}
		close(d.gate)
		for _, r := range append(joiners, first, other) {
			if res := <-r; res.err != nil {
				t.Errorf("Get: %v", res.err)
			}
		}
		if n := d.calls.Load(); n != 2 {
			t.Errorf("%d downstream calls; want 2", n)
		}
	})
}

// switchBreaker is a breaker a test opens and closes.
type switchBreaker struct{ open atomic.Bool }

func (b *switchBreaker) Allow() (func(Outcome), error) {
	if b.open.Load() {
		return nil, errors.New("open")
	}
	return func(Outcome) {}, nil
}

func (b *switchBreaker) State() BreakerState {
	if b.open.Load() {
		return BreakerOpen
	}
	return BreakerClosed
}

func TestLimitOpenBreakerFailsFastWithoutQueueing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		br := &switchBreaker{}
		l := newLoader(t, d, Options[string, string]{Limit: Limit{MaxLoads: 1}, Breaker: Breaker{Custom: br}})
		held := holdSlot(t, l, "a")
		br.open.Store(true)
		start := time.Now()
		_, err := l.Get(t.Context(), "b")
		if !errors.Is(err, ErrBreakerOpen) || time.Since(start) != 0 {
			t.Errorf("Get with the breaker open and no slot free = %v after %v; want ErrBreakerOpen at once", err, time.Since(start))
		}
		if s := l.Stats(); s.QueuedLoads != 0 || s.Limited != 0 || s.BreakerRejected != 1 {
			t.Errorf("QueuedLoads %d, Limited %d, BreakerRejected %d; want 0, 0, 1", s.QueuedLoads, s.Limited, s.BreakerRejected)
		}
		br.open.Store(false)
		close(d.gate)
		<-held
	})
}

func TestLimitServesHeldStaleValueInsteadOfQueueing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute, StaleIfError: time.Hour, Limit: Limit{MaxLoads: 1}})
		l.Set("k", "old")
		waitFor(t, "the Set to land", time.Minute, func() bool { _, _, ok := l.Peek("k"); return ok })
		time.Sleep(2 * time.Minute) // past its freshness, within StaleIfError
		held := holdSlot(t, l, "x")
		v, info, err := l.GetInfo(t.Context(), "k")
		if v != "old" || err != nil || info.Source != SourceStaleLimited || info.Source.String() != "stale-limited" {
			t.Errorf("Get with no slot free = %q, %v, %v; want the held value, stale-limited", v, info.Source, err)
		}
		if s := l.Stats(); s.StaleLimited != 1 || s.StaleHits != 1 || s.QueuedLoads != 0 || d.count("k") != 0 {
			t.Errorf("StaleLimited %d, StaleHits %d, QueuedLoads %d, loads of k %d; want 1, 1, 0, 0", s.StaleLimited, s.StaleHits, s.QueuedLoads, d.count("k"))
		}
		// A caller that demands a fresh value queues for the slot.
		fresh := getAsync(WithMaxStale(t.Context(), 0), l, "k")
		synctest.Wait()
		if s := l.Stats(); s.QueuedLoads != 1 {
			t.Errorf("QueuedLoads %d with WithMaxStale(ctx, 0); want 1: no stale value for it", s.QueuedLoads)
		}
		close(d.gate)
		<-held
		if r := <-fresh; r.err != nil || r.v == "old" {
			t.Errorf("fresh Get = %q, %v; want a loaded value", r.v, r.err)
		}
	})
}

// Peek loads nothing, so it has no load to answer stale-limited instead
// of: past StaleWhileRevalidate it finds nothing, slot or no slot (rule 16).
func TestLimitPeekIsNeverStaleLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute, StaleIfError: time.Hour, Limit: Limit{MaxLoads: 1}})
		l.Set("k", "old")
		waitFor(t, "the Set to land", time.Minute, func() bool { _, _, ok := l.Peek("k"); return ok })
		time.Sleep(2 * time.Minute) // past its freshness, within StaleIfError
		held := holdSlot(t, l, "x")
		if v, info, ok := l.Peek("k"); ok {
			t.Errorf(`Peek("k") within StaleIfError with no slot free = %q, %v, true; want nothing`, v, info.Source)
		}
		close(d.gate)
		<-held
	})
}

func TestLimitCallersLeavingAQueuedLoad(t *testing.T) {
	for _, p := range []Policy{CancelAtZero, FinishAndFill} {
		t.Run(p.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &downstream{gate: make(chan struct{})}
				l := newLoader(t, d, Options[string, string]{Policy: p, Limit: Limit{MaxLoads: 1}})
				held := holdSlot(t, l, "a")
				ctx, cancel := context.WithCancel(t.Context())
				left := getAsync(ctx, l, "q")
				synctest.Wait()
				cancel()
				if r := <-left; !errors.Is(r.err, context.Canceled) {
					t.Fatalf("Get whose caller left = %v; want context.Canceled", r.err)
				}
				synctest.Wait()
				want := int64(1) // FinishAndFill keeps it queued, to warm the cache
				if p == CancelAtZero {
					want = 0
				}
				if s := l.Stats(); s.QueuedLoads != want {
					t.Errorf("QueuedLoads %d after its caller left; want %d", s.QueuedLoads, want)
				}
				close(d.gate)
				<-held
				synctest.Wait()
				_, _, cached := l.Peek("q")
				if cached != (p == FinishAndFill) || (d.count("q") == 1) != (p == FinishAndFill) {
					t.Errorf("q cached %v, loaded %d times; want both only under FinishAndFill", cached, d.count("q"))
				}
			})
		})
	}
}

func TestLimitErrLimitedIsNeverCachedRetriedOrCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{
			Limit:   Limit{MaxLoads: 1, MaxQueue: 1, MaxWait: time.Second},
			Retry:   Retry{MaxAttempts: 3},
			Breaker: Breaker{ConsecutiveFailures: 1},
		})
		held := holdSlot(t, l, "a")
		queued := getAsync(t.Context(), l, "q1")
		synctest.Wait()
		if _, err := l.Get(t.Context(), "q2"); !errors.Is(err, ErrLimited) { // the queue is full
			t.Errorf("Get past MaxQueue = %v; want ErrLimited", err)
		}
		if r := <-queued; !errors.Is(r.err, ErrLimited) { // MaxWait passes
			t.Errorf("Get queued past MaxWait = %v; want ErrLimited", r.err)
		}
		if s := l.Stats(); s.Limited != 2 || s.Retries != 0 || s.Breaker != BreakerClosed || s.BreakerRejected != 0 {
			t.Errorf("Limited %d, Retries %d, Breaker %v, BreakerRejected %d; want 2, 0, closed, 0", s.Limited, s.Retries, s.Breaker, s.BreakerRejected)
		}
		close(d.gate)
		<-held
		if v, err := l.Get(t.Context(), "q2"); err != nil || d.count("q2") != 1 {
			t.Errorf("Get once the slot is free = %q, %v, %d loads; want a load: ErrLimited was not cached", v, err, d.count("q2"))
		}
	})
}

func TestLimitLoadTimeoutStartsAtTheSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{LoadTimeout: time.Second, Limit: Limit{MaxLoads: 1, MaxWait: time.Minute}})
		held := holdSlot(t, l, "a")
		queued := getAsync(t.Context(), l, "q")
		synctest.Wait()
		time.Sleep(3 * time.Second / 4)
		go func() { d.gate <- struct{}{} }() // a's load ends, q's starts and waits on the gate
		<-held
		synctest.Wait()
		time.Sleep(3 * time.Second / 4) // 1.5s since q started, 0.75s since its slot
		close(d.gate)
		if r := <-queued; r.err != nil {
			t.Errorf("Get that queued 0.75s and loaded 0.75s = %v; want its value: LoadTimeout counts from the slot", r.err)
		}
	})
}

func TestLimitBackgroundRefreshesNeverQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{TTL: time.Minute, StaleWhileRevalidate: time.Hour, Limit: Limit{MaxLoads: 2}})
		l.Set("k", "old")
		waitFor(t, "the Set to land", time.Minute, func() bool { _, _, ok := l.Peek("k"); return ok })
		time.Sleep(2 * time.Minute) // stale within StaleWhileRevalidate
		a, b := holdSlot(t, l, "a"), holdSlot(t, l, "b")
		v, info, err := l.GetInfo(t.Context(), "k")
		synctest.Wait()
		if v != "old" || err != nil || info.Source != SourceStale {
			t.Errorf("stale Get = %q, %v, %v; want the stale value at once", v, info.Source, err)
		}
		if s := l.Stats(); s.RefreshesLimited != 1 || s.Refreshes != 0 || s.QueuedLoads != 0 || d.count("k") != 0 {
			t.Errorf("RefreshesLimited %d, Refreshes %d, QueuedLoads %d, loads of k %d; want 1, 0, 0, 0",
				s.RefreshesLimited, s.Refreshes, s.QueuedLoads, d.count("k"))
		}
		close(d.gate)
		<-a
		<-b
		// With the slots free, the next stale Get refreshes in the background.
		l.Get(t.Context(), "k")
		synctest.Wait()
		if s := l.Stats(); s.Refreshes != 1 || d.count("k") != 1 {
			t.Errorf("Refreshes %d, loads of k %d once slots are free; want 1, 1", s.Refreshes, d.count("k"))
		}
	})
}

func TestLimitLoadManyCallTakesOneSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var inside, peak atomic.Int64
		many := func(ctx context.Context, keys []string) (map[string]string, error) {
			n := inside.Add(1)
			defer inside.Add(-1)
			peak.Store(max(peak.Load(), n))
			<-gate
			m := make(map[string]string, len(keys))
			for _, k := range keys {
				m[k] = "v" + k
			}
			return m, nil
		}
		d := &downstream{gate: gate}
		l := newLoader(t, d, Options[string, string]{LoadMany: many, MaxBatch: 100, Limit: Limit{MaxLoads: 1}})
		done := make(chan error, 1)
		go func() {
			_, err := l.GetMany(t.Context(), []string{"a", "b", "c", "d", "e"})
			done <- err
		}()
		synctest.Wait()
		other := getAsync(t.Context(), l, "z")
		synctest.Wait()
		if s := l.Stats(); s.QueuedLoads != 1 || inside.Load() != 1 {
			t.Errorf("QueuedLoads %d, LoadMany calls running %d; want the 5 keys' one call holding the one slot and z queued", s.QueuedLoads, inside.Load())
		}
		close(gate)
		if err := <-done; err != nil {
			t.Errorf("GetMany: %v", err)
		}
		<-other
	})
}

func TestLimitCloseFailsTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{Limit: Limit{MaxLoads: 1}})
		held := holdSlot(t, l, "a")
		queued := getAsync(t.Context(), l, "q")
		synctest.Wait()
		l.Close()
		<-held
		if r := <-queued; !errors.Is(r.err, ErrClosed) {
			t.Errorf("queued Get at Close = %v; want ErrClosed", r.err)
		}
	})
}

// A hit costs the same with a Limit as without: the hit path never touches
// the limiter, so it allocates nothing; nor does a stale value answered at
// once because no slot is free (a Get that starts no load). Outside a
// bubble: AllocsPerRun reads the real allocator.
func TestLimitHitAllocatesNothing(t *testing.T) {
	for _, lim := range []Limit{{MaxLoads: 50}, {Adaptive: true}} {
		t.Run(limitName(lim), func(t *testing.T) {
			d := &downstream{}
			l := newLoader(t, d, Options[string, string]{TTL: time.Hour, Limit: lim})
			ctx := context.Background()
			if _, err := l.Get(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if _, info, err := l.GetInfo(ctx, "k"); err != nil || info.Source != SourceHit {
				t.Fatalf(`GetInfo("k") = %v, %v; want a hit`, info.Source, err)
			}
			if n := testing.AllocsPerRun(1000, func() { l.Get(ctx, "k") }); n != 0 {
				t.Errorf("a hit with Limit %+v allocates %v times; want 0", lim, n)
			}
		})
	}
	t.Run("stale-limited", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := &downstream{gate: make(chan struct{})}
			l := newLoader(t, d, Options[string, string]{TTL: time.Minute, StaleIfError: time.Hour, Limit: Limit{MaxLoads: 1}})
			l.Set("k", "old")
			waitFor(t, "the Set to land", time.Minute, func() bool { _, _, ok := l.Peek("k"); return ok })
			time.Sleep(2 * time.Minute)
			held := holdSlot(t, l, "x")
			ctx := context.Background()
			if _, info, _ := l.GetInfo(ctx, "k"); info.Source != SourceStaleLimited {
				t.Fatalf(`GetInfo("k") with no slot free: %v; want stale-limited`, info.Source)
			}
			if n := testing.AllocsPerRun(1000, func() { l.Get(ctx, "k") }); n != 0 {
				t.Errorf("a stale-limited answer allocates %v times; want 0", n)
			}
			close(d.gate)
			<-held
		})
	})
}

// limitName names a Limit for a subtest or a benchmark.
func limitName(l Limit) string {
	if l.Adaptive {
		return "adaptive"
	}
	return "maxloads" + strconv.Itoa(l.MaxLoads)
}

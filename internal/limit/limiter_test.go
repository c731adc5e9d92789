package limit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// withDefaults is c with the defaults a Loader gives its Limit, whose
// LoadTimeout is maxWait: an adaptive bound's ceiling 200 and floor 1, and
// MaxWait maxWait. (MaxQueue 0 is no bound, as its default.)
func withDefaults(c Config, maxWait time.Duration) Config {
	if c.Adaptive {
		if c.MaxLoads == 0 {
			c.MaxLoads = 200
		}
		if c.MinLoads == 0 {
			c.MinLoads = 1
		}
	}
	if c.MaxWait == 0 {
		c.MaxWait = maxWait
	}
	return c
}

// testLimiter is the limiter of c with the bubble's clock, as a Loader
// made in the bubble would have it (LoadTimeout 10s).
func testLimiter(t *testing.T, c Config) *Limiter {
	t.Helper()
	epoch := time.Now()
	lm := New(withDefaults(c, 10*time.Second), func() time.Duration { return time.Since(epoch) })
	if lm == nil {
		t.Fatalf("New(%+v) = nil", c)
	}
	return lm
}

// mustAcquire takes a slot that must be free.
func mustAcquire(t *testing.T, lm *Limiter) Slot {
	t.Helper()
	s, queued, err := lm.Acquire(context.Background(), nil)
	if err != nil || queued != 0 {
		t.Fatalf("acquire = %v after %v; want a free slot at once", err, queued)
	}
	return s
}

// acquired is what one acquire in a goroutine returned.
type acquired struct {
	s      Slot
	queued time.Duration
	err    error
}

// acquireAsync acquires in a goroutine and returns at once; the result
// arrives on the channel.
func acquireAsync(ctx context.Context, lm *Limiter) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		s, q, err := lm.Acquire(ctx, nil)
		ch <- acquired{s, q, err}
	}()
	return ch
}

// limitState reads the limiter's state under its lock.
func limitState(lm *Limiter) (bound, inUse, bgInUse, waiting int) {
	s := lm.q.State()
	return s.Places, s.Held, int(s.Spent), s.Waiting
}

// Many loads at once, each holding its slot through three attempts: never
// more in flight than the bound, and every load gets its turn.
func TestLimiterBoundNeverExceeded(t *testing.T) {
	for _, l := range []Config{{MaxLoads: 5, MaxQueue: 1000}, {Adaptive: true, MaxLoads: 8, MaxQueue: 1000}} {
		synctest.Test(t, func(t *testing.T) {
			lm := testLimiter(t, l)
			var inFlight, peak atomic.Int64
			var wg sync.WaitGroup
			for i := range 200 {
				wg.Go(func() {
					s, _, err := lm.Acquire(context.Background(), nil)
					if err != nil {
						t.Errorf("load %d: acquire = %v", i, err)
						return
					}
					defer s.Release()
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					for a := range 3 { // a load and its two retries, in one slot
						begun := lm.Begin()
						time.Sleep(time.Duration(1+(i+a)%4) * time.Millisecond)
						lm.Sample(begun, SampleOK)
					}
					inFlight.Add(-1)
				})
			}
			wg.Wait()
			if max := int64(l.MaxLoads); peak.Load() > max || peak.Load() == 0 {
				t.Errorf("Limit %+v: %d loads in flight at the peak; want 1 to %d", l, peak.Load(), max)
			}
			if _, inUse, _, waiting := limitState(lm); inUse != 0 || waiting != 0 {
				t.Errorf("Limit %+v: after every load, %d slots in use and %d waiting; want 0 and 0", l, inUse, waiting)
			}
		})
	}
}

// A slot given back goes to the oldest waiter, and a load that comes
// while others wait queues behind them even if a slot is free that moment.
func TestLimiterFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 1, MaxQueue: 5})
		held := mustAcquire(t, lm)
		var order []int
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				s, q, err := lm.Acquire(context.Background(), nil)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				if want := time.Duration(1+i) * time.Millisecond; q != want {
					t.Errorf("waiter %d queued %v; want %v", i, q, want)
				}
				time.Sleep(time.Millisecond)
				s.Release()
			})
			synctest.Wait() // waiter i is queued before waiter i+1 comes
		}
		if !lm.Full() {
			t.Error("full() = false with a slot held and five loads queued")
		}
		time.Sleep(time.Millisecond)
		held.Release()
		wg.Wait()
		for i, got := range order {
			if got != i {
				t.Fatalf("grant order %v; want 0 1 2 3 4", order)
			}
		}
		if lm.Full() {
			t.Error("full() = true with every slot free")
		}
	})
}

// acquire calls waiting exactly when the load waits, once it is queued and
// before the wait, with no lock held: not for a free slot, not for a full
// queue. It is the sign the load path stops the LoadTimeout on, since full
// may be out of date by the time acquire runs.
func TestLimiterWaitingIsCalledOnlyToWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 1, MaxQueue: 1})
		calls := 0
		count := func() { calls++ }
		held, _, err := lm.Acquire(context.Background(), count)
		if err != nil || calls != 0 {
			t.Fatalf("acquire of a free slot = %v, waiting called %d times; want a slot, 0", err, calls)
		}
		full := lm.Full() // no slot free now
		var waited atomic.Int64
		got := make(chan acquired, 1)
		go func() {
			s, q, err := lm.Acquire(context.Background(), func() {
				if _, _, _, w := limitState(lm); w != 1 { // and no lock held: limitState takes it
					t.Errorf("waiting called with %d loads queued; want 1, itself", w)
				}
				waited.Add(1)
			})
			got <- acquired{s, q, err}
		}()
		synctest.Wait()
		if waited.Load() != 1 || !full {
			t.Fatalf("waiting called %d times for a load that waits (full %v); want 1", waited.Load(), full)
		}
		if _, _, err := lm.Acquire(context.Background(), count); !errors.Is(err, ErrLimited) || calls != 0 {
			t.Errorf("acquire past MaxQueue = %v, waiting called %d times; want ErrLimited, 0", err, calls)
		}
		time.Sleep(time.Millisecond)
		held.Release()
		if a := <-got; a.err != nil || a.queued != time.Millisecond || waited.Load() != 1 {
			t.Errorf("the queued load = %v after %v, waiting called %d times; want its slot after 1ms, once", a.err, a.queued, waited.Load())
		}
	})
}

// A full queue fails a load at once with ErrLimited; waiting MaxWait
// fails it then. Neither leaks a slot or a place.
func TestLimiterMaxQueueAndMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 1, MaxQueue: 2, MaxWait: 100 * time.Millisecond})
		held := mustAcquire(t, lm)
		first, second := acquireAsync(context.Background(), lm), acquireAsync(context.Background(), lm)
		synctest.Wait()
		if _, q, err := lm.Acquire(context.Background(), nil); !errors.Is(err, ErrLimited) || q != 0 {
			t.Errorf("acquire with the queue full = %v after %v; want ErrLimited at once", err, q)
		}
		if c := lm.Counts(); c.Waiting != 2 || c.Limited != 1 || c.Bound != 1 {
			t.Errorf("Counts: %d queued, %d limited, bound %d; want 2, 1, 1", c.Waiting, c.Limited, c.Bound)
		}
		for _, ch := range []<-chan acquired{first, second} {
			if r := <-ch; !errors.Is(r.err, ErrLimited) || r.queued != 100*time.Millisecond {
				t.Errorf("a waiter past MaxWait = %v after %v; want ErrLimited after 100ms", r.err, r.queued)
			}
		}
		if c := lm.Counts(); c.Waiting != 0 || c.Limited != 3 {
			t.Errorf("Counts after MaxWait: %d queued, %d limited; want 0, 3", c.Waiting, c.Limited)
		}
		held.Release()
		mustAcquire(t, lm).Release()
		if _, inUse, _, waiting := limitState(lm); inUse != 0 || waiting != 0 {
			t.Errorf("%d slots in use, %d waiting; want none", inUse, waiting)
		}
	})
}

// A load whose context ends while it waits (CancelAtZero: its last caller
// left) leaves the queue with its context's error and cause; the slot it
// would have had goes to the next in line.
func TestLimiterCancelWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 1})
		held := mustAcquire(t, lm)
		ctx, cancel := context.WithCancelCause(context.Background())
		errGone := errors.New("every caller left")
		gone := acquireAsync(ctx, lm)
		next := acquireAsync(context.Background(), lm)
		synctest.Wait()
		time.Sleep(time.Second)
		cancel(errGone)
		r := <-gone
		if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, errGone) || r.queued != time.Second {
			t.Errorf("cancelled waiter = %v after %v; want context.Canceled and its cause after 1s", r.err, r.queued)
		}
		if _, _, _, waiting := limitState(lm); waiting != 1 {
			t.Errorf("%d loads waiting after one left; want 1", waiting)
		}
		held.Release()
		r = <-next
		if r.err != nil {
			t.Fatalf("the next waiter = %v; want the slot", r.err)
		}
		r.s.Release()
		if _, inUse, _, waiting := limitState(lm); inUse != 0 || waiting != 0 {
			t.Errorf("%d slots in use, %d waiting; want none", inUse, waiting)
		}

		// Serialized event ordering, the race leave resolves:
		//  1. a waiter's context ends, and it stops waiting;
		//  2. before it takes the lock, the slot is given back and granted
		//     to it;
		//  3. it takes the lock: the grant must pass on to the next waiter,
		//     not be lost.
		held = mustAcquire(t, lm)
		w, _ := lm.q.Ask(0) // queued: the slot is held
		after := acquireAsync(context.Background(), lm)
		synctest.Wait()
		held.Release() // step 2: w is granted
		if _, _, err := lm.leave(w, context.Canceled, 0); !errors.Is(err, context.Canceled) {
			t.Errorf("leave after a grant = %v; want context.Canceled", err)
		}
		if r := <-after; r.err != nil {
			t.Errorf("the waiter after = %v; want the slot passed on", r.err)
		} else {
			r.s.Release()
		}
		if _, inUse, _, waiting := limitState(lm); inUse != 0 || waiting != 0 {
			t.Errorf("%d slots in use, %d waiting; want none", inUse, waiting)
		}
	})
}

// Many waiters that leave behind one that stays do not grow the queue
// (internal/queue's TestQueueCompacts counts its entries), and the one
// that stays gets the slot.
func TestLimiterQueueCompacts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 1, MaxQueue: 10})
		held := mustAcquire(t, lm)
		stays := acquireAsync(context.Background(), lm)
		for range 1000 {
			ctx, cancel := context.WithCancel(context.Background())
			ch := acquireAsync(ctx, lm)
			synctest.Wait()
			cancel()
			<-ch
		}
		if _, _, _, waiting := limitState(lm); waiting != 1 {
			t.Errorf("%d waiting; want the 1 that stays", waiting)
		}
		held.Release()
		if r := <-stays; r.err != nil {
			t.Errorf("the waiter that stayed = %v", r.err)
		} else {
			r.s.Release()
		}
	})
}

// Background refreshes never wait: they are refused while a foreground
// load is queued, or when background work holds half the bound, and a
// slot given back goes to a queued foreground load first.
func TestLimiterBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 4})
		bg1, ok1 := lm.TryBackground()
		bg2, ok2 := lm.TryBackground()
		if !ok1 || !ok2 {
			t.Fatalf("tryBackground with every slot free = %v, %v; want two", ok1, ok2)
		}
		if _, ok := lm.TryBackground(); ok {
			t.Error("tryBackground with background at half the bound = ok")
		}
		fg1, fg2 := mustAcquire(t, lm), mustAcquire(t, lm)
		fg3 := acquireAsync(context.Background(), lm)
		synctest.Wait()
		if _, ok := lm.TryBackground(); ok {
			t.Error("tryBackground with a foreground load queued = ok")
		}
		bg1.Release() // to the queued foreground load
		r := <-fg3
		if r.err != nil {
			t.Fatalf("queued foreground load = %v; want the background's slot", r.err)
		}
		if _, ok := lm.TryBackground(); ok {
			t.Error("tryBackground with every slot taken = ok")
		}
		fg1.Release()
		bg3, ok := lm.TryBackground()
		if !ok {
			t.Error("tryBackground with a slot free, none queued, background under half = refused")
		}
		if c := lm.Counts(); c.BackgroundRefused != 3 {
			t.Errorf("Counts.BackgroundRefused = %d; want 3", c.BackgroundRefused)
		}
		for _, s := range []Slot{bg2, bg3, fg2, r.s} {
			s.Release()
		}
		if _, inUse, bgInUse, _ := limitState(lm); inUse != 0 || bgInUse != 0 {
			t.Errorf("%d slots in use (%d background); want none", inUse, bgInUse)
		}
	})
}

// close fails every queued load with ErrClosed, and every later one; the
// slots held are still given back.
func TestLimiterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{MaxLoads: 1})
		held := mustAcquire(t, lm)
		var chs []<-chan acquired
		for range 3 {
			chs = append(chs, acquireAsync(context.Background(), lm))
		}
		synctest.Wait()
		lm.Close()
		for i, ch := range chs {
			if r := <-ch; r.err != ErrClosed {
				t.Errorf("queued load %d after close = %v; want ErrClosed", i, r.err)
			}
		}
		if _, _, err := lm.Acquire(context.Background(), nil); err != ErrClosed {
			t.Errorf("acquire after close = %v; want ErrClosed", err)
		}
		if _, ok := lm.TryBackground(); ok {
			t.Error("tryBackground after close = ok")
		}
		held.Release()
		if c := lm.Counts(); c.BackgroundRefused != 0 || c.Waiting != 0 || c.Limited != 0 {
			t.Errorf("Counts after close: %+v; want no refresh limited, none queued, none limited", c)
		}
	})
}

// When the adaptive bound falls below the slots in use, nothing is
// granted until the slots in use are below it.
func TestLimiterShrinkBelowInUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{Adaptive: true, MaxLoads: 20, MaxQueue: 10})
		var held []Slot
		for range 20 {
			held = append(held, mustAcquire(t, lm))
		}
		time.Sleep(time.Second)
		lm.Sample(lm.Begin()-time.Second, SampleTimeout) // 20 → 10
		if b, _, _, _ := limitState(lm); b != 10 {
			t.Fatalf("bound after a timeout = %d; want 10", b)
		}
		w := acquireAsync(context.Background(), lm)
		for i := range 10 {
			held[i].Release()
			synctest.Wait()
			select {
			case r := <-w:
				t.Fatalf("granted with %d slots in use of a bound of 10 (%v)", 19-i, r.err)
			default:
			}
		}
		held[10].Release() // 9 in use
		r := <-w
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.s.Release()
		for _, s := range held[11:] {
			s.Release()
		}
	})
}

// The adaptive bound, driven by loads against the downstream in
// virtual time: it settles under the downstream's capacity, falls when
// other load makes the downstream slower, and returns once it is gone.
func TestLimiterAdaptiveFallsAndReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lm := testLimiter(t, Config{Adaptive: true, MaxQueue: 1000})
		var inFlight, peak, extra atomic.Int64
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 150 { // more workers than the bound: it decides
			wg.Go(func() {
				for ctx.Err() == nil {
					s, _, err := lm.Acquire(ctx, nil)
					if err != nil {
						return
					}
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					begun := lm.Begin()
					time.Sleep(knee(int(extra.Load()))(int(n)))
					lm.Sample(begun, SampleOK)
					inFlight.Add(-1)
					s.Release()
				}
			})
		}
		bound := func() int { b, _, _, _ := limitState(lm); return b }
		time.Sleep(time.Second)
		alone := bound()
		extra.Store(60) // 60 calls from elsewhere
		time.Sleep(time.Second)
		loaded := bound()
		extra.Store(0)
		time.Sleep(time.Second)
		back := bound()
		stop()
		wg.Wait()
		t.Logf("bound %d alone, %d with other load, %d after; %d calls at once at the peak", alone, loaded, back, peak.Load())
		if alone < 30 || peak.Load() >= 100 {
			t.Errorf("alone: bound %d, %d calls at once at the peak; want 30 or more, under the capacity of 100", alone, peak.Load())
		}
		if loaded > alone/2 {
			t.Errorf("with 60 calls from elsewhere: bound %d; want it below half of %d", loaded, alone)
		}
		if back < 3*loaded || back < 30 {
			t.Errorf("once the other load is gone: bound %d; want it back from %d to 30 or more", back, loaded)
		}
	})
}

// The storm, with the limiter in front of the downstream as the
// load path will put it, in virtual time: 2,000 distinct cold keys at
// once, against a downstream whose calls take 2 ms × (1 + n/50)² and that
// fails past 100 at once. With MaxLoads 50 and with Adaptive, no call is
// ever past the capacity, every load gets its turn, and the adaptive
// storm takes at most 1.5× as long as the fixed one.
func TestLimiterStorm(t *testing.T) {
	type outcome struct {
		wall         time.Duration
		peak, failed int64
		bounds       []int
	}
	run := func(l Config) (o outcome) {
		synctest.Test(t, func(t *testing.T) {
			lm := testLimiter(t, l)
			var inFlight, peak, failed atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range 2000 {
				wg.Go(func() {
					s, _, err := lm.Acquire(context.Background(), nil)
					if err != nil {
						t.Errorf("acquire = %v", err)
						return
					}
					defer s.Release()
					begun := lm.Begin()
					n := inFlight.Add(1)
					defer inFlight.Add(-1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					if n > 100 {
						failed.Add(1)
						lm.Sample(begun, SampleFailure) // at once: not a fast answer
						return
					}
					time.Sleep(knee(0)(int(n)))
					lm.Sample(begun, SampleOK)
				})
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			for tick := time.NewTicker(10 * time.Millisecond); ; {
				b, _, _, _ := limitState(lm)
				o.bounds = append(o.bounds, b)
				select {
				case <-tick.C:
					continue
				case <-done:
				}
				tick.Stop()
				break
			}
			o.wall, o.peak, o.failed = time.Since(start), peak.Load(), failed.Load()
		})
		return o
	}
	fixed, adaptive := run(Config{MaxLoads: 50, MaxQueue: 4000}), run(Config{Adaptive: true, MaxQueue: 4000})
	t.Logf("MaxLoads 50: %v, peak %d; Adaptive: %v, peak %d, bound every 10ms %v",
		fixed.wall, fixed.peak, adaptive.wall, adaptive.peak, adaptive.bounds)
	for _, o := range []outcome{fixed, adaptive} {
		if o.failed != 0 || o.peak > 100 {
			t.Errorf("%d calls past the capacity, %d at once at the peak; want none past 100", o.failed, o.peak)
		}
	}
	if fixed.peak != 50 {
		t.Errorf("MaxLoads 50: %d calls at once at the peak; want 50", fixed.peak)
	}
	if adaptive.wall > fixed.wall*3/2 {
		t.Errorf("Adaptive took %v, MaxLoads 50 %v; want at most 1.5×", adaptive.wall, fixed.wall)
	}
}

// A nil limiter is no limit.
func TestLimiterNil(t *testing.T) {
	var lm *Limiter
	s, q, err := lm.Acquire(context.Background(), nil)
	if err != nil || q != 0 || s != (Slot{}) {
		t.Errorf("nil acquire = %+v, %v, %v; want a zero slot at once", s, q, err)
	}
	s.Release()
	if b, ok := lm.TryBackground(); !ok || b != (Slot{}) {
		t.Errorf("nil tryBackground = %+v, %v; want a zero slot, ok", b, ok)
	}
	lm.Sample(lm.Begin(), SampleFailure)
	lm.CountStale()
	lm.Close()
	if c := lm.Counts(); lm.Full() || c != (Counts{}) {
		t.Errorf("nil Full() = %v, Counts() = %+v; want false and nothing", lm.Full(), c)
	}
}

// A free slot costs no allocation.
func TestLimiterFreeSlotAllocs(t *testing.T) {
	lm := New(withDefaults(Config{Adaptive: true}, time.Second), func() time.Duration { return time.Duration(time.Now().UnixNano()) })
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() {
		s, _, _ := lm.Acquire(ctx, nil)
		lm.Sample(lm.Begin(), SampleOK)
		s.Release()
		_ = lm.Full()
	}); n != 0 {
		t.Errorf("acquire, sample, release of a free slot: %v allocations; want 0", n)
	}
}

func BenchmarkLimiterFull(b *testing.B) {
	lm := New(withDefaults(Config{MaxLoads: 50}, time.Second), func() time.Duration { return 0 })
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if lm.Full() {
				b.Error("full")
			}
		}
	})
}

func BenchmarkLimiterAcquireRelease(b *testing.B) {
	for _, l := range []Config{{MaxLoads: 50}, {Adaptive: true}} {
		name := "fixed"
		if l.Adaptive {
			name = "adaptive"
		}
		b.Run(name, func(b *testing.B) {
			epoch := time.Now()
			lm := New(withDefaults(l, time.Second), func() time.Duration { return time.Since(epoch) })
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				s, _, err := lm.Acquire(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				lm.Sample(lm.Begin(), SampleOK)
				s.Release()
			}
		})
	}
}

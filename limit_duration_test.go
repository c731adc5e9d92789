package flightcache

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// What a load that waited for its slot reports: LoadEvent.Duration is the
// downstream call's time, from the slot on, and Queued the wait before it,
// for a single load, through a Remote (whether or not it times the load
// itself) and for a LoadMany call. The caller's Info.Waited has both.

// timedRemote is a fakeRemote that, like a shared tier would, times the
// loads it runs itself: its clock also runs while the load waits for a
// slot here.
type timedRemote struct{ fakeRemote }

func (r *timedRemote) Load(ctx context.Context, key string, load func(context.Context) (string, error)) (RemoteValue[string], error) {
	start := time.Now()
	rv, err := r.fakeRemote.Load(ctx, key, load)
	if err == nil && rv.Loaded {
		rv.Took = time.Since(start)
	}
	return rv, err
}

// queuedCalls makes three calls, each a downstream call of 10ms under
// Limit{MaxLoads: 1}, started in this order: the second waits 10ms for
// the slot, the third 20ms. It returns the Info.Waited of each, in order.
func queuedCalls(t *testing.T, call func(ctx context.Context, i int) (Info, error)) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	type got struct {
		info Info
		err  error
	}
	var chans []chan got
	for i := range 3 {
		ch := make(chan got, 1)
		go func() { info, err := call(ctx, i); ch <- got{info, err} }()
		synctest.Wait() // in the queue, or holding the slot, before the next starts
		chans = append(chans, ch)
	}
	var waited []time.Duration
	for i, ch := range chans {
		g := <-ch
		if g.err != nil {
			t.Fatalf("call %d: %v", i, g.err)
		}
		waited = append(waited, g.info.Waited)
	}
	return waited
}

func TestLimitDurationExcludesQueue(t *testing.T) {
	const took = 10 * time.Millisecond
	single := func(remote Remote[string, string]) func(*testing.T, *eventLog) []time.Duration {
		return func(t *testing.T, log *eventLog) []time.Duration {
			l := newLoader(t, &downstream{delay: took}, Options[string, string]{
				Limit: Limit{MaxLoads: 1}, Remote: remote, OnLoad: log.add,
			})
			return queuedCalls(t, func(ctx context.Context, i int) (Info, error) {
				_, info, err := l.GetInfo(ctx, string(rune('a'+i)))
				return info, err
			})
		}
	}
	for _, tt := range []struct {
		name string
		run  func(*testing.T, *eventLog) []time.Duration
	}{
		{"Get", single(nil)},
		{"Get through a Remote", single(&fakeRemote{})},
		{"Get through a Remote that times its loads", single(&timedRemote{})},
		{"GetMany", queuedBatches},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var log eventLog
				waited := tt.run(t, &log)
				synctest.Wait() // an OnLoad may run after its callers have their answer
				evs := log.all()
				slices.SortFunc(evs, func(a, b LoadEvent[string]) int { return int(a.Queued - b.Queued) })
				if len(evs) != 3 {
					t.Fatalf("%d LoadEvents; want 3", len(evs))
				}
				for i, ev := range evs {
					queued := time.Duration(i) * took
					if ev.Queued != queued || ev.Duration != took {
						t.Errorf("load %d: Queued %v, Duration %v; want %v, %v: the downstream call alone", i, ev.Queued, ev.Duration, queued, took)
					}
					if want := queued + took; waited[i] != want {
						t.Errorf("call %d: Info.Waited %v; want %v, its queue included", i, waited[i], want)
					}
				}
			})
		})
	}
}

// queuedBatches is queuedCalls for three GetMany calls of two keys each,
// each one LoadMany call of 10ms.
func queuedBatches(t *testing.T, log *eventLog) []time.Duration {
	many := func(ctx context.Context, keys []string) (map[string]string, error) {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		m := make(map[string]string, len(keys))
		for _, k := range keys {
			m[k] = "v" + k
		}
		return m, nil
	}
	l := newLoader(t, &downstream{}, Options[string, string]{
		LoadMany: many, Limit: Limit{MaxLoads: 1}, OnLoad: log.add,
	})
	return queuedCalls(t, func(ctx context.Context, i int) (Info, error) {
		keys := []string{string(rune('a' + i)), string(rune('A' + i))}
		_, infos, err := l.GetManyInfo(ctx, keys)
		return infos[keys[0]], err
	})
}

// The early refresh's lead is the downstream call's time too (δ of
// Options.EarlyRefresh), not its wait for a slot: a value whose load took
// 10ms after 10ms in the queue is refreshed 10ms before it expires, not
// 20ms.
func TestLimitEarlyRefreshLeadExcludesQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const took = 10 * time.Millisecond
		d := &downstream{delay: took}
		l := newLoader(t, d, Options[string, string]{
			TTL: time.Second, EarlyRefresh: 1e-9, // a lead of δ, give or take a nanosecond
			Limit: Limit{MaxLoads: 1},
		})
		start := time.Now()
		waited := queuedCalls(t, func(ctx context.Context, i int) (Info, error) {
			_, info, err := l.GetInfo(ctx, string(rune('a'+i)))
			return info, err
		})
		expiry := start.Add(waited[1] + time.Second) // b: queued 10ms, loaded in 10ms
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		for _, tt := range []struct {
			before time.Duration
			loads  int
		}{{15 * time.Millisecond, 1}, {5 * time.Millisecond, 2}} {
			time.Sleep(time.Until(expiry.Add(-tt.before)))
			if _, err := l.Get(ctx, "b"); err != nil {
				t.Fatalf("Get(%q) %v before expiry: %v", "b", tt.before, err)
			}
			synctest.Wait()
			if n := d.count("b"); n != tt.loads {
				t.Errorf("a Get %v before expiry: %d loads of b; want %d (an early refresh %v before expiry, δ)", tt.before, n, tt.loads, took)
			}
		}
	})
}

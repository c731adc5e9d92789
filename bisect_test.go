package flightcache

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// poisoned is a LoadManyFunc that fails a call as a whole when it holds
// one of poison (or every call, with down), and records each call's keys.
type poisoned struct {
	poison   map[string]bool
	down     bool
	panics   bool          // a poison key panics instead of failing the call
	gate     chan struct{} // if non-nil, each call from the gateFrom-th on (from the first: 0) waits for it (or ctx) first
	gateFrom int
	started  chan []string // if non-nil, each call sends its keys here first

	mu    sync.Mutex
	calls [][]string
}

func (p *poisoned) load(ctx context.Context, keys []string) (map[string]string, error) {
	p.mu.Lock()
	p.calls = append(p.calls, slices.Clone(keys))
	n := len(p.calls)
	p.mu.Unlock()
	if p.started != nil {
		p.started <- slices.Clone(keys)
	}
	if p.gate != nil && n >= p.gateFrom {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if p.down {
		return nil, errBoom
	}
	for _, k := range keys {
		if p.poison[k] {
			if p.panics {
				panic("poison " + k)
			}
			return nil, errCollation
		}
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		out[k] = k + "-v"
	}
	return out, nil
}

func (p *poisoned) all() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// windowOf31 runs 31 Gets, each with a deadline, in one window (MaxBatch
// 31: it goes out once the 31 are in it) of a Loader whose LoadMany is p's
// and whose other options are opts; it returns each key's result. keys[0]
// is "poison".
func windowOf31(t *testing.T, p *poisoned, opts Options[string, string]) (keys []string, got map[string]result) {
	t.Helper()
	opts.LoadMany = p.load
	opts.MaxBatch = 31
	if opts.BatchWindow == 0 {
		opts.BatchWindow = time.Minute
	}
	l := manyLoader(t, opts)
	keys = append([]string{"poison"}, keyRange("good", 30)...)
	res := make(map[string]<-chan result, len(keys))
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		t.Cleanup(cancel)
		res[k] = getAsync(ctx, l, k)
	}
	got = make(map[string]result, len(keys))
	for _, k := range keys {
		got[k] = recv(t, "Get("+k+")", res[k])
	}
	return keys, got
}

// docs/design.md rule 31: 31 Gets in one window, one of them a key that
// fails every call it is in: the call is split, and every run the 30
// good Gets get their values, the poison one its own error, in at most
// 2·⌈log2 31⌉+1 = 11 LoadMany calls, with the breaker closed (its default
// ConsecutiveFailures, 5). Real clock, 20 runs: the keys join the window
// in whatever order the goroutines make.
func TestBatchWindowPoisonKey(t *testing.T) {
	var counts []int
	for run := range 20 {
		p := &poisoned{poison: map[string]bool{"poison": true}}
		keys, got := windowOf31(t, p, Options[string, string]{})
		for _, k := range keys[1:] {
			if r := got[k]; r.err != nil || r.v != k+"-v" {
				t.Errorf("run %d: Get(%s) = %q, %v; want its value", run, k, r.v, r.err)
			}
		}
		if r := got["poison"]; !errors.Is(r.err, errCollation) {
			t.Errorf("run %d: Get(poison) = %v; want the downstream's error", run, r.err)
		}
		calls := p.all()
		if len(calls) > 11 || len(calls[0]) != 31 {
			t.Errorf("run %d: %d LoadMany calls (first of %d keys); want at most 11, the first of the 31", run, len(calls), len(calls[0]))
		}
		counts = append(counts, len(calls))
	}
	t.Logf("LoadMany calls per window over 20 runs: %v", counts)
}

// Rule 31: without a poison key the window is one call.
func TestBatchWindowPoisonControl(t *testing.T) {
	p := &poisoned{}
	keys, got := windowOf31(t, p, Options[string, string]{})
	for _, k := range keys {
		if r := got[k]; r.err != nil || r.v != k+"-v" {
			t.Errorf("Get(%s) = %q, %v; want its value", k, r.v, r.err)
		}
	}
	if calls := p.all(); len(calls) != 1 {
		t.Errorf("LoadMany calls = %d; want 1", len(calls))
	}
}

// Rule 31: with the downstream down, a failed window is split only while
// the breaker stays closed: at most ConsecutiveFailures + 1 calls, then
// the breaker answers the rest, and it is open. Also with retries: the
// whole call's attempts count toward the breaker as any.
func TestBatchWindowDownstreamDown(t *testing.T) {
	for _, attempts := range []int{1, 3} {
		synctest.Test(t, func(t *testing.T) {
			p := &poisoned{down: true}
			_, got := windowOf31(t, p, Options[string, string]{Retry: Retry{MaxAttempts: attempts, InitialInterval: time.Millisecond}})
			for k, r := range got {
				if r.err == nil || !errors.Is(r.err, errBoom) && !errors.Is(r.err, ErrBreakerOpen) {
					t.Errorf("attempts %d: Get(%s) = %v; want the outage or the open breaker", attempts, k, r.err)
				}
			}
			calls := p.all()
			if len(calls) > DefaultConsecutiveFailures+1 {
				t.Errorf("attempts %d: %d LoadMany calls; want at most %d", attempts, len(calls), DefaultConsecutiveFailures+1)
			}
			t.Logf("attempts %d: %d LoadMany calls", attempts, len(calls))
		})
	}
}

// Rule 31 with retries: the whole call is retried (MaxAttempts), its
// parts are tried once each; the poison key's failures in a row stay
// below ConsecutiveFailures, so the good keys are answered.
func TestBatchWindowPoisonRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &poisoned{poison: map[string]bool{"poison": true}}
		var events eventLog
		keys, got := windowOf31(t, p, Options[string, string]{
			Retry:  Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
			OnLoad: events.add,
		})
		for _, k := range keys[1:] {
			if r := got[k]; r.err != nil {
				t.Errorf("Get(%s) = %v; want its value", k, r.err)
			}
		}
		calls := p.all()
		if len(calls) > 3+10 {
			t.Errorf("%d LoadMany calls; want at most 13: 3 of the whole, 10 parts", len(calls))
		}
		synctest.Wait()
		evs := events.all()
		var me *ManyError[string]
		if len(evs) != 1 || evs[0].Keys != 31 || evs[0].Attempts != len(calls) || !errors.As(evs[0].Err, &me) || len(me.Errs) != 1 {
			t.Errorf("events %+v; want one of 31 keys, %d attempts, its Err the ManyError of the poison key", evs, len(calls))
		}
		t.Logf("with MaxAttempts 3: %d LoadMany calls", len(calls))
	})
}

// Rule 31: a LoadMany that panics on the poison key is split as one that
// fails: the poison key gets the *PanicError, the others their values.
func TestBatchWindowPoisonPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &poisoned{poison: map[string]bool{"poison": true}, panics: true}
		keys, got := windowOf31(t, p, Options[string, string]{})
		for _, k := range keys[1:] {
			if r := got[k]; r.err != nil {
				t.Errorf("Get(%s) = %v; want its value", k, r.err)
			}
		}
		var pe *PanicError
		if r := got["poison"]; !errors.As(r.err, &pe) {
			t.Errorf("Get(poison) = %v; want a *PanicError", r.err)
		}
	})
}

// Rule 31 with Options.Limit: the split's tries hold the call's one
// slot, so a window split under MaxLoads 1 neither waits on itself nor
// takes a second slot.
func TestBatchWindowPoisonLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &poisoned{poison: map[string]bool{"poison": true}}
		keys, got := windowOf31(t, p, Options[string, string]{Limit: Limit{MaxLoads: 1, MaxWait: time.Second}})
		for _, k := range keys[1:] {
			if r := got[k]; r.err != nil {
				t.Errorf("Get(%s) = %v; want its value", k, r.err)
			}
		}
	})
}

// Rule 15 and 31: a GetMany's own batch, that no other caller joined,
// is not split: its keys are the caller's own choice, and it gets the
// call's error for each (one call). Once another caller joins one of its
// keys, a failed call is split, so that caller gets its value.
func TestGetManyPoisonSplitsOnlyWhenJoined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &poisoned{poison: map[string]bool{"poison": true}}
		l := manyLoader(t, Options[string, string]{LoadMany: p.load})
		_, err := l.GetMany(t.Context(), []string{"a", "b", "poison"})
		var me *ManyError[string]
		if !errors.As(err, &me) || len(me.Errs) != 3 || len(p.all()) != 1 {
			t.Fatalf("GetMany = %v after %d calls; want the 3 keys failed, one call", err, len(p.all()))
		}

		p2 := &poisoned{poison: map[string]bool{"poison": true}, gate: make(chan struct{}), started: make(chan []string, 10)}
		l2 := manyLoader(t, Options[string, string]{LoadMany: p2.load})
		many := make(chan error, 1)
		go func() {
			_, err := l2.GetMany(t.Context(), []string{"a", "b", "c", "poison"})
			many <- err
		}()
		recv(t, "the GetMany's call", p2.started)
		joined := getAsync(t.Context(), l2, "b") // joins b's call
		synctest.Wait()
		close(p2.gate)
		if r := <-joined; r.err != nil || r.v != "b-v" {
			t.Errorf("the joined Get(b) = %q, %v; want its value", r.v, r.err)
		}
		err = <-many
		if !errors.As(err, &me) || len(me.Errs) != 1 || !errors.Is(me.Errs["poison"], errCollation) {
			t.Errorf("GetMany = %v; want poison alone failed", err)
		}
		if calls := p2.all(); len(calls) != 5 {
			t.Errorf("LoadMany calls %v; want 5: the 4 keys, 2 halves, the poison half's 2", calls)
		}
	})
}

// Rule 31 under CancelAtZero: a part whose callers all left while the
// call ran is not tried; the others are.
func TestBatchWindowSplitDropsLeftPart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &poisoned{poison: map[string]bool{"c": true}, gate: make(chan struct{}), started: make(chan []string, 10)}
		l := manyLoader(t, Options[string, string]{LoadMany: p.load, BatchWindow: time.Second, MaxBatch: 4, Policy: CancelAtZero})
		res := map[string]<-chan result{}
		cancels := map[string]context.CancelFunc{}
		for _, k := range []string{"a", "b", "c", "d"} {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cancels[k] = cancel
			res[k] = getAsync(ctx, l, k)
			synctest.Wait() // the window holds the keys in this order
		}
		if keys := recv(t, "the window's call", p.started); !slices.Equal(keys, []string{"a", "b", "c", "d"}) {
			t.Fatalf("the window's call = %v; want a, b, c, d", keys)
		}
		cancels["c"]()
		cancels["d"]()
		synctest.Wait()
		close(p.gate)
		for _, k := range []string{"a", "b"} {
			if r := <-res[k]; r.err != nil {
				t.Errorf("Get(%s) = %v; want its value", k, r.err)
			}
		}
		for _, k := range []string{"c", "d"} {
			if r := <-res[k]; !errors.Is(r.err, context.Canceled) {
				t.Errorf("Get(%s) = %v; want its caller's context.Canceled", k, r.err)
			}
		}
		synctest.Wait()
		want := [][]string{{"a", "b", "c", "d"}, {"a", "b"}}
		if calls := p.all(); !slices.EqualFunc(calls, want, slices.Equal) {
			t.Errorf("LoadMany calls %v; want %v: the half nobody waits for is not tried", calls, want)
		}
	})
}

// Rule 31 and rule 8: Close during a split ends it: the part in flight
// ends with the load's context, no further part is tried, every Get
// returns, ErrClosed for those still waiting.
func TestBatchWindowCloseDuringSplit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &poisoned{poison: map[string]bool{"a": true}, started: make(chan []string, 10), gate: make(chan struct{}), gateFrom: 2}
		l := manyLoader(t, Options[string, string]{LoadMany: p.load, BatchWindow: time.Second, MaxBatch: 4})
		res := map[string]<-chan result{}
		for _, k := range []string{"a", "b", "c", "d"} {
			res[k] = getAsync(t.Context(), l, k)
			synctest.Wait()
		}
		recv(t, "the window's call", p.started)
		recv(t, "the first half's try", p.started) // it waits for the gate, which never opens
		l.Close()
		for k, ch := range res {
			if r := <-ch; !errors.Is(r.err, ErrClosed) {
				t.Errorf("Get(%s) = %v; want ErrClosed", k, r.err)
			}
		}
		if calls := p.all(); len(calls) != 2 {
			t.Errorf("LoadMany calls %v; want 2: the split stops at Close", calls)
		}
	})
}

// TestBisectHalves: the halves of a part cover its keys once, and do not
// share room to grow.
func TestBisectHalves(t *testing.T) {
	for n := 2; n <= 9; n++ {
		keys := keyRange("k", n)
		a, z := part[string]{keys: keys, err: errBoom}.halves()
		if len(a.keys)+len(z.keys) != n || !slices.Equal(append(slices.Clone(a.keys), z.keys...), keys) || a.err != errBoom || z.err != errBoom {
			t.Errorf("halves of %v = %v, %v", keys, a.keys, z.keys)
		}
		_ = append(a.keys, "x")
		if z.keys[0] != keys[len(a.keys)] {
			t.Errorf("appending to the first half of %d keys wrote the second", n)
		}
	}
}

package flightcache

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A Limit makes a storm slower and never makes it fail where no limit
// would not (docs/design.md rule 22): 2,000 distinct cold keys asked for
// at once from a healthy downstream behind a client's connection pool, in
// a synctest bubble's virtual time.

const (
	stormKeys  = 2000
	stormConns = 4                    // the pool's connections
	stormCall  = 5 * time.Millisecond // one call on a connection
)

// connPool is a healthy downstream behind a client's pool of connections,
// as a database's client has: at most cap(conns) calls run at once, each
// taking took; a call that finds every connection busy waits for one,
// first come first served, for as long as its context allows. It never
// fails a call it gets to serve.
type connPool struct {
	conns chan struct{} // a token per connection in use
	took  time.Duration

	calls, inside, peak atomic.Int64 // LoadFunc calls; those in it now (waiting or served); the most at once
}

func newConnPool(conns int, took time.Duration) *connPool {
	return &connPool{conns: make(chan struct{}, conns), took: took}
}

func (p *connPool) load(ctx context.Context, key int) (string, error) {
	p.calls.Add(1)
	n := p.inside.Add(1)
	defer p.inside.Add(-1)
	for old := p.peak.Load(); n > old && !p.peak.CompareAndSwap(old, n); old = p.peak.Load() {
	}
	select {
	case p.conns <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-p.conns }()
	t := time.NewTimer(p.took)
	defer t.Stop()
	select {
	case <-t.C:
		return "v" + strconv.Itoa(key), nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// stormOutcome is what the Gets of one storm returned, and what the
// downstream and the Loader saw.
type stormOutcome struct {
	answered, limited, timedOut, breakerOpen int
	other                                    error // the first error of any other kind
	calls, peak                              int64 // the downstream's calls, and the most at once
	stats                                    Stats // the Loader's, once every Get has returned
}

// coldStorm asks a Loader with opts, on a pool of stormConns connections
// each call taking stormCall, for stormKeys distinct cold keys at once,
// each Get with a deadline of a minute, and tallies what they returned.
// It runs in the caller's synctest bubble.
func coldStorm(t *testing.T, opts Options[int, string]) stormOutcome {
	t.Helper()
	p := newConnPool(stormConns, stormCall)
	opts.TTL = time.Minute
	l, err := New(p.load, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer l.Close()
	errs := make([]error, stormKeys)
	var wg sync.WaitGroup
	for i := range stormKeys {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if v, err := l.Get(ctx, i); err == nil && v != "v"+strconv.Itoa(i) {
				t.Errorf("Get(%d) = %q, nil; want %q", i, v, "v"+strconv.Itoa(i))
			} else {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	o := stormOutcome{calls: p.calls.Load(), peak: p.peak.Load(), stats: l.Stats()}
	for _, err := range errs {
		switch {
		case err == nil:
			o.answered++
		case errors.Is(err, ErrLimited):
			o.limited++
		case errors.Is(err, ErrLoadTimeout):
			o.timedOut++
		case errors.Is(err, ErrBreakerOpen):
			o.breakerOpen++
		case o.other == nil:
			o.other = err
		}
	}
	return o
}

// Every Get of the storm is answered with no limit (the control: the
// downstream is healthy), with a fixed bound above the pool's size, with
// the adaptive bound, and with the pool's size: the default queue holds
// the storm, and no limit sheds a load its downstream would have answered.
func TestLimitStormIsAnswered(t *testing.T) {
	for _, tt := range []struct {
		name  string
		limit Limit
		bound int64 // the most calls at once the limit allows; 0: no limit
	}{
		{"no limit (control)", Limit{}, 0},
		{"MaxLoads 50", Limit{MaxLoads: 50}, 50},
		{"Adaptive", Limit{Adaptive: true}, DefaultAdaptiveMaxLoads},
		{"MaxLoads 4, the pool's size", Limit{MaxLoads: stormConns}, stormConns},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := coldStorm(t, Options[int, string]{Limit: tt.limit})
				checkStormAnswered(t, tt.limit, o)
				if tt.bound > 0 && o.peak > tt.bound {
					t.Errorf("Limit %+v: %d downstream calls at once; want at most %d", tt.limit, o.peak, tt.bound)
				}
			})
		})
	}
}

// checkStormAnswered fails t unless every Get of the storm o was answered,
// with one downstream call each and nothing limited or left queued.
func checkStormAnswered(t *testing.T, limit Limit, o stormOutcome) {
	t.Helper()
	if o.answered != stormKeys {
		t.Errorf("Limit %+v: %d of %d Gets answered (%d ErrLimited, %d timed out, %d breaker open, other: %v); want all",
			limit, o.answered, stormKeys, o.limited, o.timedOut, o.breakerOpen, o.other)
	}
	if o.calls != stormKeys || o.stats.Limited != 0 || o.stats.QueuedLoads != 0 {
		t.Errorf("Limit %+v: %d downstream calls, Stats.Limited %d, Stats.QueuedLoads %d; want %d, 0, 0",
			limit, o.calls, o.stats.Limited, o.stats.QueuedLoads, stormKeys)
	}
}

// An explicit MaxQueue still sheds: the loads past the slots and the
// queue fail at once with ErrLimited, and only they.
func TestLimitStormExplicitMaxQueueSheds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limit := Limit{MaxLoads: stormConns, MaxQueue: 100}
		o := coldStorm(t, Options[int, string]{Limit: limit})
		want := stormConns + limit.MaxQueue // every Get asks before the first call returns
		if o.answered != want || o.limited != stormKeys-want || o.other != nil {
			t.Errorf("Limit %+v: %d answered, %d ErrLimited, other: %v; want %d, %d, none",
				limit, o.answered, o.limited, o.other, want, stormKeys-want)
		}
		if o.calls != int64(want) || o.stats.Limited != uint64(stormKeys-want) {
			t.Errorf("Limit %+v: %d downstream calls, Stats.Limited %d; want %d, %d", limit, o.calls, o.stats.Limited, want, stormKeys-want)
		}
	})
}

// The recipe for a client's pool of N connections: Limit{MaxLoads: N}
// keeps the waiting in the Limit, where it counts against MaxWait, not
// against LoadTimeout or the breaker. Without it, the same storm waits in
// the pool, on LoadTimeout: loads time out and the breaker opens.
func TestLimitPoolRecipe(t *testing.T) {
	const loadTimeout = 50 * time.Millisecond // 40 calls' worth of the pool: the storm needs 2.5s
	t.Run("no Limit (control)", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := coldStorm(t, Options[int, string]{LoadTimeout: loadTimeout})
			if o.timedOut == 0 || o.stats.Breaker != BreakerOpen {
				t.Errorf("no Limit, LoadTimeout %v: %d timed out, breaker %v; want timeouts and an open breaker",
					loadTimeout, o.timedOut, o.stats.Breaker)
			}
		})
	})
	t.Run("MaxLoads the pool's size", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			limit := Limit{MaxLoads: stormConns, MaxWait: time.Minute}
			o := coldStorm(t, Options[int, string]{LoadTimeout: loadTimeout, Limit: limit})
			checkStormAnswered(t, limit, o)
			if o.stats.Breaker != BreakerClosed || o.stats.BreakerRejected != 0 || o.peak > stormConns {
				t.Errorf("Limit %+v: breaker %v, BreakerRejected %d, %d calls at once; want closed, 0, at most %d",
					limit, o.stats.Breaker, o.stats.BreakerRejected, o.peak, stormConns)
			}
		})
	})
}

// The README's Limit snippet, run as printed: every Limit literal in the
// Go snippet of its storm section (the one it sets, and the one its
// comment offers) answers the whole storm.
func TestLimitStormREADMESnippet(t *testing.T) {
	srcs := readmeLimits(t)
	if len(srcs) == 0 {
		t.Fatal("README.md: no Limit literal in the storm section's Go snippet")
	}
	for _, src := range srcs {
		t.Run(src, func(t *testing.T) {
			limit := parseLimit(t, src)
			synctest.Test(t, func(t *testing.T) {
				checkStormAnswered(t, limit, coldStorm(t, Options[int, string]{Limit: limit}))
			})
		})
	}
}

// readmeLimits returns the Limit literals of the Go snippet that follows
// README.md's "A storm of many keys", as printed.
func readmeLimits(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "**A storm of many keys.**")
	_, snippet, ok2 := strings.Cut(section, "```go\n")
	snippet, _, ok3 := strings.Cut(snippet, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md: no Go snippet after \"**A storm of many keys.**\"")
	}
	return regexp.MustCompile(`(?:flightcache\.)?Limit\{[^}]*\}`).FindAllString(snippet, -1)
}

// parseLimit evaluates src, a Limit composite literal whose fields are
// integer or boolean literals, as the compiler would.
func parseLimit(t *testing.T, src string) Limit {
	t.Helper()
	e, err := parser.ParseExpr(src)
	lit, ok := e.(*ast.CompositeLit)
	if err != nil || !ok {
		t.Fatalf("README.md: %q is not a composite literal: %v", src, err)
	}
	var l Limit
	v := reflect.ValueOf(&l).Elem()
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		key, ok2 := kv.Key.(*ast.Ident)
		if !ok || !ok2 || !v.FieldByName(key.Name).IsValid() {
			t.Fatalf("README.md: %q: %s is not a Limit field", src, src[elt.Pos()-1:elt.End()-1])
		}
		f := v.FieldByName(key.Name)
		switch val := kv.Value.(type) {
		case *ast.BasicLit:
			n, err := strconv.ParseInt(val.Value, 0, 64)
			if val.Kind != token.INT || err != nil {
				t.Fatalf("README.md: %q: %s is not an integer", src, val.Value)
			}
			f.SetInt(n)
		case *ast.Ident:
			f.SetBool(val.Name == "true")
		default:
			t.Fatalf("README.md: %q: the test reads only integer and boolean fields", src)
		}
	}
	return l
}

// With the default queue, a load waits for a slot until MaxWait, not a
// moment less, however many wait with it; then it fails with ErrLimited.
func TestLimitDefaultQueueWaitsForMaxWait(t *testing.T) {
	const queued, maxWait = 1000, 100 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{gate: make(chan struct{})}
		l := newLoader(t, d, Options[string, string]{Limit: Limit{MaxLoads: 1, MaxWait: maxWait}})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		held := getAsync(ctx, l, "held")
		synctest.Wait() // it holds the slot
		start := time.Now()
		var returned, wrong atomic.Int64
		var wg sync.WaitGroup
		for i := range queued {
			wg.Go(func() {
				_, err := l.Get(ctx, strconv.Itoa(i))
				returned.Add(1)
				if waited := time.Since(start); (!errors.Is(err, ErrLimited) || waited != maxWait) && wrong.Add(1) == 1 {
					t.Errorf("Get(%q) = %v after %v; want ErrLimited after MaxWait, %v", strconv.Itoa(i), err, waited, maxWait)
				}
			})
		}
		synctest.Wait()
		if n, s := returned.Load(), l.Stats(); n != 0 || s.QueuedLoads != queued {
			t.Errorf("before MaxWait: %d Gets returned, Stats.QueuedLoads %d; want 0, %d", n, s.QueuedLoads, queued)
		}
		wg.Wait()
		if n := wrong.Load(); n != 0 {
			t.Errorf("%d of %d Gets did not fail with ErrLimited at MaxWait", n, queued)
		}
		if s := l.Stats(); s.Limited != queued || s.QueuedLoads != 0 {
			t.Errorf("after MaxWait: Stats.Limited %d, QueuedLoads %d; want %d, 0", s.Limited, s.QueuedLoads, queued)
		}
		close(d.gate)
		if r := <-held; r.err != nil {
			t.Errorf("Get(held) = %v; want a value", r.err)
		}
	})
}

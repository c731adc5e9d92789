package flightcache

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// chaosDuration is how long TestChaos runs. For a long run:
//
//	go test -race -run '^TestChaos$' -v -chaos.duration=10m -timeout 30m .
var chaosDuration = flag.Duration("chaos.duration", 16*time.Second,
	"how long TestChaos runs: a quarter in each of chaosConfigs (each Policy, without and with a Limit)")

// chaosConfig is one run of TestChaos: a Policy, and an Options.Limit.
type chaosConfig struct {
	policy Policy
	limit  Limit
}

// chaosConfigs are TestChaos's runs. With a Limit (docs/design.md rule
// 22), the Gets outrun the slots at their peaks (about 100 calls at once
// without one): loads queue, fail with ErrLimited (a short queue, and
// under CancelAtZero, where callers who leave take their loads out of it,
// a short MaxWait too), and values within StaleIfError are served
// stale-limited. The downstream's latency does not follow its load, so the
// adaptive bound mostly sits at its floor, which is high enough for the
// downstream to see every kind of fault in a few seconds.
var chaosConfigs = []chaosConfig{
	{policy: FinishAndFill},
	{policy: CancelAtZero},
	{policy: FinishAndFill, limit: Limit{MaxLoads: 32, MaxQueue: 32}},
	{policy: CancelAtZero, limit: Limit{Adaptive: true, MinLoads: 32, MaxLoads: 64, MaxQueue: 16, MaxWait: 250 * time.Millisecond}},
}

func (c chaosConfig) String() string {
	switch {
	case c.limit.Adaptive:
		return fmt.Sprintf("%v, Adaptive ≤ %d", c.policy, c.limit.MaxLoads)
	case c.limit.MaxLoads > 0:
		return fmt.Sprintf("%v, MaxLoads %d", c.policy, c.limit.MaxLoads)
	}
	return c.policy.String()
}

// maxWait bounds a Get without a deadline under c: one load, which may
// first wait MaxWait for a slot (its default: LoadTimeout), and then ends
// at LoadTimeout unless its LoadFunc ignores its context and hangs.
func (c chaosConfig) maxWait() time.Duration {
	switch {
	case c.limit.MaxWait > 0:
		return chaosMaxWait + c.limit.MaxWait
	case c.limit.enabled():
		return chaosMaxWait + chaosLoadTimeout
	}
	return chaosMaxWait
}

const (
	chaosWorkers     = 64
	chaosKeys        = 1000
	chaosTTL         = 300 * time.Millisecond
	chaosJitter      = 0.5
	chaosSWR         = 200 * time.Millisecond
	chaosSIE         = time.Second
	chaosLoadTimeout = time.Second
	chaosHang        = 2 * time.Second
	chaosNotFoundTTL = 100 * time.Millisecond
	chaosSlack       = 50 * time.Millisecond

	// chaosMaxAge bounds a value's age: no entry is served past its
	// freshness (at most TTL) and both stale windows.
	chaosMaxAge = chaosTTL + chaosSWR + chaosSIE
	// chaosMinUse is the least time an entry stays servable: its
	// freshness is at least TTL·(1−Jitter) (less 1ms for rounding).
	chaosMinUse = time.Duration(float64(chaosTTL)*(1-chaosJitter)) - time.Millisecond + chaosSWR + chaosSIE
	// chaosMaxWait bounds a Get without a deadline: one load, which ends
	// at LoadTimeout unless its LoadFunc ignores its context and hangs.
	chaosMaxWait = chaosLoadTimeout + chaosHang + time.Second
)

// TestChaos runs a Loader against a faulty downstream under load, in real
// time, under each Policy, without and with a Limit: 64 goroutines Get 1,000 keys with
// a Zipf mix, under random deadlines and cancellations, and interleave Set
// and Invalidate; the downstream takes 1-200ms and injects errors, panics,
// runtime.Goexit, hangs that ignore their context, and outages that open
// the breaker; Close comes at the end, under load. Every call is judged
// (chaos_judge_test.go) and the findings are printed as a table (-v).
func TestChaos(t *testing.T) {
	if *chaosDuration <= 0 {
		t.Skip("-chaos.duration is 0")
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "chaos.duration" })
	if testing.Short() && !set {
		t.Skip("-short without -chaos.duration")
	}
	each := *chaosDuration / time.Duration(len(chaosConfigs))
	var reports []*chaosReport
	for _, c := range chaosConfigs {
		reports = append(reports, runChaos(t, c, each))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: %v per run, %d goroutines, %d keys (Zipf s=1.1), TTL %v ±%.0f%%, SWR %v, SIE %v, LoadTimeout %v, hangs %v, GOMAXPROCS %d\n",
		each, chaosWorkers, chaosKeys, chaosTTL, 100*chaosJitter, chaosSWR, chaosSIE, chaosLoadTimeout, chaosHang, runtime.GOMAXPROCS(0))
	chaosTable(&b, reports)
	t.Log("\n" + b.String())
	for _, r := range reports {
		for kind := range numViolations {
			if n := r.v.n[kind].Load(); n > 0 {
				t.Errorf("%v: %d × %s, e.g.\n\t%s", r.config, n, chaosViolationNames[kind], strings.Join(r.v.examples[kind], "\n\t"))
			}
		}
		if missing := r.unexercised(); each >= 4*time.Second && len(missing) > 0 {
			t.Errorf("%v: the chaos never got to: %s", r.config, strings.Join(missing, "; "))
		}
	}
	goleak.VerifyNone(t)
}

// chaosTable prints the reports side by side, a column each.
func chaosTable(b *strings.Builder, reports []*chaosReport) {
	w := make([]int, len(reports)+1)
	for j, r := range reports {
		w[j+1] = len(r.config.String())
		for _, row := range r.rows {
			w[0] = max(w[0], len(row[0]))
			w[j+1] = max(w[j+1], len(row[1]))
		}
	}
	line := func(label string, cell func(j int) string) {
		fmt.Fprintf(b, "%-*s", w[0], label)
		for j := range reports {
			fmt.Fprintf(b, "  %*s", w[j+1], cell(j))
		}
		b.WriteString("\n")
	}
	line("", func(j int) string { return reports[j].config.String() })
	for i, row := range reports[0].rows {
		line(row[0], func(j int) string { return reports[j].rows[i][1] })
	}
}

// chaosRun is one run of TestChaos: one Loader, one chaosConfig.
type chaosRun struct {
	config     chaosConfig
	policy     Policy
	l          *Loader[int, chaosVal]
	d          *chaosDownstream
	n          chaosCounts
	v          violations
	mon        stallMonitor
	t0         time.Time
	closeStart atomic.Int64 // since t0; 0 until Close is called
	closed     atomic.Int64 // since t0; 0 until Close has returned

	mu      sync.Mutex
	overdue []chaosOverdue // Gets past a bound, judged once stalls are known
}

// chaosOverdue is a Get that returned past a bound; it is a violation
// unless the process stalled somewhere in [from, to].
type chaosOverdue struct {
	kind     chaosViolation
	from, to time.Time
	msg      string
}

func runChaos(t *testing.T, config chaosConfig, dur time.Duration) *chaosReport {
	policy := config.policy
	r := &chaosRun{config: config, policy: policy, t0: time.Now()}
	r.d = &chaosDownstream{policy: policy, keys: make([]chaosKey, chaosKeys), n: &r.n, v: &r.v, maxCalls: int64(config.limit.MaxLoads)}
	l, err := New(r.d.load, Options[int, chaosVal]{
		TTL: chaosTTL, Jitter: chaosJitter, StaleWhileRevalidate: chaosSWR, StaleIfError: chaosSIE,
		EarlyRefresh: 1,
		MaxCost:      100 * chaosKeys, // room for every key: nothing is evicted, so the stale check holds
		Policy:       policy,
		LoadTimeout:  chaosLoadTimeout,
		Retry:        Retry{MaxAttempts: 2, InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond},
		Breaker:      Breaker{ConsecutiveFailures: 5, OpenTimeout: 100 * time.Millisecond},
		NotFoundTTL:  chaosNotFoundTTL,
		OnLoad:       r.onLoad,
		Limit:        config.limit,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.l = l
	r.d.l = l

	var helpers sync.WaitGroup
	stopHelpers := make(chan struct{})
	prev := BreakerClosed
	helpers.Go(func() {
		r.mon.run(stopHelpers, func() {
			st := l.Stats().Breaker
			if st == BreakerOpen && prev != BreakerOpen {
				r.n.opened.Add(1)
			}
			if st == BreakerClosed && prev != BreakerClosed {
				r.n.reclosed.Add(1)
			}
			prev = st
		})
	})
	for range 4 {
		helpers.Go(func() { r.mon.canary(stopHelpers) })
	}
	helpers.Go(func() { // outages: every second, 300ms of failing calls opens the breaker
		for {
			for _, on := range []bool{false, true} {
				wait := 700 * time.Millisecond
				if on {
					wait = 300 * time.Millisecond
				}
				r.d.outage.Store(on)
				select {
				case <-stopHelpers:
					r.d.outage.Store(false)
					return
				case <-time.After(wait):
				}
			}
		}
	})

	var workers sync.WaitGroup
	var stop atomic.Bool
	for w := range chaosWorkers {
		workers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(r.t0.UnixNano())))
			zipf := rand.NewZipf(rng, 1.1, 1, chaosKeys-1)
			for !stop.Load() {
				key := int(zipf.Uint64())
				switch p := rng.Float64(); {
				case p < 0.005 && !chaosMissing(key):
					r.set(key)
				case p < 0.01:
					r.invalidate(key)
				default:
					r.get(rng, key)
				}
				time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
			}
		})
	}

	time.Sleep(dur)
	closeStart := time.Now()
	r.closeStart.Store(int64(closeStart.Sub(r.t0)))
	l.Close() // under load: the workers keep going
	closeTook := time.Since(closeStart)
	r.closed.Store(int64(time.Since(r.t0)))
	if n, s := r.d.inside.Load(), l.Stats(); n != 0 || s.InFlight != 0 {
		r.v.add(vAfterClose, "Close returned with %d downstream calls running, Stats.InFlight %d", n, s.InFlight)
	}
	time.Sleep(100 * time.Millisecond) // Gets after Close
	stop.Store(true)
	waitOrDump(t, &workers, 30*time.Second, "chaos workers after Close")
	close(stopHelpers)
	waitOrDump(t, &helpers, patience, "chaos helpers after stop")

	r.judgeOverdue()
	r.reconcile()
	return r.report(closeTook)
}

// waitOrDump waits for wg, failing with every goroutine's stack if it takes
// longer than d: some call did not return.
func waitOrDump(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%s: not done after %v; goroutines:\n%s", what, d, buf)
	}
}

func (r *chaosRun) set(key int) {
	r.n.sets.Add(1)
	k := &r.d.keys[key]
	k.mu.Lock()
	alone := k.starts == k.ends // no Invalidate or Set of the key in progress
	k.starts++
	mine := k.starts
	k.mu.Unlock()
	stamp := time.Now()
	r.l.Set(key, chaosVal{key: key, stamp: stamp, seq: r.d.seq.Add(1)})
	storeMax(&r.n.maxWrite, int64(time.Since(stamp)))
	k.mu.Lock()
	k.ends++
	// Readable when Set returns, if no other Invalidate or Set of the key
	// overlapped it: one that did may have been ordered after it (an
	// Invalidate then rightly drops this value), even if it has returned.
	if alone && k.starts == mine && k.starts == k.ends {
		k.obs = chaosObs{ok: true, stamp: stamp, at: time.Now(), gen: k.gen(), via: "a Set"}
	}
	k.mu.Unlock()
}

func (r *chaosRun) invalidate(key int) {
	r.n.invalidates.Add(1)
	k := &r.d.keys[key]
	k.mu.Lock()
	k.starts++
	k.mu.Unlock()
	t0 := time.Now()
	r.l.Invalidate(key)
	storeMax(&r.n.maxWrite, int64(time.Since(t0)))
	k.mu.Lock()
	k.ends++
	k.mu.Unlock()
}

func (r *chaosRun) onLoad(ev LoadEvent[int]) {
	r.n.loads.Add(1)
	if ev.Err != nil {
		r.n.loadEvErrs.Add(1)
		if ev.Stored && !errors.Is(ev.Err, ErrNotFound) {
			r.v.add(vErrorCached, "OnLoad: key %d: error %v was stored", ev.Key, ev.Err)
		}
	}
	if ev.Abandoned {
		r.n.abandoned.Add(1)
		if r.policy == FinishAndFill {
			r.v.add(vUnexpected, "OnLoad: key %d: a load abandoned under FinishAndFill", ev.Key)
		}
	}
	if ev.Background {
		r.n.background.Add(1)
	}
	if ev.Queued > 0 {
		r.n.queued.Add(1)
	}
	if errors.Is(ev.Err, ErrLimited) {
		// Rule 22: no downstream call, so no attempt to retry or to count
		// for the breaker; and never cached (checked above for any error).
		r.n.limitedLoads.Add(1)
		if !r.config.limit.enabled() || ev.Attempts != 0 || ev.Background {
			r.v.add(vUnexpected, "OnLoad: key %d: ErrLimited after %d attempts (background %v) with Limit %+v; want none without a Limit, and no attempt", ev.Key, ev.Attempts, ev.Background, r.config.limit)
		}
	}
}

// get makes one Get with a random deadline or cancellation, and judges it.
func (r *chaosRun) get(rng *rand.Rand, key int) {
	k := &r.d.keys[key]
	tok := k.token()
	ctx := context.WithValue(context.Background(), chaosTokenKey{}, tok)
	var deadline time.Time
	var canceledAt atomic.Int64 // since t0, once the cancel below has run
	switch p := rng.Float64(); {
	case p < 0.15: // no deadline
	case p < 0.75:
		r.n.deadlines.Add(1)
		deadline = tok.begin.Add(5*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond))))
		c, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		ctx = c
	default: // cancelled at a random moment
		r.n.cancels.Add(1)
		c, cancel := context.WithCancel(ctx)
		defer cancel()
		tm := time.AfterFunc(time.Duration(rng.Int64N(int64(250*time.Millisecond))), func() {
			canceledAt.Store(int64(time.Since(r.t0)))
			cancel()
		})
		defer tm.Stop()
		ctx = c
	}
	v, info, err := r.l.GetInfo(ctx, key)
	ret := time.Now()

	r.n.gets.Add(1)
	r.n.sources[info.Source].Add(1)
	if info.Source == SourceShared && err != nil {
		r.n.sharedErrs.Add(1)
	}
	if c := r.closed.Load(); c != 0 && tok.begin.Sub(r.t0) > time.Duration(c) && !(errors.Is(err, ErrClosed) && info.Source == SourceNone) {
		r.v.add(vAfterClose, "Get(%d) begun after Close returned = %v, %v; want ErrClosed", key, info.Source, err)
	}
	switch {
	case err == nil:
		r.n.values.Add(1)
		r.judgeValue(k, tok, key, v, info, ret)
	case (err == context.Canceled || err == context.DeadlineExceeded) && ctx.Err() != nil:
		r.n.ctxErrs.Add(1)
		if info.Source != SourceNone {
			r.v.add(vUnexpected, "Get(%d) = %v with Source %v; want none for the caller's own context error", key, err, info.Source)
		}
	case errors.Is(err, ErrClosed):
		r.n.closedErrs.Add(1)
	case errors.Is(err, ErrNotFound):
		r.n.notFound.Add(1)
		if !chaosMissing(key) {
			r.v.add(vUnexpected, "Get(%d) = %v; the key exists", key, err)
		}
	default: // a load's error
		r.n.loadErrs.Add(1)
		r.judgeLoadError(k, tok, key, info, err, ret)
	}

	dl := deadline
	if c := canceledAt.Load(); c != 0 {
		dl = r.t0.Add(time.Duration(c))
	}
	switch {
	case !dl.IsZero():
		late := ret.Sub(dl)
		storeMax(&r.n.maxLate, int64(late))
		if late > chaosSlack {
			r.noteOverdue(vLate, dl, ret, "Get(%d) returned %v after its context ended (%v, %v; waited %v, began %v before its context ended)",
				key, late.Round(time.Millisecond), info.Source, err, info.Waited.Round(time.Millisecond), dl.Sub(tok.begin).Round(time.Millisecond))
		}
	case canceledAt.Load() == 0 && deadline.IsZero():
		wait := ret.Sub(tok.begin)
		storeMax(&r.n.maxNoDeadline, int64(wait))
		if bound := r.config.maxWait(); wait > bound {
			r.noteOverdue(vNoDeadlineTooLong, tok.begin.Add(bound), ret, "Get(%d) without a deadline took %v (%v, %v)", key, wait, info.Source, err)
		}
	}
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// The bookkeeping of TestChaos (chaos_test.go): a faulty downstream that
// watches its own concurrency per key, and what the harness knows about
// each key, so that every Get can be judged on its own.

// chaosVal is what the chaos downstream returns (or a Set stores): the key,
// when the value was made, and a sequence number. The stamp lives inside
// the value, so a value's true age needs no trust in Info.Age.
type chaosVal struct {
	key   int
	stamp time.Time
	seq   uint64
}

// chaosTokenKey carries a *chaosToken on every Get's context. A load's
// context keeps the values of the Get that started it, so the downstream
// sees what that Get knew when it began.
type chaosTokenKey struct{}

type chaosToken struct {
	begin   time.Time
	starts  uint64 // Invalidate and Set calls of the key begun before the Get began
	gen     uint64 // Invalidate and Set calls of the key begun or returned by then
	pending bool   // one was in progress when the Get began
}

// chaosObs is a value known to have been in the cache: a Get read it there
// (hit, stale, stale-on-error) or a Set stored it, with no Invalidate or Set
// of the key in progress or begun since gen.
type chaosObs struct {
	ok    bool
	stamp time.Time // when the value was made: its entry was stamped no earlier
	at    time.Time // when the harness learned it
	gen   uint64
	via   string // "a Get" or "a Set": for failure messages
}

// chaosInflight is one downstream call running.
type chaosInflight struct {
	ctx context.Context
	tok *chaosToken
}

// chaosKey is what the harness knows about one key.
type chaosKey struct {
	mu       sync.Mutex
	starts   uint64 // Invalidate and Set calls begun
	ends     uint64 // Invalidate and Set calls returned
	obs      chaosObs
	inflight []*chaosInflight // downstream calls of the key running now
}

func (k *chaosKey) gen() uint64 { return k.starts + k.ends }

// token snapshots the key as a Get begins.
func (k *chaosKey) token() *chaosToken {
	k.mu.Lock()
	defer k.mu.Unlock()
	return &chaosToken{begin: time.Now(), starts: k.starts, gen: k.gen(), pending: k.starts != k.ends}
}

// observe records a value read from the cache by a Get that began with tok,
// if no Invalidate or Set of the key overlapped that Get.
func (k *chaosKey) observe(tok *chaosToken, stamp time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if tok.pending || tok.gen != k.gen() {
		return
	}
	if !k.obs.ok || k.obs.gen != k.gen() || stamp.After(k.obs.stamp) {
		k.obs = chaosObs{ok: true, stamp: stamp, at: time.Now(), gen: k.gen(), via: "a Get"}
	}
}

// The kinds of violation TestChaos looks for, in the order of its table.
type chaosViolation int

const (
	vOtherKey chaosViolation = iota
	vTooOld
	vAgeDishonest
	vErrorDespiteStale
	vLate
	vNoDeadlineTooLong
	vOverlap
	vOverLimit
	vErrorCached
	vUnexpected
	vAfterClose
	vStats
	numViolations
)

var chaosViolationNames = [numViolations]string{
	vOtherKey:          "a Get returned another key's value",
	vTooOld:            "a value older than TTL+SWR+SIE (+50ms)",
	vAgeDishonest:      "Info.Age above the bound or the true age",
	vErrorDespiteStale: "an error while a stale value within SIE existed",
	vLate:              "returned after deadline+50ms (no stall)",
	vNoDeadlineTooLong: "no deadline: waited > LoadTimeout+hang+1s(+MaxWait)",
	vOverlap:           "two downstream calls of a key at once",
	vOverLimit:         "more downstream calls at once than MaxLoads",
	vErrorCached:       "an error or panic cached (NotFound aside)",
	vUnexpected:        "an unexpected error, Source or event",
	vAfterClose:        "after Close: a value, or work still running",
	vStats:             "Stats disagree with the harness",
}

// chaosCounts are the harness's own counters for one run.
type chaosCounts struct {
	gets, sets, invalidates                  atomic.Int64
	sources                                  [SourceStaleLimited + 1]atomic.Int64 // every Get, by Info.Source
	values, ctxErrs, closedErrs, notFound    atomic.Int64
	loadErrs, sharedErrs, breakerErrs        atomic.Int64
	calls, errs, panics, goexits, hangs      atomic.Int64
	outageErrs, notFoundCalls                atomic.Int64
	loads, loadEvErrs, abandoned, background atomic.Int64
	overlapDetached, overlapAbandoned        atomic.Int64
	staleChecked, staleDuringClose           atomic.Int64
	lateStalled, deadlines, cancels          atomic.Int64
	opened, reclosed                         atomic.Int64
	limitedErrs, limitedLoads, queued        atomic.Int64 // Gets and loads that ended in ErrLimited; loads that queued
	refreshesLimited, peakCalls              atomic.Int64 // Stats.RefreshesLimited at the end; most downstream calls at once
	maxAge, maxLate, maxNoDeadline, maxWrite atomic.Int64 // nanoseconds
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// violations collects what went wrong, with a few examples of each kind.
type violations struct {
	n        [numViolations]atomic.Int64
	mu       sync.Mutex
	examples [numViolations][]string
}

func (v *violations) add(kind chaosViolation, format string, args ...any) {
	if v.n[kind].Add(1) > 3 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.examples[kind] = append(v.examples[kind], fmt.Sprintf(format, args...))
}

var (
	errChaos       = errors.New("chaos: downstream error")
	errChaosOutage = errors.New("chaos: downstream outage")
)

// chaosDownstream is the faulty service behind the Loader. It checks, on
// every call, that no other call of the same key is running unless the
// Loader is allowed to have started it (docs/design.md rule 6: a load
// detached by Invalidate or Set; CancelAtZero: a load its callers
// abandoned).
type chaosDownstream struct {
	l      *Loader[int, chaosVal] // set once New returns, before any Get
	policy Policy
	keys   []chaosKey
	n      *chaosCounts
	v      *violations
	outage atomic.Bool
	inside atomic.Int64 // calls running now
	seq    atomic.Uint64
	// slept counts the calls that got past their sleep: every 80th of them
	// calls runtime.Goexit, so that each run has Goexits however few calls
	// a Limit lets through (a 1% draw left some runs with none).
	slept atomic.Int64
	// maxCalls is Options.Limit.MaxLoads (the adaptive bound's ceiling), or
	// 0: no calls at once beyond it, retries and refreshes included.
	maxCalls int64
}

// abandoned reports whether the load running under ctx was abandoned by
// its callers (CancelAtZero) and has left the in-flight map. Its context's
// cause is not enough: a load past LoadTimeout keeps that cause when its
// last caller leaves.
func (d *chaosDownstream) abandoned(key int, ctx context.Context) bool {
	m, _ := ctx.Value(loadKey{}).(*loadMarker)
	if m == nil {
		return false
	}
	c := m.id.(*call[int, chaosVal])
	sh := d.l.flights.shard(c.h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return c.abandoned && sh.loads[key] != c
}

// missing reports whether key does not exist downstream: its loads return
// ErrNotFound, which NotFoundTTL caches.
func chaosMissing(key int) bool { return key%100 == 37 }

func (d *chaosDownstream) load(ctx context.Context, key int) (chaosVal, error) {
	tok, _ := ctx.Value(chaosTokenKey{}).(*chaosToken)
	if tok == nil {
		d.v.add(vUnexpected, "load of %d: the load's context lost the values of the Get that started it", key)
		tok = &chaosToken{pending: true}
	}
	k := &d.keys[key]
	me := &chaosInflight{ctx: ctx, tok: tok}
	k.mu.Lock()
	// Either call may be the one the Loader let go: a load's goroutine
	// can reach the downstream after its load was detached or abandoned.
	abandoned := func(ctx context.Context) bool {
		return d.policy == CancelAtZero && d.abandoned(key, ctx)
	}
	detached := func(tok *chaosToken) bool { return k.starts > tok.starts || tok.pending }
	for _, o := range k.inflight {
		switch {
		case abandoned(o.ctx) || abandoned(ctx):
			d.n.overlapAbandoned.Add(1)
		case detached(o.tok) || detached(tok):
			d.n.overlapDetached.Add(1)
		default:
			d.v.add(vOverlap, "key %d: a downstream call started while another, begun %v earlier, still ran; no Invalidate or Set since, not abandoned",
				key, time.Since(o.tok.begin).Round(time.Millisecond))
		}
	}
	k.inflight = append(k.inflight, me)
	k.mu.Unlock()
	d.n.calls.Add(1)
	// The count goes down in the defer below, before the Loader gives the
	// call's slot back: a call that starts after that holds another slot.
	n := d.inside.Add(1)
	storeMax(&d.n.peakCalls, n)
	if d.maxCalls > 0 && n > d.maxCalls {
		d.v.add(vOverLimit, "key %d: %d downstream calls at once; Limit.MaxLoads is %d", key, n, d.maxCalls)
	}
	defer func() { // also on panic and runtime.Goexit
		k.mu.Lock()
		for i, o := range k.inflight {
			if o == me {
				k.inflight = append(k.inflight[:i], k.inflight[i+1:]...)
				break
			}
		}
		k.mu.Unlock()
		d.inside.Add(-1)
	}()

	if d.outage.Load() {
		if err := chaosSleep(ctx, time.Millisecond+rand.N(4*time.Millisecond)); err != nil {
			return chaosVal{}, err
		}
		d.n.outageErrs.Add(1)
		return chaosVal{}, errChaosOutage
	}
	u := rand.Float64()
	if u < 0.01 { // a hang that ignores its context
		d.n.hangs.Add(1)
		time.Sleep(chaosHang)
		if err := ctx.Err(); err != nil {
			return chaosVal{}, err
		}
		return d.answer(key)
	}
	if err := chaosSleep(ctx, time.Millisecond+rand.N(200*time.Millisecond)); err != nil {
		return chaosVal{}, err
	}
	if d.slept.Add(1)%80 == 40 {
		d.n.goexits.Add(1)
		runtime.Goexit()
	}
	switch {
	case u < 0.11:
		d.n.errs.Add(1)
		return chaosVal{}, errChaos
	case u < 0.13:
		d.n.panics.Add(1)
		panic(fmt.Sprintf("chaos: panic loading %d", key))
	}
	return d.answer(key)
}

func (d *chaosDownstream) answer(key int) (chaosVal, error) {
	if chaosMissing(key) {
		d.n.notFoundCalls.Add(1)
		return chaosVal{}, fmt.Errorf("chaos: key %d: %w", key, ErrNotFound)
	}
	return chaosVal{key: key, stamp: time.Now(), seq: d.seq.Add(1)}, nil
}

// chaosSleep waits d or until ctx ends, whichever comes first.
func chaosSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stallMonitor watches for stalls of the whole process (GC, a busy
// machine), which delay a Get without any fault of the Loader: a 1ms ticker
// served late, or a goroutine that waited long in the scheduler's run queue
// (the runtime's /sched/latencies histogram, read on every tick).
type stallMonitor struct {
	mu     sync.Mutex
	stalls [][2]time.Time // intervals in which something stalled > stallGap
	max    time.Duration
}

const stallGap = 20 * time.Millisecond

// run ticks until stop is closed, calling each on every tick.
func (m *stallMonitor) run(stop <-chan struct{}, each func()) {
	tk := time.NewTicker(time.Millisecond)
	defer tk.Stop()
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	slowRuns := func() (n uint64, longest time.Duration) {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
			return 0, 0
		}
		h := sample[0].Value.Float64Histogram()
		for i, c := range h.Counts {
			if lo := time.Duration(h.Buckets[i] * float64(time.Second)); lo >= stallGap && c > 0 {
				n += c
				longest = max(longest, lo)
			}
		}
		return n, longest
	}
	last := time.Now()
	slow, _ := slowRuns()
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		now := time.Now()
		if gap := now.Sub(last); gap > stallGap {
			m.note(last, now, gap)
		}
		if n, longest := slowRuns(); n > slow {
			m.note(last.Add(-longest), now, longest) // a goroutine waited at least longest to run
			slow = n
		}
		last = now
		each()
	}
}

// canary waits on context deadlines, as a Get does, until stop is closed,
// and notes every wake-up later than stallGap: the process could not run a
// woken goroutine in time.
func (m *stallMonitor) canary(stop <-chan struct{}) {
	for {
		deadline := time.Now().Add(time.Millisecond + rand.N(9*time.Millisecond))
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		select {
		case <-stop:
			cancel()
			return
		case <-ctx.Done():
		}
		cancel()
		if late := time.Since(deadline); late > stallGap {
			m.note(deadline, time.Now(), late)
		}
	}
}

func (m *stallMonitor) note(from, to time.Time, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stalls = append(m.stalls, [2]time.Time{from, to})
	m.max = max(m.max, d)
}

// stallReach widens the interval a stall is looked for in: the monitor
// and the canaries are woken ahead of queued goroutines, so they see only
// part of a starved stretch, and sometimes only its edge.
const stallReach = 250 * time.Millisecond

// overlaps reports whether a stall came within stallReach of [from, to].
func (m *stallMonitor) overlaps(from, to time.Time) bool {
	from, to = from.Add(-stallReach), to.Add(stallReach)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.stalls {
		if s[0].Before(to) && s[1].After(from) {
			return true
		}
	}
	return false
}

func (m *stallMonitor) summary() (n int, longest time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.stalls), m.max
}

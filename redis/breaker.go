package flightredis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/store"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// How Breaker adapts gobreaker's DistributedCircuitBreaker to the two-step
// [flightcache.CircuitBreaker]:
//
// DistributedCircuitBreaker has one entry point, Execute(req): it reads the
// shared state, takes a shared mutex, runs req, writes the state back and
// unlocks. Holding the mutex across req would serialise every downstream
// call of the fleet, whatever the key. So Breaker calls Execute only for
// what must be atomic, with a req that returns at once:
//
//   - Allow reads the shared state without the mutex (one GET): closed →
//     the call goes ahead, open → refused, half-open → a probe (below);
//   - done records a failure through Execute (the mutex is held for a few
//     round trips, not for the call), and a success only when it changes
//     something (failures to reset, or a half-open breaker to close);
//   - a half-open probe does hold the mutex for the whole call, which is
//     what half-open means: one probe at a time for the whole fleet.
//     Other processes' Allow fail fast instead of waiting for it.
//
// gobreaker reads the shared state before it takes the mutex, so two
// processes could both write back what they read (a lost update). The
// store below takes the mutex on that first read instead, making every
// Execute one read-modify-write under the mutex.

// BreakerOptions configures a [Breaker]. Name is required; every other
// zero field means the default its comment gives.
type BreakerOptions struct {
	// Name identifies the breaker: every process with the same Name (on the
	// same Redis) shares it. gobreaker keeps its state under
	// "gobreaker:state:"+Name and its mutex under "gobreaker:mutex:"+Name.
	Name string

	// Breaker gives the thresholds, as for the Loader's own breaker:
	// ConsecutiveFailures, OpenTimeout and HalfOpenRequests, with the same
	// defaults ([flightcache.Breaker.WithDefaults]). IsFailure stays with
	// the Loader, which applies it before reporting an outcome; Disabled
	// and Custom are ignored.
	Breaker flightcache.Breaker

	// ProbeTimeout is how long a half-open probe may hold the shared mutex;
	// a probe whose process dies blocks others' probes this long. Set it to
	// the Loader's LoadTimeout. 0 means flightcache.DefaultLoadTimeout.
	ProbeTimeout time.Duration

	// Timeout bounds each Redis round trip. 0 means DefaultTimeout.
	Timeout time.Duration

	// RetryAfter is how long the breaker decides locally, with a breaker of
	// this process only, after a Redis failure. 0 means DefaultRetryAfter.
	RetryAfter time.Duration

	// LockWait is how long recording an outcome waits for the shared mutex
	// (held by another process's update) before it drops the outcome.
	// 0 means 100ms.
	LockWait time.Duration
}

// Breaker is a [flightcache.CircuitBreaker] whose state every process with
// the same [BreakerOptions.Name] shares through Redis, so that a downstream
// that failed for some processes is spared by all. Set it as
// [flightcache.Breaker.Custom]. It is safe for concurrent use; one Breaker
// serves one Loader, or several in a process. Close it after the Loaders.
//
// When Redis fails, the Breaker decides with a local gobreaker breaker of
// the same settings for RetryAfter, then tries Redis again: a Redis outage
// never refuses a call by itself.
type Breaker struct {
	rdb      redis.UniversalClient
	opts     BreakerOptions // defaults applied
	settings gobreaker.Settings
	stateKey string

	sem   chan struct{}                                  // one token: one Execute at a time here; guards store and dcb
	store *store.Store                                   // guarded by sem
	dcb   *gobreaker.DistributedCircuitBreaker[struct{}] // guarded by sem; nil until seeded

	local     *gobreaker.TwoStepCircuitBreaker[struct{}] // decides while Redis is unreachable
	downUntil atomic.Int64                               // UnixNano; 0 = Redis usable
	seen      atomic.Uint32                              // the flightcache.BreakerState last read

	ctx   context.Context // parent of every Redis round trip; cancelled by Close
	stop  context.CancelFunc
	quit  chan struct{} // closed by Close: a probe waiting for its outcome gives up
	wg    sync.WaitGroup
	once  sync.Once
	stats breakerCounters
}

var _ flightcache.CircuitBreaker = (*Breaker)(nil)

var (
	errFailure = errors.New("flightredis: downstream failure")
	errIgnored = errors.New("flightredis: outcome ignored")
)

// NewBreaker returns a Breaker on client. Like [NewTier], it requires a client
// created with ContextTimeoutEnabled, and does not contact Redis: the
// shared state is created on first use.
func NewBreaker(client redis.UniversalClient, opts BreakerOptions) (*Breaker, error) {
	if err := checkClient(client); err != nil {
		return nil, err
	}
	switch {
	case opts.Name == "":
		return nil, errors.New("flightredis: BreakerOptions.Name is required")
	case opts.ProbeTimeout < 0, opts.Timeout < 0, opts.RetryAfter < 0, opts.LockWait < 0, opts.Breaker.OpenTimeout < 0:
		return nil, errors.New("flightredis: BreakerOptions has a negative duration")
	}
	opts.ProbeTimeout = cmp(opts.ProbeTimeout, flightcache.DefaultLoadTimeout)
	opts.Timeout = cmp(opts.Timeout, DefaultTimeout)
	opts.RetryAfter = cmp(opts.RetryAfter, DefaultRetryAfter)
	opts.LockWait = cmp(opts.LockWait, 100*time.Millisecond)
	opts.Breaker = opts.Breaker.WithDefaults() // the Loader's own breaker's settings
	bo := opts.Breaker
	n := bo.ConsecutiveFailures
	settings := gobreaker.Settings{
		Name:        opts.Name,
		MaxRequests: bo.HalfOpenRequests,
		Timeout:     bo.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= n },
		IsExcluded:  func(err error) bool { return err == errIgnored },
	}
	b := &Breaker{
		rdb:      client,
		opts:     opts,
		settings: settings,
		stateKey: "gobreaker:state:" + opts.Name,
		sem:      make(chan struct{}, 1),
		local:    gobreaker.NewTwoStepCircuitBreaker[struct{}](settings),
		quit:     make(chan struct{}),
	}
	b.ctx, b.stop = context.WithCancel(context.Background())
	b.store = &store.Store{
		RDB:      client,
		MutexKey: "gobreaker:mutex:" + opts.Name,
		Timeout:  opts.Timeout,
		LockWait: opts.LockWait,
		LockTTL:  max(time.Second, remote.Mul(opts.Timeout, 5)),
		ProbeTTL: remote.Add(opts.ProbeTimeout, max(time.Second, remote.Mul(opts.Timeout, 5))),
		Base:     b.ctx,
	}
	return b, nil
}

// Allow implements [flightcache.CircuitBreaker]. In the closed state it
// costs one Redis read; a refusal wraps gobreaker.ErrOpenState or
// gobreaker.ErrTooManyRequests.
func (b *Breaker) Allow() (func(flightcache.Outcome), error) {
	if b.down() || b.ctx.Err() != nil { // stepping aside, or closed
		return b.allowLocal()
	}
	v, err := b.peek()
	if err != nil {
		b.failed()
		return b.allowLocal()
	}
	switch v.state {
	case gobreaker.StateOpen:
		b.stats.rejected.Add(1)
		return nil, fmt.Errorf("flightredis: shared breaker %q: %w", b.opts.Name, gobreaker.ErrOpenState)
	case gobreaker.StateHalfOpen:
		return b.probe()
	}
	return func(o flightcache.Outcome) { b.closedDone(v.gen, o) }, nil
}

// State implements [flightcache.CircuitBreaker]: the shared state as this
// process last read it, or the local breaker's while Redis is unreachable.
func (b *Breaker) State() flightcache.BreakerState {
	if b.down() {
		return toState(b.local.State())
	}
	return flightcache.BreakerState(b.seen.Load())
}

// Close stops a probe that still waits for its outcome and waits for the
// Breaker's goroutines. It does not close the client. It is idempotent and
// always returns nil.
func (b *Breaker) Close() error {
	b.once.Do(func() {
		close(b.quit)
		b.stop()
	})
	b.wg.Wait()
	return nil
}

func toState(s gobreaker.State) flightcache.BreakerState {
	switch s {
	case gobreaker.StateOpen:
		return flightcache.BreakerOpen
	case gobreaker.StateHalfOpen:
		return flightcache.BreakerHalfOpen
	}
	return flightcache.BreakerClosed
}

func (b *Breaker) down() bool {
	u := b.downUntil.Load()
	return u != 0 && time.Now().UnixNano() < u
}

func (b *Breaker) failed() {
	b.stats.redisErrors.Add(1)
	b.downUntil.Store(unixNanoAfter(time.Now(), b.opts.RetryAfter))
}

// view is the shared state as gobreaker would see it now.
type view struct {
	state    gobreaker.State
	failures uint32 // consecutive failures
	gen      uint64 // generation; 0 when no state exists yet
}

// peek reads the shared state without the mutex (an open breaker past its
// timeout is half-open; a closed one past its interval has no failures). A
// state not yet created reads as closed.
func (b *Breaker) peek() (view, error) {
	c, cancel := context.WithTimeout(b.ctx, b.opts.Timeout)
	data, err := b.rdb.Get(c, b.stateKey).Bytes()
	cancel()
	if errors.Is(err, redis.Nil) {
		b.seen.Store(uint32(flightcache.BreakerClosed))
		return view{state: gobreaker.StateClosed}, nil
	}
	if err != nil {
		return view{}, err
	}
	var s gobreaker.SharedState
	if err := json.Unmarshal(data, &s); err != nil {
		return view{}, fmt.Errorf("flightredis: shared breaker state: %w", err)
	}
	v := view{state: s.State, failures: s.Counts.ConsecutiveFailures, gen: s.Generation}
	now := time.Now()
	switch {
	case v.state == gobreaker.StateOpen && s.Expiry.Before(now):
		v.state, v.gen = gobreaker.StateHalfOpen, v.gen+1
	case v.state == gobreaker.StateClosed && !s.Expiry.IsZero() && s.Expiry.Before(now):
		v.failures, v.gen = 0, v.gen+1
	}
	b.seen.Store(uint32(toState(v.state)))
	return v, nil
}

// closedDone records the outcome of a call allowed in the closed state of
// generation gen.
func (b *Breaker) closedDone(gen uint64, o flightcache.Outcome) {
	switch o {
	case flightcache.OutcomeIgnored:
		return
	case flightcache.OutcomeSuccess:
		// A success changes the shared state only if it resets failures:
		// look before taking the mutex.
		v, err := b.peek()
		if err == nil && (v.state != gobreaker.StateClosed || v.failures == 0) {
			return
		}
		b.record(gen, nil)
	default:
		b.record(gen, errFailure)
	}
}

// record writes one outcome of generation gen into the shared state under
// the mutex.
func (b *Breaker) record(gen uint64, outcome error) {
	timer := time.NewTimer(b.opts.LockWait)
	defer timer.Stop()
	select {
	case b.sem <- struct{}{}:
	case <-timer.C:
		b.stats.dropped.Add(1) // this process is probing: the outcome is stale anyway
		return
	case <-b.quit:
		return
	}
	defer func() { <-b.sem }()
	err := b.execute(store.Update, gen, func() (struct{}, error) { return struct{}{}, outcome })
	b.classify(err)
}

// probe runs one half-open probe, holding the shared mutex until its
// outcome is reported. Another probe in flight, here or elsewhere, makes
// it fail fast with gobreaker.ErrTooManyRequests.
func (b *Breaker) probe() (func(flightcache.Outcome), error) {
	select {
	case b.sem <- struct{}{}:
	default:
		b.stats.probeBusy.Add(1)
		return nil, b.tooMany(store.ErrProbing)
	}
	admitted := make(chan error, 1)
	outcome := make(chan error, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() { <-b.sem }()
		ran := false
		err := b.execute(store.Probe, 0, func() (struct{}, error) {
			ran = true
			admitted <- nil
			select {
			case err := <-outcome:
				return struct{}{}, err
			case <-b.quit:
				return struct{}{}, errIgnored
			}
		})
		if !ran {
			admitted <- err
			return
		}
		b.classify(err)
	}()
	if err := <-admitted; err != nil {
		switch {
		case errors.Is(err, store.ErrBusy), errors.Is(err, store.ErrProbing):
			b.stats.probeBusy.Add(1)
			return nil, b.tooMany(err)
		case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
			b.stats.rejected.Add(1)
			return nil, fmt.Errorf("flightredis: shared breaker %q: %w", b.opts.Name, err)
		}
		b.failed()
		return b.allowLocal()
	}
	b.stats.probes.Add(1)
	return func(o flightcache.Outcome) { outcome <- outcomeErr(o) }, nil
}

func (b *Breaker) tooMany(cause error) error {
	return fmt.Errorf("flightredis: shared breaker %q: %w: %w", b.opts.Name, gobreaker.ErrTooManyRequests, cause)
}

func outcomeErr(o flightcache.Outcome) error {
	switch o {
	case flightcache.OutcomeSuccess:
		return nil
	case flightcache.OutcomeIgnored:
		return errIgnored
	}
	return errFailure
}

// classify counts the result of an Execute that recorded an outcome.
func (b *Breaker) classify(err error) {
	switch {
	case err == nil, err == errFailure, err == errIgnored:
		b.stats.recorded.Add(1)
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests),
		errors.Is(err, store.ErrStale):
		// The state moved on since the call was allowed: gobreaker drops
		// this outcome too, as it would in one process.
		b.stats.stale.Add(1)
	case errors.Is(err, store.ErrBusy), errors.Is(err, store.ErrProbing):
		b.stats.dropped.Add(1)
	default:
		b.stats.dropped.Add(1)
		b.failed()
	}
}

// execute runs req through the DistributedCircuitBreaker with the store in
// mode, seeding the shared state if it is missing (first use, or a Redis
// that restarted empty). The caller holds sem. A Redis failure or a busy
// mutex is returned as such, never as gobreaker's ErrNoSharedState.
func (b *Breaker) execute(mode store.Mode, gen uint64, req func() (struct{}, error)) error {
	s := b.store
	for attempt := 0; ; attempt++ {
		if b.dcb == nil {
			s.Begin(store.Seed, 0)
			dcb, err := gobreaker.NewDistributedCircuitBreaker[struct{}](s, b.settings)
			if s.Fault() != nil {
				return s.Fault()
			}
			if err != nil {
				return err
			}
			b.dcb = dcb
		}
		s.Begin(mode, gen)
		_, err := b.dcb.Execute(req)
		s.End() // gobreaker skips Unlock on some error paths
		switch {
		case s.Fault() != nil:
			return s.Fault()
		case errors.Is(err, gobreaker.ErrNoSharedState) && attempt == 0:
			b.dcb = nil
			continue
		}
		return err
	}
}

// allowLocal decides with this process's own breaker.
func (b *Breaker) allowLocal() (func(flightcache.Outcome), error) {
	b.stats.local.Add(1)
	done, err := b.local.Allow()
	if err != nil {
		return nil, fmt.Errorf("flightredis: breaker %q (local while Redis is unreachable): %w", b.opts.Name, err)
	}
	return func(o flightcache.Outcome) { done(outcomeErr(o)) }, nil
}

// BreakerStats are a [Breaker]'s cumulative counters, per process.
type BreakerStats struct {
	// Rejected counts calls refused because the shared breaker was open.
	Rejected uint64
	// Probes counts half-open probes this process ran; ProbeBusy counts
	// calls refused because another probe (here or elsewhere) was running.
	Probes, ProbeBusy uint64
	// Recorded counts outcomes written to the shared state; Stale counts
	// outcomes ignored because the breaker changed state since their call
	// was allowed (as gobreaker ignores them in one process); Dropped
	// counts outcomes not written (mutex busy, Redis failure).
	Recorded, Stale, Dropped uint64
	// RedisErrors counts Redis failures; Local counts decisions made by the
	// local breaker while Redis was unreachable.
	RedisErrors, Local uint64
}

type breakerCounters struct {
	rejected, probes, probeBusy, recorded, stale, dropped, redisErrors, local atomic.Uint64
}

// Stats returns the Breaker's counters.
func (b *Breaker) Stats() BreakerStats {
	c := &b.stats
	return BreakerStats{
		Rejected: c.rejected.Load(), Probes: c.probes.Load(), ProbeBusy: c.probeBusy.Load(),
		Recorded: c.recorded.Load(), Stale: c.stale.Load(), Dropped: c.dropped.Load(),
		RedisErrors: c.redisErrors.Load(), Local: c.local.Load(),
	}
}

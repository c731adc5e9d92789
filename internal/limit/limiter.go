// Package limit bounds the calls made at once to a downstream: a
// [Limiter] hands out slots, first come first served, with a fixed bound
// or an adaptive one found from the calls' latency (the gradient), and
// keeps background work to less than half of it.
//
// It knows nothing of what the calls are for: its caller passes in the
// clock, each call's context, and what each attempt said (a [Sample]).
// The only clock it reads is the caller's; it starts a timer only for a
// wait of [Config.MaxWait].
package limit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/queue"
)

// ErrClosed is the error of an Acquire after Close, or of one waiting
// when Close came.
var ErrClosed = errors.New("limit: closed")

// ErrLimited is the error of an Acquire that waited MaxWait, or found the
// queue full at MaxQueue.
var ErrLimited = errors.New("limit: no slot free")

// Config is what a [Limiter] bounds. MaxLoads 0 bounds nothing: [New]
// returns nil.
type Config struct {
	// MaxLoads is the most calls at once; with Adaptive, the ceiling of the
	// adaptive bound. Every value up to math.MaxInt works.
	MaxLoads int

	// Adaptive finds the bound from the calls' latency, between MinLoads
	// and MaxLoads, starting at AdaptiveStart within those two.
	Adaptive bool

	// MinLoads is the floor of the adaptive bound: with Adaptive,
	// 1 <= MinLoads <= MaxLoads.
	MinLoads int

	// MaxQueue is how many calls may wait for a slot; 0 means no bound.
	MaxQueue int

	// MaxWait is the longest wait for a slot; 0 means as long as the
	// call's context.
	MaxWait time.Duration
}

// Limiter hands out the slots for calls to a downstream. A nil *Limiter is
// no limit: every method works on it and bounds nothing, so a caller calls
// it unconditionally. It is safe for concurrent use.
//
// The slots are the places of a first-come-first-served queue (q): a call
// that finds none free (or others already waiting: no overtaking) waits
// in it on a channel of its own, on its own goroutine, with a timer for
// MaxWait. What is given back goes to the oldest waiter first; a waiter
// that left (its context, or MaxWait) is skipped. Background calls
// never wait: each one's slot costs 1 of a room of half the bound, rounded
// up (a foreground slot costs nothing), so background work holds less than
// half the bound. When the adaptive bound falls below the slots in use,
// nothing is granted until enough are given back.
type Limiter struct {
	now      func() time.Duration // the caller's clock
	maxWait  time.Duration        // longest wait for a slot; 0: as long as the call's context
	adaptive bool

	q    queue.Queue // the slots: places; the bound and its background share (q.Resize) are set from the gradient
	grad gradient    // the adaptive bound; used only if adaptive, and only under q's lock (in q.Resize)

	limited, backgroundRefused, staleLimited atomic.Uint64
}

// Slot is one slot held, returned by Acquire, TryBackground and
// Background: its Release gives it back, exactly once. The zero Slot (from
// a nil Limiter) holds nothing.
type Slot struct {
	lm *Limiter
	bg bool
}

// New returns the Limiter of cfg, or nil if cfg bounds nothing (MaxLoads
// 0). now is the caller's clock, read for the time a call waited and, with
// an adaptive bound, for each attempt's latency.
func New(cfg Config, now func() time.Duration) *Limiter {
	if cfg.MaxLoads == 0 {
		return nil
	}
	lm := &Limiter{now: now, maxWait: cfg.MaxWait, adaptive: cfg.Adaptive}
	bound := cfg.MaxLoads
	if cfg.Adaptive {
		lm.grad = newGradient(cfg.MinLoads, cfg.MaxLoads)
		bound = lm.grad.bound()
	}
	lm.q.Init(bound, backgroundShare(bound), cfg.MaxQueue)
	return lm
}

// backgroundShare is the room of background slots under bound: each costs
// 1, and together they hold less than half the bound (2·n < bound).
func backgroundShare(bound int) int64 { return int64(bound/2 + bound%2) }

// Full reports, without a lock, whether a call started now would have to
// wait: no slot is free, or calls are already waiting. A caller may ask it
// to answer otherwise (with a stale value) instead of starting a call. It
// may be out of date by the time it returns; a call that then finds no
// slot queues.
func (lm *Limiter) Full() bool { return lm != nil && lm.q.Full() }

// CountStale counts an answer given with a stale value because Full said
// so (Counts.StaleLimited).
func (lm *Limiter) CountStale() {
	if lm != nil {
		lm.staleLimited.Add(1)
	}
}

// Acquire takes a slot for a foreground call: at once if one is free and
// nobody waits, else after waiting its turn, for at most MaxWait, while
// ctx (the call's context) lasts. queued is how long it waited. It fails
// with ErrLimited when MaxWait passes or the queue is full (only with a
// MaxQueue), with ErrClosed after Close (both unwrapped), and
// with ctx's error (and its cause, when that says more) when ctx ends
// while it waits.
// Without an error, the slot must be released. A free slot costs no
// clock read and no allocation.
//
// waiting, if not nil, is called once it is decided that the call waits,
// on the caller's goroutine with no lock held, before the wait begins. It
// is the only sure sign: Full may have said no an instant before the last
// slot went.
func (lm *Limiter) Acquire(ctx context.Context, waiting func()) (s Slot, queued time.Duration, err error) {
	if lm == nil {
		return Slot{}, 0, nil
	}
	w, st := lm.q.Ask(0)
	switch st {
	case queue.Closed:
		return Slot{}, 0, ErrClosed
	case queue.Taken:
		return Slot{lm: lm}, 0, nil
	case queue.NoRoom:
		lm.limited.Add(1)
		return Slot{}, 0, ErrLimited
	}
	if waiting != nil {
		waiting()
	}

	start := lm.now()
	var expired <-chan time.Time
	if lm.maxWait > 0 {
		t := time.NewTimer(lm.maxWait)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.Ready():
	case <-ctx.Done():
		err = leftQueue(ctx)
	case <-expired:
		err = ErrLimited
	}
	queued = lm.now() - start
	if err == nil {
		if !w.Granted() {
			return Slot{}, queued, ErrClosed
		}
		return Slot{lm: lm}, queued, nil
	}
	return lm.leave(w, err, queued)
}

// leave takes w, which stopped waiting with err, out of the queue. If w
// was answered meanwhile, the answer stands unless ctx ended (then the
// slot goes to the next in line): a grant at MaxWait's last moment is a
// grant.
func (lm *Limiter) leave(w *queue.Waiter, err error, queued time.Duration) (Slot, time.Duration, error) {
	switch lm.q.Leave(w, errors.Is(err, ErrLimited)) {
	case queue.Taken:
		return Slot{lm: lm}, queued, nil
	case queue.Closed:
		err = ErrClosed
	}
	if errors.Is(err, ErrLimited) {
		lm.limited.Add(1)
	}
	return Slot{}, queued, err
}

// leftQueue is the error of a call whose context ended before it had a
// slot: ctx's error, and the cause too when that says why.
func leftQueue(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// TryBackground takes a slot for a background call, which never waits:
// ok only while no foreground call waits, a slot is free, and background
// work holds less than half the bound. A refusal is counted in
// Counts.BackgroundRefused (not after Close). With ok, the slot must be
// released.
func (lm *Limiter) TryBackground() (s Slot, ok bool) {
	if lm == nil {
		return Slot{}, true
	}
	switch lm.q.TryTake(1) {
	case queue.Taken:
		return Slot{lm: lm, bg: true}, true
	case queue.NoRoom:
		lm.backgroundRefused.Add(1)
	}
	return Slot{}, false
}

// Background is a slot TryBackground took: every background slot is the
// same, so a caller need not keep the one it was given to release it.
func (lm *Limiter) Background() Slot { return Slot{lm: lm, bg: true} }

// Release gives the slot back; the oldest waiter gets it, if the bound
// allows.
func (s Slot) Release() {
	if s.lm == nil {
		return
	}
	var cost int64
	if s.bg {
		cost = 1
	}
	s.lm.q.Give(1, cost)
}

// Begin is when an attempt starts, for Sample: the clock, read only with
// an adaptive bound (0 otherwise).
func (lm *Limiter) Begin() time.Duration {
	if lm == nil || !lm.adaptive {
		return 0
	}
	return lm.now()
}

// Sample feeds the adaptive bound one attempt, begun at Begin's time, that
// ended as k; the caller holds its slot. A rise of the bound grants slots
// to the waiters at once. Without an adaptive bound it does nothing.
func (lm *Limiter) Sample(begun time.Duration, k Sample) {
	if lm == nil || !lm.adaptive || k == SampleIgnored {
		return
	}
	now := lm.now()
	lm.q.Resize(func(inUse int) (int, int64) {
		b := lm.grad.observe(now, now-begun, k, inUse)
		return b, backgroundShare(b)
	})
}

// Close refuses every waiter, now and later, with ErrClosed. Slots held
// are still released as usual.
func (lm *Limiter) Close() {
	if lm == nil {
		return
	}
	lm.q.Close()
}

// Counts is the state of a Limiter at one moment.
type Counts struct {
	Bound             int    // the slots the bound allows now
	Waiting           int    // calls waiting for a slot
	Limited           uint64 // Acquires failed with ErrLimited
	StaleLimited      uint64 // CountStale's count
	BackgroundRefused uint64 // TryBackground's refusals
}

// Counts returns the Limiter's state; the zero Counts for a nil Limiter.
func (lm *Limiter) Counts() Counts {
	if lm == nil {
		return Counts{}
	}
	st := lm.q.State()
	return Counts{
		Bound:             st.Places,
		Waiting:           st.Waiting,
		Limited:           lm.limited.Load(),
		StaleLimited:      lm.staleLimited.Load(),
		BackgroundRefused: lm.backgroundRefused.Load(),
	}
}

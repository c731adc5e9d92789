package flightcache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/internal/queue"
)

// limiter hands out a Loader's slots for downstream calls (see [Limit]).
// A nil *limiter is no limit: every method works on it and bounds nothing,
// so the core calls it unconditionally and the hit path never touches it.
//
// The slots are the places of a first-come-first-served queue (q): a load
// that finds none free (or others already waiting: no overtaking) waits
// in it on a channel of its own, on its own goroutine, with a timer for
// MaxWait. What is given back goes to the oldest waiter first; a waiter
// that left (its context, or MaxWait) is skipped. Background refreshes
// never wait: each one's slot costs 1 of a room of half the bound, rounded
// up (a foreground slot costs nothing), so background work holds less than
// half the bound. When the adaptive bound falls below the slots in use,
// nothing is granted until enough are given back.
type limiter struct {
	now      func() time.Duration // the Loader's clock
	maxWait  time.Duration        // longest wait for a slot; 0: as long as the load's context
	adaptive bool

	q    queue.Queue // the slots: places; the bound and its background share (q.Resize) are set from the gradient
	grad gradient    // the adaptive bound; used only if adaptive, and only under q's lock (in q.Resize)

	limited, refreshesLimited, staleLimited atomic.Uint64
}

// slot is one slot held, returned by acquire and tryBackground: its
// release gives it back, exactly once. The zero slot (from a nil limiter)
// holds nothing.
type slot struct {
	lm *limiter
	bg bool
}

// newLimiter returns the limiter of l (whose defaults it sets:
// withDefaults), or nil if l bounds nothing. loadTimeout is the Loader's
// (0: the MaxWait default is no bound); now is the Loader's clock.
func newLimiter(l Limit, loadTimeout time.Duration, now func() time.Duration) *limiter {
	if !l.enabled() {
		return nil
	}
	l = l.withDefaults(loadTimeout)
	lm := &limiter{now: now, maxWait: l.MaxWait, adaptive: l.Adaptive}
	bound := l.MaxLoads
	if l.Adaptive {
		lm.grad = newGradient(l.MinLoads, l.MaxLoads)
		bound = lm.grad.bound()
	}
	lm.q.Init(bound, backgroundShare(bound), l.MaxQueue)
	return lm
}

// backgroundShare is the room of background slots under bound: each costs
// 1, and together they hold less than half the bound (2·n < bound).
func backgroundShare(bound int) int64 { return int64(bound/2 + bound%2) }

// full reports, without a lock, whether a load started now would have to
// wait: no slot is free, or loads are already waiting. The read path asks
// it to answer with a stale value instead of starting a load. It may be
// out of date by the time it returns; a load that then finds no slot
// queues, and its stale value still covers an ErrLimited.
func (lm *limiter) full() bool { return lm != nil && lm.q.Full() }

// countStale counts a Get answered with a stale value because full said
// so (Stats.StaleLimited).
func (lm *limiter) countStale() {
	if lm != nil {
		lm.staleLimited.Add(1)
	}
}

// acquire takes a slot for a foreground downstream call: at once if one is
// free and nobody waits, else after waiting its turn, for at most MaxWait,
// while ctx (the load's context) lasts. queued is how long it waited. It
// fails with ErrLimited when MaxWait passes or the queue is full (only at
// an explicit MaxQueue), with ErrClosed after close, and with ctx's error
// (and its cause, when that says more: ErrClosed, CancelAtZero's) when
// ctx ends while it waits.
// Without an error, the slot must be released. A free slot costs no
// clock read and no allocation.
//
// waiting, if not nil, is called once it is decided that the load waits,
// on the caller's goroutine with no lock held, before the wait begins (the
// load path stops the load's LoadTimeout there). It is the only sure
// sign: full may have said no an instant before the last slot went.
func (lm *limiter) acquire(ctx context.Context, waiting func()) (s slot, queued time.Duration, err error) {
	if lm == nil {
		return slot{}, 0, nil
	}
	w, st := lm.q.Ask(0)
	switch st {
	case queue.Closed:
		return slot{}, 0, ErrClosed
	case queue.Taken:
		return slot{lm: lm}, 0, nil
	case queue.NoRoom:
		lm.limited.Add(1)
		return slot{}, 0, ErrLimited
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
			return slot{}, queued, ErrClosed
		}
		return slot{lm: lm}, queued, nil
	}
	return lm.leave(w, err, queued)
}

// leave takes w, which stopped waiting with err, out of the queue. If w
// was answered meanwhile, the answer stands unless ctx ended (then the
// slot goes to the next in line): a grant at MaxWait's last moment is a
// grant.
func (lm *limiter) leave(w *queue.Waiter, err error, queued time.Duration) (slot, time.Duration, error) {
	switch lm.q.Leave(w, errors.Is(err, ErrLimited)) {
	case queue.Taken:
		return slot{lm: lm}, queued, nil
	case queue.Closed:
		err = ErrClosed
	}
	if errors.Is(err, ErrLimited) {
		lm.limited.Add(1)
	}
	return slot{}, queued, err
}

// leftQueue is the error of a load whose context ended before it had a
// slot: ctx's error, and the cause too when that says why (ErrClosed, or
// the Loader's reason for cancelling the load).
func leftQueue(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// tryBackground takes a slot for a background refresh, which never waits:
// ok only while no foreground load waits, a slot is free, and background
// work holds less than half the bound. A refusal is counted in
// Stats.RefreshesLimited (not after close). With ok, the slot must be
// released.
func (lm *limiter) tryBackground() (s slot, ok bool) {
	if lm == nil {
		return slot{}, true
	}
	switch lm.q.TryTake(1) {
	case queue.Taken:
		return slot{lm: lm, bg: true}, true
	case queue.NoRoom:
		lm.refreshesLimited.Add(1)
	}
	return slot{}, false
}

// release gives the slot back; the oldest waiter gets it, if the bound
// allows.
func (s slot) release() {
	if s.lm == nil {
		return
	}
	var cost int64
	if s.bg {
		cost = 1
	}
	s.lm.q.Give(1, cost)
}

// begin is when an attempt starts, for sample: the clock, read only with
// an adaptive bound (0 otherwise).
func (lm *limiter) begin() time.Duration {
	if lm == nil || !lm.adaptive {
		return 0
	}
	return lm.now()
}

// sample feeds the adaptive bound one downstream attempt, begun at begin's
// time, that ended as k; the caller holds its slot. A rise of the bound
// grants slots to the waiters at once. Without an adaptive bound it does
// nothing.
func (lm *limiter) sample(begun time.Duration, k sampleKind) {
	if lm == nil || !lm.adaptive || k == sampleIgnored {
		return
	}
	now := lm.now()
	lm.q.Resize(func(inUse int) (int, int64) {
		b := lm.grad.observe(now, now-begun, k, inUse)
		return b, backgroundShare(b)
	})
}

// close refuses every waiter, now and later, with ErrClosed. Slots held
// are still released as usual.
func (lm *limiter) close() {
	if lm == nil {
		return
	}
	lm.q.Close()
}

// fill copies the limiter's state into s: LoadLimit (0 without a limit),
// QueuedLoads, Limited, StaleLimited and RefreshesLimited.
func (lm *limiter) fill(s *Stats) {
	if lm == nil {
		return
	}
	st := lm.q.State()
	s.LoadLimit, s.QueuedLoads = int64(st.Places), int64(st.Waiting)
	s.Limited = lm.limited.Load()
	s.StaleLimited = lm.staleLimited.Load()
	s.RefreshesLimited = lm.refreshesLimited.Load()
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// limiter hands out a Loader's slots for downstream calls (see [Limit]).
// A nil *limiter is no limit: every method works on it and bounds nothing,
// so the core calls it unconditionally and the hit path never touches it.
//
// Slots are counted under mu; a load that finds none free (or others
// already waiting: no overtaking) waits in a FIFO queue on a channel of its
// own, on its own goroutine, with a timer for MaxWait. What is given back
// goes to the oldest waiter first; a waiter that left (its context, or
// MaxWait) stays in the slice marked gone, is skipped, and is compacted
// away. Background refreshes never wait. When the adaptive bound falls
// below the slots in use, nothing is granted until enough are given back.
type limiter struct {
	now      func() time.Duration // the Loader's clock
	maxQueue int                  // most live waiters; math.MaxInt unless Limit.MaxQueue is set
	maxWait  time.Duration        // longest wait for a slot; 0: as long as the load's context
	adaptive bool

	mu      sync.Mutex
	bound   int            // slots that may be in use; fixed unless adaptive
	inUse   int            // slots held, foreground and background; above bound after the adaptive bound fell
	bgInUse int            // of inUse, held by background refreshes
	waiters []*limitWaiter // oldest first, from head on; gone ones skipped
	head    int            // waiters[:head] have been answered or skipped
	waiting int            // waiters in waiters[head:] that are not gone
	closed  bool           // close: every waiter, now and later, is refused
	grad    gradient       // the adaptive bound; used only if adaptive

	isFull                                  atomic.Bool // no slot free, or loads waiting: full(); written under mu
	limited, refreshesLimited, staleLimited atomic.Uint64
}

// limitWaiter is one load waiting for a slot. Its fields are guarded by
// the limiter's mu; err is also read by the waiter once ready is closed.
type limitWaiter struct {
	ready    chan struct{} // closed when answered
	answered bool          // granted a slot (err nil) or refused (err)
	err      error
	gone     bool // left the queue unanswered
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
	lm := &limiter{now: now, maxQueue: l.MaxQueue, maxWait: l.MaxWait, adaptive: l.Adaptive, bound: l.MaxLoads}
	if l.Adaptive {
		lm.grad = newGradient(l.MinLoads, l.MaxLoads)
		lm.bound = lm.grad.bound()
	}
	return lm
}

// full reports, without a lock, whether a load started now would have to
// wait: no slot is free, or loads are already waiting. The read path asks
// it to answer with a stale value instead of starting a load. It may be
// out of date by the time it returns; a load that then finds no slot
// queues, and its stale value still covers an ErrLimited.
func (lm *limiter) full() bool { return lm != nil && lm.isFull.Load() }

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
	lm.mu.Lock()
	switch {
	case lm.closed:
		lm.mu.Unlock()
		return slot{}, 0, ErrClosed
	case lm.waiting == 0 && lm.inUse < lm.bound:
		lm.inUse++
		lm.updateLocked()
		lm.mu.Unlock()
		return slot{lm: lm}, 0, nil
	case lm.waiting >= lm.maxQueue:
		lm.mu.Unlock()
		lm.limited.Add(1)
		return slot{}, 0, ErrLimited
	}
	w := &limitWaiter{ready: make(chan struct{})}
	lm.pushLocked(w)
	lm.updateLocked()
	lm.mu.Unlock()
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
	case <-w.ready:
	case <-ctx.Done():
		err = leftQueue(ctx)
	case <-expired:
		err = ErrLimited
	}
	queued = lm.now() - start
	if err == nil {
		if w.err != nil {
			return slot{}, queued, w.err
		}
		return slot{lm: lm}, queued, nil
	}
	return lm.leave(w, err, queued)
}

// leave takes w, which stopped waiting with err, out of the queue. If w
// was answered meanwhile, the answer stands unless ctx ended (then the
// slot goes to the next in line): a grant at MaxWait's last moment is a
// grant.
func (lm *limiter) leave(w *limitWaiter, err error, queued time.Duration) (slot, time.Duration, error) {
	lm.mu.Lock()
	switch {
	case w.answered && w.err != nil:
		err = w.err
	case w.answered && errors.Is(err, ErrLimited):
		lm.mu.Unlock()
		return slot{lm: lm}, queued, nil
	case w.answered:
		lm.giveLocked(false)
	default:
		w.gone = true
		lm.waiting--
		if lm.waiting == 0 {
			lm.resetLocked()
		}
		lm.updateLocked()
	}
	lm.mu.Unlock()
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
	lm.mu.Lock()
	closed := lm.closed
	ok = !closed && lm.waiting == 0 && lm.inUse < lm.bound && 2*lm.bgInUse < lm.bound
	if ok {
		lm.inUse++
		lm.bgInUse++
		lm.updateLocked()
	}
	lm.mu.Unlock()
	if !ok {
		if !closed {
			lm.refreshesLimited.Add(1)
		}
		return slot{}, false
	}
	return slot{lm: lm, bg: true}, true
}

// release gives the slot back; the oldest waiter gets it, if the bound
// allows.
func (s slot) release() {
	if s.lm == nil {
		return
	}
	s.lm.mu.Lock()
	s.lm.giveLocked(s.bg)
	s.lm.mu.Unlock()
}

// giveLocked gives a slot back and grants what the bound allows; the
// caller holds mu.
func (lm *limiter) giveLocked(bg bool) {
	lm.inUse--
	if bg {
		lm.bgInUse--
	}
	lm.grantLocked()
	lm.updateLocked()
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
	lm.mu.Lock()
	lm.bound = lm.grad.observe(now, now-begun, k, lm.inUse)
	lm.grantLocked()
	lm.updateLocked()
	lm.mu.Unlock()
}

// close refuses every waiter, now and later, with ErrClosed. Slots held
// are still released as usual.
func (lm *limiter) close() {
	if lm == nil {
		return
	}
	lm.mu.Lock()
	lm.closed = true
	for lm.waiting > 0 {
		w := lm.popLocked()
		w.answered, w.err = true, ErrClosed
		close(w.ready)
	}
	lm.updateLocked()
	lm.mu.Unlock()
}

// fill copies the limiter's state into s: LoadLimit (0 without a limit),
// QueuedLoads, Limited, StaleLimited and RefreshesLimited.
func (lm *limiter) fill(s *Stats) {
	if lm == nil {
		return
	}
	lm.mu.Lock()
	s.LoadLimit, s.QueuedLoads = int64(lm.bound), int64(lm.waiting)
	lm.mu.Unlock()
	s.Limited = lm.limited.Load()
	s.StaleLimited = lm.staleLimited.Load()
	s.RefreshesLimited = lm.refreshesLimited.Load()
}

// grantLocked hands free slots to the oldest waiters; the caller holds mu.
func (lm *limiter) grantLocked() {
	for lm.waiting > 0 && lm.inUse < lm.bound {
		w := lm.popLocked()
		lm.inUse++
		w.answered = true
		close(w.ready)
	}
}

// pushLocked queues w; the caller holds mu. Half-answered queues move to
// the front, and gone waiters are dropped once they outnumber the live
// ones, so a queue fed as fast as it drains, or one whose waiters keep
// leaving behind a waiter that stays, does not grow.
func (lm *limiter) pushLocked(w *limitWaiter) {
	if len(lm.waiters)-lm.head > 2*lm.waiting+16 {
		live := lm.waiters[:0]
		for _, x := range lm.waiters[lm.head:] {
			if !x.gone {
				live = append(live, x)
			}
		}
		clear(lm.waiters[len(live):])
		lm.waiters, lm.head = live, 0
	} else if lm.head > 0 && lm.head*2 >= len(lm.waiters) {
		n := copy(lm.waiters, lm.waiters[lm.head:])
		clear(lm.waiters[n:])
		lm.waiters, lm.head = lm.waiters[:n], 0
	}
	lm.waiters = append(lm.waiters, w)
	lm.waiting++
}

// popLocked takes the oldest live waiter off the queue (there is one); the
// caller holds mu.
func (lm *limiter) popLocked() *limitWaiter {
	for {
		w := lm.waiters[lm.head]
		lm.waiters[lm.head] = nil
		lm.head++
		if w.gone {
			continue
		}
		if lm.waiting--; lm.waiting == 0 {
			lm.resetLocked()
		}
		return w
	}
}

// resetLocked empties the queue, which holds no live waiter, dropping its
// memory after a large burst; the caller holds mu.
func (lm *limiter) resetLocked() {
	clear(lm.waiters[lm.head:])
	if cap(lm.waiters) > 1024 {
		lm.waiters = nil
	} else {
		lm.waiters = lm.waiters[:0]
	}
	lm.head = 0
}

// updateLocked refreshes the flag full reads; the caller holds mu.
func (lm *limiter) updateLocked() { lm.isFull.Store(lm.waiting > 0 || lm.inUse >= lm.bound) }

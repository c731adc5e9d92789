// Package life is how a Loader stops: a gate that counts calls in and out
// and, once closed, refuses new ones and says when the last has left; and
// the pool of goroutines its loads run on. It knows nothing of keys,
// values or caches: a call is a count, a job is something to run.
package life

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A Gate says "no new work, wait for what runs". Every call that must
// finish before its owner frees what it uses enters on a Stripe and leaves
// through it; after Close a call is refused at the door, before it touches
// a stripe, so that a stream of calls after Close cannot keep the stripes
// from balancing; and a call checks the flag again once counted in: if
// Close began in between, it counts itself out at once and is refused.
// Once closed, every call that leaves checks whether all stripes balance;
// the one that sees it closes Idle.
//
// Gets (the hit path) and other operations are counted apart: a Get
// leaves through one of its outcomes (hit, stale, passed on, closed),
// which are also the owner's statistics, read with Counts.
type Gate struct {
	closed   atomic.Bool
	idleOnce atomic.Bool
	idle     chan struct{}
	stripes  []Stripe
	pool     *stripePool   // allocated apart: see Stripe
	refused  atomic.Uint64 // Gets refused at the door, off the stripes
}

// Init readies g: a stripe for every few processors.
func (g *Gate) Init() {
	n := 8
	for n < 4*runtime.GOMAXPROCS(0) && n < 256 {
		n *= 2
	}
	g.stripes = make([]Stripe, n)
	p := &stripePool{stripes: g.stripes}
	p.New = func() any { return &p.stripes[int(p.next.Add(1))%len(p.stripes)] }
	g.pool = p
	g.idle = make(chan struct{})
}

// Closed reports whether Close has been called.
func (g *Gate) Closed() bool { return g.closed.Load() }

// Close closes g to new calls; it reports whether this call closed it
// (false: it was closed already). The caller then ends what runs and
// calls CheckIdle.
func (g *Gate) Close() bool { return !g.closed.Swap(true) }

// Idle is closed once g is closed and every call has left.
func (g *Gate) Idle() <-chan struct{} { return g.idle }

// CheckIdle closes Idle if g is closed and nothing is inside.
func (g *Gate) CheckIdle() {
	if g.quiet() && g.idleOnce.CompareAndSwap(false, true) {
		close(g.idle)
	}
}

// Gets is the count of the Gets one call let in (EnterGets): one, or the
// keys of a batch. Each is counted out by its outcome (Hit, Stale,
// Passed), all at once when the call leaves (ExitGets): until then the
// call is inside, so the gate cannot balance before a load the call
// starts is counted in on its stripe.
type Gets struct {
	s                   *Stripe
	n                   uint64 // let in
	hits, stale, passed uint64 // answered so far
}

// Stripe is the stripe the Gets are counted on: a load they start is
// counted in there (Stripe.Enter).
func (in *Gets) Stripe() *Stripe { return in.s }

// Hit counts one Get answered from a fresh value.
func (in *Gets) Hit() { in.hits++ }

// Stale counts one Get answered at once with a stale value.
func (in *Gets) Stale() { in.stale++ }

// Passed counts one Get that went on past the fast path (a miss, or a
// late hit, counted apart by the owner).
func (in *Gets) Passed() { in.passed++ }

// EnterGets lets n Gets in, into in. It returns false after Close (the
// Gets counted as closed). A call it lets in defers ExitGets(in) at once.
func (g *Gate) EnterGets(in *Gets, n uint64) bool {
	if g.closed.Load() {
		g.refused.Add(n)
		return false
	}
	s := g.pool.Get().(*Stripe)
	s.gets.Add(n)
	if g.closed.Load() { // Close began between the two checks
		s.closed.Add(n)
		g.release(s)
		return false
	}
	in.s, in.n = s, n
	return true
}

// Unanswered is how many of the Gets in let in have no outcome yet: at
// ExitGets, those a panic cut short. The owner counts them as it counts an
// abandoned Get before it calls ExitGets.
func (in *Gets) Unanswered() uint64 { return in.n - in.hits - in.stale - in.passed }

// ExitGets counts out the Gets in let in (those without an outcome as
// passed on), and gives its stripe back. It is their one way out,
// deferred as soon as EnterGets let them in, so the count balances
// whatever panics on the way.
func (g *Gate) ExitGets(in *Gets) {
	s := in.s
	in.passed += in.Unanswered()
	if in.hits > 0 {
		s.hits.Add(in.hits)
	}
	if in.stale > 0 {
		s.stale.Add(in.stale)
	}
	if in.passed > 0 {
		s.passed.Add(in.passed)
	}
	g.release(s)
}

// EnterOp counts an operation other than a Get in. It returns false after
// Close.
func (g *Gate) EnterOp() (*Stripe, bool) {
	if g.closed.Load() {
		return nil, false
	}
	s := g.pool.Get().(*Stripe)
	s.opsIn.Add(1)
	if g.closed.Load() { // Close began between the two checks
		g.ExitOp(s)
		return nil, false
	}
	return s, true
}

// ExitOp counts an operation out, and gives its stripe back.
func (g *Gate) ExitOp(s *Stripe) {
	s.opsOut.Add(1)
	g.release(s)
}

// Enter counts in a child of the call inside on s (a goroutine it
// starts), before that call leaves: the child then keeps the gate from
// balancing until it leaves (ExitChild).
func (s *Stripe) Enter() { s.opsIn.Add(1) }

// ExitChild counts out a child counted in with Stripe.Enter. The stripe
// is not given back: the call that started the child may hold it still.
func (g *Gate) ExitChild(s *Stripe) {
	s.opsOut.Add(1)
	if g.closed.Load() {
		g.CheckIdle()
	}
}

// release gives a stripe back once its call has counted out, and checks
// whether a Close is waiting for that.
func (g *Gate) release(s *Stripe) {
	g.pool.Put(s)
	if g.closed.Load() {
		g.CheckIdle()
	}
}

// Counts are the Gets a gate has counted, ever.
type Counts struct {
	Gets   uint64 // let in, or refused
	Hits   uint64 // answered from a fresh value
	Stale  uint64 // answered at once with a stale value
	Closed uint64 // refused because the gate was closed
}

// Counts adds up the stripes.
func (g *Gate) Counts() Counts {
	var c Counts
	for i := range g.stripes {
		s := &g.stripes[i]
		c.Hits += s.hits.Load()
		c.Stale += s.stale.Load()
		c.Closed += s.closed.Load()
		c.Gets += s.gets.Load()
	}
	refused := g.refused.Load()
	c.Gets += refused
	c.Closed += refused
	return c
}

// OpsIn is how many operations and children have been counted in, ever.
func (g *Gate) OpsIn() uint64 {
	var n uint64
	for i := range g.stripes {
		n += g.stripes[i].opsIn.Load()
	}
	return n
}

// Stripe holds the counters the hit path touches. Each call takes one
// stripe for its whole run from a sync.Pool, so a goroutine mostly reuses
// the stripe of its own P and counters do not bounce between cores. The
// pool only hands out pointers into a fixed array: a stripe dropped from
// the pool at a GC is never lost, only handed out again later.
//
// The pool lives apart from the Gate (stripePool) and holds nothing that
// leads back to its owner: the runtime keeps every pool that has been used
// until the GC after next, so a pool inside the owner kept a closed
// owner, and all it holds, alive through one more GC.
//
// gets is incremented when a Get starts, and exactly one of the exit
// counters when it ends: hits, stale and closed are outcomes; passed means
// it went on past the fast path.
type Stripe struct {
	gets   atomic.Uint64
	hits   atomic.Uint64
	stale  atomic.Uint64
	passed atomic.Uint64
	closed atomic.Uint64
	opsIn  atomic.Uint64   // operations and children counted in
	opsOut atomic.Uint64   // and out
	_      [128 - 7*8]byte // one stripe per pair of cache lines
}

// exits is how many Gets have left on this stripe.
func (s *Stripe) exits() uint64 {
	return s.hits.Load() + s.stale.Load() + s.passed.Load() + s.closed.Load()
}

// stripePool hands out the stripes.
type stripePool struct {
	sync.Pool               // of *Stripe, pointing into stripes
	stripes   []Stripe      // the same as the Gate's
	next      atomic.Uint32 // round-robin index for New
}

// quiet reports whether no call is inside. Per stripe, the outs are read
// before the ins: a call that counts in after its stripe was read sees the
// closed flag (set before quiet is called) and leaves at once, and a child
// is counted in on its starter's stripe before the starter counts out.
func (g *Gate) quiet() bool {
	for i := range g.stripes {
		s := &g.stripes[i]
		out, opsOut := s.exits(), s.opsOut.Load()
		if out != s.gets.Load() || opsOut != s.opsIn.Load() {
			return false
		}
	}
	return true
}

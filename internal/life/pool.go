package life

import (
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A Job is one piece of work a Pool runs.
type Job interface{ Run() }

// A Pool runs jobs on goroutines it reuses. One that ends a job waits for
// the next, if fewer than maxIdle already wait, rather than exit: a new
// goroutine starts on a small stack, and a job that grows it pays for a
// copy of the whole stack, where a reused one has grown already. Idle
// goroutines beyond Kept leave after IdleFor; all leave once the done
// channel given to Init is closed, and Wait waits for them.
type Pool struct {
	jobs    chan Job      // unbuffered: a job goes to a goroutine waiting now, or to a new one
	idle    atomic.Int32  // goroutines waiting for a job
	started atomic.Uint64 // goroutines started, ever
	maxIdle int32
	done    <-chan struct{}
	running sync.WaitGroup
}

// Kept goroutines wait for a job until done; the others of a burst, up
// to maxIdle, leave after waiting IdleFor.
const Kept = 2

// IdleFor is how long an idle goroutine beyond Kept waits for a job
// before it leaves.
const IdleFor = 10 * time.Second

// Init readies p; its goroutines leave once done is closed.
func (p *Pool) Init(done <-chan struct{}) {
	p.jobs = make(chan Job)
	p.maxIdle = int32(max(8, 4*runtime.GOMAXPROCS(0)))
	p.done = done
}

// Go runs j on a pool goroutine: an idle one if one waits now, else a new
// one.
func (p *Pool) Go(j Job) {
	select {
	case p.jobs <- j:
	default:
		p.running.Add(1)
		p.started.Add(1)
		go p.work(j)
	}
}

// Started is how many goroutines p has started, ever.
func (p *Pool) Started() uint64 { return p.started.Load() }

// Wait waits until every goroutine of p has left: the busy ones when their
// job ends, the idle ones once done is closed.
func (p *Pool) Wait() { p.running.Wait() }

// work runs j, then the jobs handed to it, until it would wait for one
// while maxIdle others wait too, has waited IdleFor while Kept others
// waited, or done is closed.
func (p *Pool) work(j Job) {
	defer p.running.Done()
	var idle *time.Timer
	for {
		poolGoroutine(j)
		n := p.idle.Add(1)
		if n > p.maxIdle {
			p.idle.Add(-1)
			return
		}
		var expired <-chan time.Time // nil: the first few wait without a timer, so a stream of jobs pays none
		if n > Kept {
			if idle == nil {
				idle = time.NewTimer(IdleFor)
			} else {
				idle.Reset(IdleFor)
			}
			expired = idle.C
		}
		select {
		case j = <-p.jobs:
		case <-expired:
			j = nil
		case <-p.done:
			j = nil
		}
		p.idle.Add(-1)
		if expired != nil {
			idle.Stop()
		}
		if j == nil {
			return
		}
	}
}

// A goroutine's owner may need to know whether code runs on one of its
// goroutines: a Close called from a job cannot wait for that job to end.
// The caller may be any code, passed no context, and Go has no
// goroutine-local state, so the only thing that knows is the stack: every
// job runs under poolGoroutine, and OnPool looks for that function in the
// stack by its address, not by its name, so a rename cannot break it
// silently. RunWriter and OnWriter mark one more goroutine the same way.

// poolGoroutine is the first frame of every job.
//
//go:noinline
func poolGoroutine(j Job) { j.Run() }

// writerGoroutine is the first frame of a function run by RunWriter.
//
//go:noinline
func writerGoroutine(f func()) { f() }

var (
	poolGoroutinePC   = reflect.ValueOf(poolGoroutine).Pointer()
	writerGoroutinePC = reflect.ValueOf(writerGoroutine).Pointer()
)

// OnPool reports whether the caller runs in a job of some Pool.
func OnPool() bool { return calledUnder(poolGoroutinePC) }

// RunWriter runs f, marked so that OnWriter, called from anything f
// calls, reports true.
func RunWriter(f func()) { writerGoroutine(f) }

// OnWriter reports whether the caller runs under RunWriter.
func OnWriter() bool { return calledUnder(writerGoroutinePC) }

// calledUnder reports whether the function whose entry address is entry
// is among the caller's callers.
func calledUnder(entry uintptr) bool {
	pcs := make([]uintptr, 64)
	for {
		n := runtime.Callers(2, pcs)
		if n < len(pcs) {
			pcs = pcs[:n]
			break
		}
		pcs = make([]uintptr, 2*len(pcs))
	}
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Entry == entry {
			return true
		}
		if !more {
			return false
		}
	}
}

// MaxIdle is how many goroutines of p may wait for a job at once.
func (p *Pool) MaxIdle() int { return int(p.maxIdle) }

// Idle is how many goroutines of p wait for a job now.
func (p *Pool) Idle() int { return int(p.idle.Load()) }

package flightcache

import (
	"runtime"
	"strings"
	"sync/atomic"
)

// How a Loader shuts down: Close (in loader.go) sets the closed flag, waits
// out every operation that starts a goroutine or writes the cache, and
// cancels the loads. The last load goroutine to exit, or Close itself if
// none runs, then stops the Loader: it waits for Gets still inside a cache
// lookup and closes ristretto.

// exit ends a load goroutine; the last one out after Close stops the Loader.
//
// "Last" is judged only once Close has drained the joins: before that, a
// join that passed its closed check may still start a load. Reading the
// count again after the flag matters too: between this goroutine's
// decrement and its look at the flag, a join may have started another load
// and Close may have drained; that load has to end before the Loader stops.
func (l *Loader[K, V]) exit() {
	l.active.Add(-1)
	if hook := testHookExit.Load(); hook != nil {
		(*hook)()
	}
	if l.drained.Load() && l.active.Load() == 0 {
		l.stop()
	}
}

// testHookExit, when set by a test, runs in exit between the decrement and
// the check that may stop the Loader.
var testHookExit atomic.Pointer[func()]

// stop frees the cache once no goroutine of the Loader runs and no Get is
// inside a cache lookup (ristretto's Close must not race its Get or Set).
func (l *Loader[K, V]) stop() {
	l.teardown.Do(func() {
		close(l.applier.stop) // no load is left to add to it
		<-l.applier.done
		for !l.stats.quiet() {
			runtime.Gosched()
		}
		l.tearingDown.Store(true)
		l.cache.Close()
		close(l.closeDone)
	})
}

// runFrame is the name prefix of the Loader's load goroutine.
const runFrame = "github.com/flightcache/flightcache.(*Loader[...]).run"

// onLoaderGoroutine reports whether the caller runs on a load goroutine of
// some Loader, found by walking its own stack.
func onLoaderGoroutine() bool {
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
		if f.Function == runFrame || strings.HasPrefix(f.Function, runFrame+".") {
			return true
		}
		if !more {
			return false
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// Part b's blast radius as an Observer sees it. Each run's Loader has a
// small Observer of its own (Options.Observer; an OpenTelemetry one would
// make the same links as spans, see otelflightcache): its LoadStart
// numbers the load and leaves the number in the load's context, LoadEnd
// records how the load ended, and Waited, called for every Get that
// waited on a load, finds the load it waited for through WaitEvent.Load,
// the context that LoadStart returned. So each waiting Get is linked to
// its one load, and a failed load's links are its blast radius, counted
// by the Observer rather than by the Loader (LoadEvent.Callers).

// observedLoad is one load as the Observer saw it.
type observedLoad struct {
	N            int           `json:"n"` // the load's number, from 1, in LoadStart order
	Key          string        `json:"key"`
	Err          string        `json:"err,omitempty"`
	TimedOut     bool          `json:"timed_out,omitempty"`
	Took         time.Duration `json:"took_ns"`
	Callers      int           `json:"callers"`       // LoadEvent.Callers, in LoadEnd
	Linked       int           `json:"linked"`        // Waited calls whose WaitEvent.Load is this load's context
	LinkedErrors int           `json:"linked_errors"` // of those, Gets that returned an error
	LinkedStale  int           `json:"linked_stale"`  // of those, Gets answered with a stale value instead (Info.Source)
}

// blastObserver is part b's Observer. It is safe for concurrent use: the
// loads call it from their goroutines, the readers from theirs.
type blastObserver struct {
	mu       sync.Mutex
	loads    []observedLoad // by number - 1
	unlinked int            // Waited calls with no load context (a Get that left before its load started)
}

// loadNumber is the context key of the load's number.
type loadNumber struct{}

func (o *blastObserver) LoadStart(ctx context.Context, ev flightcache.LoadStartEvent[string]) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.loads = append(o.loads, observedLoad{N: len(o.loads) + 1, Key: ev.Key})
	return context.WithValue(ctx, loadNumber{}, len(o.loads))
}

func (o *blastObserver) LoadEnd(ctx context.Context, ev flightcache.LoadEvent[string]) {
	n, _ := ctx.Value(loadNumber{}).(int)
	o.mu.Lock()
	defer o.mu.Unlock()
	if n < 1 || n > len(o.loads) {
		return
	}
	ld := &o.loads[n-1]
	ld.Took, ld.Callers = ev.Duration, ev.Callers
	if ev.Err != nil {
		ld.Err, ld.TimedOut = ev.Err.Error(), errors.Is(ev.Err, flightcache.ErrLoadTimeout)
	}
}

func (o *blastObserver) Waited(ctx context.Context, ev flightcache.WaitEvent[string]) {
	var n int
	if ev.Load != nil {
		n, _ = ev.Load.Value(loadNumber{}).(int)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n < 1 || n > len(o.loads) {
		o.unlinked++
		return
	}
	ld := &o.loads[n-1]
	ld.Linked++
	if ev.Err != nil {
		ld.LinkedErrors++
	}
	if ev.Info.Source == flightcache.SourceStaleOnError {
		ld.LinkedStale++
	}
}

// observedBlast is what one run's Observer saw.
type observedBlast struct {
	Loads          int           `json:"loads"`
	FailedLoads    int           `json:"failed_loads"`
	LinkedToFailed int           `json:"linked_to_failed"` // Σ Linked over the failed loads
	Unlinked       int           `json:"unlinked"`
	Largest        *observedLoad `json:"largest_failed,omitempty"` // the failed load the most Gets were linked to
}

// summary is what o saw, once the Loader is closed (every LoadEnd has
// run).
func (o *blastObserver) summary() *observedBlast {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := &observedBlast{Loads: len(o.loads), Unlinked: o.unlinked}
	for i := range o.loads {
		ld := &o.loads[i]
		if ld.Err == "" {
			continue
		}
		s.FailedLoads++
		s.LinkedToFailed += ld.Linked
		if s.Largest == nil || ld.Linked > s.Largest.Linked {
			c := *ld
			s.Largest = &c
		}
	}
	return s
}

// printObserved prints, per run, the largest failed load as the Observer
// saw it, and the Gets it linked to the failed loads.
func (r *blastResult) printObserved(w io.Writer) {
	fmt.Fprintln(w, "  The same runs as the Loader's Observer saw them: LoadStart numbers each load in its context,")
	fmt.Fprintln(w, "  and every Get that waited is linked to its load by WaitEvent.Load, that context.")
	fmt.Fprintln(w)
	header := []string{""}
	for _, run := range r.Runs {
		header = append(header, run.Name)
	}
	stat := func(label string, f func(*observedBlast) string) []string {
		line := []string{label}
		for _, run := range r.Runs {
			line = append(line, f(run.Observed))
		}
		return line
	}
	largest := func(f func(*observedLoad) string) func(*observedBlast) string {
		return func(o *observedBlast) string {
			if o == nil || o.Largest == nil {
				return "-"
			}
			return f(o.Largest)
		}
	}
	table(w, "l", header, [][]string{
		stat("loads seen (LoadStart, LoadEnd)", func(o *observedBlast) string { return fmt.Sprint(o.Loads) }),
		stat("failed loads", func(o *observedBlast) string { return fmt.Sprint(o.FailedLoads) }),
		stat("Gets linked to a failed load (WaitEvent.Load)", func(o *observedBlast) string { return fmt.Sprint(o.LinkedToFailed) }),
		stat("the failed load most Gets were linked to", largest(func(l *observedLoad) string { return fmt.Sprintf("#%d, %s", l.N, l.Key) })),
		stat("  how it ended (LoadEnd)", largest(func(l *observedLoad) string {
			if l.TimedOut {
				return "timed out, " + ms(l.Took)
			}
			return "failed, " + ms(l.Took)
		})),
		stat("  Gets linked to it", largest(func(l *observedLoad) string { return fmt.Sprint(l.Linked) })),
		stat("  of them got its error", largest(func(l *observedLoad) string { return fmt.Sprint(l.LinkedErrors) })),
		stat("  of them got the stale value instead", largest(func(l *observedLoad) string { return fmt.Sprint(l.LinkedStale) })),
		stat("  its LoadEvent.Callers", largest(func(l *observedLoad) string { return fmt.Sprint(l.Callers) })),
	})
}

// checkObserved reconciles the Observer with LoadEvent: it saw every load,
// linked every Get that waited on a failed load to it, and left none
// unlinked (every reader waits to the end, so none leaves before its load
// starts).
func (run *blastRun) checkObserved() string {
	o := run.Observed
	switch {
	case o == nil:
		return ""
	case uint64(o.Loads) != run.Loads || uint64(o.FailedLoads) != run.LoadErrors:
		return fmt.Sprintf("MISMATCH (%s): the Observer saw %d loads, %d failed; Stats.Loads %d, Stats.LoadErrors %d",
			run.Name, o.Loads, o.FailedLoads, run.Loads, run.LoadErrors)
	case o.LinkedToFailed != run.FailedCallers || o.Unlinked != 0:
		return fmt.Sprintf("MISMATCH (%s): the Observer linked %d Gets to failed loads (%d unlinked); Σ LoadEvent.Callers %d",
			run.Name, o.LinkedToFailed, o.Unlinked, run.FailedCallers)
	}
	return ""
}

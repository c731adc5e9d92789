package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// Part f: a storm of many keys. Single-flight collapses a storm on one
// key; it does nothing for 2,000 distinct cold keys asked for at once (a
// cold start after a deploy, a mass expiry, a crawler), each its own
// downstream call. The downstream here slows with its own concurrency and
// fails past its capacity, as a database does when its connections run
// out. The storm runs three times, each on a fresh Loader and downstream:
// with no limit, with Options.Limit.MaxLoads, and with an adaptive limit
// that finds the bound from the downstream's latency, below a ceiling at
// the downstream's capacity.

// stormRow is one configuration's storm.
type stormRow struct {
	Config      string            `json:"config"`
	Limit       flightcache.Limit `json:"limit"`
	Gets        int               `json:"gets"`
	Answered    int               `json:"answered"`         // Gets that returned a value
	Limited     int               `json:"limited"`          // of the others, those that failed with ErrLimited
	BreakerOpen int               `json:"breaker_open"`     // and with ErrBreakerOpen
	Calls       int64             `json:"downstream_calls"` // what the downstream counted
	Overloaded  int64             `json:"overloaded_calls"` // of them, calls past its capacity, which failed at once
	Peak        int               `json:"peak_concurrent_calls"`
	Wall        time.Duration     `json:"wall_ns"`     // from the storm's start to its last Get's answer
	P99         time.Duration     `json:"p99_wait_ns"` // of the Gets' own durations
	Trace       []stormPoint      `json:"trace"`       // the Loader's bound and the downstream's load over time
	Stats       flightcache.Stats `json:"stats"`       // the Loader's, once the storm is over
}

// stormPoint is one sample of a storm's trace.
type stormPoint struct {
	At       time.Duration `json:"at_ns"`
	Bound    int64         `json:"load_limit"`   // Stats.LoadLimit: the Loader's bound (0: none)
	Queued   int64         `json:"queued_loads"` // Stats.QueuedLoads
	InFlight int           `json:"in_flight"`    // calls the downstream is serving
}

// stormResult is part f.
type stormResult struct {
	Keys     int           `json:"keys"`
	Base     time.Duration `json:"base_latency_ns"`
	Knee     int           `json:"knee"`
	Capacity int           `json:"capacity"`
	Rows     []stormRow    `json:"rows"`
}

// errOverloaded is the storm downstream's answer past its capacity.
var errOverloaded = errors.New("catalogue: too many connections")

// catalogue is part f's downstream: a call takes base × (1 + n/knee)²
// with n calls in flight, itself included, and a call that would be past
// capacity fails at once. It counts its calls, its failures and the most
// calls it served at once, and reports how many it serves now.
type catalogue struct {
	base           time.Duration
	knee, capacity int

	mu                sync.Mutex
	calls, overloaded int64
	inFlight, peak    int
}

// load is the flightcache.LoadFunc.
func (c *catalogue) load(ctx context.Context, key int) (string, error) {
	c.mu.Lock()
	c.calls++
	c.inFlight++
	n := c.inFlight
	c.peak = max(c.peak, n)
	if n > c.capacity {
		c.overloaded++
		c.inFlight--
		c.mu.Unlock()
		return "", errOverloaded
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.inFlight--
		c.mu.Unlock()
	}()
	f := 1 + float64(n)/float64(c.knee)
	t := time.NewTimer(time.Duration(float64(c.base) * f * f))
	defer t.Stop()
	select {
	case <-t.C:
		return fmt.Sprintf("item %d", key), nil
	case <-ctx.Done():
		return "", fmt.Errorf("catalogue: %w", ctx.Err())
	}
}

// serving is how many calls the downstream serves now.
func (c *catalogue) serving() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFlight
}

func runStorm(cfg config, p *progress) (*stormResult, error) {
	res := &stormResult{Keys: cfg.stormKeys, Base: cfg.stormBase, Knee: cfg.stormKnee, Capacity: cfg.stormCapacity}
	for _, c := range []struct {
		name  string
		limit flightcache.Limit
	}{
		{"no limit", flightcache.Limit{}},
		{fmt.Sprintf("MaxLoads %d", cfg.stormMaxLoads), flightcache.Limit{MaxLoads: cfg.stormMaxLoads}},
		// The adaptive bound's ceiling is the downstream's capacity, as the
		// Limit's doc says to set it in front of a pool: below it the bound
		// follows the latency. With the default ceiling (200) it may probe
		// past the capacity on a loaded machine, and five such calls in a
		// row open the breaker.
		{fmt.Sprintf("Adaptive, ceiling %d", cfg.stormCapacity), flightcache.Limit{Adaptive: true, MaxLoads: cfg.stormCapacity}},
	} {
		row, err := storm(cfg, p, c.name, c.limit)
		if err != nil {
			return nil, fmt.Errorf("part f, %s: %w", c.name, err)
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// storm runs one storm: every key asked for at once, on a cold Loader.
func storm(cfg config, p *progress, name string, limit flightcache.Limit) (stormRow, error) {
	row := stormRow{Config: name, Limit: limit, Gets: cfg.stormKeys}
	down := &catalogue{base: cfg.stormBase, knee: cfg.stormKnee, capacity: cfg.stormCapacity}
	l, err := flightcache.New(down.load, flightcache.Options[int, string]{TTL: time.Minute, Limit: limit})
	if err != nil {
		return row, err
	}
	stop := p.start("f. "+name, time.Duration(cfg.stormKeys/cfg.stormMaxLoads)*cfg.stormBase*4, l.Stats)

	var ready, done sync.WaitGroup
	start := make(chan struct{})
	took := make([]time.Duration, cfg.stormKeys)
	errs := make([]error, cfg.stormKeys)
	for i := range cfg.stormKeys {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-start
			t0 := time.Now()
			_, errs[i] = l.Get(context.Background(), i)
			took[i] = time.Since(t0)
		})
	}
	ready.Wait() // every Get is about to be made: the storm starts at once

	traced := make(chan []stormPoint)
	over := make(chan struct{})
	t0 := time.Now()
	go func() {
		var trace []stormPoint
		tick := time.NewTicker(cfg.traceEvery)
		defer tick.Stop()
		for {
			s := l.Stats()
			trace = append(trace, stormPoint{At: time.Since(t0), Bound: s.LoadLimit, Queued: s.QueuedLoads, InFlight: down.serving()})
			select {
			case <-over:
				traced <- trace
				return
			case <-tick.C:
			}
		}
	}()
	close(start)
	done.Wait()
	row.Wall = time.Since(t0)
	close(over)
	row.Trace = <-traced
	stop()
	l.Close() // every load has finished: the Stats below are final
	row.Stats = l.Stats()

	for _, err := range errs {
		switch {
		case err == nil:
			row.Answered++
		case errors.Is(err, flightcache.ErrLimited):
			row.Limited++
		case errors.Is(err, flightcache.ErrBreakerOpen):
			row.BreakerOpen++
		}
	}
	slices.Sort(took)
	row.P99 = took[(len(took)*99+99)/100-1]
	row.Calls, row.Overloaded, row.Peak = down.calls, down.overloaded, down.peak
	return row, nil
}

// madeCalls is the downstream calls the Loader's Stats say it made: its
// loads, less those refused before the downstream (no retries here).
func (r stormRow) madeCalls() uint64 {
	return r.Stats.Loads - r.Stats.BreakerRejected - r.Stats.Limited
}

// bounded reports whether the Loader reported a bound during the storm.
func (r stormRow) bounded() bool {
	return slices.ContainsFunc(r.Trace, func(pt stormPoint) bool { return pt.Bound > 0 })
}

func (r *stormResult) print(w io.Writer) {
	fmt.Fprintf(w, "f. A storm of many keys: %d distinct cold keys asked for at once, from a downstream whose calls take\n", r.Keys)
	fmt.Fprintf(w, "   %v × (1 + n/%d)² with n in flight and fail past %d at once. Each way starts cold: its own Loader and downstream.\n",
		r.Base, r.Knee, r.Capacity)
	fmt.Fprintln(w)
	var rows [][]string
	reconciled := true
	for _, row := range r.Rows {
		failed := row.Gets - row.Answered
		why := ""
		if failed > 0 {
			why = fmt.Sprintf(" (%d breaker open, %d limited)", row.BreakerOpen, row.Limited)
		}
		rows = append(rows, []string{
			row.Config, fmt.Sprintf("%d of %d%s", row.Answered, row.Gets, why),
			fmt.Sprint(row.Calls), fmt.Sprint(row.Overloaded), fmt.Sprint(row.Peak), ms(row.Wall), ms(row.P99),
		})
		reconciled = reconciled && row.madeCalls() == uint64(row.Calls)
	}
	table(w, "ll", []string{"limit", "Gets answered", "downstream calls", "past capacity", "calls at once", "wall time", "p99 wait"}, rows)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  past capacity and calls at once are the downstream's own counts (at the peak); the p99 wait is")
	fmt.Fprintln(w, "  over every Get's own duration, answered or not.")
	if reconciled {
		fmt.Fprintln(w, "  Stats.Loads, less the loads refused by the breaker or the limit (Stats.BreakerRejected, Stats.Limited),")
		fmt.Fprintln(w, "  matches the calls the downstream counted, in every way.")
	} else {
		fmt.Fprintln(w, "  WARNING: Stats.Loads, less BreakerRejected and Limited, differs from the downstream's own count;")
		fmt.Fprintln(w, "  see downstream_calls and stats in -json.")
	}
	for _, row := range r.Rows {
		switch {
		case row.Limit == (flightcache.Limit{}):
		case !row.bounded():
			fmt.Fprintf(w, "  NOTE: %s: the Loader reported no bound (Stats.LoadLimit stayed 0): this build does not apply Options.Limit.\n", row.Config)
		case row.Limit.Adaptive:
			fmt.Fprintf(w, "  %s, the bound over time (Stats.LoadLimit; -json has every %v):\n", row.Config, traceStep(row.Trace))
			fmt.Fprintf(w, "    %s\n", boundLine(row.Trace, 16))
		}
	}
}

// traceStep is the interval between a trace's points.
func traceStep(trace []stormPoint) time.Duration {
	if len(trace) < 2 {
		return 0
	}
	return (trace[len(trace)-1].At - trace[0].At) / time.Duration(len(trace)-1)
}

// boundLine shows at most n points of a trace, evenly spread, as
// "at: bound" pairs.
func boundLine(trace []stormPoint, n int) string {
	var b strings.Builder
	for i := range min(n, len(trace)) {
		pt := trace[i*(len(trace)-1)/max(min(n, len(trace))-1, 1)]
		if i > 0 {
			b.WriteString("  ")
		}
		fmt.Fprintf(&b, "%.0f ms: %d", float64(pt.At)/float64(time.Millisecond), pt.Bound)
	}
	return b.String()
}

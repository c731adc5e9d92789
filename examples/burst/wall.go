package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// Part c: the expiry wall. One hot key, read continuously: when its TTL
// ends, every reader that arrives during the reload waits for it. Serving
// the stale value while one refresh runs (StaleWhileRevalidate), or
// refreshing before expiry (EarlyRefresh, XFetch), removes the wall.

// wallRow is one strategy of part c; every count covers the run only (the
// warm-up load excluded).
type wallRow struct {
	Strategy   string        `json:"strategy"`
	Gets       uint64        `json:"gets"`      // Stats.Gets
	Hits       uint64        `json:"hits"`      // Stats.Hits
	Stale      uint64        `json:"stale"`     // Stats.StaleHits
	Waited     uint64        `json:"waited"`    // Stats.Misses: Gets that waited for a load
	Loads      uint64        `json:"loads"`     // Stats.Loads: downstream calls
	Refreshes  uint64        `json:"refreshes"` // Stats.Refreshes: background ones among them
	MaxLatency time.Duration `json:"max_latency_ns"`
	Slow       int           `json:"slow"` // Gets slower than the threshold
}

// wallResult is part c.
type wallResult struct {
	TTL       time.Duration `json:"ttl_ns"`
	Load      time.Duration `json:"load_ns"`
	Readers   int           `json:"readers"`
	Duration  time.Duration `json:"duration_ns"`
	Think     time.Duration `json:"think_ns"`
	Threshold time.Duration `json:"slow_threshold_ns"`
	Rows      []wallRow     `json:"rows"`
}

func runWall(cfg config, p *progress) (*wallResult, error) {
	res := &wallResult{TTL: cfg.wallTTL, Load: cfg.wallLoad, Readers: cfg.readers,
		Duration: cfg.duration, Think: cfg.think, Threshold: cfg.slow}
	type strategy struct {
		name string
		opts flightcache.Options[string, string]
	}
	strategies := []strategy{
		{"TTL only", flightcache.Options[string, string]{}},
		{fmt.Sprintf("stale-while-revalidate %v", cfg.swr), flightcache.Options[string, string]{StaleWhileRevalidate: cfg.swr}},
	}
	for _, beta := range cfg.betas {
		strategies = append(strategies, strategy{fmt.Sprintf("early refresh, β = %g", beta),
			flightcache.Options[string, string]{EarlyRefresh: beta}})
	}
	var phases []*wallPhase
	defer func() {
		for _, ph := range phases {
			ph.l.Close() // after an error; a no-op once stopped
		}
	}()
	exps := make([]experiment, 0, len(strategies))
	for _, st := range strategies {
		st.opts.TTL = cfg.wallTTL
		ph, err := newWallPhase(cfg, st.name, st.opts)
		if err != nil {
			return nil, err
		}
		phases = append(phases, ph)
		exps = append(exps, ph)
	}
	sideBySide(p, fmt.Sprintf("c. %d strategies side by side", len(exps)), cfg.duration, exps...)
	for _, ph := range phases {
		res.Rows = append(res.Rows, ph.result())
	}
	return res, nil
}

// wallTally is what one reader measured.
type wallTally struct {
	max  time.Duration
	slow int
}

// wallPhase is one strategy of part c: a Loader on its own downstream, and
// its readers. It is an experiment.
type wallPhase struct {
	name        string
	cfg         config
	svc         *service
	l           *flightcache.Loader[string, string]
	before      flightcache.Stats // after the warm-up load
	tallies     []wallTally
	stopReaders chan struct{}
	wg          sync.WaitGroup
}

// newWallPhase creates the Loader and warms the key: the run measures the
// wall, not the cold start.
func newWallPhase(cfg config, name string, opts flightcache.Options[string, string]) (*wallPhase, error) {
	ph := &wallPhase{
		name: name, cfg: cfg,
		svc:         &service{min: cfg.wallLoad, max: cfg.wallLoad},
		tallies:     make([]wallTally, cfg.readers),
		stopReaders: make(chan struct{}),
	}
	var err error
	if ph.l, err = flightcache.New(ph.svc.load, opts); err != nil {
		return nil, err
	}
	if _, err := ph.l.Get(context.Background(), "hot"); err != nil {
		ph.l.Close()
		return nil, err
	}
	ph.before = ph.l.Stats()
	return ph, nil
}

func (ph *wallPhase) start() {
	for i := range ph.tallies {
		ph.wg.Go(func() { ph.read(&ph.tallies[i]) })
	}
}

// read is one reader: Get, measure, pause, until stopped.
func (ph *wallPhase) read(t *wallTally) {
	ctx := context.Background()
	for {
		select {
		case <-ph.stopReaders:
			return
		default:
		}
		start := time.Now()
		ph.l.Get(ctx, "hot")
		d := time.Since(start)
		t.max = max(t.max, d)
		if d > ph.cfg.slow {
			t.slow++
		}
		time.Sleep(ph.cfg.think)
	}
}

func (ph *wallPhase) stats() flightcache.Stats { return ph.l.Stats() }

func (ph *wallPhase) stop() {
	close(ph.stopReaders)
	ph.wg.Wait()
	ph.l.Close() // a refresh still running is cancelled and counted: Stats are final
}

// result summarises a stopped phase, the warm-up load excluded.
func (ph *wallPhase) result() wallRow {
	s, b := ph.l.Stats(), ph.before
	row := wallRow{
		Strategy: ph.name,
		Gets:     s.Gets - b.Gets, Hits: s.Hits - b.Hits, Stale: s.StaleHits - b.StaleHits,
		Waited: s.Misses - b.Misses, Loads: s.Loads - b.Loads, Refreshes: s.Refreshes - b.Refreshes,
	}
	for _, t := range ph.tallies {
		row.MaxLatency = max(row.MaxLatency, t.max)
		row.Slow += t.slow
	}
	return row
}

func (r *wallResult) print(w io.Writer) {
	fmt.Fprintf(w, "c. The expiry wall: one hot key, TTL %v, loads of %v, %d readers for %v, each pausing %v\n",
		r.TTL, r.Load, r.Readers, r.Duration, r.Think)
	fmt.Fprintln(w, "   between Gets, after one warm-up load. The strategies run side by side, each with its own")
	fmt.Fprintln(w, "   Loader, downstream and readers.")
	fmt.Fprintln(w)
	var rows [][]string
	for _, row := range r.Rows {
		rows = append(rows, []string{
			row.Strategy, fmt.Sprint(row.Gets), fmt.Sprint(row.Waited), fmt.Sprint(row.Stale),
			ms(row.MaxLatency), fmt.Sprint(row.Slow), fmt.Sprint(row.Loads), fmt.Sprint(row.Refreshes),
		})
	}
	table(w, "l", []string{"strategy", "Gets", "waited", "served stale", "max Get latency",
		fmt.Sprintf("Gets > %v", r.Threshold), "downstream calls", "of them in background"}, rows)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  waited = Stats.Misses, served stale = Stats.StaleHits, downstream calls = Stats.Loads,")
	fmt.Fprintln(w, "  in background = Stats.Refreshes; latencies are measured around each Get.")
	fmt.Fprintln(w, "  With a TTL only, every reader that arrives during a reload waits for it: the wall. With")
	fmt.Fprintln(w, "  stale-while-revalidate they get the old value at once while one refresh runs. Early refresh")
	fmt.Fprintln(w, "  reloads before expiry, so nothing is stale either, at the price of a few extra downstream")
	fmt.Fprintln(w, "  calls: a value's refresh falls due δ·(1 + β·X) before it expires (δ its load time, X drawn")
	fmt.Fprintln(w, "  once per value from Exp(1), the lead capped at half its lifetime) and the first Get after that")
	fmt.Fprintln(w, "  starts it, so the number of refreshes does not grow with the read rate. A larger β refreshes")
	fmt.Fprintln(w, "  earlier; a smaller one now and then finishes a little late.")
}

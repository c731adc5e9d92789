package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// Part e: the N+1 problem. A page lists 100 ids and needs the row behind
// each. Fetched one Get at a time, the page pays a downstream round trip
// per id, in a row. GetMany without LoadMany loads the ids all at once:
// one round trip of wall time, but still one downstream call per id, all
// arriving together. With Options.LoadMany the page is one call (or one
// per MaxBatch ids). The last two ways are the loop a resolver runs, a Get
// per id on goroutines of their own, over a downstream that only answers
// LoadMany (no LoadFunc): each Get its own LoadMany call of one id, then,
// with Options.BatchWindow, the Gets gathered into one call. Each way
// starts from a cold cache: a fresh Loader and a fresh downstream.

// pageRow is one way of fetching the page.
type pageRow struct {
	Way        string        `json:"way"`
	MaxBatch   int           `json:"max_batch,omitempty"` // Options.MaxBatch, when set
	Values     int           `json:"values"`              // ids that came back with a row
	Gets       uint64        `json:"gets"`                // Stats.Gets
	Loads      uint64        `json:"loads"`               // Stats.Loads: downstream calls
	BatchLoads uint64        `json:"batch_loads"`         // Stats.BatchLoads: of them, LoadMany calls
	BatchKeys  uint64        `json:"batch_keys"`          // Stats.BatchKeys
	ManyCalls  int64         `json:"service_many_calls"`  // of the calls the downstream counted, LoadMany's (one id each without a LoadFunc or a window)
	Window     time.Duration `json:"batch_window_ns,omitempty"`
	Calls      int64         `json:"service_calls"`     // what the fake downstream counted, to reconcile
	Rows       int64         `json:"service_rows"`      // rows it read, over all calls
	LargestIn  int           `json:"largest_call_keys"` // the most ids one call asked for
	PeakCalls  int           `json:"peak_concurrent_calls"`
	Wall       time.Duration `json:"wall_ns"` // from the first Get to the page's last row
}

// nPlusOneResult is part e.
type nPlusOneResult struct {
	Page      int           `json:"page"`
	RoundTrip time.Duration `json:"round_trip_ns"`
	PerRow    time.Duration `json:"per_row_ns"`
	Rows      []pageRow     `json:"rows"`
}

// directory is part e's downstream, a table behind a network: every call
// costs one round trip plus perRow for each row it reads, whether it asks
// for one id or many. It counts its calls, the rows they read, the largest
// call and how many calls it served at once.
type directory struct {
	roundTrip, perRow time.Duration

	mu             sync.Mutex
	calls, rows    int64
	manyCalls      int64 // of calls, those of loadMany
	inFlight, peak int
	largest        int
}

// serve is one call for n rows: it is counted, then takes its time.
func (d *directory) serve(ctx context.Context, n int) error {
	d.mu.Lock()
	d.calls++
	d.rows += int64(n)
	d.largest = max(d.largest, n)
	d.inFlight++
	d.peak = max(d.peak, d.inFlight)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.inFlight--
		d.mu.Unlock()
	}()
	t := time.NewTimer(d.roundTrip + time.Duration(n)*d.perRow)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("directory: %w", ctx.Err())
	}
}

// record is the row behind id.
func record(id int) string { return fmt.Sprintf("item %d", id) }

// load is the flightcache.LoadFunc: one id per call.
func (d *directory) load(ctx context.Context, id int) (string, error) {
	if err := d.serve(ctx, 1); err != nil {
		return "", err
	}
	return record(id), nil
}

// loadMany is the flightcache.LoadManyFunc: every id in one call, as
// WHERE id IN (...).
func (d *directory) loadMany(ctx context.Context, ids []int) (map[int]string, error) {
	d.mu.Lock()
	d.manyCalls++
	d.mu.Unlock()
	if err := d.serve(ctx, len(ids)); err != nil {
		return nil, err
	}
	m := make(map[int]string, len(ids))
	for _, id := range ids {
		m[id] = record(id)
	}
	return m, nil
}

func runNPlusOne(cfg config, p *progress) (*nPlusOneResult, error) {
	res := &nPlusOneResult{Page: cfg.page, RoundTrip: cfg.roundTrip, PerRow: cfg.perRow}
	ids := make([]int, cfg.page)
	for i := range ids {
		ids[i] = 1001 + i
	}
	oneCall := cfg.roundTrip + cfg.perRow
	for _, w := range []nPlusOneWay{
		{name: "Get, one id after another", expect: time.Duration(cfg.page) * oneCall},
		{name: "GetMany, no LoadMany", many: true, expect: oneCall},
		{name: "GetMany, LoadMany", many: true, loadMany: true, expect: cfg.roundTrip + time.Duration(cfg.page)*cfg.perRow},
		{name: fmt.Sprintf("GetMany, LoadMany, MaxBatch %d", cfg.smallBatch), many: true, loadMany: true, maxBatch: cfg.smallBatch,
			expect: cfg.roundTrip + time.Duration(min(cfg.page, cfg.smallBatch))*cfg.perRow},
		{name: "Gets at once, LoadMany only", atOnce: true, loadMany: true, expect: oneCall},
		{name: fmt.Sprintf("Gets at once, LoadMany only, BatchWindow %v", cfg.window), atOnce: true, loadMany: true,
			maxBatch: cfg.page, window: cfg.window, expect: cfg.roundTrip + time.Duration(cfg.page)*cfg.perRow},
	} {
		d := &directory{roundTrip: cfg.roundTrip, perRow: cfg.perRow}
		opts := flightcache.Options[int, string]{TTL: time.Minute, MaxBatch: w.maxBatch, BatchWindow: w.window}
		load := d.load
		if w.loadMany {
			opts.LoadMany = d.loadMany
		}
		if w.atOnce {
			load = nil // a downstream that answers only LoadMany
		}
		l, err := flightcache.New(load, opts)
		if err != nil {
			return nil, err
		}
		stop := p.start("e. "+w.name, w.expect, l.Stats)
		start := time.Now()
		page, err := w.fetch(l, ids)
		wall := time.Since(start)
		stop()
		l.Close() // every load has finished: the Stats below are final
		if err != nil {
			return nil, fmt.Errorf("part e, %s: %w", w.name, err)
		}
		s := l.Stats()
		res.Rows = append(res.Rows, pageRow{
			Way: w.name, MaxBatch: w.maxBatch, Values: len(page),
			Gets: s.Gets, Loads: s.Loads, BatchLoads: s.BatchLoads, BatchKeys: s.BatchKeys, ManyCalls: d.manyCalls, Window: w.window,
			Calls: d.calls, Rows: d.rows, LargestIn: d.largest, PeakCalls: d.peak, Wall: wall,
		})
	}
	return res, nil
}

// nPlusOneWay is one way of fetching part e's page.
type nPlusOneWay struct {
	name     string
	many     bool // GetMany, not a Get per id
	atOnce   bool // a Get per id, each on its own goroutine, and no LoadFunc
	loadMany bool
	maxBatch int
	window   time.Duration // Options.BatchWindow
	expect   time.Duration // for the progress line
}

// fetch fetches the page of ids through l, the way w says.
func (w nPlusOneWay) fetch(l *flightcache.Loader[int, string], ids []int) (map[int]string, error) {
	ctx := context.Background()
	if w.many {
		return l.GetMany(ctx, ids)
	}
	page := make(map[int]string, len(ids))
	if !w.atOnce {
		for _, id := range ids {
			v, err := l.Get(ctx, id)
			if err != nil {
				return page, err
			}
			page[id] = v
		}
		return page, nil
	}
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	ready := make(chan struct{}) // every goroutine asks at once, as a resolver's do
	for _, id := range ids {
		wg.Go(func() {
			<-ready
			v, err := l.Get(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				first = cmp.Or(first, err)
				return
			}
			page[id] = v
		})
	}
	close(ready)
	wg.Wait()
	return page, first
}

func (r *nPlusOneResult) print(w io.Writer) {
	fmt.Fprintf(w, "e. The N+1 problem: a page of %d ids, each a row behind a downstream that takes %v a call\n",
		r.Page, r.RoundTrip)
	fmt.Fprintf(w, "   (a round trip) plus %v per row it reads. Each way starts cold: its own Loader and downstream.\n", r.PerRow)
	fmt.Fprintln(w)
	var rows [][]string
	reconciled := true
	for _, row := range r.Rows {
		largest := fmt.Sprintf("%d ids", row.LargestIn)
		if row.LargestIn == 1 {
			largest = "1 id"
		}
		rows = append(rows, []string{
			row.Way, fmt.Sprint(row.Values), fmt.Sprint(row.Loads), fmt.Sprint(row.ManyCalls),
			largest, fmt.Sprint(row.PeakCalls), ms(row.Wall),
		})
		reconciled = reconciled && int64(row.Loads) == row.Calls && row.Rows == int64(r.Page)
	}
	table(w, "l", []string{"way", "ids answered", "downstream calls", "of them LoadMany", "largest call",
		"calls at once", "wall time"}, rows)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  downstream calls = Stats.Loads; of them LoadMany, largest call and calls at once are the")
	fmt.Fprintln(w, "  downstream's own counts; wall time is measured around the page's Gets.")
	if reconciled {
		fmt.Fprintln(w, "  Stats.Loads matches the calls the downstream counted, and it read each id once, in every way.")
	} else {
		fmt.Fprintln(w, "  WARNING: Stats.Loads differs from the downstream's own count; see service_calls in -json.")
	}
	fmt.Fprintln(w, "  A Get per id pays the round trip once per id, one after another. GetMany without LoadMany")
	fmt.Fprintln(w, "  pays it about once in wall time, but sends every id as its own call, all at once: a spike")
	fmt.Fprintln(w, "  this fake downstream absorbs and a real one (a connection pool) would queue. With LoadMany the")
	fmt.Fprintln(w, "  page is one call per MaxBatch ids: as quick, and one query's work for the downstream.")
	fmt.Fprintln(w, "  A Get per id on goroutines of their own, with no LoadFunc, is a LoadMany call per id; with")
	fmt.Fprintln(w, "  Options.BatchWindow the Gets wait up to the window (or until MaxBatch wait) and share one call.")
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
)

// Part b: the blast radius of one failure. Readers ask for one of a few hot
// keys; every read waits on a load (TTL 1ns: nothing stays fresh, as behind
// a bare singleflight), and every tenth load hangs until LoadTimeout. One
// failed load hands its error to every reader queued behind it; LoadEvent
// counts them, and so does each run's Observer, which links every waiting
// Get to its load (observed.go). The last run keeps each key's last good
// value as a fallback (StaleIfError) and counts the readers that still
// saw an error.

// callersRow is one line of the callers-per-load table.
type callersRow struct {
	Callers int `json:"callers"`
	OK      int `json:"ok"`
	Failed  int `json:"failed"`
}

// blastRun is one run of part b.
type blastRun struct {
	Name         string        `json:"name"`
	Readers      int           `json:"readers"`
	Duration     time.Duration `json:"duration_ns"`
	StaleIfError time.Duration `json:"stale_if_error_ns"`

	// From Stats.
	Gets         uint64 `json:"gets"`
	Loads        uint64 `json:"loads"`
	LoadErrors   uint64 `json:"load_errors"`
	SharedErrors uint64 `json:"shared_errors"`
	StaleOnError uint64 `json:"stale_on_error"`

	// From LoadEvent.
	ByCallers     []callersRow  `json:"by_callers"`
	FailedCallers int           `json:"failed_callers"` // Σ Callers over failed loads
	MaxBlast      int           `json:"max_blast"`      // the most callers one failed load reached
	MeanBlast     float64       `json:"mean_blast"`
	MeanCallersOK float64       `json:"mean_callers_ok"`
	TimedOut      int           `json:"timed_out"` // failed loads matching ErrLoadTimeout
	ServiceCalls  int64         `json:"service_calls"`
	SharedWaitP50 time.Duration `json:"shared_wait_p50_ns"` // Info.Waited of readers that joined a load
	SharedWaitMax time.Duration `json:"shared_wait_max_ns"`

	// From the readers: what Get returned.
	ReaderErrors    int `json:"reader_errors"`
	ErrorsWithStale int `json:"errors_with_stale"` // errors for a key that had already returned a good value

	// From the Loader's Observer.
	Observed *observedBlast `json:"observed"`
}

// blastResult is part b.
type blastResult struct {
	Keys        int           `json:"keys"`
	LoadMin     time.Duration `json:"load_min_ns"`
	LoadMax     time.Duration `json:"load_max_ns"`
	LoadTimeout time.Duration `json:"load_timeout_ns"`
	FailEvery   int64         `json:"fail_every"`
	Runs        []blastRun    `json:"runs"`
}

func runBlast(cfg config, p *progress) (*blastResult, error) {
	res := &blastResult{Keys: cfg.keys, LoadMin: cfg.loadMin, LoadMax: cfg.loadMax, LoadTimeout: cfg.loadTimeout, FailEvery: cfg.failEvery}
	control, err := newBlastPhase(cfg, "1 reader", 1, 0)
	if err != nil {
		return nil, err
	}
	sideBySide(p, "b. 1 reader", max(cfg.duration/3, time.Millisecond), control)

	bare, err := newBlastPhase(cfg, fmt.Sprintf("%d readers", cfg.readers), cfg.readers, 0)
	if err != nil {
		return nil, err
	}
	covered, err := newBlastPhase(cfg, fmt.Sprintf("%d readers, StaleIfError", cfg.readers), cfg.readers, time.Hour)
	if err != nil {
		bare.l.Close() // never started: nothing else to stop
		return nil, err
	}
	sideBySide(p, fmt.Sprintf("b. %d readers, without and with StaleIfError", cfg.readers),
		2*cfg.duration, bare, covered)

	for _, ph := range []*blastPhase{control, bare, covered} {
		res.Runs = append(res.Runs, ph.result())
	}
	return res, nil
}

// readerTally is what one reader saw; merged after the run.
type readerTally struct {
	errors, errorsWithStale int
	waits                   []time.Duration
}

// blastPhase is one run of part b: a Loader on its own flaky downstream,
// and its readers. It is an experiment.
type blastPhase struct {
	name         string
	readers      int
	staleIfError time.Duration
	svc          *service
	l            *flightcache.Loader[string, string]
	keys         []string
	good         []atomic.Bool // a Get of keys[i] has returned a value
	tallies      chan readerTally
	stopReaders  chan struct{}
	wg           sync.WaitGroup
	started      time.Time
	took         time.Duration
	minLoads     int           // stop waits until this many loads have finished
	enough       chan struct{} // closed by OnLoad at the minLoads-th load

	mu     sync.Mutex // guards events
	events []flightcache.LoadEvent[string]
	obs    *blastObserver // the Loader's Observer
}

func newBlastPhase(cfg config, name string, readers int, staleIfError time.Duration) (*blastPhase, error) {
	ph := &blastPhase{
		name: name, readers: readers, staleIfError: staleIfError,
		svc:         &service{min: cfg.loadMin, max: cfg.loadMax, failEvery: cfg.failEvery},
		keys:        make([]string, cfg.keys),
		good:        make([]atomic.Bool, cfg.keys),
		tallies:     make(chan readerTally, readers),
		stopReaders: make(chan struct{}),
		minLoads:    cfg.minLoads,
		enough:      make(chan struct{}),
		obs:         &blastObserver{},
	}
	if ph.minLoads <= 0 {
		close(ph.enough)
	}
	for i := range ph.keys {
		ph.keys[i] = fmt.Sprintf("user:%d", i+1)
	}
	var err error
	ph.l, err = flightcache.New(ph.svc.load, flightcache.Options[string, string]{
		TTL:          time.Nanosecond, // nothing stays fresh: every read waits on a load
		StaleIfError: staleIfError,
		LoadTimeout:  cfg.loadTimeout,
		Breaker:      flightcache.Breaker{Disabled: true},
		Observer:     ph.obs,
		OnLoad: func(ev flightcache.LoadEvent[string]) {
			ph.mu.Lock()
			ph.events = append(ph.events, ev)
			if len(ph.events) == ph.minLoads {
				close(ph.enough)
			}
			ph.mu.Unlock()
		},
	})
	return ph, err
}

func (ph *blastPhase) start() {
	ph.started = time.Now()
	for range ph.readers {
		ph.wg.Go(func() { ph.tallies <- blastReader(ph.l, ph.keys, ph.good, ph.stopReaders) })
	}
}

func (ph *blastPhase) stats() flightcache.Stats { return ph.l.Stats() }

// stop lets the readers run on until minLoads loads have finished (so that
// even a short run has a failed load), then stops them and closes the Loader.
func (ph *blastPhase) stop() {
	<-ph.enough // the readers keep loading: every Get of a 1ns-TTL key is a load
	close(ph.stopReaders)
	ph.wg.Wait()
	ph.took = time.Since(ph.started)
	ph.l.Close() // waits for every OnLoad: events and Stats are final
	close(ph.tallies)
}

// result summarises a stopped phase.
func (ph *blastPhase) result() blastRun {
	s := ph.l.Stats()
	run := blastRun{
		Name: ph.name, Readers: ph.readers, Duration: ph.took, StaleIfError: ph.staleIfError,
		Gets: s.Gets, Loads: s.Loads, LoadErrors: s.LoadErrors,
		SharedErrors: s.SharedErrors, StaleOnError: s.StaleOnError,
		ServiceCalls: ph.svc.calls.Load(),
	}
	run.addEvents(ph.events)
	run.addTallies(ph.tallies)
	run.Observed = ph.obs.summary()
	return run
}

// addEvents tallies the loads' LoadEvents into callers per load and the
// blast radius of the failed ones.
func (run *blastRun) addEvents(events []flightcache.LoadEvent[string]) {
	byCallers := map[int]*callersRow{}
	var okLoads, okCallers, failed int
	for _, ev := range events {
		row := byCallers[ev.Callers]
		if row == nil {
			row = &callersRow{Callers: ev.Callers}
			byCallers[ev.Callers] = row
		}
		if ev.Err != nil {
			row.Failed++
			failed++
			run.FailedCallers += ev.Callers
			run.MaxBlast = max(run.MaxBlast, ev.Callers)
			if errors.Is(ev.Err, flightcache.ErrLoadTimeout) {
				run.TimedOut++
			}
		} else {
			row.OK++
			okLoads++
			okCallers += ev.Callers
		}
	}
	for _, row := range byCallers {
		run.ByCallers = append(run.ByCallers, *row)
	}
	slices.SortFunc(run.ByCallers, func(a, b callersRow) int { return a.Callers - b.Callers })
	if failed > 0 {
		run.MeanBlast = float64(run.FailedCallers) / float64(failed)
	}
	if okLoads > 0 {
		run.MeanCallersOK = float64(okCallers) / float64(okLoads)
	}
}

// addTallies adds up what the readers saw.
func (run *blastRun) addTallies(tallies <-chan readerTally) {
	var waits []time.Duration
	for t := range tallies {
		run.ReaderErrors += t.errors
		run.ErrorsWithStale += t.errorsWithStale
		waits = append(waits, t.waits...)
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		run.SharedWaitP50 = waits[len(waits)/2]
		run.SharedWaitMax = waits[len(waits)-1]
	}
}

// blastReader asks for random keys until stop is closed and returns what
// it saw. good[i] records that a Get of keys[i] has returned a value: from
// then on a stale value exists, and an error counts against StaleIfError.
func blastReader(l *flightcache.Loader[string, string], keys []string, good []atomic.Bool, stop <-chan struct{}) readerTally {
	var t readerTally
	for {
		select {
		case <-stop:
			return t
		default:
		}
		k := rand.IntN(len(keys))
		hadValue := good[k].Load()
		// A background context: each Get runs to its end, so every caller a
		// load counted receives its result.
		_, info, err := l.GetInfo(context.Background(), keys[k])
		if err != nil {
			t.errors++
			if hadValue {
				t.errorsWithStale++
			}
		} else {
			good[k].Store(true)
		}
		if info.Source == flightcache.SourceShared {
			t.waits = append(t.waits, info.Waited)
		}
	}
}

func (r *blastResult) print(w io.Writer) {
	fmt.Fprintf(w, "b. Blast radius of one failure: readers ask for one of %d hot keys, again as soon as they have\n", r.Keys)
	fmt.Fprintf(w, "   an answer. Each load takes %v–%v; every %dth hangs until LoadTimeout (%v). TTL 1ns and no\n",
		r.LoadMin, r.LoadMax, r.FailEvery, r.LoadTimeout)
	fmt.Fprintln(w, "   breaker: every read waits on a load, as behind a bare singleflight. First a control run with")
	fmt.Fprintln(w, "   1 reader; then two runs side by side, each with its own Loader and downstream, the second")
	fmt.Fprintln(w, "   with StaleIfError 1h: each key's last good value, stale the moment it is stored, stays as a")
	fmt.Fprintln(w, "   fallback for a failed load.")
	fmt.Fprintln(w)

	r.printCallers(w)
	fmt.Fprintln(w)
	r.printSummary(w)
	fmt.Fprintln(w)
	r.printObserved(w)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  "+r.check())
}

// printCallers prints how many loads reached how many callers, one ok and
// failed pair of columns per run.
func (r *blastResult) printCallers(w io.Writer) {
	header := []string{"callers per load (LoadEvent)"}
	maxCallers := 0
	for _, run := range r.Runs {
		header = append(header, run.Name+": ok", "failed")
		for _, row := range run.ByCallers {
			maxCallers = max(maxCallers, row.Callers)
		}
	}
	var rows [][]string
	for c := 0; c <= maxCallers; c++ {
		line := []string{fmt.Sprint(c)}
		seen := false
		for _, run := range r.Runs {
			ok, failed := 0, 0
			for _, row := range run.ByCallers {
				if row.Callers == c {
					ok, failed = row.OK, row.Failed
				}
			}
			seen = seen || ok+failed > 0
			line = append(line, fmt.Sprint(ok), fmt.Sprint(failed))
		}
		if seen {
			rows = append(rows, line)
		}
	}
	table(w, "l", header, rows)
}

// printSummary prints the blast radius and what the readers saw, per run.
func (r *blastResult) printSummary(w io.Writer) {
	header := []string{""}
	for _, run := range r.Runs {
		header = append(header, run.Name)
	}
	stat := func(label string, f func(blastRun) string) []string {
		line := []string{label}
		for _, run := range r.Runs {
			line = append(line, f(run))
		}
		return line
	}
	withStale := func(f func(blastRun) string) func(blastRun) string {
		return func(run blastRun) string {
			if run.StaleIfError == 0 {
				return "-"
			}
			return f(run)
		}
	}
	ifFailed := func(f func(blastRun) string) func(blastRun) string {
		return func(run blastRun) string {
			if run.LoadErrors == 0 {
				return "-"
			}
			return f(run)
		}
	}
	waited := func(f func(blastRun) time.Duration) func(blastRun) string {
		return func(run blastRun) string {
			if run.Readers == 1 {
				return "-" // nobody to share with
			}
			return ms(f(run))
		}
	}
	table(w, "l", header, [][]string{
		stat("reads (Stats.Gets)", func(b blastRun) string { return fmt.Sprint(b.Gets) }),
		stat("loads (Stats.Loads)", func(b blastRun) string { return fmt.Sprint(b.Loads) }),
		stat("failed loads (Stats.LoadErrors)", func(b blastRun) string { return fmt.Sprint(b.LoadErrors) }),
		stat("callers of failed loads (Σ LoadEvent.Callers)", func(b blastRun) string { return fmt.Sprint(b.FailedCallers) }),
		stat("  per failed load: mean", ifFailed(func(b blastRun) string { return fmt.Sprintf("%.2f", b.MeanBlast) })),
		stat("  per failed load: max", ifFailed(func(b blastRun) string { return fmt.Sprint(b.MaxBlast) })),
		stat("  per successful load: mean", func(b blastRun) string { return fmt.Sprintf("%.2f", b.MeanCallersOK) }),
		stat("served the stale value instead (Stats.StaleOnError)", withStale(func(b blastRun) string { return fmt.Sprint(b.StaleOnError) })),
		stat("readers that got an error", func(b blastRun) string { return fmt.Sprint(b.ReaderErrors) }),
		stat("  while a stale value existed (goal 0)", withStale(func(b blastRun) string { return fmt.Sprint(b.ErrorsWithStale) })),
		stat("wait of readers that joined a load, p50 (Info.Waited)", waited(func(b blastRun) time.Duration { return b.SharedWaitP50 })),
		stat("  max", waited(func(b blastRun) time.Duration { return b.SharedWaitMax })),
	})
}

// check reconciles the readers' view with LoadEvent and Stats: every caller
// of a failed load got either its error or a stale value; without
// StaleIfError, the readers' errors are the failed loads' starters plus the
// shared errors; and the downstream's own count equals Stats.Loads.
func (r *blastResult) check() string {
	for _, run := range r.Runs {
		if run.FailedCallers != run.ReaderErrors+int(run.StaleOnError) {
			return fmt.Sprintf("MISMATCH (%s): callers of failed loads %d != reader errors %d + Stats.StaleOnError %d",
				run.Name, run.FailedCallers, run.ReaderErrors, run.StaleOnError)
		}
		if run.StaleIfError == 0 && uint64(run.ReaderErrors) != run.LoadErrors+run.SharedErrors {
			return fmt.Sprintf("MISMATCH (%s): reader errors %d != Stats.LoadErrors %d + Stats.SharedErrors %d",
				run.Name, run.ReaderErrors, run.LoadErrors, run.SharedErrors)
		}
		if uint64(run.ServiceCalls) != run.Loads {
			return fmt.Sprintf("MISMATCH (%s): the downstream counted %d calls, Stats.Loads %d", run.Name, run.ServiceCalls, run.Loads)
		}
		if msg := run.checkObserved(); msg != "" {
			return msg
		}
	}
	return "Reconciled in every run: callers of failed loads = readers that got an error + Stats.StaleOnError;\n" +
		"  without StaleIfError, readers that got an error = Stats.LoadErrors + Stats.SharedErrors;\n" +
		"  Stats.Loads = the calls the downstream itself counted = the loads the Observer saw, and the Gets\n" +
		"  it linked to failed loads (WaitEvent.Load) = callers of failed loads."
}

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/postgres/internal/cputime"
)

func run(cfg config) error {
	return runTo(context.Background(), cfg, os.Stdout)
}

// result is what -mode fleet found, for the test.
type result struct {
	lags       []time.Duration // commit -> the last process stopped serving the old row, sorted
	missing    int             // updates never invalidated
	skipped    int             // updates the consumer's Mapping never saw
	stale      int             // reads older than the row's last commit once the p99 had passed
	staleAtMax int             // the same once the max had passed
	reads      int
}

func runTo(ctx context.Context, cfg config, w io.Writer) error {
	_, err := measure(ctx, cfg, w)
	return err
}

func measure(ctx context.Context, cfg config, w io.Writer) (result, error) {
	fl, err := newFleet(ctx, cfg, w)
	if err != nil {
		return result{}, err
	}
	err = fl.measure(ctx)
	return fl.result, err
}

func (fl *fleet) measure(ctx context.Context) error {
	cfg, w := fl.cfg, fl.w
	defer fl.close()
	if err := fl.start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: %d processes x %d readers (%d Gets/s each) on the Redis tier, %d rows, load %s\n",
		cfg.mode, cfg.procs, cfg.readers, cfg.reads, cfg.rows, loadavg())
	began := time.Now()
	ws, err := fl.all("warm")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "warm: each process Got every row (%v); held:", time.Since(began).Round(time.Millisecond))
	for _, r := range ws {
		fmt.Fprintf(w, " %d", r.Held)
	}
	fmt.Fprintln(w)
	switch cfg.mode {
	case "restart":
		return fl.restart(ctx)
	case "bulk":
		return fl.bulk(ctx)
	}
	return fl.stream(ctx, cfg.mode == "pgrestart")
}

// stream is -mode fleet and -mode pgrestart.
func (fl *fleet) stream(ctx context.Context, restartPG bool) error {
	cfg, w := fl.cfg, fl.w
	if _, err := fl.all("read"); err != nil {
		return err
	}
	time.Sleep(time.Second)
	walsender, visibility := fl.backends(ctx)
	ws0, vis0 := cputime.Of(walsender), cputime.Of(visibility)
	load0 := loadavg()
	var restarted sync.WaitGroup
	var restartErr error
	var restartTook time.Duration
	at := func(k int) {
		if restartPG && k == cfg.n/2 {
			restarted.Go(func() {
				t := time.Now()
				out, err := exec.Command("bash", cfg.pgctl, "restart", cfg.url).CombinedOutput()
				restartTook = time.Since(t)
				if err != nil {
					restartErr = fmt.Errorf("restart PostgreSQL: %w: %s", err, out)
				}
			})
		}
	}
	commits, wrote, err := fl.write(ctx, cfg.n, cfg.rate, fl.roundRobin, at)
	restarted.Wait()
	if err != nil || restartErr != nil {
		return fmt.Errorf("writer: %w", errorsJoin(err, restartErr))
	}
	ws, vis := cputime.Of(walsender)-ws0, cputime.Of(visibility)-vis0
	if restartPG { // the backends were restarted with the server: their CPU is lost
		ws, vis = -1, -1
	}
	time.Sleep(time.Second)
	consumer := !cfg.control
	if consumer {
		if _, err := fl.procs[0].do("catchup"); err != nil {
			return err
		}
	}
	time.Sleep(500 * time.Millisecond)
	rs, err := fl.all("stop")
	if err != nil {
		return err
	}
	load1 := loadavg()

	fmt.Fprintf(w, "writer: %d updates at %.0f/s (asked %d/s)", cfg.n, float64(cfg.n)/wrote.Seconds(), cfg.rate)
	if restartPG {
		fmt.Fprintf(w, "; PostgreSQL restarted at update %d (took %v)", cfg.n/2, restartTook.Round(time.Millisecond))
	}
	fmt.Fprintf(w, "; load %s -> %s\n", load0, load1)
	drops, reads := make([][]record, len(fl.procs)), make([][]record, len(fl.procs))
	for i := range fl.procs {
		if drops[i], err = readRecords[record](fl.dir, "drops", i); err != nil {
			return err
		}
		if reads[i], err = readRecords[record](fl.dir, "reads", i); err != nil {
			return err
		}
	}
	var invals []inval
	if !cfg.control {
		if invals, err = readRecords[inval](fl.dir, "invals", 0); err != nil {
			return err
		}
	}
	lags, missing := lastDrops(commits, invals, drops, cfg.rows)
	thr := cfg.after
	switch {
	case thr > 0:
	case len(lags) > 0:
		thr = pct(lags, 99)
	default:
		thr = 50 * time.Millisecond
	}
	if len(lags) > 0 {
		fmt.Fprintf(w, "commit -> last process stops serving the old row: p50 %v p99 %v max %v (%d updates; never invalidated: %d)\n",
			pct(lags, 50), pct(lags, 99), pct(lags, 100), len(lags), missing)
	} else {
		fmt.Fprintf(w, "commit -> last process stops serving the old row: never, each copy is served until its TTL (%v): no Source\n", cfg.ttl)
	}
	stale, total := staleReads(commits, reads, cfg.rows, thr)
	fl.result = result{lags: lags, missing: missing, stale: stale, reads: total}
	fmt.Fprintf(w, "reads older than the row's last commit %v after it: %d of %d reads", thr, stale, total)
	if len(lags) > 0 {
		fl.result.staleAtMax, _ = staleReads(commits, reads, cfg.rows, pct(lags, 100))
		at50, _ := staleReads(commits, reads, cfg.rows, 50*time.Millisecond)
		fmt.Fprintf(w, " (%d once the max, %v, had passed; %d once 50 ms, the target p99, had)", fl.result.staleAtMax, pct(lags, 100), at50)
	}
	for i, r := range rs {
		fmt.Fprintf(w, "; p%d %d reads, %d errors, %d loads", i, r.Reads, r.ReadErrs, r.Loads)
	}
	fmt.Fprintln(w)
	for i, r := range rs {
		fmt.Fprintf(w, "p%d: holds %d rows; tier: %s\n", i, r.Held, r.Tier)
	}
	if !consumer {
		return nil
	}
	st := rs[0].Stats
	v, err := fl.procs[0].do(fmt.Sprintf("verify %d %d", cfg.n, cfg.rows))
	if err != nil {
		return err
	}
	fl.result.skipped = v.Missing
	fmt.Fprintf(w, "Source: %d transactions, %d changes, lag (commit -> applied, last %d) p50 %v p99 %v; reconnects %d, gaps %d; updates its Mapping never saw: %d of %d\n",
		st.Transactions, st.Changes, st.Lag.Samples, st.Lag.P50, st.Lag.P99, st.Reconnects, st.Gaps, v.Missing, cfg.n)
	if r := rs[0]; r.Invalidations > 0 {
		fmt.Fprintf(w, "the Source's Invalidate calls (through the tier): %d, %v each on average, %v in all\n",
			r.Invalidations, (r.Invalidating / time.Duration(r.Invalidations)).Round(time.Microsecond), r.Invalidating.Round(time.Millisecond))
	}
	var others time.Duration
	for _, r := range rs[1:] {
		others += r.CPU
	}
	others /= time.Duration(len(rs) - 1)
	per := func(d time.Duration) string {
		return (d * 1000 / time.Duration(cfg.n)).Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "CPU per 1,000 changes: the consumer %s (its process %s less the others' mean %s, over %v)",
		per(rs[0].CPU-others), per(rs[0].CPU), per(others), wrote.Round(time.Millisecond))
	if ws >= 0 {
		fmt.Fprintf(w, ", its walsender %s", per(ws))
	}
	if vis >= 0 {
		fmt.Fprintf(w, ", its visibility queries' backend %s", per(vis))
	}
	fmt.Fprintln(w)
	if v.Missing > 0 {
		return fmt.Errorf("%d updates skipped", v.Missing)
	}
	return nil
}

// restart is -mode restart: the last process down while -changed rows
// change, restarted warm.
func (fl *fleet) restart(ctx context.Context) error {
	cfg, w := fl.cfg, fl.w
	if _, err := fl.all("read"); err != nil {
		return err
	}
	time.Sleep(time.Second)
	last := len(fl.procs) - 1
	down := fl.procs[last]
	p, err := down.do("prepare")
	if err != nil {
		return err
	}
	if _, err := fl.procs[0].do("catchup"); err != nil { // the consumer applied every change up to p.LSN
		return err
	}
	time.Sleep(200 * time.Millisecond) // and the tier brought them to the process
	path := fl.dir + "/snapshot"
	snap, err := down.do(fmt.Sprintf("snapshot %s %d", path, p.LSN))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "process %d saved %d entries at %v; tier: %s\n", last, snap.Held, p.LSN, snap.Tier)
	down.stop()
	fl.procs[last] = nil
	wentDown := time.Now()
	load0 := loadavg()
	upd := func(k int) update {
		return update{id: int64(k + 1), ver: 2, sql: "UPDATE " + fl.table + " SET ver = $2 WHERE id = $1"}
	}
	_, wrote, err := fl.write(ctx, cfg.changed, max(1, int(float64(cfg.changed)/cfg.down.Seconds())), upd, nil)
	if err != nil {
		return err
	}
	time.Sleep(time.Until(wentDown.Add(cfg.down)))
	up, err := fl.spawn(last, false, path, !cfg.control)
	if err != nil {
		return err
	}
	fl.procs[last] = up
	r := up.ready
	c, err := up.do(fmt.Sprintf("check 1 %d 2", cfg.changed))
	if err != nil {
		return err
	}
	u, err := up.do(fmt.Sprintf("check %d %d 0", cfg.changed+1, cfg.rows))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "process %d down %v (load %s -> %s) while %d rows changed (in %v); restarted warm: %d entries restored",
		last, time.Since(wentDown).Round(time.Second), load0, loadavg(), cfg.changed, wrote.Round(time.Millisecond), r.Restored)
	if cfg.control {
		fmt.Fprintf(w, ", no catch-up (the control)\n")
	} else {
		st := r.Stats
		fmt.Fprintf(w, ", caught up in %v (%d transactions, %d changes, resumed %v, gaps %d)\n",
			r.CaughtUp.Round(time.Millisecond), st.Transactions, st.Changes, st.Resumed, st.Gaps)
	}
	fmt.Fprintf(w, "changed rows served old: %d of %d (%d loads); untouched rows: %d of %d served without a load\n",
		c.Old, c.Checked, c.Loads, u.Checked-int(u.Loads), u.Checked)
	others, err := fl.all(fmt.Sprintf("check 1 %d 2", cfg.changed))
	if err != nil {
		return err
	}
	for i, o := range others[:last] {
		fmt.Fprintf(w, "process %d (up throughout): changed rows served old %d of %d\n", i, o.Old, o.Checked)
	}
	return nil
}

// bulk is -mode bulk: one UPDATE of every row, beside single-row
// updates of the side table.
func (fl *fleet) bulk(ctx context.Context) error {
	cfg, w := fl.cfg, fl.w
	if _, err := fl.all("read"); err != nil {
		return err
	}
	time.Sleep(time.Second)
	if _, err := fl.procs[0].do("baseline"); err != nil {
		return err
	}
	load0 := loadavg()
	side, stop := context.WithCancel(ctx)
	var singles atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second / time.Duration(cfg.rate))
		defer t.Stop()
		for k := 0; ; k++ {
			select {
			case <-side.Done():
				return
			case <-t.C:
			}
			if _, err := fl.pool.Exec(side, "UPDATE "+fl.side+" SET ver = ver + 1 WHERE id = $1", k%1000+1); err == nil {
				singles.Add(1)
			}
		}
	})
	defer func() { stop(); wg.Wait() }()
	time.Sleep(2 * time.Second)
	began := time.Now()
	tag, err := fl.pool.Exec(ctx, "UPDATE "+fl.table+" SET ver = ver + 1")
	if err != nil {
		return err
	}
	committed := time.Now()
	if _, err := fl.procs[0].do("catchup"); err != nil {
		return err
	}
	applied := time.Since(committed)
	time.Sleep(5 * time.Second)
	stop()
	wg.Wait()
	peak, err := fl.procs[0].do("peak")
	if err != nil {
		return err
	}
	st, err := fl.procs[0].do("stats")
	if err != nil {
		return err
	}
	// The time until every transaction's lag is under 50 ms again: the
	// last one at or over it, from the bulk's commit.
	var recovered time.Duration
	for _, a := range st.Applied {
		if a.Lag >= 50*time.Millisecond && a.Commit >= began.Add(-time.Second).UnixNano() {
			recovered = max(recovered, time.Unix(0, a.Commit).Add(a.Lag).Sub(committed))
		}
	}
	checks, err := fl.all(fmt.Sprintf("check 1 %d 2", cfg.rows))
	if err != nil {
		return err
	}
	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "bulk UPDATE of %d rows: %v to commit; commit -> applied by the consumer %v; load %s -> %s\n",
		tag.RowsAffected(), committed.Sub(began).Round(time.Millisecond), applied.Round(time.Millisecond), load0, loadavg())
	fmt.Fprintf(w, "the consumer's heap: objects (live and not yet swept) baseline %.1f MB, peak %.1f MB: %+.1f MB; live at the end of a GC baseline %.1f MB, peak %.1f MB: %+.1f MB\n",
		mb(peak.HeapBase), mb(peak.HeapPeak), mb(peak.HeapPeak)-mb(peak.HeapBase),
		mb(peak.LiveBase), mb(peak.LivePeak), mb(peak.LivePeak)-mb(peak.LiveBase))
	fmt.Fprintf(w, "lag under 50 ms again %v after the bulk's commit (%d single-row updates at %d/s beside it; Source lag p50 %v p99 %v over the last %d)\n",
		recovered.Round(time.Millisecond), singles.Load(), cfg.rate, st.Stats.Lag.P50, st.Stats.Lag.P99, st.Stats.Lag.Samples)
	for i, c := range checks {
		fmt.Fprintf(w, "process %d: rows served old after it %d of %d; tier: %s\n", i, c.Old, c.Checked, c.Tier)
	}
	if slices.ContainsFunc(checks, func(c reply) bool { return c.Old > 0 }) {
		time.Sleep(10 * time.Second) // the tier replays the invalidations it kept at its health checks
		if checks, err = fl.all(fmt.Sprintf("check 1 %d 2", cfg.rows)); err != nil {
			return err
		}
		for i, c := range checks {
			fmt.Fprintf(w, "process %d, 10 s later: rows served old %d of %d; tier: %s\n", i, c.Old, c.Checked, c.Tier)
		}
	}
	return nil
}

func errorsJoin(a, b error) error {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	return fmt.Errorf("%w; %w", a, b)
}

func readRecords[R record | inval](dir, kind string, child int) ([]R, error) {
	b, err := os.ReadFile(recordsPath(dir, kind, child))
	if err != nil {
		return nil, err
	}
	rs := make([]R, len(b)/binary.Size(new(R)))
	return rs, binary.Read(bytes.NewReader(b), binary.LittleEndian, rs)
}

// lastDrops returns, for each update, the time from its commit's return
// to when the last process stopped serving the old row: the later of the
// consumer's Invalidate of it returning (the shared entry is gone, and
// the tier has told the holders) and each process's first drop of the
// row's copy after that Invalidate began (before the row's next one). It
// also returns how many updates were never invalidated.
func lastDrops(commits []int64, invals []inval, drops [][]record, rows int) (lags []time.Duration, missing int) {
	first := make([]*inval, len(commits)) // update k's first Invalidate (a replay may repeat it)
	starts := map[int32][]int64{}         // each row's Invalidates' starts, in order
	for i := range invals {
		iv := &invals[i]
		starts[iv.Row] = append(starts[iv.Row], iv.Start)
		k := (int(iv.Ver)-2)*rows + int(iv.Row) - 1
		if k >= 0 && k < len(commits) && first[k] == nil {
			first[k] = iv
		}
	}
	byRow := make([]map[int32][]int64, len(drops))
	for i, ds := range drops {
		byRow[i] = map[int32][]int64{}
		for _, d := range ds {
			byRow[i][d.Row] = append(byRow[i][d.Row], d.At)
		}
		for _, ts := range byRow[i] {
			slices.Sort(ts)
		}
	}
	for k, at := range commits {
		iv := first[k]
		if iv == nil {
			missing++
			continue
		}
		ss := starts[iv.Row]
		next := sort.Search(len(ss), func(j int) bool { return ss[j] > iv.Start })
		lo, hi := iv.Start, int64(1<<62)
		if next < len(ss) {
			hi = ss[next]
		}
		last := iv.End
		for i := range drops {
			ts := byRow[i][iv.Row]
			j := sort.Search(len(ts), func(j int) bool { return ts[j] >= lo })
			if j < len(ts) && ts[j] < hi {
				last = max(last, ts[j])
			}
		}
		lags = append(lags, max(0, time.Duration(last-at)))
	}
	slices.Sort(lags)
	return lags, missing
}

// staleReads counts the reads that returned a version older than a
// commit of their row made more than thr before the read started.
func staleReads(commits []int64, reads [][]record, rows int, thr time.Duration) (stale, total int) {
	for _, rs := range reads {
		for _, r := range rs {
			total++
			i := int(r.Row) - 1 // the row's commits are i, i+rows, i+2*rows...
			m := (len(commits) - i + rows - 1) / rows
			j := sort.Search(m, func(j int) bool { return commits[i+j*rows]+int64(thr) >= r.At }) - 1
			if j >= 0 && int64(r.Ver) < int64(j+2) {
				stale++
			}
		}
	}
	return stale, total
}

// pct returns the p-th percentile of sorted ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := min(len(ds)-1, (len(ds)*p+99)/100-1)
	return ds[max(i, 0)].Round(10 * time.Microsecond)
}

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quick is a scaled-down configuration: short runs and fast loads, with a
// failure often enough that every run of part b sees some.
func quick() config {
	cfg := defaultConfig()
	cfg.duration = 300 * time.Millisecond
	cfg.readers = 4
	cfg.keys = 2
	cfg.loadMin, cfg.loadMax = 5*time.Millisecond, 10*time.Millisecond
	cfg.failEvery = 3
	cfg.minLoads = 10 // so that every run of part b has failed loads, however slow the machine
	cfg.loadTimeout = 30 * time.Millisecond
	cfg.wallTTL = 30 * time.Millisecond
	cfg.wallLoad = 5 * time.Millisecond
	cfg.think = time.Millisecond
	cfg.roundTrip = 2 * time.Millisecond
	cfg.window = time.Minute // part e's window goes out when full, not when it ends
	return cfg
}

func TestCoalesce(t *testing.T) {
	res, err := runCoalesce(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 4 {
		t.Fatalf("%d rows; want 4", len(res.Rows))
	}
	for _, row := range res.Rows {
		if int64(row.DownstreamCalls) != row.ServiceCalls {
			t.Errorf("%s: Stats.Loads %d, downstream counted %d", row.Scenario, row.DownstreamCalls, row.ServiceCalls)
		}
		total := 0
		for _, n := range row.Sources {
			total += n
		}
		if row.Sources != nil && total != row.Requests {
			t.Errorf("%s: %d Infos for %d requests: %v", row.Scenario, total, row.Requests, row.Sources)
		}
		if row.Sources["error"] > 0 {
			t.Errorf("%s: %d requests failed", row.Scenario, row.Sources["error"])
		}
	}
	noCoord, loader, ttl200, ttl10 := res.Rows[0], res.Rows[1], res.Rows[2], res.Rows[3]
	if noCoord.DownstreamCalls != burstSize {
		t.Errorf("no coordination: %d downstream calls; want %d", noCoord.DownstreamCalls, burstSize)
	}
	// One load per cold key: a request that arrives after the load is a hit.
	if loader.DownstreamCalls != 1 || loader.Sources["loaded"] != 1 {
		t.Errorf("through a Loader: %d downstream calls, sources %v; want 1 load", loader.DownstreamCalls, loader.Sources)
	}
	// Timing decides whether a burst finds the TTL 200 ms value fresh, but
	// never more than one load per burst...
	if ttl200.DownstreamCalls < 1 || ttl200.DownstreamCalls > burstCount {
		t.Errorf("TTL 200 ms: %d downstream calls; want 1 to %d", ttl200.DownstreamCalls, burstCount)
	}
	// ...and a 10 ms value has always expired 50 ms later.
	if ttl10.DownstreamCalls < burstCount {
		t.Errorf("TTL 10 ms: %d downstream calls; want at least %d", ttl10.DownstreamCalls, burstCount)
	}
}

func TestBlast(t *testing.T) {
	cfg := quick()
	res, err := runBlast(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.check(); strings.HasPrefix(got, "MISMATCH") {
		t.Fatal(got)
	}
	control, readers, stale := res.Runs[0], res.Runs[1], res.Runs[2]
	for _, run := range res.Runs {
		if run.LoadErrors == 0 {
			t.Errorf("%s: no failed load in %d loads (every %dth fails)", run.Name, run.Loads, cfg.failEvery)
		}
		if run.TimedOut == 0 {
			t.Errorf("%s: no load matched ErrLoadTimeout", run.Name)
		}
	}
	for _, row := range control.ByCallers {
		if row.Callers != 1 {
			t.Errorf("control: a load with %d callers; one reader makes loads of 1", row.Callers)
		}
	}
	if readers.ReaderErrors == 0 {
		t.Errorf("%s: no reader got an error from %d failed loads", readers.Name, readers.LoadErrors)
	}
	// StaleIfError: once a key has a value, a failed load never reaches a
	// reader as an error.
	if stale.ErrorsWithStale != 0 {
		t.Errorf("%s: %d readers got an error while a stale value existed; want 0", stale.Name, stale.ErrorsWithStale)
	}
	if stale.StaleOnError == 0 {
		t.Errorf("%s: no reader was served a stale value for %d failed loads", stale.Name, stale.LoadErrors)
	}
	// The Observer links every Get that waited to its load (check: as many
	// to the failed loads as LoadEvent counted callers); its largest failed
	// load's Gets got its error, or, under StaleIfError, the stale value.
	for _, run := range res.Runs {
		if l := run.Observed.Largest; l == nil || l.Linked != l.Callers || l.Linked == 0 {
			t.Errorf("%s: the Observer's largest failed load %+v; want its Gets linked, as many as its callers", run.Name, l)
		}
	}
	if l := readers.Observed.Largest; l != nil && l.LinkedErrors != l.Linked {
		t.Errorf("%s: %d of the %d Gets linked to the largest failed load got its error; want all", readers.Name, l.LinkedErrors, l.Linked)
	}

	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"callers per load", "while a stale value existed (goal 0)", "WaitEvent.Load", "Reconciled in every run"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestWall(t *testing.T) {
	cfg := quick()
	res, err := runWall(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2+len(cfg.betas) {
		t.Fatalf("%d rows; want %d", len(res.Rows), 2+len(cfg.betas))
	}
	ttlOnly, swr := res.Rows[0], res.Rows[1]
	for _, row := range res.Rows {
		if row.Gets == 0 || row.Loads == 0 {
			t.Errorf("%s: %d Gets, %d loads; the run should see the key expire", row.Strategy, row.Gets, row.Loads)
		}
	}
	if ttlOnly.Waited == 0 {
		t.Errorf("TTL only: no Get waited for a reload in a run 10 TTLs long")
	}
	// Within the stale window (1s, longer than the run) no Get waits.
	if swr.Waited != 0 || swr.Stale == 0 {
		t.Errorf("%s: %d Gets waited, %d served stale; want 0 waited", swr.Strategy, swr.Waited, swr.Stale)
	}
	for _, row := range res.Rows[2:] {
		if row.Refreshes == 0 {
			t.Errorf("%s: no background refresh", row.Strategy)
		}
	}
}

func TestRunFlagsAndJSON(t *testing.T) {
	for _, args := range [][]string{
		{"-only", "x"}, {"-only", "h"}, {"-only", ""}, {"-duration", "0s"}, {"-readers", "0"}, {"-keys", "0"}, {"extra"},
	} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q) = nil; want an error", args)
		}
	}
	var out bytes.Buffer
	if err := run([]string{"-only", "a", "-json"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var res results
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("-json output: %v\n%s", err, out.String())
	}
	if res.A == nil || res.B != nil || res.C != nil || len(res.A.Rows) != 4 {
		t.Errorf("-only a -json: got %+v", res)
	}
}

// Part d: with Options.Freshness no Get ever returns a token past its
// stated expiry, and revalidating with ErrNotModified transfers fewer
// bodies than full reloads for about as many downstream calls.
func TestFreshnessPart(t *testing.T) {
	cfg := quick()
	cfg.duration = 1200 * time.Millisecond // 600 ms per run: a few token lives (100-400 ms)
	res, err := runFreshness(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tokens) != 2 || len(res.Catalog) != 2 {
		t.Fatalf("rows: %d token, %d catalogue; want 2 and 2", len(res.Tokens), len(res.Catalog))
	}
	if own := res.Tokens[1]; own.Gets == 0 || own.Expired != 0 {
		t.Errorf("%s: %d Gets, %d expired tokens served; want Gets and none expired", own.Config, own.Gets, own.Expired)
	}
	full, reval := res.Catalog[0], res.Catalog[1]
	if reval.NotModified == 0 || full.NotModified != 0 || reval.Bytes >= full.Bytes {
		t.Errorf("catalogue: full reload %+v, revalidation %+v; want 304s only with Reload, and fewer bytes", full, reval)
	}
}

// Part e: a Get per id is a downstream call per id, one after another;
// GetMany without LoadMany makes as many calls, at once; with LoadMany the
// page is ⌈page / MaxBatch⌉ calls. Gets at once over a downstream that
// answers only LoadMany are a LoadMany call each; with a BatchWindow
// (docs/design.md rule 31) they share one: the page fills MaxBatch (the
// page) and goes out at once.
func TestNPlusOnePart(t *testing.T) {
	cfg := quick()
	res, err := runNPlusOne(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 6 {
		t.Fatalf("%d rows; want 6", len(res.Rows))
	}
	page := cfg.page
	for _, row := range res.Rows {
		if row.Values != page || row.Gets != uint64(page) || row.Rows != int64(page) {
			t.Errorf("%s: %d ids answered, Stats.Gets %d, %d rows read; want %d of each", row.Way, row.Values, row.Gets, row.Rows, page)
		}
		if int64(row.Loads) != row.Calls {
			t.Errorf("%s: Stats.Loads %d, downstream counted %d", row.Way, row.Loads, row.Calls)
		}
	}
	batches := (page + cfg.smallBatch - 1) / cfg.smallBatch
	for i, want := range []struct {
		calls, batchLoads, batchKeys, largest int
	}{
		{page, 0, 0, 1},
		{page, 0, 0, 1},
		{1, 1, page, page},
		{batches, batches, page, cfg.smallBatch},
	} {
		row := res.Rows[i]
		if row.Calls != int64(want.calls) || row.BatchLoads != uint64(want.batchLoads) ||
			row.BatchKeys != uint64(want.batchKeys) || row.LargestIn != want.largest {
			t.Errorf("%s: %d calls, %d LoadMany calls for %d keys, largest call %d; want %d, %d, %d, %d",
				row.Way, row.Calls, row.BatchLoads, row.BatchKeys, row.LargestIn,
				want.calls, want.batchLoads, want.batchKeys, want.largest)
		}
	}
	if alone := res.Rows[4]; alone.Calls != int64(page) || alone.ManyCalls != int64(page) || alone.BatchLoads != 0 || alone.LargestIn != 1 {
		t.Errorf("%s: %d calls, %d LoadMany, %d batches, largest %d; want %d LoadMany calls of 1 id, no batch", alone.Way,
			alone.Calls, alone.ManyCalls, alone.BatchLoads, alone.LargestIn, page)
	}
	// The window is long (quick's) and its MaxBatch is the page: it goes
	// out when the page's last Get joins it, however slow the machine is
	// to start the goroutines, and long before the window would end.
	if win := res.Rows[5]; win.Calls != 1 || win.ManyCalls != 1 || win.BatchLoads != 1 ||
		win.BatchKeys != uint64(page) || win.LargestIn != page || win.Window != cfg.window || win.Wall >= cfg.window {
		t.Errorf("%s: %d calls, %d LoadMany, %d batches of %d keys in all, largest %d, in %v; want 1 LoadMany call of the %d ids, sent when full, before the %v window ends",
			win.Way, win.Calls, win.ManyCalls, win.BatchLoads, win.BatchKeys, win.LargestIn, win.Wall, page, cfg.window)
	}
	oneByOne, concurrent, batched, small := res.Rows[0], res.Rows[1], res.Rows[2], res.Rows[3]
	if oneByOne.PeakCalls != 1 || batched.PeakCalls != 1 {
		t.Errorf("calls at once: %d one by one, %d with LoadMany; want 1 and 1", oneByOne.PeakCalls, batched.PeakCalls)
	}
	if concurrent.PeakCalls < 2 {
		t.Errorf("%s: at most %d call at once; the page's loads should overlap", concurrent.Way, concurrent.PeakCalls)
	}
	if small.PeakCalls < 1 || small.PeakCalls > batches {
		t.Errorf("%s: %d calls at once; want 1 to %d", small.Way, small.PeakCalls, batches)
	}
	// Wall time, loosely: one by one waits out every round trip in turn,
	// and a single LoadMany call waits out one.
	if floor := time.Duration(page) * cfg.roundTrip; oneByOne.Wall < floor {
		t.Errorf("one by one took %v; %d round trips in a row take at least %v", oneByOne.Wall, page, floor)
	}
	if batched.Wall >= oneByOne.Wall {
		t.Errorf("LoadMany took %v, one by one %v; want it faster", batched.Wall, oneByOne.Wall)
	}

	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"e. The N+1 problem", "GetMany, LoadMany, MaxBatch 25", "BatchWindow", "Stats.Loads matches"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := run([]string{"-only", "e", "-json"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var all results
	if err := json.Unmarshal(out.Bytes(), &all); err != nil {
		t.Fatalf("-json output: %v\n%s", err, out.String())
	}
	if all.A != nil || all.D != nil || all.E == nil || len(all.E.Rows) != 6 {
		t.Errorf("-only e -json: got %+v", all)
	}
}

// Part f: every Get of the storm is answered or failed, and the Loader's
// Stats reconcile with the downstream's count. Once the Loader applies
// Options.Limit (it reports a bound), the limited storms never call the
// downstream past its capacity (the adaptive bound's ceiling is that
// capacity): MaxLoads answers every Get, Adaptive all but the loads that
// waited past MaxWait on a loaded machine (at most 1%).
func TestStormPart(t *testing.T) {
	cfg := quick()
	res, err := runStorm(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 3 {
		t.Fatalf("%d rows; want 3", len(res.Rows))
	}
	for _, row := range res.Rows {
		if row.Gets != cfg.stormKeys || row.Stats.Gets != uint64(cfg.stormKeys) {
			t.Errorf("%s: %d Gets, Stats.Gets %d; want %d", row.Config, row.Gets, row.Stats.Gets, cfg.stormKeys)
		}
		if got := row.madeCalls(); got != uint64(row.Calls) {
			t.Errorf("%s: Stats say %d downstream calls (%+v), the downstream counted %d", row.Config, got, row.Stats, row.Calls)
		}
		if row.Peak < 1 || row.Wall <= 0 || row.P99 <= 0 || len(row.Trace) == 0 {
			t.Errorf("%s: peak %d, wall %v, p99 %v, %d trace points; want all measured", row.Config, row.Peak, row.Wall, row.P99, len(row.Trace))
		}
		if row.Limit == (flightcache.Limit{}) {
			if row.bounded() {
				t.Errorf("%s: the Loader reported a bound (Stats.LoadLimit) with no Options.Limit; want none", row.Config)
			}
			continue // no limit: nothing more to hold it to
		}
		if !row.bounded() {
			t.Errorf("%s: the Loader reported no bound during the storm (Stats.LoadLimit stayed 0); want Options.Limit applied", row.Config)
		}
		if row.Overloaded != 0 || row.Peak > cfg.stormCapacity {
			t.Errorf("%s: %d calls past capacity, %d at once; want none past %d", row.Config, row.Overloaded, row.Peak, cfg.stormCapacity)
		}
		switch failed := row.Gets - row.Answered; {
		case !row.Limit.Adaptive && (failed != 0 || row.Peak > row.Limit.MaxLoads):
			t.Errorf("%s: %d Gets failed, %d calls at once; want 0 and at most %d", row.Config, failed, row.Peak, row.Limit.MaxLoads)
		case row.Limit.Adaptive && (failed != row.Limited || failed*100 > row.Gets):
			t.Errorf("%s: %d of %d Gets failed (%d ErrLimited, %d ErrBreakerOpen; %d calls past capacity, peak %d); want at most 1%%",
				row.Config, failed, row.Gets, row.Limited, row.BreakerOpen, row.Overloaded, row.Peak)
		}
	}

	var out bytes.Buffer
	res.print(&out)
	for _, want := range []string{"f. A storm of many keys", "MaxLoads 50", "Adaptive, ceiling 100", "matches the calls the downstream counted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRestart(t *testing.T) {
	cfg := quick()
	cfg.restartKeys, cfg.restartWindow = 200, 200*time.Millisecond
	res, err := runRestart(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Saved != cfg.restartKeys || len(res.Rows) != 2 {
		t.Fatalf("saved %d entries, %d rows; want %d, 2", res.Saved, len(res.Rows), cfg.restartKeys)
	}
	cold, warm := res.Rows[0], res.Rows[1]
	if cold.Calls < 1 || cold.Calls > int64(cfg.restartKeys) || int64(cold.Loads) != cold.Calls {
		t.Errorf("cold start: %d downstream calls, %d loads; want 1 to %d, reconciled", cold.Calls, cold.Loads, cfg.restartKeys)
	}
	if warm.Restored != cfg.restartKeys || warm.Calls != 0 || warm.Misses != 0 || warm.Gets == 0 {
		t.Errorf("restored: %+v; want %d restored, Gets and no downstream call", warm, cfg.restartKeys)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// Part g: a warm restart. A process serves restartKeys keys and restarts.
// Before it stops it saves what its Loader holds (Loader.Entries, encoded
// with gob); the new process either starts cold, or restores the saved
// entries (Loader.Restore) before it serves. The same readers then ask
// for random keys for restartWindow, and the downstream counts its calls.

// restartRow is one way of starting the new process.
type restartRow struct {
	Way      string        `json:"way"`
	Restored int           `json:"restored"`          // entries Restore stored
	Calls    int64         `json:"service_calls"`     // downstream calls in the window
	Loads    uint64        `json:"loads"`             // Stats.Loads, to reconcile
	Gets     uint64        `json:"gets"`              // Stats.Gets in the window
	Misses   uint64        `json:"misses"`            // Stats.Misses: Gets that waited for a load
	Early    int64         `json:"first_100ms_calls"` // downstream calls in the window's first 100 ms
	Start    time.Duration `json:"start_ns"`          // decoding and Restore, before the first Get
}

// restartResult is part g.
type restartResult struct {
	Keys       int           `json:"keys"`
	Readers    int           `json:"readers"`
	Window     time.Duration `json:"window_ns"`
	Saved      int           `json:"saved"`       // entries Entries yielded at shutdown
	SavedBytes int           `json:"saved_bytes"` // their gob encoding
	Rows       []restartRow  `json:"rows"`
}

func runRestart(cfg config, p *progress) (*restartResult, error) {
	res := &restartResult{Keys: cfg.restartKeys, Readers: cfg.readers, Window: cfg.restartWindow}
	saved, n, err := warmAndSave(cfg, p)
	if err != nil {
		return nil, err
	}
	res.Saved, res.SavedBytes = n, len(saved)
	for _, restore := range []bool{false, true} {
		row, err := restartOnce(cfg, p, saved, restore)
		if err != nil {
			return nil, err
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// restartOpts is the Loader of both processes.
func restartOpts() flightcache.Options[string, string] {
	return flightcache.Options[string, string]{TTL: time.Minute, Jitter: 0.2, StaleWhileRevalidate: time.Minute}
}

// restartKey is the key of index i.
func restartKey(i int) string { return fmt.Sprintf("user:%d", i) }

// warmAndSave is the process before the restart: it loads every key, then,
// at shutdown, saves what its Loader holds with gob.
func warmAndSave(cfg config, p *progress) (saved []byte, n int, err error) {
	svc := &service{min: cfg.roundTrip, max: 2 * cfg.roundTrip}
	l, err := flightcache.New(svc.load, restartOpts())
	if err != nil {
		return nil, 0, err
	}
	defer l.Close()
	stop := p.start("g. warming the process before the restart", 0, l.Stats)
	ids := make(chan int)
	var wg sync.WaitGroup
	for range cfg.readers {
		wg.Go(func() {
			for i := range ids {
				l.Get(context.Background(), restartKey(i))
			}
		})
	}
	for i := range cfg.restartKeys {
		ids <- i
	}
	close(ids)
	wg.Wait()
	stop()
	var entries []flightcache.Entry[string, string]
	for en := range l.Entries() {
		entries = append(entries, en)
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(entries); err != nil {
		return nil, 0, fmt.Errorf("part g, saving: %w", err)
	}
	return buf.Bytes(), len(entries), l.Shutdown(context.Background())
}

// restartOnce is the process after the restart, cold or restored: readers
// ask for random keys for the window.
func restartOnce(cfg config, p *progress, saved []byte, restore bool) (restartRow, error) {
	row := restartRow{Way: "cold start"}
	svc := &service{min: cfg.roundTrip, max: 2 * cfg.roundTrip}
	l, err := flightcache.New(svc.load, restartOpts())
	if err != nil {
		return row, err
	}
	defer l.Close()
	t0 := time.Now()
	if restore {
		row.Way = "restored at start"
		var entries []flightcache.Entry[string, string]
		if err := gob.NewDecoder(bytes.NewReader(saved)).Decode(&entries); err != nil {
			return row, fmt.Errorf("part g, restoring: %w", err)
		}
		if row.Restored, err = l.Restore(slices.Values(entries)); err != nil {
			return row, fmt.Errorf("part g, restoring: %w", err)
		}
	}
	row.Start = time.Since(t0)
	stop := p.start("g. "+row.Way, cfg.restartWindow, l.Stats)
	row.Early = readRandom(l, svc, cfg)
	stop()
	// The readers are gone, but loads they started may still run (a Get
	// whose context ended leaves its load to finish): wait for them, so
	// that the Loader's count and the downstream's are of the same loads.
	if err := l.Shutdown(context.Background()); err != nil {
		return row, err
	}
	s := l.Stats()
	row.Calls, row.Loads, row.Gets, row.Misses = svc.calls.Load(), s.Loads, s.Gets, s.Misses
	return row, nil
}

// readRandom runs cfg.readers readers of random keys for the window, and
// returns the downstream calls of its first 100 ms.
func readRandom(l *flightcache.Loader[string, string], svc *service, cfg config) (early int64) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.restartWindow)
	defer cancel()
	var wg sync.WaitGroup
	for range cfg.readers {
		wg.Go(func() {
			for ctx.Err() == nil {
				l.Get(ctx, restartKey(rand.IntN(cfg.restartKeys)))
			}
		})
	}
	t := time.NewTimer(min(100*time.Millisecond, cfg.restartWindow))
	select {
	case <-t.C:
		early = svc.calls.Load()
	case <-ctx.Done():
		t.Stop()
		early = svc.calls.Load()
	}
	wg.Wait()
	return early
}

func (r *restartResult) print(w io.Writer) {
	fmt.Fprintf(w, "g. A warm restart: a process that served %d keys restarts; %d readers then ask for random keys\n",
		r.Keys, r.Readers)
	fmt.Fprintf(w, "   for %v. Saved at shutdown: %d entries (Loader.Entries), %d bytes of gob.\n", r.Window, r.Saved, r.SavedBytes)
	fmt.Fprintln(w)
	var rows [][]string
	for _, row := range r.Rows {
		rows = append(rows, []string{
			row.Way, fmt.Sprint(row.Restored), ms(row.Start), fmt.Sprint(row.Early),
			fmt.Sprint(row.Calls), fmt.Sprint(row.Misses), fmt.Sprint(row.Gets),
		})
	}
	table(w, "l", []string{"new process", "restored", "restore took", "calls, first 100 ms",
		"calls, whole window", "Gets that waited", "Gets"}, rows)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  calls are the downstream's own count; Gets that waited = Stats.Misses. A cold process calls")
	fmt.Fprintln(w, "  the downstream once for every key its readers ask for that it has not loaded yet, and its")
	fmt.Fprintln(w, "  readers wait for each; a restored one serves the saved values, each with the freshness it")
	fmt.Fprintln(w, "  had left, and calls nobody until they go stale.")
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/flightcache/flightcache"
)

// Part a: the figure of the single-flight guide. Identical requests for one
// cold key, against a 50 ms downstream: with no coordination each request
// is a downstream call; through a Loader, overlapping requests share one
// load, and a TTL cache absorbs the bursts that follow.

const (
	burstSize  = 100
	burstGap   = 50 * time.Millisecond
	burstLoad  = 50 * time.Millisecond
	burstCount = 3
)

// burstRow is one scenario of part a.
type burstRow struct {
	Scenario        string         `json:"scenario"`
	Requests        int            `json:"requests"`
	DownstreamCalls uint64         `json:"downstream_calls"`     // Stats.Loads; the service's own count for the baseline
	MaxCallers      uint64         `json:"max_callers_per_load"` // Stats.MaxCallersPerLoad
	Sources         map[string]int `json:"sources,omitempty"`    // Info.Source of every request
	ServiceCalls    int64          `json:"service_calls"`        // what the fake downstream counted, to reconcile
}

// coalesceResult is part a.
type coalesceResult struct {
	Rows []burstRow `json:"rows"`
}

func runCoalesce(p *progress) (*coalesceResult, error) {
	res := &coalesceResult{}

	// No coordination: every request calls the downstream itself. There is
	// no Loader here, so the count is the service's own.
	const name = "100 concurrent, no coordination"
	svc := &service{min: burstLoad, max: burstLoad}
	stop := p.start("a. "+name, burstLoad, func() flightcache.Stats { return flightcache.Stats{} })
	burst(burstSize, func() { svc.load(context.Background(), "u1") })
	stop()
	n := svc.calls.Load()
	res.Rows = append(res.Rows, burstRow{
		Scenario: name, Requests: burstSize,
		DownstreamCalls: uint64(n), ServiceCalls: n,
	})

	for _, sc := range []struct {
		name   string
		ttl    time.Duration
		bursts int
	}{
		{"100 concurrent, through a Loader", time.Minute, 1},
		{"3 bursts of 100, 50 ms apart, TTL 200 ms", 200 * time.Millisecond, burstCount},
		{"3 bursts of 100, 50 ms apart, TTL 10 ms", 10 * time.Millisecond, burstCount},
	} {
		row, err := loaderBursts(p, sc.name, sc.ttl, sc.bursts)
		if err != nil {
			return nil, err
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// loaderBursts sends bursts of identical requests through a fresh Loader,
// burstGap apart, and reads the outcome from its Stats and Infos.
func loaderBursts(p *progress, name string, ttl time.Duration, bursts int) (burstRow, error) {
	svc := &service{min: burstLoad, max: burstLoad}
	l, err := flightcache.New(svc.load, flightcache.Options[string, string]{TTL: ttl})
	if err != nil {
		return burstRow{}, err
	}

	var mu sync.Mutex
	sources := map[string]int{}
	stop := p.start("a. "+name, time.Duration(bursts)*(burstLoad+burstGap), l.Stats)
	for i := range bursts {
		if i > 0 {
			time.Sleep(burstGap)
		}
		burst(burstSize, func() {
			_, info, err := l.GetInfo(context.Background(), "u1")
			src := info.Source.String()
			if err != nil {
				src = "error"
			}
			mu.Lock()
			sources[src]++
			mu.Unlock()
		})
	}
	stop()
	l.Close() // every load has finished: the Stats below are final
	s := l.Stats()
	return burstRow{
		Scenario: name, Requests: bursts * burstSize,
		DownstreamCalls: s.Loads, MaxCallers: s.MaxCallersPerLoad,
		Sources: sources, ServiceCalls: svc.calls.Load(),
	}, nil
}

// burst runs n copies of f at once and waits for all of them.
func burst(n int, f func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			f()
		})
	}
	close(start)
	wg.Wait()
}

func (r *coalesceResult) print(w io.Writer) {
	fmt.Fprintln(w, "a. Downstream calls for identical requests (one key, a 50 ms downstream)")
	fmt.Fprintln(w)
	rows := [][]string{}
	reconciled := true
	for _, row := range r.Rows {
		answered, largest := "-", "-"
		if row.Sources != nil {
			answered, largest = sourceSummary(row.Sources), fmt.Sprint(row.MaxCallers)
		}
		rows = append(rows, []string{
			row.Scenario, fmt.Sprint(row.Requests), fmt.Sprint(row.DownstreamCalls),
			largest, answered,
		})
		reconciled = reconciled && int64(row.DownstreamCalls) == row.ServiceCalls
	}
	table(w, "lrrrl", []string{"scenario", "requests", "downstream calls", "largest load's callers", "answered as (Info.Source)"}, rows)
	fmt.Fprintln(w)
	if reconciled {
		fmt.Fprintln(w, "  Stats.Loads matches the calls the downstream itself counted, in every row.")
	} else {
		fmt.Fprintln(w, "  WARNING: Stats.Loads differs from the calls the downstream counted; see service_calls in -json.")
	}
	fmt.Fprintln(w, "  Coalescing removes the duplicates that overlap; the TTL removes the ones that follow.")
}

// sourceSummary renders counts of Info sources in a fixed order.
func sourceSummary(m map[string]int) string {
	var parts []string
	for _, s := range []string{"loaded", "shared", "hit", "stale", "stale-on-error", "none", "error"} {
		if m[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[s], s))
		}
	}
	return strings.Join(parts, ", ")
}

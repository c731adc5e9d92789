package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	flightredis "github.com/flightcache/flightcache/redis"
)

// row is one run's figures: a line of the table.
type row struct {
	procs, real, light int
	mode               string
	secs               float64
	writes, loads      float64 // achieved, per second
	realHeard          float64 // messages per real process per second (mean)
	lightMean          float64 // ... per light process per second
	lightMax           float64
	lightLost          int     // light connections Redis closed
	broadcasts         float64 // wake-up broadcasts (loaded-channel messages) per second
	wakeups            float64 // wake-ups the first real process heard per second
	masters            []string
	deliveries         []float64 // per master, per second (the fleet's listeners)
	cpu                []float64 // per master, % of a core
	cpuMain            bool      // cpu is the main thread's
	busPublishes       int64     // -1: not a Cluster
	drop               [3]time.Duration
	dropN, dropUnheard int
	tracking           string // tracking memory, or "—"
	coldKeys           int
	callsPerCold       float64
	mostPerCold        int
	coldCalls          int       // the downstream calls of the cold keys
	leases, localLoads uint64    // the real tiers' in the run: every downstream call is one or the other
	takeovers          uint64    // of leases, those taken from a holder that stopped beating
	redisErrors        uint64    // the real tiers' in the run
	tiers              string    // the real tiers' invalidation path, and their distrusts and re-arms in the run
	load1              [2]string // load average at start and end
	benchCPU           float64   // this process's CPU, % of a core
}

// figures works out a row from the readings before and after a run.
func (fl *fleet) figures(b, a reading, writes, loads int64) row {
	secs := a.at.Sub(b.at).Seconds()
	r := row{procs: len(fl.reals) + len(fl.light), real: len(fl.reals), light: len(fl.light),
		mode: fl.cfg.mode, secs: secs, writes: float64(writes) / secs, loads: float64(loads) / secs,
		wakeups: float64(a.wakeups-b.wakeups) / secs, broadcasts: float64(a.broadcasts-b.broadcasts) / secs, tracking: "—", load1: [2]string{b.load1, a.load1},
		cpuMain: true, busPublishes: -1, benchCPU: 100 * (a.cpu - b.cpu) / secs}
	perMaster := map[string]int64{}
	for i := range a.real {
		n := a.real[i] - b.real[i]
		r.realHeard += float64(n) / secs / float64(len(a.real))
		if fl.cfg.mode == "broadcast" {
			perMaster[fl.subNode] += n // the tier of before subscribed as broadcast does
		} // else the light processes' deliveries only: a real tier's are spread over the masters

	}
	for i, l := range fl.light {
		var heard int64
		for node, n := range a.light[i] {
			heard += n - b.light[i][node]
			perMaster[node] += n - b.light[i][node]
		}
		n := float64(heard) / secs
		r.lightMean += n / float64(len(fl.light))
		r.lightMax = max(r.lightMax, n)
		if l.Lost() {
			r.lightLost++
		}
	}
	r.masters = masters(a.nodes)
	for _, m := range r.masters {
		r.deliveries = append(r.deliveries, float64(perMaster[m])/secs)
		r.cpu = append(r.cpu, 100*(a.nodes[m].cpu-b.nodes[m].cpu)/secs)
		r.cpuMain = r.cpuMain && a.nodes[m].mainThread
	}
	for addr, n := range a.nodes {
		if n.busPublish >= 0 {
			r.busPublishes = max(r.busPublishes, 0) + n.busPublish - b.nodes[addr].busPublish
		}
	}
	if fl.cfg.mode == "tracking" {
		r.tracking = fl.memory.String(int64(len(fl.light)) * int64(min(fl.cfg.entries, len(fl.universe))))
	}
	r.tiers = tierSummary(b.tiers, a.tiers)
	r.drop, r.dropN, r.dropUnheard = fl.drops.result()
	r.coldKeys, r.callsPerCold, r.mostPerCold, r.coldCalls = fl.down.perKey()
	for i := range a.tiers {
		r.leases += a.tiers[i].Leases - b.tiers[i].Leases
		r.localLoads += a.tiers[i].LocalLoads - b.tiers[i].LocalLoads
		r.takeovers += a.tiers[i].Takeovers - b.tiers[i].Takeovers
		r.redisErrors += a.tiers[i].RedisErrors - b.tiers[i].RedisErrors
	}
	return r
}

// header prints the table's header.
func header(w io.Writer) {
	fmt.Fprintln(w, "| P (real+light) | mode | writes/s, loads/s achieved | msgs heard /proc/s: real; light mean / max (lost) | wake-up broadcasts/s; per-key wake-ups a real process heard /s | deliveries/s per master | main-thread CPU % per master (max/mean) | cluster-bus publishes | Invalidate→last holder's drop p50 / p90 / p99 (timed, unheard) | tracking memory | real tiers: invalidations by; distrusts, re-arms, subscription losses | downstream calls per cold key (most) | load avg start→end; benchmark's CPU % |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
}

// print prints r as a line of the table.
func (r row) print(w io.Writer) {
	cpuName := "main thread"
	if !r.cpuMain {
		cpuName = "whole process"
	}
	bus := "n/a (one node)"
	if r.busPublishes >= 0 {
		bus = fmt.Sprint(r.busPublishes)
	}
	fmt.Fprintf(w, "| %d (%d+%d) | %s | %.0f, %.0f | %.0f; %.0f / %.0f (%d) | %.0f; %.0f | %s | %s (%s, %.1f×) | %s | %s / %s / %s (%d, %d) | %s | %s | %.2f (%d) over %d keys | %s→%s; %.0f |\n",
		r.procs, r.real, r.light, r.mode, r.writes, r.loads, r.realHeard, r.lightMean, r.lightMax, r.lightLost,
		r.broadcasts, r.wakeups, join(r.deliveries, "%.0f"), join(r.cpu, "%.1f"), cpuName, maxOverMean(r.cpu), bus,
		ms(r.drop[0]), ms(r.drop[1]), ms(r.drop[2]), r.dropN, r.dropUnheard, r.tracking, r.tiers,
		r.callsPerCold, r.mostPerCold, r.coldKeys, r.load1[0], r.load1[1], r.benchCPU)
}

func join(vs []float64, format string) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(s, " / ")
}

func maxOverMean(vs []float64) float64 {
	var sum, most float64
	for _, v := range vs {
		sum += v
		most = max(most, v)
	}
	if sum == 0 {
		return 0
	}
	return most / (sum / float64(len(vs)))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond)) }

// tierSummary gives the real tiers' invalidation path (each tier's
// Stats.Invalidations, "—" before it is known) and, summed over them,
// what they counted during the run: distrusts of every copy, tracking
// re-arms and subscription losses.
func tierSummary(b, a []flightredis.Stats) string {
	paths := map[string]bool{}
	var distrusts, rearms, losses uint64
	for i := range a {
		paths[cmp.Or(a[i].Invalidations, "—")] = true
		distrusts += a[i].Distrusts - b[i].Distrusts
		rearms += a[i].Rearms - b[i].Rearms
		losses += a[i].SubscriptionLosses - b[i].SubscriptionLosses
	}
	return fmt.Sprintf("%s; %d, %d, %d", strings.Join(slices.Sorted(maps.Keys(paths)), "+"), distrusts, rearms, losses)
}

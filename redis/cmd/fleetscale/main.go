// Command fleetscale measures what the Redis tier's messaging costs a
// fleet of P processes: how many messages each process hears, how many
// deliveries and how much CPU each master spends on them, what crosses
// the cluster bus, and how long an Invalidate takes to reach the last
// process that holds the key.
//
//	go run ./cmd/fleetscale -cluster "$REDIS_CLUSTER" -procs 10,100,1000 -writes 1000 -loads 1000 -for 10s
//	go run ./cmd/fleetscale -redis 127.0.0.1:6379 -procs 100
//
// -redis names one Redis node (default $REDIS_ADDR); -cluster names the
// nodes of a Redis Cluster, comma-separated (default $REDIS_CLUSTER). A
// flag given on the command line wins over the environment; giving both
// is an error.
//
// # The fleet
//
// A run of P processes has -real of them real (3 by default), in this
// process: each a flightcache.Loader on a flightredis.Tier with its own
// Redis client, on one Prefix. Before the run, a process of its own loads
// every one of the fleet's -keys keys (100,000 by default), so each has a
// shared entry, and is closed; the other real holders then hold the first
// -entries of them (read before the run). The first real process drives
// the fleet's traffic: R (-writes) Sets and Invalidates per second, half
// each, of the fleet's keys in a fixed shuffled order (so about
// entries/keys of them are of keys the holders hold, and those are
// timed); and L (-loads) cold loads per second, each a Get of a new key
// by every real process at once (a fake downstream counts the calls per
// key: the tier should make it 1). Both are paced on a 2ms ticker, with
// 64 workers each; the achieved rates are printed.
//
// The other P−real processes are light: raw connections that listen as
// a process's tier would (-mode), and count what they hear by matching
// the messages' RESP encoding in what they read, without parsing, so
// that a thousand of them fit on two cores. -mode broadcast is the tier
// before per-key wake-ups and tracking: SUBSCRIBE to <Prefix>loaded and
// <Prefix>invalidated, on the master go-redis would choose (that of
// <Prefix>loaded's slot). -mode tracking is the tier with CLIENT
// TRACKING: each light process holds -entries of the fleet's keys, drawn
// at random, read once after CLIENT CACHING yes on a RESP3 connection
// with tracking on (one per master that holds some), and hears an
// invalidation push when one of them is written. -mode sharded is the
// tier where tracking is refused: SSUBSCRIBE to the tier's sharded
// invalidation channels, on each master that holds some (SUBSCRIBE on
// one node). A light process never loads, so it never waits for a
// per-key wake-up.
//
// # The figures
//
// Each run prints a markdown table line: messages heard per process per
// second (the real processes', every pub/sub message and invalidation
// push counted on their clients' connections, and the light ones' mean
// and max); wake-up broadcasts per second (<Prefix>loaded's messages a
// real process heard) and the per-key wake-ups the first real process's
// tier heard (Stats.WakeupsHeard: only while it waits on the key);
// deliveries per master per second (what the light processes'
// connections on it heard, and in broadcast mode the real processes'
// too, all on the one master they subscribe on); main-thread CPU per master (the delta of INFO cpu's
// used_cpu_{sys,user}_main_thread over the run, or of used_cpu_{sys,user}
// when a server lacks them, which the line says); cluster-bus publishes
// (the delta of CLUSTER INFO's cluster_stats_messages_publish_sent,
// summed over every node: classic PUBLISH only, a sharded one stays in
// its shard); the time from a write's call to the drop of the key's copy
// by the last holder that held it (a holder's
// flightcache.EvictionObserver sees the drop, with cause invalidated, on
// the goroutine that drops it); in tracking mode, what the light
// processes' tracking added to Redis's used_memory (the largest master's
// growth, and the growth per key and process over the fleet); the real
// tiers' invalidation path (Stats.Invalidations) and the distrusts,
// tracking re-arms and subscription losses they counted in the run; and
// the cold keys' downstream calls.
//
// # What the OS needs
//
// One file descriptor per light process, and a few per real one: about
// P + 100. fleetscale raises its soft RLIMIT_NOFILE to the hard limit;
// if that is below, raise the hard limit (ulimit -Hn, limits.conf). Redis
// must accept P clients (maxclients, 10,000 by default) and, in broadcast
// mode at large P, keep up: a light process Redis finds too slow (its
// client output buffer limit for pub/sub) is disconnected and counted as
// lost.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err == nil {
		raiseFileLimit()
		_, err = run(context.Background(), cfg, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetscale:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("fleetscale", flag.ContinueOnError)
	addr := fs.String("redis", os.Getenv("REDIS_ADDR"), "Redis address `host:port` (default $REDIS_ADDR)")
	cluster := fs.String("cluster", os.Getenv("REDIS_CLUSTER"), "Redis Cluster node addresses, `host:port,...` (default $REDIS_CLUSTER)")
	procs := fs.String("procs", "10,100,1000", "processes P of each run, comma-separated")
	cfg := config{}
	fs.StringVar(&cfg.mode, "mode", "broadcast", "how the light processes listen: broadcast, tracking or sharded")
	fs.IntVar(&cfg.real, "real", 3, "real processes per run (one drives, the others hold keys)")
	fs.IntVar(&cfg.writes, "writes", 1000, "Sets+Invalidates per second across the fleet (R)")
	fs.IntVar(&cfg.loads, "loads", 1000, "cold loads per second across the fleet (L)")
	fs.IntVar(&cfg.entries, "entries", 10000, "entries each holding process holds")
	fs.IntVar(&cfg.keys, "keys", 100000, "the fleet's keys: the writes go over them in turn, and each process holds -entries of them")
	fs.DurationVar(&cfg.dur, "for", 10*time.Second, "measured time of each run")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case set["redis"] && set["cluster"]:
		return cfg, fmt.Errorf("give -redis or -cluster, not both")
	case *cluster != "" && !set["redis"]:
		cfg.tgt.cluster = strings.Split(*cluster, ",")
	case *addr != "":
		cfg.tgt.addr = *addr
	default:
		return cfg, fmt.Errorf("give -redis host:port or -cluster host:port,... (or set REDIS_ADDR or REDIS_CLUSTER)")
	}
	for _, s := range strings.Split(*procs, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || p < 1 {
			return cfg, fmt.Errorf("-procs: %q is not a process count", s)
		}
		cfg.procs = append(cfg.procs, p)
	}
	return cfg, cfg.check()
}

func (c config) check() error {
	switch {
	case modes[c.mode] == nil:
		return fmt.Errorf("-mode %q: not one of %s", c.mode, strings.Join(slices.Sorted(maps.Keys(modes)), ", "))
	case c.real < 1 || c.entries < 1 || c.keys < 1 || c.writes < 0 || c.loads < 0 || c.dur <= 0:
		return fmt.Errorf("-real and -entries must be >= 1, -writes and -loads >= 0, -for > 0")
	}
	return nil
}

// run measures one run per entry of cfg.procs, printing the table as it
// goes, and returns the rows.
func run(ctx context.Context, cfg config, w io.Writer) ([]row, error) {
	admin := cfg.tgt.client(nil)
	defer admin.Close()
	fmt.Fprintf(w, "R = %d writes/s, L = %d cold loads/s, %d entries per holder, %v per run, on %v\n\n",
		cfg.writes, cfg.loads, cfg.entries, cfg.dur, cfg.tgt)
	header(w)
	var rows []row
	for _, p := range cfg.procs {
		r, err := runOne(ctx, cfg, admin, p)
		if err != nil {
			return rows, fmt.Errorf("P = %d: %w", p, err)
		}
		r.print(w)
		rows = append(rows, r)
	}
	return rows, nil
}

// runOne sets up a fleet of procs processes, measures it for cfg.dur,
// and tears it down.
func runOne(ctx context.Context, cfg config, admin redis.UniversalClient, procs int) (row, error) {
	setup, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	fl, err := newFleet(setup, cfg, admin, procs)
	if err != nil {
		return row{}, err
	}
	defer fl.close()
	time.Sleep(200 * time.Millisecond) // let the subscriptions settle
	before, err := fl.read(ctx)
	if err != nil {
		return row{}, err
	}
	drive, stop := context.WithTimeout(ctx, cfg.dur)
	writes, loads := fl.drive(drive)
	stop()
	after, err := fl.read(ctx)
	if err != nil {
		return row{}, err
	}
	time.Sleep(time.Second) // the last writes' drops
	return fl.figures(before, after, writes, loads), nil
}

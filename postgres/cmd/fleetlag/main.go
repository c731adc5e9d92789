// Command fleetlag measures how a fleet of processes, each a
// flightcache.Loader on the Redis tier, follows rows that an outside
// writer changes in PostgreSQL, with one process reading the change
// stream (a flightpg Source on its Loader), and what that costs.
//
//	go run ./cmd/fleetlag -mode fleet -n 10000 -rate 1000            # commit -> last process stops serving the old row
//	go run ./cmd/fleetlag -mode fleet -n 10000 -rate 1000 -control   # the same without the Source
//	go run ./cmd/fleetlag -mode restart -down 30s -changed 1000      # a process down, restarted warm
//	go run ./cmd/fleetlag -mode restart -down 30s -changed 1000 -control
//	go run ./cmd/fleetlag -mode pgrestart -n 10000 -rate 1000        # PostgreSQL restarted mid-stream
//	go run ./cmd/fleetlag -mode bulk -rows 100000                    # a bulk UPDATE of every row
//
// -url names the server (default $PG_URL; the user needs REPLICATION),
// -redis the Redis (default $REDIS_ADDR). Run from the module's
// directory: -mode pgrestart runs `bash testdata/start-postgres.sh
// restart URL` (-pgctl), so the server must be one that script started.
//
// # The fleet
//
// fleetlag makes a table of -rows rows (id int8 primary key, ver int8)
// and a publication of it, then starts -procs processes (itself,
// re-executed; 3 by default). Each is a Loader of the rows (key the id,
// value the ver column, loaded with a plain SELECT on a pgx pool, TTL
// -ttl) on a flightredis.Tier over one Redis and Prefix, with -readers
// readers (16) that Get a row drawn at random, -reads times a second
// each (200), and record what each Get returned and when it started.
// One process (the first; a flag chooses it today, a lease in Redis
// will) runs a flightpg.Source on its Loader, on a permanent slot: its
// Invalidates reach the other processes through the tier. With -control
// no process does: today's behaviour, each copy served until its TTL.
// Every process first Gets every row, so that each holds them all.
//
// The outside writer is plain pgx (4 connections): update k sets row
// k mod rows + 1 to version k / rows + 2, paced at -rate a second (a
// row's updates go in order, on one connection), each timed from its
// commit's return.
//
// # The figures
//
//   - Commit -> the last process stops serving the old row: each
//     process records when its Loader drops a copy because of an
//     invalidation (an EvictionObserver, on the goroutine that drops it),
//     and the consumer when its Invalidate of each update began and
//     returned (the shared entry is gone then); an update's time is the
//     later of that return and each process's first drop of the row
//     after the Invalidate began (before the row's next one), from the
//     commit's return. p50, p99 and max over the updates.
//   - Reads older than the row's last commit once that commit's p99 has
//     passed: every read a reader made whose Get started more than the
//     p99 above (with -control, 50 ms, the target; -after sets it) after
//     a commit of the row and returned a version before it; also counted
//     once the max, and once 50 ms, had passed.
//   - CPU: the consuming process's CPU less the mean of the others' (the
//     same readers, no Source), per 1,000 changes; the walsender's (its
//     pid from pg_stat_replication) and the backend of the Source's
//     visibility queries, from /proc/<pid>/stat, when the server runs on
//     this machine. And the machine's load average.
//
// -mode restart: the last process, after the fleet warmed, creates a
// permanent slot of its own and reads the server's position; once the
// consumer has caught up to it (and 200 ms more, for the tier's
// invalidations to reach the process), it saves that position and its
// Loader's Entries and exits. -changed rows then change, paced over
// -down; the process starts again, restores the entries, resumes its
// slot from the saved position (Options.Resume), CatchUp, closes that
// Source, and only then Gets every row: the changed rows served old are
// counted (with -control it restores without the catch-up).
//
// -mode pgrestart is -mode fleet with PostgreSQL restarted (fast
// shutdown) at the middle of the updates; the writer retries its
// updates until they commit, and the consumer checks that its Mapping
// saw every update: 0 skipped.
//
// -mode bulk: the fleet holds -rows rows (100,000); one UPDATE changes
// them all while single-row updates of a side table go on at -rate. It
// prints the consumer's heap growth over its baseline (sampled every 2
// ms: the heap's objects, live and not yet swept, and the heap live at
// the end of each GC), the time from the UPDATE's commit to applied, the
// time until every transaction's lag is under 50 ms again, and the rows
// each process serves old after it (and 10 s later, when some were).
//
// -cpuprofile dir writes each process's CPU profile while its readers
// run, and in -mode bulk the consumer's allocation profile, to dir.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// config is one invocation's flags: the parent's, and those it passes on
// to the processes it starts.
type config struct {
	url, redis string
	mode       string
	n, rate    int
	rows       int
	procs      int
	readers    int
	reads      int // Gets a second per reader
	ttl        time.Duration
	control    bool
	after      time.Duration
	down       time.Duration
	changed    int
	pgctl      string
	profile    string

	// a process of the fleet's (set by the parent)
	child           int
	prefix, table   string
	pub, slot       string
	ownSlot, dir    string
	consume, record bool
	restore         string
	catchup         bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err == nil {
		if cfg.child >= 0 {
			err = runChild(cfg)
		} else {
			err = run(cfg)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetlag:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("fleetlag", flag.ContinueOnError)
	fs.StringVar(&cfg.url, "url", os.Getenv("PG_URL"), "the PostgreSQL server (default $PG_URL); the user needs REPLICATION")
	fs.StringVar(&cfg.redis, "redis", os.Getenv("REDIS_ADDR"), "Redis `host:port` (default $REDIS_ADDR)")
	fs.StringVar(&cfg.mode, "mode", "fleet", "fleet, restart, pgrestart or bulk")
	fs.IntVar(&cfg.n, "n", 10000, "updates by the outside writer (fleet, pgrestart)")
	fs.IntVar(&cfg.rate, "rate", 1000, "updates a second")
	fs.IntVar(&cfg.rows, "rows", 0, "rows of the table (default 1,000; 2 x -changed for restart; 100,000 for bulk)")
	fs.IntVar(&cfg.procs, "procs", 3, "processes of the fleet")
	fs.IntVar(&cfg.readers, "readers", 16, "readers per process")
	fs.IntVar(&cfg.reads, "reads", 200, "Gets a second per reader")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Minute, "the Loaders' TTL")
	fs.BoolVar(&cfg.control, "control", false, "the control: no Source (fleet), no catch-up (restart)")
	fs.DurationVar(&cfg.after, "after", 0, "count reads older than the last commit this long after it (default the p99 measured; 50ms with -control)")
	fs.DurationVar(&cfg.down, "down", 30*time.Second, "how long the process is down (restart)")
	fs.IntVar(&cfg.changed, "changed", 1000, "rows changed while it is down (restart)")
	fs.StringVar(&cfg.pgctl, "pgctl", "testdata/start-postgres.sh", "the script that restarts PostgreSQL (pgrestart)")
	fs.StringVar(&cfg.profile, "cpuprofile", "", "write each process's CPU profile, while its readers run, to `dir`/cpu.<process>")
	fs.IntVar(&cfg.child, "child", -1, "internal: run as process i of the fleet")
	fs.StringVar(&cfg.prefix, "prefix", "", "internal")
	fs.StringVar(&cfg.table, "table", "", "internal")
	fs.StringVar(&cfg.pub, "pub", "", "internal")
	fs.StringVar(&cfg.slot, "slot", "", "internal")
	fs.StringVar(&cfg.ownSlot, "ownslot", "", "internal")
	fs.StringVar(&cfg.dir, "dir", "", "internal")
	fs.BoolVar(&cfg.consume, "consume", false, "internal")
	fs.BoolVar(&cfg.record, "record", false, "internal")
	fs.StringVar(&cfg.restore, "restore", "", "internal")
	fs.BoolVar(&cfg.catchup, "catchup", false, "internal")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.rows == 0 {
		switch cfg.mode {
		case "restart":
			cfg.rows = 2 * cfg.changed
		case "bulk":
			cfg.rows = 100000
		default:
			cfg.rows = 1000
		}
	}
	switch {
	case cfg.url == "" || cfg.redis == "":
		return cfg, fmt.Errorf("need -url (or $PG_URL) and -redis (or $REDIS_ADDR)")
	case cfg.mode != "fleet" && cfg.mode != "restart" && cfg.mode != "pgrestart" && cfg.mode != "bulk":
		return cfg, fmt.Errorf("-mode %q: not fleet, restart, pgrestart or bulk", cfg.mode)
	case cfg.n < 1 || cfg.rate < 1 || cfg.rows < 1 || cfg.procs < 2 || cfg.readers < 1 || cfg.reads < 1:
		return cfg, fmt.Errorf("-n, -rate, -rows, -readers and -reads must be >= 1, -procs >= 2")
	case cfg.mode == "restart" && (cfg.changed < 1 || cfg.changed > cfg.rows || cfg.down <= 0):
		return cfg, fmt.Errorf("-changed must be 1 to -rows, -down > 0")
	}
	return cfg, nil
}

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/redis/go-redis/v9"
)

// config is one invocation's flags.
type config struct {
	tgt     target
	procs   []int         // P of each run
	mode    string        // how the light processes listen (modes)
	real    int           // real processes per run, at most P
	writes  int           // Sets+Invalidates per second across the fleet
	loads   int           // cold loads per second across the fleet
	entries int           // keys each holder holds
	keys    int           // the fleet's keys, which the writes go over
	dur     time.Duration // each run's measured time
}

// fleet is one run: P processes on one Prefix, real and light.
type fleet struct {
	cfg                 config
	tgt                 target
	admin               redis.UniversalClient // reads the nodes' stats
	prefix              string
	loaded, invalidated string // the tier's channels (tier.go)
	subNode             string // where go-redis subscribes to them
	down                *downstream
	drops               *dropClock
	universe            []string     // the fleet's keys
	order               []int        // the writes go over universe in this order, a fixed shuffle
	held                []string     // the keys the real holders hold: the first of universe
	slots               []string     // slot → master on a Cluster; nil for one node
	lights              atomic.Int64 // light processes opened: seeds their keys
	memory              memoryUse    // what the light processes' listening cost Redis
	reals               []*realProc  // [0] drives; the others hold
	light               []listener
}

// newFleet starts a run's real processes, has the holders hold their
// keys, then opens the light processes' listening.
func newFleet(ctx context.Context, cfg config, admin redis.UniversalClient, procs int) (fl *fleet, err error) {
	prefix := fmt.Sprintf("fleetscale:%d:%d:", os.Getpid(), time.Now().UnixNano())
	fl = &fleet{cfg: cfg, tgt: cfg.tgt, admin: admin, prefix: prefix,
		loaded: prefix + "loaded", invalidated: prefix + "invalidated",
		down: &downstream{cold: map[string]int{}}, drops: newDropClock()}
	defer func() {
		if err != nil {
			fl.close()
		}
	}()
	if fl.subNode, err = subscriptionNode(ctx, admin, fl.loaded); err != nil {
		return fl, err
	}
	if fl.slots, err = slotMasters(ctx, admin); err != nil {
		return fl, err
	}
	for i := range max(cfg.keys, cfg.entries) {
		fl.universe = append(fl.universe, "h:"+strconv.Itoa(i))
	}
	fl.held = fl.universe[:cfg.entries]
	fl.order = rand.New(rand.NewPCG(1, 2)).Perm(len(fl.universe))
	if err := fl.populate(ctx); err != nil {
		return fl, err
	}
	for i := range min(cfg.real, procs) {
		p, err := newReal(ctx, fl, i > 0)
		if err != nil {
			return fl, err
		}
		fl.reals = append(fl.reals, p)
		if i > 0 {
			if err := p.warm(ctx, fl.held); err != nil {
				return fl, err
			}
		}
	}
	before, err := snapshot(ctx, admin)
	if err != nil {
		return fl, err
	}
	if fl.light, err = openListeners(ctx, modes[cfg.mode], fl, procs-len(fl.reals)); err != nil {
		return fl, err
	}
	after, err := snapshot(ctx, admin)
	fl.memory = memoryOf(before, after)
	return fl, err
}

// populate has every key of the fleet's universe shared in Redis, so a
// write of any changes an entry that exists: a process of its own loads
// them all, and is closed.
func (fl *fleet) populate(ctx context.Context) error {
	p, err := newReal(ctx, fl, false)
	if err != nil {
		return err
	}
	defer p.close()
	return p.warm(ctx, fl.universe)
}

// close stops every process of the run and deletes its keys.
func (fl *fleet) close() {
	closeListeners(fl.light)
	for _, p := range fl.reals {
		p.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deletePrefix(ctx, fl.admin, fl.prefix)
}

// drive runs the fleet's traffic until ctx ends and returns the writes
// and cold loads made.
func (fl *fleet) drive(ctx context.Context) (writes, loads int64) {
	var wg sync.WaitGroup
	wg.Go(func() { writes = pace(ctx, fl.cfg.writes, 64, fl.write) })
	wg.Go(func() { loads = pace(ctx, fl.cfg.loads, 64, fl.coldLoad) })
	wg.Wait()
	return writes, loads
}

// write is the i-th write of the run, by the driving process: a Set
// (even i) or an Invalidate (odd i) of one of the fleet's keys, in a
// fixed shuffled order (the first -entries keys are those the real
// holders hold, so about entries/keys of the writes are timed). It
// is timed until every holder that holds the key (Peek) has dropped it.
func (fl *fleet) write(i int) {
	key := fl.universe[fl.order[i%len(fl.order)]]
	holders := 0
	for _, p := range fl.reals[1:] {
		if _, _, ok := p.l.Peek(key); ok {
			holders++
		}
	}
	if holders > 0 {
		fl.drops.expect(key, holders, time.Now())
	}
	if i%2 == 0 {
		fl.reals[0].l.Set(key, "s:"+strconv.Itoa(i))
	} else {
		fl.reals[0].l.Invalidate(key)
	}
}

// coldLoad is the i-th cold load of the run: every real process Gets a
// key nobody has loaded, at once; the tier should call the downstream
// once for all of them.
func (fl *fleet) coldLoad(i int) {
	key := "c:" + strconv.Itoa(i)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, p := range fl.reals {
		wg.Go(func() { _, _ = p.l.Get(ctx, key) })
	}
	wg.Wait()
}

// reading is what the fleet and its Redis have counted at one moment.
type reading struct {
	at         time.Time
	nodes      map[string]nodeStats
	real       []int64             // messages each real process heard
	broadcasts int64               // loaded-channel messages the first real process heard (wake-up broadcasts)
	wakeups    int64               // wake-ups the first real process heard (its tier's Stats.WakeupsHeard)
	tiers      []flightredis.Stats // the real processes' tiers
	light      []map[string]int64  // messages each light process heard, per master
	load1      string              // the machine's load average over the last minute
	cpu        float64             // seconds of CPU this benchmark process has used
}

func (fl *fleet) read(ctx context.Context) (r reading, err error) {
	r.at = time.Now()
	r.cpu = cpuSeconds()
	for _, p := range fl.reals {
		r.real = append(r.real, p.heard.total())
	}
	r.broadcasts = fl.reals[0].heard.msgs[0].Load()
	for _, p := range fl.reals {
		r.tiers = append(r.tiers, p.tier.Stats())
	}
	r.wakeups = int64(fl.reals[0].tier.Stats().WakeupsHeard)
	for _, l := range fl.light {
		heard := map[string]int64{}
		l.Heard(func(node string, n int64) { heard[node] += n })
		r.light = append(r.light, heard)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.load1, _, _ = strings.Cut(string(b), " ")
	}
	r.nodes, err = snapshot(ctx, fl.admin)
	return r, err
}

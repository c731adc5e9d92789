package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
	flightpg "github.com/flightcache/flightcache/postgres"
	"github.com/flightcache/flightcache/postgres/internal/cputime"
	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// proc is one process of the fleet: a Loader of the table's rows (key the
// row id, value its ver column) on the Redis tier, its readers, and, when
// it consumes, a flightpg Source on its Loader.
type proc struct {
	cfg   config
	pool  *pgxpool.Pool
	rdb   *redis.Client
	tier  *flightredis.Tier[int64, int64]
	l     *flightcache.Loader[int64, int64]
	src   *flightpg.Source[int64]
	loads atomic.Int64 // downstream (PostgreSQL) loads made here

	invalidating  atomic.Int64 // time the Source's Invalidate calls took, in all
	invalidations atomic.Int64

	dropMu sync.Mutex
	drops  []record // when each copy was dropped by an invalidation

	seenMu  sync.Mutex
	seen    map[[2]int64]bool // (row, ver) the Source's Mapping was given
	lastVer map[int64]int64   // the last ver the Mapping was given for each row
	invals  []inval           // each Invalidate the Source made, of a row of the table
	applied []appliedTx       // each transaction the Source applied

	readers  sync.WaitGroup
	stop     context.CancelFunc
	reads    [][]record // each reader's reads
	readErrs atomic.Int64
	cpu0     time.Duration // CPU used when the readers started
	profile  *os.File      // the CPU profile being written, or nil

	heapBase, heapPeak atomic.Uint64 // the heap's objects, live and not yet swept
	liveBase, livePeak atomic.Uint64 // the heap live at the end of each GC
	heapStop           chan struct{}
}

// record is one read (row, the ver it returned, when the Get started) or
// one drop (row, 0, when), as written to the files the parent reads.
type record struct {
	Row, Ver int32
	At       int64 // unix nanoseconds
}

// inval is one Invalidate the consumer's Source made: the row, the
// version its change carried, when the call began and returned (unix
// nanoseconds).
type inval struct {
	Row, Ver   int32
	Start, End int64
}

// appliedTx is one transaction the consumer applied.
type appliedTx struct {
	Commit int64         `json:"commit"` // unix nanoseconds, the server's clock
	Lag    time.Duration `json:"lag"`
	Keys   int           `json:"keys"`
}

// reply is what a process answers to a command, as one JSON line.
type reply struct {
	Err      string          `json:"err,omitempty"`
	LSN      flightpg.LSN    `json:"lsn,omitempty"`
	Reads    int             `json:"reads,omitempty"`
	ReadErrs int64           `json:"readErrs,omitempty"`
	Loads    int64           `json:"loads,omitempty"`
	CPU      time.Duration   `json:"cpu,omitempty"`
	Old      int             `json:"old,omitempty"`
	Checked  int             `json:"checked,omitempty"`
	Missing  int             `json:"missing,omitempty"`
	Seen     int             `json:"seen,omitempty"`
	Restored int             `json:"restored,omitempty"`
	CaughtUp time.Duration   `json:"caughtUp,omitempty"`
	Stats    *flightpg.Stats `json:"stats,omitempty"`
	HeapBase uint64          `json:"heapBase,omitempty"`
	HeapPeak uint64          `json:"heapPeak,omitempty"`
	LiveBase uint64          `json:"liveBase,omitempty"`
	LivePeak uint64          `json:"livePeak,omitempty"`
	Applied  []appliedTx     `json:"applied,omitempty"`

	Held          int           `json:"held,omitempty"`
	Tier          string        `json:"tier,omitempty"`
	Invalidations int64         `json:"invalidations,omitempty"`
	Invalidating  time.Duration `json:"invalidating,omitempty"`
}

// snapshot is what a process saves at a warm shutdown.
type snapshot struct {
	LSN     flightpg.LSN
	Entries []flightcache.Entry[int64, int64]
}

// runChild is a process of the fleet: it starts, says "ready" (or its
// error) on stdout, then answers the commands read from stdin, one a
// line, until EOF.
func runChild(cfg config) error {
	time.AfterFunc(time.Hour, func() { os.Exit(3) }) // a parent gone without closing the pipe
	ctx := context.Background()
	p := &proc{cfg: cfg, seen: map[[2]int64]bool{}, lastVer: map[int64]int64{}}
	out := json.NewEncoder(os.Stdout)
	r, err := p.start(ctx)
	if err != nil {
		r.Err = err.Error()
	}
	_ = out.Encode(r)
	if err != nil {
		p.close()
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		r, err := p.command(ctx, f)
		if err != nil {
			r.Err = err.Error()
		}
		_ = out.Encode(r)
		if f[0] == "snapshot" && err == nil {
			break // the warm shutdown: this process is down
		}
	}
	p.close()
	return nil
}

func (p *proc) start(ctx context.Context) (r reply, err error) {
	cfg := p.cfg
	if p.pool, err = pgxpool.New(ctx, cfg.url); err != nil {
		return r, err
	}
	p.rdb = redis.NewClient(&redis.Options{Addr: cfg.redis, ContextTimeoutEnabled: true,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	if p.tier, err = flightredis.NewTier(p.rdb, flightredis.Options[int64, int64]{Prefix: cfg.prefix}); err != nil {
		return r, err
	}
	load := func(ctx context.Context, id int64) (int64, error) {
		p.loads.Add(1)
		var ver int64
		err := p.pool.QueryRow(ctx, "SELECT ver FROM "+cfg.table+" WHERE id = $1", id).Scan(&ver)
		return ver, err
	}
	if p.l, err = flightcache.New(load, flightcache.Options[int64, int64]{
		TTL:         cfg.ttl,
		MaxCost:     int64(2*cfg.rows + 10000),
		LoadTimeout: 5 * time.Second,
		Remote:      p.tier,
		Observer:    dropObserver{p},
	}); err != nil {
		return r, err
	}
	deadline := time.Now().Add(time.Minute)
	for !p.tier.Stats().Listening {
		if time.Now().After(deadline) {
			return r, errors.New("the tier did not subscribe")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if cfg.restore != "" {
		if err := p.restore(ctx, &r); err != nil {
			return r, err
		}
	}
	if consumes(cfg) {
		if p.src, err = p.newSource(ctx, cfg.slot, 0); err != nil {
			return r, err
		}
	}
	return r, nil
}

// consumes says whether this process reads the change stream. Today a
// flag names the one process that does; with a lease in Redis, each
// process would start its Source once it holds the lease instead, and
// nothing else here changes.
func consumes(cfg config) bool { return cfg.consume }

// mapping names the row a change is of: its id (the key), from New, or
// from Old for a DELETE. It records (row, ver) for the check that no
// change was skipped.
func (p *proc) mapping(c flightpg.Change) ([]int64, []string) {
	row := c.New
	if row == nil {
		row = c.Old
	}
	id, _ := row["id"].(int64)
	if c.Table != p.cfg.table {
		return []int64{-id}, nil // the side table of -mode bulk
	}
	if ver, ok := row["ver"].(int64); ok {
		p.seenMu.Lock()
		p.seen[[2]int64{id, ver}] = true
		p.lastVer[id] = ver
		p.seenMu.Unlock()
	}
	return []int64{id}, nil
}

// newSource starts a Source on this process's Loader, on the permanent
// slot named, from resume when it is not zero.
func (p *proc) newSource(ctx context.Context, slot string, resume flightpg.LSN) (*flightpg.Source[int64], error) {
	return flightpg.New(ctx, withApp(p.cfg.url), timedTarget{p}, p.mapping, flightpg.Options{
		Publication:     p.cfg.pub,
		Slot:            slot,
		DropSlotOnClose: true,
		Resume:          resume,
		OnError:         func(err error) { fmt.Fprintln(os.Stderr, "fleetlag: source:", err) },
		OnApplied: func(a flightpg.Applied) {
			p.seenMu.Lock()
			p.applied = append(p.applied, appliedTx{Commit: a.CommitTime.UnixNano(), Lag: a.Lag, Keys: a.Keys})
			p.seenMu.Unlock()
		},
	})
}

// timedTarget is the Source's target: the Loader, with the time its
// Invalidate calls take (the Redis tier's round trip included) added up.
type timedTarget struct{ p *proc }

func (t timedTarget) Invalidate(id int64) {
	began := time.Now()
	t.p.l.Invalidate(id)
	ended := time.Now()
	t.p.invalidating.Add(int64(ended.Sub(began)))
	t.p.invalidations.Add(1)
	if id > 0 {
		t.p.seenMu.Lock()
		t.p.invals = append(t.p.invals, inval{Row: int32(id), Ver: int32(t.p.lastVer[id]),
			Start: began.UnixNano(), End: ended.UnixNano()})
		t.p.seenMu.Unlock()
	}
}

func (t timedTarget) InvalidateAll() { t.p.l.InvalidateAll() }

// restore is the warm start: the saved entries restored, then (with
// -catchup) a Source on this process's own slot resumes from the saved
// position, catches up and closes, before the process serves.
func (p *proc) restore(ctx context.Context, r *reply) error {
	f, err := os.Open(p.cfg.restore)
	if err != nil {
		return err
	}
	var s snapshot
	err = gob.NewDecoder(f).Decode(&s)
	_ = f.Close()
	if err != nil {
		return err
	}
	if r.Restored, err = p.l.Restore(slices.Values(s.Entries)); err != nil {
		return err
	}
	if !p.cfg.catchup {
		return nil
	}
	began := time.Now()
	src, err := p.newSource(ctx, p.cfg.ownSlot, s.LSN)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err = src.CatchUp(cctx)
	r.CaughtUp = time.Since(began)
	st := src.Stats()
	r.Stats = &st
	return errors.Join(err, src.Close())
}

func (p *proc) close() {
	if p.stop != nil {
		p.stop()
		p.readers.Wait()
	}
	if p.src != nil {
		_ = p.src.Close()
	}
	if p.l != nil {
		_ = p.l.Close()
	}
	if p.tier != nil {
		_ = p.tier.Close()
	}
	if p.rdb != nil {
		_ = p.rdb.Close()
	}
	if p.pool != nil {
		p.pool.Close()
	}
}

// command runs one command of the parent's.
func (p *proc) command(ctx context.Context, f []string) (r reply, err error) {
	arg := func(i int) int64 {
		if i >= len(f) {
			err = fmt.Errorf("%s: missing argument %d", f[0], i)
			return 0
		}
		n, e := strconv.ParseInt(f[i], 10, 64)
		if e != nil {
			err = e
		}
		return n
	}
	switch f[0] {
	case "warm": // a Get of every row, 32 at a time
		r.Old, r.Checked, err = p.check(ctx, 1, int64(p.cfg.rows), 0)
		r.Held = p.l.Len()
	case "read":
		p.startReaders()
	case "stop":
		err = p.stopReaders(&r)
	case "check": // check FROM TO MINVER: Get each row, count those older than MINVER
		from, to, least := arg(1), arg(2), arg(3)
		if err == nil {
			before := p.loads.Load()
			r.Old, r.Checked, err = p.check(ctx, from, to, least)
			r.Loads = p.loads.Load() - before
			r.Tier = p.tierStats()
		}
	case "catchup":
		if p.src == nil {
			return r, errors.New("catchup: this process does not consume")
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		defer cancel()
		r.LSN, err = p.src.CatchUp(cctx)
	case "prepare": // the warm shutdown's first step: this process's own slot, then the position
		err = p.prepare(ctx, &r)
	case "snapshot": // snapshot PATH LSN
		lsn := arg(2)
		if err == nil {
			r.Held, r.Tier = p.l.Len(), p.tierStats()
			err = p.save(f[1], flightpg.LSN(lsn))
		}
	case "verify": // verify N ROWS: every update of the writer's round robin seen
		n, rows := arg(1), arg(2)
		if err == nil {
			p.seenMu.Lock()
			for k := range n {
				if !p.seen[[2]int64{k%rows + 1, k/rows + 2}] {
					r.Missing++
				}
			}
			r.Seen = len(p.seen)
			p.seenMu.Unlock()
		}
	case "stats":
		if p.src != nil {
			st := p.src.Stats()
			r.Stats = &st
		}
		p.seenMu.Lock()
		r.Applied = slices.Clone(p.applied)
		r.Seen = len(p.seen)
		p.seenMu.Unlock()
	case "baseline":
		p.heapWatch()
	case "peak":
		if p.heapStop != nil {
			close(p.heapStop)
			p.heapStop = nil
		}
		r.HeapBase, r.HeapPeak = p.heapBase.Load(), p.heapPeak.Load()
		r.LiveBase, r.LivePeak = p.liveBase.Load(), p.livePeak.Load()
		if p.cfg.profile != "" {
			if f, err := os.Create(fmt.Sprintf("%s/heap.%d", p.cfg.profile, p.cfg.child)); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
		}
	default:
		err = fmt.Errorf("unknown command %q", f[0])
	}
	return r, err
}

// check Gets rows from..to, 32 at a time, and counts those older than
// least.
func (p *proc) check(ctx context.Context, from, to, least int64) (old, checked int, err error) {
	var mu sync.Mutex
	var first error
	ids := make(chan int64)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for id := range ids {
				gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				ver, err := p.l.Get(gctx, id)
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					first = cmpErr(first, fmt.Errorf("row %d: %w", id, err))
				case ver < least:
					old++
				}
				checked++
				mu.Unlock()
			}
		})
	}
	for id := from; id <= to; id++ {
		ids <- id
	}
	close(ids)
	wg.Wait()
	return old, checked, first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// startReaders starts the -readers readers: each Gets a row drawn at
// random, -reads times a second, in bursts every 5 ms, and records what
// it read.
func (p *proc) startReaders() {
	ctx, cancel := context.WithCancel(context.Background())
	p.stop = cancel
	p.cpu0 = cputime.Self()
	if p.cfg.profile != "" {
		if f, err := os.Create(fmt.Sprintf("%s/cpu.%d", p.cfg.profile, p.cfg.child)); err == nil && pprof.StartCPUProfile(f) == nil {
			p.profile = f
		}
	}
	p.reads = make([][]record, p.cfg.readers)
	const tick = 5 * time.Millisecond
	for i := range p.cfg.readers {
		p.readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p.cfg.child), uint64(i)))
			t := time.NewTicker(tick)
			defer t.Stop()
			burst := max(1, p.cfg.reads*int(tick)/int(time.Second))
			var rec []record
			defer func() { p.reads[i] = rec }()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				for range burst {
					id := 1 + rng.Int64N(int64(p.cfg.rows))
					at := time.Now()
					gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
					ver, err := p.l.Get(gctx, id)
					gcancel()
					if err != nil {
						if ctx.Err() == nil {
							p.readErrs.Add(1)
						}
						continue
					}
					if p.cfg.record {
						rec = append(rec, record{Row: int32(id), Ver: int32(ver), At: at.UnixNano()})
					}
				}
			}
		})
	}
}

// stopReaders stops the readers and writes the reads and the drops to
// the files the parent reads.
func (p *proc) stopReaders(r *reply) error {
	if p.stop != nil {
		p.stop()
		p.readers.Wait()
		p.stop = nil
	}
	r.CPU = cputime.Self() - p.cpu0
	if p.profile != nil {
		pprof.StopCPUProfile()
		_ = p.profile.Close()
		p.profile = nil
	}
	r.ReadErrs = p.readErrs.Load()
	r.Loads = p.loads.Load()
	var all []record
	for _, rs := range p.reads {
		all = append(all, rs...)
	}
	r.Reads = len(all)
	r.Held, r.Tier = p.l.Len(), p.tierStats()
	r.Invalidations, r.Invalidating = p.invalidations.Load(), time.Duration(p.invalidating.Load())
	p.dropMu.Lock()
	drops := slices.Clone(p.drops)
	p.dropMu.Unlock()
	if p.src != nil {
		st := p.src.Stats()
		r.Stats = &st
	}
	p.seenMu.Lock()
	invals := slices.Clone(p.invals)
	p.seenMu.Unlock()
	return errors.Join(writeRecords(p.cfg.dir, "reads", p.cfg.child, all),
		writeRecords(p.cfg.dir, "drops", p.cfg.child, drops),
		writeRecords(p.cfg.dir, "invals", p.cfg.child, invals))
}

func writeRecords[R record | inval](dir, kind string, child int, rs []R) error {
	f, err := os.Create(recordsPath(dir, kind, child))
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	err = binary.Write(w, binary.LittleEndian, rs)
	return errors.Join(err, w.Flush(), f.Close())
}

func recordsPath(dir, kind string, child int) string {
	return fmt.Sprintf("%s/%s.%d", dir, kind, child)
}

// prepare is the first step of a warm shutdown of a process that does
// not consume: it creates its own permanent slot (which keeps, from
// now on, what is committed while it is down), then reads the server's
// position after it: the snapshot's position, once the consumer has
// applied it.
func (p *proc) prepare(ctx context.Context, r *reply) error {
	if _, err := p.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", p.cfg.ownSlot); err != nil {
		return err
	}
	var at string
	if err := p.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&at); err != nil {
		return err
	}
	lsn, err := flightpg.ParseLSN(at)
	r.LSN = lsn
	return err
}

// tierStats says what the tier counted that makes the Loader read its
// copies again.
func (p *proc) tierStats() string {
	st := p.tier.Stats()
	return fmt.Sprintf("%s, invalidations sent %d heard %d replayed %d lost %d, distrusts %d (tracked conns lost %d, subscription losses %d, undecoded %d), skipped %d, redis errors %d",
		st.Invalidations, st.InvalidationsSent, st.InvalidationsHeard, st.InvalidationsReplayed, st.InvalidationsLost,
		st.Distrusts, st.TrackedConnsLost, st.SubscriptionLosses, st.UndecodedInvalidations, st.Skipped, st.RedisErrors)
}

// save writes the snapshot (the position, then the entries) to path.
func (p *proc) save(path string, lsn flightpg.LSN) error {
	if p.stop != nil {
		p.stop()
		p.readers.Wait()
		p.stop = nil
	}
	s := snapshot{LSN: lsn, Entries: slices.Collect(p.l.Entries())}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(gob.NewEncoder(f).Encode(s), f.Close())
}

// heapWatch records the heap now, after a GC, as the baseline, and its
// peak from now on, sampled every 2 ms (runtime/metrics, which does not
// stop the world), until "peak".
func (p *proc) heapWatch() {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	heap := func() (objects, live uint64) {
		metrics.Read(sample)
		return sample[0].Value.Uint64(), sample[1].Value.Uint64()
	}
	o, l := heap()
	p.heapBase.Store(o)
	p.heapPeak.Store(o)
	p.liveBase.Store(l)
	p.livePeak.Store(l)
	stop := make(chan struct{})
	p.heapStop = stop
	go func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			o, l := heap()
			if o > p.heapPeak.Load() {
				p.heapPeak.Store(o)
			}
			if l > p.livePeak.Load() {
				p.livePeak.Store(l)
			}
		}
	}()
}

// dropObserver records when the Loader drops a copy because of an
// invalidation: flightcache calls Evicted on the goroutine that drops
// it, right when it does.
type dropObserver struct{ p *proc }

func (dropObserver) LoadStart(ctx context.Context, _ flightcache.LoadStartEvent[int64]) context.Context {
	return ctx
}
func (dropObserver) LoadEnd(context.Context, flightcache.LoadEvent[int64]) {}
func (dropObserver) Waited(context.Context, flightcache.WaitEvent[int64])  {}

func (o dropObserver) Evicted(ev flightcache.EvictionEvent[int64]) {
	if ev.Cause != flightcache.EvictionInvalidated {
		return
	}
	at := time.Now().UnixNano()
	o.p.dropMu.Lock()
	o.p.drops = append(o.p.drops, record{Row: int32(ev.Key), At: at})
	o.p.dropMu.Unlock()
}

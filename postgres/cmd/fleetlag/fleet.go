package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// fleet is one run: the table, its publication, and the processes.
type fleet struct {
	cfg    config
	pool   *pgxpool.Pool // the outside writer's, and the admin queries'
	suffix string
	table  string
	side   string // bulk: a table of single-row updates beside the bulk one
	pub    string
	slot   string // the consumer's
	dir    string // where the processes write their records
	procs  []*child
	w      io.Writer
	result result
}

// child is a running process of the fleet.
type child struct {
	i     int
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	ready reply // its first line
}

func newFleet(ctx context.Context, cfg config, w io.Writer) (fl *fleet, err error) {
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	fl = &fleet{cfg: cfg, suffix: suffix, w: w,
		table: "fleetlag_" + suffix, side: "fleetlag_side_" + suffix,
		pub: "fleetlag_pub_" + suffix, slot: "fleetlag_" + suffix}
	defer func() {
		if err != nil {
			fl.close()
		}
	}()
	pcfg, err := pgxpool.ParseConfig(cfg.url)
	if err != nil {
		return fl, err
	}
	pcfg.MaxConns = 8
	if fl.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fl, err
	}
	if fl.dir, err = os.MkdirTemp("", "fleetlag"); err != nil {
		return fl, err
	}
	for _, sql := range []string{
		"CREATE TABLE " + fl.table + " (id int8 PRIMARY KEY, ver int8 NOT NULL)",
		"INSERT INTO " + fl.table + " SELECT g, 1 FROM generate_series(1, " + strconv.Itoa(cfg.rows) + ") g",
		"CREATE TABLE " + fl.side + " (id int8 PRIMARY KEY, ver int8 NOT NULL)",
		"INSERT INTO " + fl.side + " SELECT g, 1 FROM generate_series(1, 1000) g",
		"CREATE PUBLICATION " + fl.pub + " FOR TABLE " + fl.table + ", " + fl.side,
	} {
		if _, err := fl.pool.Exec(ctx, sql); err != nil {
			return fl, fmt.Errorf("%s: %w", sql, err)
		}
	}
	return fl, nil
}

// start starts the fleet's processes; the consumer (unless -control) is
// the first.
func (fl *fleet) start(ctx context.Context) error {
	for i := range fl.cfg.procs {
		c, err := fl.spawn(i, i == 0 && (!fl.cfg.control || fl.cfg.mode == "restart"), "", false)
		if err != nil {
			return err
		}
		fl.procs = append(fl.procs, c)
	}
	return nil
}

// args are the flags process i runs with.
func (fl *fleet) args(i int, consume bool, restore string, catchup bool) []string {
	cfg := fl.cfg
	return []string{"-child", strconv.Itoa(i), "-url", cfg.url, "-redis", cfg.redis,
		"-prefix", "fleetlag:" + fl.suffix + ":", "-table", fl.table, "-pub", fl.pub,
		"-slot", fl.slot, "-ownslot", fl.ownSlot(i), "-dir", fl.dir,
		"-rows", strconv.Itoa(cfg.rows), "-readers", strconv.Itoa(cfg.readers),
		"-reads", strconv.Itoa(cfg.reads), "-ttl", cfg.ttl.String(),
		"-consume=" + strconv.FormatBool(consume), "-record=" + strconv.FormatBool(cfg.mode != "bulk"),
		"-restore", restore, "-catchup=" + strconv.FormatBool(catchup), "-cpuprofile", cfg.profile}
}

// ownSlot is the slot a process that does not consume keeps while it is
// down (restart).
func (fl *fleet) ownSlot(i int) string { return fmt.Sprintf("fleetlag_%s_p%d", fl.suffix, i) }

// spawn starts process i: the consumer when consume is set; restored
// from the snapshot at restore when it is not empty, and then caught up
// on its own slot first when catchup is set.
func (fl *fleet) spawn(i int, consume bool, restore string, catchup bool) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, fl.args(i, consume, restore, catchup)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{i: i, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	c.out.Buffer(nil, 256<<20)
	if c.ready, err = c.next(); err != nil {
		c.stop()
		return nil, fmt.Errorf("process %d did not start: %w", i, err)
	}
	return c, nil
}

func (c *child) next() (reply, error) {
	var r reply
	if !c.out.Scan() {
		return r, fmt.Errorf("process %d exited", c.i)
	}
	if err := json.Unmarshal(c.out.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Err != "" {
		return r, fmt.Errorf("process %d: %s", c.i, r.Err)
	}
	return r, nil
}

// do sends one command and returns the answer.
func (c *child) do(cmd string) (reply, error) {
	if _, err := fmt.Fprintln(c.in, cmd); err != nil {
		return reply{}, err
	}
	return c.next()
}

func (c *child) stop() {
	_ = c.in.Close() // a process exits at EOF
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// all sends cmd to every process at once and returns their answers.
func (fl *fleet) all(cmd string) ([]reply, error) {
	rs := make([]reply, len(fl.procs))
	errs := make([]error, len(fl.procs))
	var wg sync.WaitGroup
	for i, c := range fl.procs {
		wg.Go(func() { rs[i], errs[i] = c.do(cmd) })
	}
	wg.Wait()
	return rs, errors.Join(errs...)
}

func (fl *fleet) close() {
	for _, c := range fl.procs {
		if c != nil {
			c.stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if fl.pool != nil {
		for _, sql := range []string{
			"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'fleetlag\\_" + fl.suffix + "%' AND NOT active",
			"DROP PUBLICATION IF EXISTS " + fl.pub,
			"DROP TABLE IF EXISTS " + fl.table,
			"DROP TABLE IF EXISTS " + fl.side,
		} {
			_, _ = fl.pool.Exec(ctx, sql)
		}
		fl.pool.Close()
	}
	rdb := redis.NewClient(&redis.Options{Addr: fl.cfg.redis})
	iter := rdb.Scan(ctx, 0, "fleetlag:"+fl.suffix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	_ = rdb.Close()
	if fl.dir != "" {
		_ = os.RemoveAll(fl.dir)
	}
}

// update is one update of the outside writer.
type update struct {
	id, ver int64
	sql     string // UPDATE ... SET ver = $2 WHERE id = $1
}

// write commits updates 0..n-1 (what(k) says which), paced at rate a
// second, on 4 connections: update k on connection k mod 4, so that a
// row's updates (rows apart, a multiple of 4 when rows is) commit in
// order. A failed update is retried until it commits (it is
// idempotent). It returns each commit's return time (unix nanoseconds).
// at(k), when set, is called before update k is sent.
func (fl *fleet) write(ctx context.Context, n, rate int, what func(k int) update, at func(k int)) ([]int64, time.Duration, error) {
	conns := 4
	if fl.cfg.rows%conns != 0 {
		conns = 1
	}
	commits := make([]int64, n)
	queues := make([]chan int, conns)
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for c := range conns {
		queues[c] = make(chan int, n/conns+1)
		wg.Go(func() {
			for k := range queues[c] {
				if errs[c] != nil {
					continue
				}
				u := what(k)
				deadline := time.Now().Add(2 * time.Minute)
				for {
					_, err := fl.pool.Exec(ctx, u.sql, u.id, u.ver)
					if err == nil {
						break
					}
					if time.Now().After(deadline) {
						errs[c] = fmt.Errorf("update %d: %w", k, err)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				commits[k] = time.Now().UnixNano()
			}
		})
	}
	began := time.Now()
	for k := range n {
		if d := time.Until(began.Add(time.Duration(k) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		if at != nil {
			at(k)
		}
		queues[k%conns] <- k
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	return commits, time.Since(began), errors.Join(errs...)
}

// roundRobin is the writer's k-th update of the fleet modes: row
// k mod rows + 1 to version k / rows + 2.
func (fl *fleet) roundRobin(k int) update {
	r := fl.cfg.rows
	return update{id: int64(k%r + 1), ver: int64(k/r + 2), sql: "UPDATE " + fl.table + " SET ver = $2 WHERE id = $1"}
}

// backends returns the pids of the consumer's walsender and of the
// backend of its Source's visibility queries (0 when not found).
func (fl *fleet) backends(ctx context.Context) (walsender, visibility int) {
	_ = fl.pool.QueryRow(ctx, "SELECT pid FROM pg_stat_replication WHERE application_name = $1", sourceApp).Scan(&walsender)
	_ = fl.pool.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND backend_type = 'client backend'", sourceApp).Scan(&visibility)
	return walsender, visibility
}

// sourceApp is the application_name of the Source's connections.
const sourceApp = "fleetlag_source"

// withApp returns the connection string with the application_name set.
func withApp(url string) string {
	switch {
	case strings.Contains(url, "://") && strings.Contains(url, "?"):
		return url + "&application_name=" + sourceApp
	case strings.Contains(url, "://"):
		return url + "?application_name=" + sourceApp
	}
	return url + " application_name=" + sourceApp
}

// loadavg returns the machine's load average over the last minute.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	s, _, _ := strings.Cut(string(b), " ")
	return s
}

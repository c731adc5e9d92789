// Command fleet shows the Redis tier at work across OS processes: it starts
// a downstream (an HTTP server on the loopback interface that counts
// calls), then runs N worker processes (itself, re-executed) that each fire
// concurrent Gets for the same cold keys, once without the tier and once
// with it, and prints the downstream calls and the latency of each way.
//
//	go run ./redis/cmd/fleet -redis 127.0.0.1:6379 -procs 4
//	go run ./redis/cmd/fleet -cluster 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 -procs 4
//
// -redis names one Redis node (default $REDIS_ADDR); -cluster names the
// nodes of a Redis Cluster, comma-separated (default $REDIS_CLUSTER; any
// reachable node would do as a seed, several are safer), and makes every
// process use a ClusterClient. A flag given on the command line wins over
// the environment; giving both flags is an error.
//
// Without the tier, each process coalesces its own Gets: N calls per key.
// With it, one process per key takes the lease and calls the downstream;
// the others wait for its publish: 1 call per key.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/redis/go-redis/v9"
)

// target is the Redis the processes share: one node, or a Cluster.
type target struct {
	addr    string   // one node's host:port, or ""
	cluster []string // the Cluster's nodes, or nil
}

// args are the flags that pass the target on to a worker process.
func (t target) args() []string {
	if t.cluster != nil {
		return []string{"-cluster", strings.Join(t.cluster, ",")}
	}
	return []string{"-redis", t.addr}
}

// client returns a client for the target: a ClusterClient for a Cluster.
// Both have ContextTimeoutEnabled (the tier requires it) and short
// timeouts. A ClusterClient also retries TRYAGAIN through a slot
// migration (MaxRedirects, MaxRetryBackoff) and reloads its slot map
// every second, so that after a failover it finds the new master quickly
// (go-redis reloads it on MOVED and ASK, which a dead master never sends).
func (t target) client() redis.UniversalClient {
	if t.cluster != nil {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                      t.cluster,
			ContextTimeoutEnabled:      true,
			ReadTimeout:                time.Second,
			WriteTimeout:               time.Second,
			MaxRedirects:               16,
			MaxRetryBackoff:            100 * time.Millisecond,
			ClusterStateReloadInterval: time.Second,
		})
	}
	return redis.NewClient(&redis.Options{
		Addr:                  t.addr,
		ContextTimeoutEnabled: true,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
	})
}

func (t target) String() string {
	if t.cluster != nil {
		return fmt.Sprintf("the Redis Cluster of %d nodes at %s", len(t.cluster), strings.Join(t.cluster, ","))
	}
	return "the Redis at " + t.addr
}

func main() {
	addr := flag.String("redis", os.Getenv("REDIS_ADDR"), "Redis address `host:port` (default $REDIS_ADDR)")
	cluster := flag.String("cluster", os.Getenv("REDIS_CLUSTER"), "Redis Cluster node addresses, `host:port,host:port,...` (default $REDIS_CLUSTER)")
	procs := flag.Int("procs", 4, "worker processes")
	gets := flag.Int("gets", 50, "concurrent Gets per process per key")
	keys := flag.Int("keys", 30, "cold keys (rounds)")
	latency := flag.Duration("latency", 20*time.Millisecond, "downstream latency")
	worker := flag.Bool("worker", false, "run as a worker (internal)")
	url := flag.String("url", "", "downstream URL (internal)")
	tier := flag.Bool("tier", false, "use the Redis tier (internal)")
	prefix := flag.String("prefix", "", "Redis key prefix (internal)")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var tgt target
	switch {
	case set["redis"] && set["cluster"]:
		fmt.Fprintln(os.Stderr, "fleet: give -redis or -cluster, not both")
		os.Exit(2)
	case *cluster != "" && !set["redis"]:
		tgt.cluster = strings.Split(*cluster, ",")
	case *addr != "":
		tgt.addr = *addr
	default:
		fmt.Fprintln(os.Stderr, "fleet: give -redis host:port or -cluster host:port,... (or set REDIS_ADDR or REDIS_CLUSTER)")
		os.Exit(2)
	}
	var err error
	if *worker {
		err = runWorker(tgt, *url, *prefix, *tier, *gets)
	} else {
		err = run(tgt, *procs, *gets, *keys, *latency)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// report is what a worker says about one key.
type report struct {
	Latency time.Duration `json:"latency"` // median Get latency in this process
	Leased  bool          `json:"leased"`  // this process held the lease
	Errors  int           `json:"errors"`
}

func run(tgt target, procs, gets, keys int, latency time.Duration) error {
	var calls atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		time.Sleep(latency)
		fmt.Fprintf(w, "%s-v%d", r.URL.Query().Get("key"), n)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"
	prefix := fmt.Sprintf("fleet:%d:%d:", os.Getpid(), time.Now().UnixNano())
	defer cleanup(tgt, prefix)

	fmt.Printf("%d processes × %d concurrent Gets per cold key, %d keys, downstream latency %v, on %v\n\n",
		procs, gets, keys, latency, tgt)
	type outcome struct {
		calls           int64
		holders, others []time.Duration
		errors          int
	}
	results := map[bool]*outcome{}
	for _, tier := range []bool{false, true} {
		calls.Store(0)
		ws, err := startWorkers(procs, tgt, url, prefix, tier, gets)
		if err != nil {
			return err
		}
		// One key to warm up connections and goroutines; not counted.
		for _, w := range ws {
			fmt.Fprintln(w.in, "warm-up")
		}
		for _, w := range ws {
			if _, err := w.next(); err != nil {
				return err
			}
		}
		calls.Store(0)
		o := &outcome{}
		for k := range keys {
			for _, w := range ws {
				fmt.Fprintf(w.in, "key-%d\n", k)
			}
			for _, w := range ws {
				r, err := w.next()
				if err != nil {
					return err
				}
				o.errors += r.Errors
				if r.Leased || !tier {
					o.holders = append(o.holders, r.Latency)
				} else {
					o.others = append(o.others, r.Latency)
				}
			}
		}
		for _, w := range ws {
			w.stop()
		}
		o.calls = calls.Load()
		results[tier] = o
	}

	fmt.Printf("%-18s %16s %10s %8s\n", "", "downstream calls", "per key", "errors")
	for _, tier := range []bool{false, true} {
		o := results[tier]
		name := map[bool]string{false: "without the tier", true: "with the tier"}[tier]
		fmt.Printf("%-18s %16d %10.1f %8d\n", name, o.calls, float64(o.calls)/float64(keys), o.errors)
	}
	local, holders, others := results[false].holders, results[true].holders, results[true].others
	fmt.Printf("\nlatency of a cold key in one process (median of its %d Gets):\n", gets)
	fmt.Printf("  %-32s p50 %8v  p99 %8v\n", "without the tier", pct(local, 50), pct(local, 99))
	fmt.Printf("  %-32s p50 %8v  p99 %8v\n", "with the tier, lease holder", pct(holders, 50), pct(holders, 99))
	fmt.Printf("  %-32s p50 %8v  p99 %8v\n", "with the tier, waiting processes", pct(others, 50), pct(others, 99))
	fmt.Printf("\nwhat the tier adds (same percentile, minus without the tier): holder p50 %v, p99 %v; waiters p50 %v, p99 %v\n",
		pct(holders, 50)-pct(local, 50), pct(holders, 99)-pct(local, 99),
		pct(others, 50)-pct(local, 50), pct(others, 99)-pct(local, 99))
	return nil
}

// pct returns the p-th percentile of ds, rounded.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)].Round(10 * time.Microsecond)
}

// cleanup deletes the keys under prefix: on a Cluster, on every master.
func cleanup(tgt target, prefix string) {
	c := tgt.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	del := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return del(ctx, node) })
		return
	}
	_ = del(ctx, c)
}

// workerProc is a running worker process.
type workerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startWorkers(n int, tgt target, url, prefix string, tier bool, gets int) ([]*workerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var ws []*workerProc
	for range n {
		args := append([]string{"-worker"}, tgt.args()...)
		cmd := exec.Command(self, append(args, "-url", url, "-prefix", prefix,
			"-tier="+strconv.FormatBool(tier), "-gets", strconv.Itoa(gets))...)
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
		w := &workerProc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		if !w.out.Scan() || w.out.Text() != "ready" {
			return nil, fmt.Errorf("worker %d did not start", cmd.Process.Pid)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func (w *workerProc) next() (report, error) {
	var r report
	if !w.out.Scan() {
		return r, fmt.Errorf("worker %d exited", w.cmd.Process.Pid)
	}
	err := json.Unmarshal(w.out.Bytes(), &r)
	return r, err
}

func (w *workerProc) stop() {
	_ = w.in.Close() // the worker exits at EOF
	_ = w.cmd.Wait()
}

// runWorker serves keys named on stdin, one line each, until EOF, and
// reports each on stdout. It exits by itself after 10 minutes, in case
// its parent is gone without closing the pipe.
func runWorker(tgt target, url, prefix string, tier bool, gets int) error {
	time.AfterFunc(10*time.Minute, func() { os.Exit(3) })
	httpc := &http.Client{}
	load := func(ctx context.Context, key string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"?key="+key, nil)
		if err != nil {
			return "", err
		}
		resp, err := httpc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	opts := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 5 * time.Second}
	rdb := tgt.client()
	defer rdb.Close()
	var t *flightredis.Tier[string, string]
	if tier {
		var err error
		if t, err = flightredis.NewTier(rdb, flightredis.Options[string, string]{Prefix: prefix}); err != nil {
			return err
		}
		defer t.Close()
		opts.Remote = t
	}
	l, err := flightcache.New(load, opts)
	if err != nil {
		return err
	}
	defer l.Close()

	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		key := in.Text()
		var leases uint64
		if t != nil {
			leases = t.Stats().Leases
		}
		lat := make([]time.Duration, gets)
		var errs atomic.Int64
		var wg sync.WaitGroup
		for i := range gets {
			wg.Go(func() {
				start := time.Now()
				if _, err := l.Get(context.Background(), key); err != nil {
					errs.Add(1)
				}
				lat[i] = time.Since(start)
			})
		}
		wg.Wait()
		slices.Sort(lat)
		r := report{Latency: lat[len(lat)/2], Errors: int(errs.Load())}
		if t != nil {
			r.Leased = t.Stats().Leases > leases
		}
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
	return in.Err()
}

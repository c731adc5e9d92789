package flightredis

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// These tests run real OS processes: the test binary re-executed with
// FLIGHTREDIS_CHILD=burst. Each child builds a Loader (with or without the
// tier), prints "ready", waits for a line on stdin, fires its Gets for one
// key at once, prints a JSON result and exits. The downstream is an HTTP
// server in the parent, on the loopback interface, that counts calls.
//
// A child exits on its own: at its deadline (FR_DEADLINE), or when its
// stdin closes before the start signal (the parent died).

// childResult is what a child prints when its Gets are done.
type childResult struct {
	Pid     int      `json:"pid"`
	OK      int      `json:"ok"`
	Errors  []string `json:"errors"`
	Values  []string `json:"values"` // distinct values received
	Elapsed string   `json:"elapsed"`
	Tier    Stats    `json:"tier"`
}

// fleetConfig is passed to children through the environment.
type fleetConfig struct {
	procs, gets   int
	tier          bool
	prefix, key   string
	url           string
	loadTimeout   time.Duration
	timeout       time.Duration // the tier's Options.Timeout
	holderTimeout time.Duration
}

func (c fleetConfig) env(addr string) []string {
	return append(os.Environ(),
		childEnv+"=burst",
		"FR_ADDR="+addr,
		"FR_PREFIX="+c.prefix,
		"FR_KEY="+c.key,
		"FR_URL="+c.url,
		"FR_TIER="+strconv.FormatBool(c.tier),
		"FR_GETS="+strconv.Itoa(c.gets),
		"FR_LOAD_TIMEOUT="+c.loadTimeout.String(),
		"FR_TIMEOUT="+c.timeout.String(),
		"FR_HOLDER_TIMEOUT="+c.holderTimeout.String(),
		"FR_DEADLINE="+(2*time.Minute).String(),
	)
}

func runChild(role string) int {
	if role == "reader" {
		return readerChild() // invalidate_test.go
	}
	if role != "burst" {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
	deadline, err := time.ParseDuration(os.Getenv("FR_DEADLINE"))
	if err != nil {
		deadline = time.Minute
	}
	time.AfterFunc(deadline, func() {
		fmt.Fprintln(os.Stderr, "child: deadline reached, exiting")
		os.Exit(3)
	})
	if err := burstChild(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func burstChild() error {
	gets, _ := strconv.Atoi(os.Getenv("FR_GETS"))
	loadTimeout, _ := time.ParseDuration(os.Getenv("FR_LOAD_TIMEOUT"))
	timeout, _ := time.ParseDuration(os.Getenv("FR_TIMEOUT"))
	holderTimeout, _ := time.ParseDuration(os.Getenv("FR_HOLDER_TIMEOUT"))
	url, key := os.Getenv("FR_URL"), os.Getenv("FR_KEY")
	pid := strconv.Itoa(os.Getpid())

	httpc := &http.Client{}
	defer httpc.CloseIdleConnections()
	load := func(ctx context.Context, key string) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"?key="+key, nil)
		if err != nil {
			return "", err
		}
		req.Header.Set("X-Child-Pid", pid)
		resp, err := httpc.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}

	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: loadTimeout}
	rdb := dial(os.Getenv("FR_ADDR"))
	defer rdb.Close()
	var tier *Tier[string, string]
	if os.Getenv("FR_TIER") == "true" {
		var err error
		tier, err = NewTier(rdb, Options[string, string]{Prefix: os.Getenv("FR_PREFIX"), Timeout: timeout, HolderTimeout: holderTimeout})
		if err != nil {
			return err
		}
		defer tier.Close()
		lo.Remote = tier
	}
	l, err := flightcache.New(load, lo)
	if err != nil {
		return err
	}
	defer l.Close()

	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fmt.Errorf("no start signal: %w", err)
	}
	start := time.Now()
	var mu sync.Mutex
	res := childResult{Pid: os.Getpid()}
	var wg sync.WaitGroup
	for range gets {
		wg.Go(func() {
			v, err := l.Get(context.Background(), key)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors = append(res.Errors, err.Error())
				return
			}
			res.OK++
			if !slices.Contains(res.Values, v) {
				res.Values = append(res.Values, v)
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start).String()
	if tier != nil {
		res.Tier = tier.Stats()
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return nil
}

// counter is the downstream: an HTTP server on the loopback interface that
// counts calls. hold, if set, decides per call whether it blocks until its
// client goes away (a call from a process the test kills).
type counter struct {
	srv   *httptest.Server
	calls atomic.Int64
	delay time.Duration
	first chan int // receives the pid of the first caller
	hold  func(n int64) bool
}

func newCounter(t *testing.T, delay time.Duration) *counter {
	c := &counter{delay: delay, first: make(chan int, 1)}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := c.calls.Add(1)
		if n == 1 {
			pid, _ := strconv.Atoi(r.Header.Get("X-Child-Pid"))
			c.first <- pid
		}
		if c.hold != nil && c.hold(n) {
			select {
			case <-r.Context().Done(): // the caller died
			case <-time.After(time.Minute):
			}
			return
		}
		time.Sleep(c.delay)
		fmt.Fprintf(w, "%s-v%d", r.URL.Query().Get("key"), n)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// child is one running child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	errs  *strings.Builder
}

// startFleet starts cfg.procs children and waits until each is ready.
func startFleet(t *testing.T, addr string, cfg fleetConfig) []*child {
	t.Helper()
	var kids []*child
	for range cfg.procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = cfg.env(addr)
		errs := &strings.Builder{}
		cmd.Stderr = &lockedWriter{w: errs}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		k := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 4), errs: errs}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
			close(k.lines)
		}()
		t.Cleanup(func() {
			_ = k.cmd.Process.Kill()
			_ = k.cmd.Wait()
		})
		kids = append(kids, k)
	}
	for _, k := range kids {
		if line := k.next(t, time.Minute); line != "ready" {
			t.Fatalf("child %d said %q; want ready; stderr:\n%s", k.cmd.Process.Pid, line, k.errs)
		}
	}
	return kids
}

func (k *child) next(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-k.lines:
		if !ok {
			t.Fatalf("child %d exited early; stderr:\n%s", k.cmd.Process.Pid, k.errs)
		}
		return line
	case <-time.After(d):
		t.Fatalf("child %d: no output for %v; stderr:\n%s", k.cmd.Process.Pid, d, k.errs)
	}
	return ""
}

func (k *child) result(t *testing.T, d time.Duration) childResult {
	t.Helper()
	var r childResult
	line := k.next(t, d)
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("child %d printed %q: %v", k.cmd.Process.Pid, line, err)
	}
	return r
}

func goAll(kids []*child) {
	for _, k := range kids {
		_, _ = io.WriteString(k.stdin, "go\n")
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestFleetOneDownstreamCall(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	const procs, gets = 4, 50
	got := map[bool]int64{}
	var stats []Stats
	for _, tier := range []bool{false, true} {
		down := newCounter(t, 200*time.Millisecond)
		cfg := fleetConfig{
			procs: procs, gets: gets, tier: tier, prefix: prefix, key: "cold-" + token(4),
			url: down.srv.URL, loadTimeout: 10 * time.Second, timeout: generous.Timeout, holderTimeout: generous.HolderTimeout,
		}
		kids := startFleet(t, addr, cfg)
		goAll(kids)
		values := map[string]bool{}
		for _, k := range kids {
			r := k.result(t, time.Minute)
			if r.OK != gets || len(r.Errors) > 0 {
				t.Errorf("tier=%v: child %d: %d ok, errors %v; want %d ok", tier, r.Pid, r.OK, r.Errors, gets)
			}
			for _, v := range r.Values {
				values[v] = true
			}
			if tier {
				stats = append(stats, r.Tier)
			}
		}
		got[tier] = down.calls.Load()
		if tier && len(values) != 1 {
			t.Errorf("with the tier, processes saw values %v; want one", values)
		}
	}
	t.Logf("%d processes × %d concurrent Gets of one cold key: %d downstream calls without the tier, %d with it",
		procs, gets, got[false], got[true])
	if got[false] != procs || got[true] != 1 {
		t.Errorf("downstream calls: %d without the tier, %d with it; want %d and 1; the tiers' stats: %+v", got[false], got[true], procs, stats)
	}
}

func TestFleetHolderKilled(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	const procs, gets = 3, 20
	// A Timeout of a second: a round trip past it would step a process
	// aside, to load for itself. The survivor that takes over beats every
	// HolderTimeout/3 (a Timeout each at most): a HolderTimeout of 5s
	// leaves it two beats before another would take over from it.
	loadTimeout, timeout, holderTimeout := 10*time.Second, time.Second, 5*time.Second
	down := newCounter(t, 50*time.Millisecond)
	down.hold = func(n int64) bool { return n == 1 } // the first holder hangs until killed
	cfg := fleetConfig{
		procs: procs, gets: gets, tier: true, prefix: prefix, key: "cold-" + token(4),
		url: down.srv.URL, loadTimeout: loadTimeout, timeout: timeout, holderTimeout: holderTimeout,
	}
	kids := startFleet(t, addr, cfg)
	goAll(kids)

	var pid int
	select {
	case pid = <-down.first:
	case <-time.After(time.Minute):
		t.Fatal("no downstream call")
	}
	var victim *child
	for _, k := range kids {
		if k.cmd.Process.Pid == pid {
			victim = k
		}
	}
	if victim == nil {
		t.Fatalf("the first call came from pid %d, not a child", pid)
	}
	time.Sleep(100 * time.Millisecond) // let the others start waiting on the lease
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	leaseTTL := loadTimeout + max(loadTimeout/2, time.Second) // the default
	var takeovers uint64
	var stats []Stats
	var last time.Duration
	for _, k := range kids {
		if k == victim {
			continue
		}
		r := k.result(t, leaseTTL+loadTimeout)
		last = max(last, time.Since(killed))
		if r.OK != gets || len(r.Errors) > 0 {
			t.Errorf("child %d: %d ok, errors %v; want %d ok", r.Pid, r.OK, r.Errors, gets)
		}
		takeovers += r.Tier.Takeovers
		stats = append(stats, r.Tier)
	}
	t.Logf("holder SIGKILLed mid-load: the other processes had the value %v later (HolderTimeout %v, LeaseTTL %v)",
		last.Round(time.Millisecond), holderTimeout, leaseTTL)
	if last > leaseTTL+loadTimeout {
		t.Errorf("failover took %v; want under LeaseTTL + LoadTimeout = %v", last, leaseTTL+loadTimeout)
	}
	if n := down.calls.Load(); n != 2 || takeovers != 1 {
		t.Errorf("downstream calls = %d, takeovers = %d; want 2 (the killed holder's and one takeover) and 1; the others' stats: %+v", n, takeovers, stats)
	}
}

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serveEnv, set to 1 in a process's environment, makes the test binary
// run the server's main instead of the tests (see TestMain): the tests
// start the real server that way, without a go build of their own.
const serveEnv = "HTTPSERVER_TEST_SERVE"

// binary is the real server, in a process of its own, started by
// startBinary.
type binary struct {
	apiURL, pricingURL string

	cmd     *exec.Cmd
	stderr  *strings.Builder
	exited  chan error
	stopped bool // the exit has been received from exited

	logMu    sync.Mutex
	logLines []string
}

// startBinary starts the real server with args on free loopback ports
// (the API's and the pricing service's), and returns once it has logged
// both URLs. The server is this test binary run again with serveEnv set:
// main, flags, signals and log, as the built command runs them. It skips
// the test in -short mode. The server is killed at the end of the test
// unless stopped by stop.
func startBinary(t *testing.T, args ...string) *binary {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the server in a process of its own")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatalf("the test binary, to run as the server: %v", err)
	}

	b := &binary{
		cmd:    exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-pricing-addr", "127.0.0.1:0"}, args...)...),
		stderr: &strings.Builder{},
		exited: make(chan error, 1),
	}
	b.cmd.Env = append(os.Environ(), serveEnv+"=1")
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b.cmd.Stderr = b.stderr
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan [2]string, 1)
	go func() {
		// Read the log: the two servers' URLs, then everything until exit.
		var pricingURL string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			b.logMu.Lock()
			b.logLines = append(b.logLines, line)
			b.logMu.Unlock()
			u := logField(line, "url")
			switch {
			case strings.Contains(line, `msg="pricing service listening"`):
				pricingURL = u
			case strings.Contains(line, "msg=listening"):
				urls <- [2]string{u, pricingURL}
			}
		}
		b.exited <- b.cmd.Wait()
	}()
	t.Cleanup(func() {
		if !b.stopped {
			b.cmd.Process.Kill()
			<-b.exited
		}
	})

	select {
	case u := <-urls:
		b.apiURL, b.pricingURL = u[0], u[1]
	case err := <-b.exited:
		b.stopped = true
		t.Fatalf("server exited before listening: %v\n%s", err, b.stderr.String())
	case <-time.After(time.Minute):
		t.Fatal("server did not log its address within a minute")
	}
	if b.apiURL == "" || b.pricingURL == "" {
		t.Fatalf("addresses not logged: api %q, pricing %q", b.apiURL, b.pricingURL)
	}
	return b
}

// stop sends the server SIGTERM and checks that it stops cleanly.
func (b *binary) stop(t *testing.T) {
	t.Helper()
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.exited:
		b.stopped = true
		if err != nil {
			t.Errorf("after SIGTERM: %v\n%s", err, b.stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("server still running a minute after SIGTERM")
	}
	b.logMu.Lock()
	defer b.logMu.Unlock()
	if last := b.logLines[len(b.logLines)-1]; !strings.Contains(last, "msg=stopped") {
		t.Errorf("last log line %q; want msg=stopped\n%s", last, strings.Join(b.logLines, "\n"))
	}
}

// pricingCounts is the pricing service's GET /debug/requests.
type pricingCounts struct {
	Requests      int64
	NotModified   int64 `json:"not_modified"`
	BatchRequests int64 `json:"batch_requests"`
	BatchIDs      int64 `json:"batch_ids"`
}

// getJSON GETs url with client and decodes its JSON body into v; it
// returns the status code.
func getJSON(client *http.Client, url string, v any) (int, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: status %d, decoding the body: %w", url, resp.StatusCode, err)
	}
	return resp.StatusCode, nil
}

// TestBinary runs the real server, on free loopback ports,
// sends 200 concurrent requests for one product, and checks that the
// pricing service saw one request. Then SIGTERM must stop it cleanly.
func TestBinary(t *testing.T) {
	// A slow price (so the requests overlap) that never fails.
	b := startBinary(t, "-latency", "300ms", "-fail", "0")
	apiURL := b.apiURL

	transport := &http.Transport{MaxIdleConnsPerHost: 200}
	client := &http.Client{Transport: transport, Timeout: time.Minute}
	const n = 200
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		sources  = map[string]int{}
	)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			resp, err := client.Get(apiURL + "/products/42")
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			statuses[resp.StatusCode]++
			sources[resp.Header.Get("X-Cache")]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if statuses[http.StatusOK] != n {
		t.Errorf("statuses of %d concurrent requests: %v; want all 200", n, statuses)
	}
	if sources["loaded"] != 1 || sources["shared"]+sources["hit"] != n-1 {
		t.Errorf("X-Cache of %d concurrent requests: %v; want 1 loaded, the rest shared or hit", n, sources)
	}

	pricing := func() pricingCounts {
		t.Helper()
		var s pricingCounts
		if _, err := getJSON(client, b.pricingURL+"/debug/requests", &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := pricing(); s.Requests != 1 {
		t.Errorf("pricing service saw %d requests; want 1", s.Requests)
	}

	// 100 concurrent no-cache requests are not answered from the cache,
	// yet make one pricing call between them: a revalidation (If-None-Match),
	// answered 304 with no body, since the price has not changed.
	var noCache sync.WaitGroup
	go2 := make(chan struct{})
	for range 100 {
		noCache.Go(func() {
			<-go2
			req, _ := http.NewRequest(http.MethodGet, apiURL+"/products/42", nil)
			req.Header.Set("Cache-Control", "no-cache")
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("GET no-cache: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Cache") == "hit" {
				t.Errorf("GET no-cache: %d, X-Cache %q; want 200, not from the cache", resp.StatusCode, resp.Header.Get("X-Cache"))
			}
		})
	}
	close(go2)
	noCache.Wait()
	if s := pricing(); s.Requests != 2 || s.NotModified != 1 {
		t.Errorf("after 100 no-cache requests the pricing service saw %d requests, %d answered 304; want 2 and 1", s.Requests, s.NotModified)
	}

	// A flash-sale price says max-age=1: a second and a half later it is
	// no longer fresh, while the server's TTL (-ttl, 10s) is much longer.
	xcache := func(path string) string {
		t.Helper()
		resp, err := client.Get(apiURL + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("X-Cache")
	}
	xcache("/products/200")
	if got := xcache("/products/200"); got != "hit" {
		t.Errorf("flash price right after its load: X-Cache %q; want hit", got)
	}
	time.Sleep(1500 * time.Millisecond)
	if got := xcache("/products/200"); got == "hit" {
		t.Errorf("flash price 1.5s after its load (max-age=1): X-Cache %q; want it no longer fresh", got)
	}
	transport.CloseIdleConnections()

	b.stop(t)
}

// TestBinaryGetMany runs the real server: 50 concurrent requests for
// overlapping lists of ids (windows over 1..60), on a cold cache, make one
// pricing call per distinct id in all, in batches, and every request gets
// its products.
func TestBinaryGetMany(t *testing.T) {
	// Each pricing call takes 300ms, so the requests overlap: a request
	// finds most of its ids loading for another and shares those loads.
	// Nothing fails, expires or times out during the test, so no id is
	// ever loaded twice; this holds however the requests interleave.
	b := startBinary(t, "-latency", "300ms", "-fail", "0", "-ttl", "5m", "-load-timeout", "1m")
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: time.Minute}

	lists := overlappingLists(50)
	ask := func(what string) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, l := range lists {
			wg.Go(func() {
				<-start
				var a productsAnswer
				code, err := getJSON(client, b.apiURL+"/products?ids="+strings.Join(l, ","), &a)
				if err == nil {
					err = checkAnswer(l, code, a)
				}
				if err != nil {
					t.Errorf("%s: GET /products?ids=%s: %v", what, strings.Join(l, ","), err)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	ask("cold cache")

	var p pricingCounts
	if _, err := getJSON(client, b.pricingURL+"/debug/requests", &p); err != nil {
		t.Fatal(err)
	}
	distinct := int64(len(distinctIDs(lists)))
	t.Logf("%d requests, %d distinct ids: %d batch calls to the pricing service, %d ids asked, %d single price requests",
		len(lists), distinct, p.BatchRequests, p.BatchIDs, p.Requests)
	// Every id asked for was priced (each answer holds its products), the
	// batches asked for as many ids as there are distinct ones, and no
	// single price was requested: so each distinct id was asked for once.
	if p.BatchIDs != distinct || p.Requests != 0 {
		t.Errorf("pricing service asked for %d ids in batches and %d single prices; want %d ids (each distinct id once), no single price", p.BatchIDs, p.Requests, distinct)
	}
	if p.BatchRequests < 1 || p.BatchRequests >= distinct {
		t.Errorf("%d batch calls for %d distinct ids; want fewer calls than ids", p.BatchRequests, distinct)
	}
	var s struct{ Loads, BatchLoads, BatchKeys int64 }
	if _, err := getJSON(client, b.apiURL+"/debug/flightcache", &s); err != nil {
		t.Fatal(err)
	}
	if s.BatchLoads != p.BatchRequests || s.BatchKeys != distinct || s.Loads != s.BatchLoads {
		t.Errorf("Loader Stats Loads %d, BatchLoads %d, BatchKeys %d; want %d, %d, %d", s.Loads, s.BatchLoads, s.BatchKeys, p.BatchRequests, p.BatchRequests, distinct)
	}

	// Again, on a warm cache: no pricing call at all.
	ask("warm cache")
	var again pricingCounts
	if _, err := getJSON(client, b.pricingURL+"/debug/requests", &again); err != nil {
		t.Fatal(err)
	}
	if again != p {
		t.Errorf("pricing service counts after the same requests on a warm cache: %+v; want still %+v", again, p)
	}

	transport.CloseIdleConnections()
	b.stop(t)
}

// logField returns the value of key in a log line of slog's text format.
func logField(line, key string) string {
	for f := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

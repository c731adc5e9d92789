package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestBinary builds the real server, starts it on free loopback ports,
// sends 200 concurrent requests for one product, and checks that the
// pricing service saw one request. Then SIGTERM must stop it cleanly.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the binary with")
	}
	bin := filepath.Join(t.TempDir(), "httpserver")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	// A slow price (so the requests overlap) that never fails.
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-pricing-addr", "127.0.0.1:0", "-latency", "300ms", "-fail", "0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var logMu sync.Mutex
	var logLines []string
	urls := make(chan [2]string, 1)
	go func() {
		// Read the log: the two servers' URLs, then everything until exit.
		var pricingURL string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logLines = append(logLines, line)
			logMu.Unlock()
			u := logField(line, "url")
			switch {
			case strings.Contains(line, `msg="pricing service listening"`):
				pricingURL = u
			case strings.Contains(line, "msg=listening"):
				urls <- [2]string{u, pricingURL}
			}
		}
		exited <- cmd.Wait()
	}()
	stopped := false // the exit has been received from exited
	defer func() {
		if !stopped {
			cmd.Process.Kill()
			<-exited
		}
	}()

	var apiURL, pricingURL string
	select {
	case u := <-urls:
		apiURL, pricingURL = u[0], u[1]
	case err := <-exited:
		stopped = true
		t.Fatalf("server exited before listening: %v\n%s", err, stderr.String())
	case <-time.After(time.Minute):
		t.Fatal("server did not log its address within a minute")
	}
	if apiURL == "" || pricingURL == "" {
		t.Fatalf("addresses not logged: api %q, pricing %q", apiURL, pricingURL)
	}

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

	type seen struct {
		Requests    int64
		NotModified int64 `json:"not_modified"`
	}
	pricing := func() seen {
		t.Helper()
		resp, err := client.Get(pricingURL + "/debug/requests")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s seen
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
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

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("after SIGTERM: %v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("server still running a minute after SIGTERM")
	}
	logMu.Lock()
	defer logMu.Unlock()
	if last := logLines[len(logLines)-1]; !strings.Contains(last, "msg=stopped") {
		t.Errorf("last log line %q; want msg=stopped\n%s", last, strings.Join(logLines, "\n"))
	}
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

package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
	"go.uber.org/goleak"
)

// TestMain runs the tests, or, with serveEnv set, the server itself: the
// tests that need the real server in a process of its own run this binary
// so (startBinary).
func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// faults wraps the pricing service: it counts the requests that reach the
// downstream, and can fail them or hold them until the test lets them go.
type faults struct {
	next    http.Handler
	calls   atomic.Int64
	fail    atomic.Bool   // answer 500 at once
	arrived chan struct{} // if not nil, receives one value per request
	gate    chan struct{} // if not nil, each request waits for a value (or its context)
}

func (f *faults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	if f.arrived != nil {
		f.arrived <- struct{}{}
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-r.Context().Done():
			return
		}
	}
	if f.fail.Load() {
		writeJSON(w, http.StatusInternalServerError, errorBody{"injected failure"})
		return
	}
	f.next.ServeHTTP(w, r)
}

// inProcess is an http.RoundTripper that serves requests with a handler in
// the calling goroutine: no sockets, so a synctest bubble can hold it.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return rec.Result(), nil
}

// fixture is the API on a cached repository on the pricing service.
type fixture struct {
	svc  *pricingService
	down *faults
	repo *CachedRepository
	api  *api
	h    http.Handler
}

// newFixture builds the stack in process (call it inside the synctest
// bubble, if any); the pricing service takes 100 ms per price.
func newFixture(t *testing.T, opts flightcache.Options[string, Product]) *fixture {
	t.Helper()
	return newFixtureWith(t, &pricingService{Latency: 100 * time.Millisecond}, opts)
}

// newFixtureWith is newFixture on the pricing service svc.
func newFixtureWith(t *testing.T, svc *pricingService, opts flightcache.Options[string, Product]) *fixture {
	t.Helper()
	down := &faults{next: svc.Handler()}
	plain := &HTTPRepository{Client: &http.Client{Transport: inProcess{down}}, BaseURL: "http://pricing.test"}
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	repo, err := NewCachedRepository(plain, opts)
	if err != nil {
		t.Fatalf("NewCachedRepository: %v", err)
	}
	t.Cleanup(func() { repo.Close() })
	a := &api{repo: repo, stats: repo.Stats, retryAfter: opts.Breaker.OpenTimeout, log: slog.New(slog.DiscardHandler)}
	return &fixture{svc: svc, down: down, repo: repo, api: a, h: a.routes()}
}

// get serves one GET in process; headers are name, value pairs.
func get(h http.Handler, path string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// want checks a response's status and headers; a header wanted as "" must
// be absent.
func want(t *testing.T, what string, rec *httptest.ResponseRecorder, status int, headers ...string) {
	t.Helper()
	if rec.Code != status {
		t.Errorf("%s: status %d; want %d (body %s)", what, rec.Code, status, strings.TrimSpace(rec.Body.String()))
	}
	for i := 0; i+1 < len(headers); i += 2 {
		name, value := headers[i], headers[i+1]
		got, ok := rec.Result().Header[http.CanonicalHeaderKey(name)]
		switch {
		case value == "" && ok:
			t.Errorf("%s: header %s = %q; want none", what, name, got)
		case value != "" && (len(got) != 1 || got[0] != value):
			t.Errorf("%s: header %s = %q; want %q", what, name, got, value)
		}
	}
}

func TestProductLoadedThenHit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{})
		rec := get(f.h, "/products/42")
		want(t, "first GET", rec, http.StatusOK, "X-Cache", "loaded", "Age", "0", "Content-Type", "application/json")
		var p Product
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.ID != "42" || p.Name != "Product 42" || p.PriceCents == 0 {
			t.Errorf("body %s: %+v, %v; want product 42", rec.Body.String(), p, err)
		}

		time.Sleep(3 * time.Second)
		want(t, "GET 3s later", get(f.h, "/products/42"), http.StatusOK, "X-Cache", "hit", "Age", "3")
		if n := f.down.calls.Load(); n != 1 {
			t.Errorf("pricing service saw %d requests; want 1", n)
		}
	})
}

func TestConcurrentRequestsShareOneLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{})
		const n = 50
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			sources = map[string]int{}
		)
		for range n {
			wg.Go(func() {
				rec := get(f.h, "/products/7")
				if rec.Code != http.StatusOK {
					t.Errorf("status %d; want 200", rec.Code)
				}
				mu.Lock()
				sources[rec.Header().Get("X-Cache")]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if sources["loaded"] != 1 || sources["shared"] != n-1 {
			t.Errorf("X-Cache of %d concurrent requests: %v; want 1 loaded, %d shared", n, sources, n-1)
		}
		if c := f.down.calls.Load(); c != 1 {
			t.Errorf("pricing service saw %d requests; want 1", c)
		}
	})
}

func TestNotFoundIsCached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{NotFoundTTL: time.Minute})
		want(t, "first GET", get(f.h, "/products/nope"), http.StatusNotFound, "X-Cache", "loaded", "Age", "0")
		time.Sleep(2 * time.Second)
		rec := get(f.h, "/products/nope")
		want(t, "second GET", rec, http.StatusNotFound, "X-Cache", "hit", "Age", "2")
		if !strings.Contains(rec.Body.String(), `"error"`) {
			t.Errorf("404 body %q has no error", rec.Body.String())
		}
		if c := f.down.calls.Load(); c != 1 {
			t.Errorf("pricing service saw %d requests; want 1 (the not-found is cached)", c)
		}
	})
}

func TestStaleWhileRevalidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{StaleWhileRevalidate: time.Minute})
		want(t, "first GET", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "loaded")
		time.Sleep(12 * time.Second)
		want(t, "GET after the TTL", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "stale", "Age", "12")
		time.Sleep(time.Second) // the background refresh (100 ms) has finished
		want(t, "GET after the refresh", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "hit", "Age", "0")
		if c := f.down.calls.Load(); c != 2 {
			t.Errorf("pricing service saw %d requests; want 2", c)
		}
	})
}

func TestBreakerOpenAndStaleOnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{
			StaleIfError: time.Minute,
			Breaker:      flightcache.Breaker{ConsecutiveFailures: 1, OpenTimeout: 7 * time.Second},
		})
		want(t, "first GET", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "loaded")

		f.down.fail.Store(true)
		time.Sleep(11 * time.Second)
		// The reload fails (and opens the breaker); the stale price covers it.
		want(t, "GET during the outage", get(f.h, "/products/1"), http.StatusOK,
			"X-Cache", "stale-on-error", "Age", "11", "Retry-After", "")
		// Nothing stale for product 2: the breaker's refusal reaches the client.
		want(t, "GET of another product", get(f.h, "/products/2"), http.StatusServiceUnavailable,
			"Retry-After", "7", "X-Cache", "error", "Age", "")
		// The breaker is open; product 1 is still covered.
		want(t, "GET with the breaker open", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "stale-on-error")

		if c := f.down.calls.Load(); c != 2 {
			t.Errorf("pricing service saw %d requests; want 2 (the open breaker refuses the rest)", c)
		}
		if s := f.repo.Stats(); s.Breaker != flightcache.BreakerOpen || s.BreakerRejected != 2 {
			t.Errorf("breaker %v, %d rejected; want open, 2", s.Breaker, s.BreakerRejected)
		}
	})
}

func TestBadGateway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{Breaker: flightcache.Breaker{Disabled: true}})
		f.down.fail.Store(true)
		want(t, "GET", get(f.h, "/products/1"), http.StatusBadGateway, "X-Cache", "error", "Age", "")
		f.down.fail.Store(false)
		want(t, "GET after recovery", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "loaded")
	})
}

func TestLoadTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{LoadTimeout: 50 * time.Millisecond})
		want(t, "GET", get(f.h, "/products/1"), http.StatusGatewayTimeout, "X-Cache", "error", "Age", "")
	})
}

func TestCacheControl(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Fresh for 10s, then stale for a minute.
		f := newFixture(t, flightcache.Options[string, Product]{StaleWhileRevalidate: time.Minute})
		goStale := func() {
			time.Sleep(15 * time.Second) // 5s past freshness
		}
		want(t, "first GET", get(f.h, "/products/1"), http.StatusOK, "X-Cache", "loaded")
		// RFC 9111 5.2.1.4: no-cache is not answered from the cache
		// without revalidation, fresh or not.
		want(t, "no-cache on a fresh price", get(f.h, "/products/1", "Cache-Control", "no-cache"), http.StatusOK, "X-Cache", "loaded")

		goStale()
		want(t, "max-stale=2, stale for 5s", get(f.h, "/products/1", "Cache-Control", "max-stale=2"), http.StatusOK, "X-Cache", "loaded")
		goStale()
		want(t, "no-cache, stale", get(f.h, "/products/1", "Cache-Control", "no-cache"), http.StatusOK, "X-Cache", "loaded")
		goStale()
		want(t, "max-stale=0, stale", get(f.h, "/products/1", "Cache-Control", "max-age=60, max-stale=0"), http.StatusOK, "X-Cache", "loaded")
		goStale()
		want(t, "max-stale=10, stale for 5s", get(f.h, "/products/1", "Cache-Control", "max-stale=10"), http.StatusOK, "X-Cache", "stale", "Age", "15")
		goStale()
		want(t, "malformed max-stale", get(f.h, "/products/1", "Cache-Control", "max-stale=soon"), http.StatusOK, "X-Cache", "stale")
		goStale()
		want(t, "max-stale without a value", get(f.h, "/products/1", "Cache-Control", "max-stale"), http.StatusOK, "X-Cache", "stale")
	})
}

func TestPlainRepositoryIsADropIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := &faults{next: (&pricingService{Latency: 10 * time.Millisecond}).Handler()}
		var repo ProductRepository = &HTTPRepository{Client: &http.Client{Transport: inProcess{down}}, BaseURL: "http://pricing.test"}
		h := (&api{repo: repo, log: slog.New(slog.DiscardHandler)}).routes()
		for range 2 {
			want(t, "GET", get(h, "/products/5"), http.StatusOK, "X-Cache", "", "Age", "")
		}
		want(t, "GET unknown", get(h, "/products/0"), http.StatusNotFound, "X-Cache", "")
		if c := down.calls.Load(); c != 3 {
			t.Errorf("pricing service saw %d requests; want 3 (no cache)", c)
		}
		if rec := get(h, "/debug/flightcache"); rec.Code != http.StatusNotFound {
			t.Errorf("/debug/flightcache without a Loader: status %d; want 404", rec.Code)
		}
	})
}

func TestClosedRepository(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{})
		f.repo.Close()
		want(t, "GET after Close", get(f.h, "/products/1"), http.StatusServiceUnavailable, "X-Cache", "")
	})
}

// TestClientDisconnect runs over real connections: a client that hangs up
// ends its own wait, and the request that shares its load still gets the
// product.
func TestClientDisconnect(t *testing.T) {
	down := &faults{
		next:    (&pricingService{}).Handler(),
		arrived: make(chan struct{}, 1),
		gate:    make(chan struct{}),
	}
	pricing := httptest.NewServer(down)
	defer pricing.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	repo, err := NewCachedRepository(&HTTPRepository{Client: &http.Client{Transport: transport}, BaseURL: pricing.URL},
		flightcache.Options[string, Product]{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	a := &api{repo: repo, stats: repo.Stats, log: slog.New(slog.DiscardHandler)}
	srv := httptest.NewServer(a.routes())
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	type answer struct {
		resp *http.Response
		err  error
	}
	send := func(ctx context.Context) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/products/3", nil)
			resp, err := client.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			ch <- answer{resp, err}
		}()
		return ch
	}

	ctxA, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	a1 := send(ctxA)
	recv(t, "A's load to reach the pricing service", down.arrived)
	b := send(context.Background())
	waitFor(t, "B to join the load", func() bool { return repo.Stats().Misses == 2 })

	hangUp()
	if got := recv(t, "A's answer after hanging up", a1); got.err == nil {
		t.Fatalf("A: status %d after hanging up; want an error", got.resp.StatusCode)
	}
	waitFor(t, "the server to see A leave", func() bool { return repo.Stats().Canceled == 1 })

	close(down.gate)
	got := recv(t, "B's answer", b)
	if got.err != nil {
		t.Fatalf("B: %v", got.err)
	}
	if got.resp.StatusCode != http.StatusOK || got.resp.Header.Get("X-Cache") != "shared" {
		t.Errorf("B: status %d, X-Cache %q; want 200, shared", got.resp.StatusCode, got.resp.Header.Get("X-Cache"))
	}
	if c := down.calls.Load(); c != 1 {
		t.Errorf("pricing service saw %d requests; want 1", c)
	}
}

// recv receives from ch, failing the test after a minute: a test on the
// real clock that deadlocks fails there, not at the package's timeout.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
		panic("unreachable")
	}
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDebugStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{TTL: time.Minute})
		want(t, "GET", get(f.h, "/products/9"), http.StatusOK, "X-Cache", "loaded")
		want(t, "GET", get(f.h, "/products/9"), http.StatusOK, "X-Cache", "hit")
		synctest.Wait() // the load has been counted

		rec := get(f.h, "/debug/flightcache")
		want(t, "/debug/flightcache", rec, http.StatusOK, "Content-Type", "application/json")
		var stats map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &stats); err != nil {
			t.Fatalf("/debug/flightcache: %v", err)
		}
		for k, v := range map[string]any{"Gets": 2.0, "Hits": 1.0, "Misses": 1.0, "Loads": 1.0, "Breaker": "closed"} {
			if stats[k] != v {
				t.Errorf("/debug/flightcache %s = %v; want %v", k, stats[k], v)
			}
		}
	})
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-fail", "2"}, {"-latency", "-1s"}, {"-ttl", "0s"}, {"extra"}, {"-nope"},
		{"-trace", "jaeger"}, {"-otlp", "collector"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) = nil error", args)
		}
	}
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil || cfg.addr != "127.0.0.1:8080" || cfg.latency != 80*time.Millisecond || cfg.failRate != 0.05 {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
}

// post serves one POST in process.
func post(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
	return rec
}

// The pricing service's Cache-Control and ETag drive the cache: a price
// lives as long as its max-age says (a flash-sale product's max-age=1
// expires after a second while the default TTL is ten), and once it has
// expired it is revalidated with If-None-Match: a 304 renews it with no
// body transferred.
func TestPerResponseFreshnessAndRevalidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := &pricingService{Latency: 100 * time.Millisecond, MaxAge: 5 * time.Second, FlashMaxAge: time.Second,
			StaleIfError: time.Minute}
		f := newFixtureWith(t, svc, flightcache.Options[string, Product]{}) // TTL 10s
		want(t, "first GET of a flash product", get(f.h, "/products/100"), http.StatusOK, "X-Cache", "loaded")
		want(t, "first GET of a product", get(f.h, "/products/7"), http.StatusOK, "X-Cache", "loaded")
		time.Sleep(1500 * time.Millisecond)
		want(t, "flash product 1.5s on (max-age=1)", get(f.h, "/products/100"), http.StatusOK, "X-Cache", "loaded", "Age", "0")
		want(t, "product 1.5s on (max-age=5)", get(f.h, "/products/7"), http.StatusOK, "X-Cache", "hit", "Age", "1")
		if n, nm := svc.requests.Load(), svc.notModified.Load(); n != 3 || nm != 1 {
			t.Errorf("pricing requests %d, of them 304 %d; want 3 and 1 (the flash price revalidated, unchanged)", n, nm)
		}
		post(svc.Handler(), "/prices/100/change")
		time.Sleep(1500 * time.Millisecond)
		rec := get(f.h, "/products/100")
		want(t, "flash product after its price changed", rec, http.StatusOK, "X-Cache", "loaded")
		var p Product
		if err := json.NewDecoder(rec.Body).Decode(&p); err != nil || p.PriceCents != 100+100*37%9900+5 {
			t.Errorf("changed price = %d, %v; want the new price", p.PriceCents, err)
		}
		if s := f.repo.Stats(); s.Reloads != 2 || s.NotModified != 1 {
			t.Errorf("Stats Reloads %d, NotModified %d; want 2, 1", s.Reloads, s.NotModified)
		}
	})
}

// A burst of no-cache requests makes one pricing call between them, and
// POST /products/{id}/refresh reloads in the background while GETs keep
// getting the current price.
func TestNoCacheBurstAndRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := &pricingService{Latency: 100 * time.Millisecond, MaxAge: time.Minute}
		f := newFixtureWith(t, svc, flightcache.Options[string, Product]{})
		get(f.h, "/products/3")
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() { get(f.h, "/products/3", "Cache-Control", "no-cache") })
		}
		wg.Wait()
		if n := svc.requests.Load(); n != 2 {
			t.Errorf("pricing requests after a burst of 100 no-cache GETs = %d; want 2 (the first GET, one revalidation)", n)
		}
		post(svc.Handler(), "/prices/3/change")
		want(t, "POST refresh", post(f.h, "/products/3/refresh"), http.StatusAccepted)
		want(t, "GET during the refresh", get(f.h, "/products/3"), http.StatusOK, "X-Cache", "hit")
		time.Sleep(200 * time.Millisecond) // the pricing service answers the refresh
		synctest.Wait()
		var p Product
		json.NewDecoder(get(f.h, "/products/3").Body).Decode(&p)
		if p.PriceCents != 100+3*37%9900+5 {
			t.Errorf("price after the refresh = %d; want the changed one", p.PriceCents)
		}
	})
}

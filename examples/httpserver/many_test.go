package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
)

// overlappingLists returns n lists of product ids for GET /products?ids=:
// each a window of 5 to 20 consecutive ids within 1..60, shuffled, with
// one of its ids asked twice. The lists are the same on every run.
func overlappingLists(n int) [][]string {
	rng := rand.New(rand.NewPCG(1, 2))
	lists := make([][]string, n)
	for i := range lists {
		size := 5 + rng.IntN(16)
		lo := 1 + rng.IntN(60-size+1)
		ids := make([]string, 0, size+1)
		for id := lo; id < lo+size; id++ {
			ids = append(ids, strconv.Itoa(id))
		}
		rng.Shuffle(len(ids), func(a, b int) { ids[a], ids[b] = ids[b], ids[a] })
		ids = slices.Insert(ids, rng.IntN(len(ids)+1), ids[rng.IntN(len(ids))])
		lists[i] = ids
	}
	return lists
}

// distinctIDs returns the distinct ids of lists.
func distinctIDs(lists [][]string) map[string]bool {
	ids := map[string]bool{}
	for _, l := range lists {
		for _, id := range l {
			ids[id] = true
		}
	}
	return ids
}

// checkAnswer checks a 200 answer to GET /products?ids= for asked, ids
// of the catalog whose prices never changed: every product, in the order
// asked, once, at its price, and nothing missing.
func checkAnswer(asked []string, code int, got productsAnswer) error {
	if code != http.StatusOK {
		return fmt.Errorf("status %d (%s); want 200", code, got.Error)
	}
	var want []string
	for _, id := range asked {
		if !slices.Contains(want, id) {
			want = append(want, id)
		}
	}
	var ids []string
	for _, p := range got.Products {
		ids = append(ids, p.ID)
		n, _ := strconv.Atoi(p.ID)
		if p.Name != "Product "+p.ID || p.PriceCents != int64(100+n*37%9900) || p.Currency != "EUR" {
			return fmt.Errorf("product %+v; want product %s at its price", p, p.ID)
		}
	}
	if !slices.Equal(ids, want) || len(got.Missing) != 0 || len(got.Failed) != 0 {
		return fmt.Errorf("products %v, missing %v, failed %v; want products %v, none missing or failed", ids, got.Missing, got.Failed, want)
	}
	return nil
}

// answerOf decodes a recorded answer to GET /products?ids=.
func answerOf(t *testing.T, rec *httptest.ResponseRecorder) productsAnswer {
	t.Helper()
	var a productsAnswer
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return a
}

// ids returns the ids of ps.
func ids(ps []Product) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}

// askCounter wraps the pricing service: it counts single price requests,
// batch requests, and how many times each id was asked for in a batch.
type askCounter struct {
	next http.Handler

	mu      sync.Mutex
	singles int
	batches int
	asked   map[string]int
}

func (c *askCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/prices":
		c.batches++
		for id := range strings.SplitSeq(r.URL.Query().Get("ids"), ",") {
			c.asked[id]++
		}
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/prices/"):
		c.singles++
	}
	c.mu.Unlock()
	c.next.ServeHTTP(w, r)
}

// countAsks puts an askCounter in front of f's pricing service. Call it
// before the first request.
func countAsks(f *fixture) *askCounter {
	c := &askCounter{next: f.down.next, asked: map[string]int{}}
	f.down.next = c
	return c
}

// In process, in a synctest bubble: 50 concurrent requests for
// overlapping lists all arrive before the first batch answers (100 ms of
// fake time), so each id is asked for once, by whichever request first
// missed it, and every other request for it shares that load.
func TestProductsOverlappingRequestsShareBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{MaxBatch: 50})
		asks := countAsks(f)
		lists := overlappingLists(50)
		var wg sync.WaitGroup
		for _, l := range lists {
			wg.Go(func() {
				rec := get(f.h, "/products?ids="+strings.Join(l, ","))
				var a productsAnswer
				json.Unmarshal(rec.Body.Bytes(), &a)
				if err := checkAnswer(l, rec.Code, a); err != nil {
					t.Errorf("GET /products?ids=%s: %v", strings.Join(l, ","), err)
				}
			})
		}
		wg.Wait()

		distinct := distinctIDs(lists)
		for id := range distinct {
			if asks.asked[id] != 1 {
				t.Errorf("id %s asked of the pricing service %d times; want 1", id, asks.asked[id])
			}
		}
		if len(asks.asked) != len(distinct) || asks.singles != 0 {
			t.Errorf("pricing service asked for %d ids and %d single prices; want %d ids, no single price", len(asks.asked), asks.singles, len(distinct))
		}
		if asks.batches < 1 || asks.batches >= len(distinct) {
			t.Errorf("%d batch calls for %d distinct ids; want fewer calls than ids", asks.batches, len(distinct))
		}
		s := f.repo.Stats()
		if s.BatchLoads != uint64(asks.batches) || s.BatchKeys != uint64(len(distinct)) || s.Loads != s.BatchLoads {
			t.Errorf("Stats Loads %d, BatchLoads %d, BatchKeys %d; want %d, %d, %d", s.Loads, s.BatchLoads, s.BatchKeys, asks.batches, asks.batches, len(distinct))
		}
		t.Logf("%d requests, %d distinct ids: %d batch calls, %d ids asked", len(lists), len(distinct), asks.batches, len(distinct))

		// Again: all from the cache.
		for _, l := range lists {
			rec := get(f.h, "/products?ids="+strings.Join(l, ","))
			if err := checkAnswer(l, rec.Code, answerOf(t, rec)); err != nil {
				t.Errorf("GET /products?ids=%s again: %v", strings.Join(l, ","), err)
			}
		}
		if c := f.down.calls.Load(); c != int64(asks.batches) {
			t.Errorf("pricing service saw %d requests after the lists were asked again; want still %d", c, asks.batches)
		}
	})
}

// Ids that name no product are listed as missing (and their absence is
// cached); the products found come in the order asked, duplicates
// ignored.
func TestProductsMissing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{NotFoundTTL: time.Minute})
		asks := countAsks(f)
		for _, what := range []string{"first GET", "second GET"} {
			rec := get(f.h, "/products?ids=5,0,1001,5,2,0")
			want(t, what, rec, http.StatusOK, "Content-Type", "application/json", "X-Cache", "")
			a := answerOf(t, rec)
			if got := ids(a.Products); !slices.Equal(got, []string{"5", "2"}) || !slices.Equal(a.Missing, []string{"0", "1001"}) ||
				a.Failed != nil || a.Error != "" {
				t.Errorf("%s: products %v, missing %v, failed %v, error %q; want [5 2], [0 1001], none, none", what, got, a.Missing, a.Failed, a.Error)
			}
		}
		if asks.batches != 1 || len(asks.asked) != 4 {
			t.Errorf("pricing service saw %d batches asking %v; want 1 asking 5, 0, 1001, 2 (then all cached)", asks.batches, asks.asked)
		}

		rec := get(f.h, "/products?ids=0")
		if a := answerOf(t, rec); rec.Code != http.StatusOK || len(a.Products) != 0 || !slices.Equal(a.Missing, []string{"0"}) {
			t.Errorf("only a missing id: %d %s; want 200, no products, missing [0]", rec.Code, rec.Body.String())
		}
		if !strings.Contains(rec.Body.String(), `"products":[]`) {
			t.Errorf("no product found: body %s; want an empty products list", rec.Body.String())
		}
	})
}

// A bad id is refused with 400, naming it, before anything is looked up.
func TestProductsBadIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{MaxBatch: 50})
		many := make([]string, maxIDs+1)
		for i := range many {
			many[i] = strconv.Itoa(i + 1)
		}
		for _, c := range []struct{ query, says string }{
			{"ids=1,x7,3", `"x7"`},
			{"ids=1,-2", `"-2"`},
			{"ids=007", `"007"`},
			{"ids=1,,2", `""`},
			{"ids=1,2,", `""`},
			{"ids=1.5", `"1.5"`},
			{"ids=", "ids is required"},
			{"", "ids is required"},
			{"ids=" + strings.Join(many, ","), "at most 100"},
		} {
			rec := get(f.h, "/products?"+c.query)
			want(t, c.query, rec, http.StatusBadRequest, "Content-Type", "application/json")
			if !strings.Contains(rec.Body.String(), strings.ReplaceAll(c.says, `"`, `\"`)) {
				t.Errorf("%s: body %s; want it to say %s", c.query, strings.TrimSpace(rec.Body.String()), c.says)
			}
		}
		// Spaces around ids and 100 ids (with duplicates) are fine.
		want(t, "ids with spaces", get(f.h, "/products?ids=1,%202%20,3"), http.StatusOK)
		want(t, "100 ids", get(f.h, "/products?ids=1,"+strings.Join(many[:maxIDs], ",")), http.StatusOK)
		if c := f.down.calls.Load(); c != 3 {
			t.Errorf("pricing service saw %d requests; want 3 (none for the bad ones; 1 to 3, then 97 ids in batches of 50)", c)
		}
	})
}

// When some ids fail, the answer says which, with what is known of the
// others; its status is 502, or 503 with Retry-After while the breaker is
// open.
func TestProductsPartialFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{
			NotFoundTTL: time.Minute,
			Breaker:     flightcache.Breaker{ConsecutiveFailures: 2, OpenTimeout: 7 * time.Second},
		})
		want(t, "GET before the outage", get(f.h, "/products?ids=1,2,0"), http.StatusOK)

		f.down.fail.Store(true)
		rec := get(f.h, "/products?ids=2,3,0,1,4")
		want(t, "GET during the outage", rec, http.StatusBadGateway, "Retry-After", "")
		a := answerOf(t, rec)
		if got := ids(a.Products); !slices.Equal(got, []string{"2", "1"}) || !slices.Equal(a.Missing, []string{"0"}) ||
			!slices.Equal(a.Failed, []string{"3", "4"}) || a.Error != "pricing service failed" {
			t.Errorf("during the outage: %s; want products [2 1], missing [0], failed [3 4], an error", rec.Body.String())
		}

		// A second failure opens the breaker; then it refuses at once.
		want(t, "second failure", get(f.h, "/products?ids=5"), http.StatusBadGateway)
		rec = get(f.h, "/products?ids=6,1,7")
		want(t, "GET with the breaker open", rec, http.StatusServiceUnavailable, "Retry-After", "7")
		if a := answerOf(t, rec); !slices.Equal(ids(a.Products), []string{"1"}) || !slices.Equal(a.Failed, []string{"6", "7"}) {
			t.Errorf("with the breaker open: %s; want product 1, failed [6 7]", rec.Body.String())
		}
		if c := f.down.calls.Load(); c != 3 {
			t.Errorf("pricing service saw %d requests; want 3 (the open breaker refuses the last)", c)
		}
	})
}

// Products loaded in a batch follow the batch's Cache-Control (that of
// its shortest-lived price) and keep their own ETag: once expired, each is
// revalidated on its own, and an unchanged price is renewed by a 304.
func TestProductsBatchFreshness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := &pricingService{Latency: 100 * time.Millisecond, MaxAge: 5 * time.Second, FlashMaxAge: time.Second,
			StaleIfError: time.Minute}

		rec := get(svc.Handler(), "/prices?ids=7,100,nope,7,2000")
		want(t, "batch with a flash price", rec, http.StatusOK, "Cache-Control", "max-age=1, stale-if-error=60")
		var answer batchAnswer
		json.Unmarshal(rec.Body.Bytes(), &answer)
		if len(answer.Prices) != 2 || answer.Prices[0].ID != "7" || answer.Prices[0].ETag != `"7-0"` || answer.Prices[1].ID != "100" {
			t.Errorf("batch answer %s; want 7 and 100, each with its ETag", rec.Body.String())
		}
		want(t, "batch without one", get(svc.Handler(), "/prices?ids=7,8"), http.StatusOK, "Cache-Control", "max-age=5, stale-if-error=60")
		want(t, "batch of unknown ids", get(svc.Handler(), "/prices?ids=0"), http.StatusOK, "Cache-Control", "")
		want(t, "batch without ids", get(svc.Handler(), "/prices"), http.StatusBadRequest)
		want(t, "too big a batch", get(svc.Handler(), "/prices?ids=1"+strings.Repeat(",1", maxPriceBatch)), http.StatusBadRequest)

		f := newFixtureWith(t, svc, flightcache.Options[string, Product]{}) // TTL 10s
		want(t, "GET 7,8", get(f.h, "/products?ids=7,8"), http.StatusOK)
		want(t, "GET 100,9", get(f.h, "/products?ids=100,9"), http.StatusOK)
		time.Sleep(1500 * time.Millisecond)
		want(t, "product 9 1.5s on (its batch said max-age=1)", get(f.h, "/products/9"), http.StatusOK, "X-Cache", "loaded", "Age", "0")
		want(t, "product 7 1.5s on (max-age=5)", get(f.h, "/products/7"), http.StatusOK, "X-Cache", "hit", "Age", "1")
		if n, nm := svc.requests.Load(), svc.notModified.Load(); n != 1 || nm != 1 {
			t.Errorf("single price requests %d, of them 304 %d; want 1 and 1 (9 revalidated with the ETag of its batch)", n, nm)
		}
	})
}

// getOnly is a ProductRepository that is no ManyGetter.
type getOnly struct{ ProductRepository }

// GET /products?ids= works on the plain repository (one batch call each
// time) and on one without GetMany (one Get per id).
func TestProductsPlainRepositories(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := &faults{next: (&pricingService{Latency: 10 * time.Millisecond}).Handler()}
		plain := &HTTPRepository{Client: &http.Client{Transport: inProcess{down}}, BaseURL: "http://pricing.test"}
		for _, c := range []struct {
			name  string
			repo  ProductRepository
			calls int64
		}{{"HTTPRepository", plain, 1}, {"a repository without GetMany", getOnly{plain}, 3}} {
			down.calls.Store(0)
			h := (&api{repo: c.repo, log: slog.New(slog.DiscardHandler)}).routes()
			rec := get(h, "/products?ids=6,0,5,6")
			want(t, c.name, rec, http.StatusOK)
			if a := answerOf(t, rec); !slices.Equal(ids(a.Products), []string{"6", "5"}) || !slices.Equal(a.Missing, []string{"0"}) {
				t.Errorf("%s: %s; want products 6, 5 and 0 missing", c.name, rec.Body.String())
			}
			if n := down.calls.Load(); n != c.calls {
				t.Errorf("%s: pricing service saw %d requests; want %d", c.name, n, c.calls)
			}

			down.fail.Store(true)
			rec = get(h, "/products?ids=6,0")
			want(t, c.name+" failing", rec, http.StatusBadGateway)
			if a := answerOf(t, rec); len(a.Products) != 0 || len(a.Missing) != 0 || len(a.Failed) == 0 {
				t.Errorf("%s failing: %s; want the ids failed", c.name, rec.Body.String())
			}
			down.fail.Store(false)
		}
	})
}

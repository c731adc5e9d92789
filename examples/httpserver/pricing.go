package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// catalogSize is how many products the pricing service knows: ids 1 to
// catalogSize. Any other id is not found.
const catalogSize = 1000

// maxPriceBatch is the most ids one GET /prices may list.
const maxPriceBatch = 100

// pricingService is the slow downstream of this example: a stand-in for a
// pricing service, served over HTTP on loopback by its own server. Every
// price takes Latency to compute, and a FailRate share of requests fail
// with 500. It is safe for concurrent use.
type pricingService struct {
	// Latency is how long every price request takes, unless the request's
	// context ends first.
	Latency time.Duration
	// FailRate, in [0, 1], is the share of price requests answered with
	// 500 Internal Server Error.
	FailRate float64
	// MaxAge, StaleWhileRevalidate and StaleIfError go out with every
	// price as Cache-Control (max-age, stale-while-revalidate,
	// stale-if-error, RFC 5861), in whole seconds; 0 leaves a directive
	// out. FlashMaxAge, if set, is the max-age of the products whose id is
	// a multiple of 100, whose prices change fast.
	MaxAge, FlashMaxAge                time.Duration
	StaleWhileRevalidate, StaleIfError time.Duration

	requests    atomic.Int64 // price requests received
	notModified atomic.Int64 // of those, answered 304 Not Modified (no body)

	batchRequests atomic.Int64 // batch price requests received (GET /prices)
	batchIDs      atomic.Int64 // ids asked for over all of those

	mu         sync.Mutex
	versions   map[string]int // how many times each price changed (POST /prices/{id}/change)
	categories map[string]int // how many times each category's prices changed (POST /categories/{category}/change)
}

// Handler serves GET /prices/{id} (the price of one product as JSON, with
// an ETag; If-None-Match gets 304 Not Modified while the price has not
// changed), GET /prices?ids=1,2,3 (the prices of several products in one
// call, see batchPrices), POST /prices/{id}/change (the price changes),
// POST /categories/{category}/change (every price of a category changes) and
// GET /debug/requests (how many price requests arrived, how many were
// answered 304, how many batch requests arrived and how many ids they
// asked for, as JSON).
func (s *pricingService) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /prices/{id}", s.price)
	mux.HandleFunc("GET /prices", s.batchPrices)
	mux.HandleFunc("POST /prices/{id}/change", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.versions == nil {
			s.versions = map[string]int{}
		}
		s.versions[r.PathValue("id")]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /categories/{category}/change", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.categories == nil {
			s.categories = map[string]int{}
		}
		s.categories[r.PathValue("category")]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /debug/requests", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]int64{
			"requests":       s.requests.Load(),
			"not_modified":   s.notModified.Load(),
			"batch_requests": s.batchRequests.Load(),
			"batch_ids":      s.batchIDs.Load(),
		})
	})
	return mux
}

// maxAge is the max-age of the price of product n; 0 means none.
func (s *pricingService) maxAge(n int) time.Duration {
	if s.FlashMaxAge > 0 && n%100 == 0 {
		return s.FlashMaxAge
	}
	return s.MaxAge
}

// livesLess reports whether the price of product n has a shorter max-age
// than that of product m; no max-age is the longest.
func (s *pricingService) livesLess(n, m int) bool {
	a, b := s.maxAge(n), s.maxAge(m)
	return a > 0 && (b == 0 || a < b)
}

// cacheControl is the Cache-Control of the price of product n.
func (s *pricingService) cacheControl(n int) string {
	cc := ""
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"max-age", s.maxAge(n)}, {"stale-while-revalidate", s.StaleWhileRevalidate}, {"stale-if-error", s.StaleIfError}} {
		if d.v > 0 {
			if cc != "" {
				cc += ", "
			}
			cc += fmt.Sprintf("%s=%d", d.name, int64(d.v/time.Second))
		}
	}
	return cc
}

// work takes the service's latency and fails as often as FailRate says. It
// returns false when the request is over: the caller gave up (nobody reads
// the answer), or the failure has been written.
func (s *pricingService) work(w http.ResponseWriter, r *http.Request) bool {
	t := time.NewTimer(s.Latency)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return false
	}
	if s.FailRate > 0 && rand.Float64() < s.FailRate {
		writeJSON(w, http.StatusInternalServerError, errorBody{"pricing: backend overloaded"})
		return false
	}
	return true
}

func (s *pricingService) price(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if !s.work(w, r) {
		return
	}
	id := r.PathValue("id")
	n, ok := parseID(id)
	if !ok {
		writeJSON(w, http.StatusNotFound, errorBody{"pricing: no product " + strconv.Quote(id)})
		return
	}
	p, etag := s.product(id, n)
	h := w.Header()
	h.Set("ETag", etag)
	if cc := s.cacheControl(n); cc != "" {
		h.Set("Cache-Control", cc)
	}
	if r.Header.Get("If-None-Match") == etag {
		s.notModified.Add(1)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// product prices product n, whose id is id, and returns it with its ETag.
func (s *pricingService) product(id string, n int) (Product, string) {
	s.mu.Lock()
	version := s.versions[id] + s.categories[Category(id)]
	s.mu.Unlock()
	return Product{
		ID:         id,
		Name:       "Product " + id,
		PriceCents: int64(100 + n*37%9900 + 5*version),
		Currency:   "EUR",
		PricedAt:   time.Now().UTC(),
	}, fmt.Sprintf(`"%s-%d"`, id, version)
}

// parseID returns the product number of id, and false if id names no
// product of the catalog.
func parseID(id string) (int, bool) {
	n, err := strconv.Atoi(id)
	return n, err == nil && n >= 1 && n <= catalogSize && strconv.Itoa(n) == id
}

// batchItem is one price of a batch answer: the product, with the ETag the
// single endpoint would give it (so that a price loaded in a batch can be
// revalidated on its own later, with If-None-Match).
type batchItem struct {
	Product
	ETag string `json:"etag"`
}

// batchAnswer is the body of a GET /prices answer.
type batchAnswer struct {
	// Prices holds the products of the ids the service knows, in the
	// order asked, each once. An unknown id is simply absent.
	Prices []batchItem `json:"prices"`
}

// batchPrices serves GET /prices?ids=1,2,3: the prices of up to
// maxPriceBatch products in one call. The whole call takes Latency (not
// Latency per id) and fails as a whole with FailRate. No ids, an empty id
// or more than maxPriceBatch ids is 400 Bad Request.
//
// Freshness is kept simple: the answer carries one Cache-Control for all
// of its prices, that of the shortest-lived one (a flash-sale product in a
// batch shortens the life of every price in it, never the other way
// round), and each price carries its own ETag in the body; there is no
// conditional batch request.
func (s *pricingService) batchPrices(w http.ResponseWriter, r *http.Request) {
	s.batchRequests.Add(1)
	ids := strings.Split(r.URL.Query().Get("ids"), ",")
	s.batchIDs.Add(int64(len(ids)))
	switch {
	case len(ids) > maxPriceBatch:
		writeJSON(w, http.StatusBadRequest, errorBody{fmt.Sprintf("pricing: %d ids; at most %d per request", len(ids), maxPriceBatch)})
		return
	case slices.Contains(ids, ""):
		writeJSON(w, http.StatusBadRequest, errorBody{"pricing: ids must be a comma-separated list of ids"})
		return
	}
	if !s.work(w, r) {
		return
	}
	answer := batchAnswer{Prices: []batchItem{}}
	seen := make(map[string]bool, len(ids))
	shortest := 0 // the product whose price lives least, 0 before the first
	for _, id := range ids {
		n, ok := parseID(id)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		p, etag := s.product(id, n)
		answer.Prices = append(answer.Prices, batchItem{Product: p, ETag: etag})
		if shortest == 0 || s.livesLess(n, shortest) {
			shortest = n
		}
	}
	if cc := s.cacheControl(shortest); shortest != 0 && cc != "" {
		w.Header().Set("Cache-Control", cc)
	}
	writeJSON(w, http.StatusOK, answer)
}

// errorBody is the JSON body of every error answer, of both servers.
type errorBody struct {
	Error string `json:"error"`
}

// writeJSON writes v as the JSON body of a response with status code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

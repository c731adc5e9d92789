package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// catalogSize is how many products the pricing service knows: ids 1 to
// catalogSize. Any other id is not found.
const catalogSize = 1000

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

	mu       sync.Mutex
	versions map[string]int // how many times each price changed (POST /prices/{id}/change)
}

// Handler serves GET /prices/{id} (the price of one product as JSON, with
// an ETag; If-None-Match gets 304 Not Modified while the price has not
// changed), POST /prices/{id}/change (the price changes) and GET
// /debug/requests (how many price requests arrived, and how many were
// answered 304, as JSON).
func (s *pricingService) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /prices/{id}", s.price)
	mux.HandleFunc("POST /prices/{id}/change", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.versions == nil {
			s.versions = map[string]int{}
		}
		s.versions[r.PathValue("id")]++
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /debug/requests", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]int64{"requests": s.requests.Load(), "not_modified": s.notModified.Load()})
	})
	return mux
}

// cacheControl is the Cache-Control of the price of product n.
func (s *pricingService) cacheControl(n int) string {
	maxAge := s.MaxAge
	if s.FlashMaxAge > 0 && n%100 == 0 {
		maxAge = s.FlashMaxAge
	}
	cc := ""
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"max-age", maxAge}, {"stale-while-revalidate", s.StaleWhileRevalidate}, {"stale-if-error", s.StaleIfError}} {
		if d.v > 0 {
			if cc != "" {
				cc += ", "
			}
			cc += fmt.Sprintf("%s=%d", d.name, int64(d.v/time.Second))
		}
	}
	return cc
}

func (s *pricingService) price(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	t := time.NewTimer(s.Latency)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return // the caller gave up; nobody reads the answer
	}
	if s.FailRate > 0 && rand.Float64() < s.FailRate {
		writeJSON(w, http.StatusInternalServerError, errorBody{"pricing: backend overloaded"})
		return
	}
	id := r.PathValue("id")
	n, err := strconv.Atoi(id)
	if err != nil || n < 1 || n > catalogSize || strconv.Itoa(n) != id {
		writeJSON(w, http.StatusNotFound, errorBody{"pricing: no product " + strconv.Quote(id)})
		return
	}
	s.mu.Lock()
	version := s.versions[id]
	s.mu.Unlock()
	etag := fmt.Sprintf(`"%s-%d"`, id, version)
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
	writeJSON(w, http.StatusOK, Product{
		ID:         id,
		Name:       "Product " + id,
		PriceCents: int64(100 + n*37%9900 + 5*version),
		Currency:   "EUR",
		PricedAt:   time.Now().UTC(),
	})
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

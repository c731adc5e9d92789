package main

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
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

	requests atomic.Int64 // price requests received
}

// Handler serves GET /prices/{id} (the price of one product as JSON) and
// GET /debug/requests (how many price requests arrived, as JSON).
func (s *pricingService) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /prices/{id}", s.price)
	mux.HandleFunc("GET /debug/requests", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]int64{"requests": s.requests.Load()})
	})
	return mux
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
	writeJSON(w, http.StatusOK, Product{
		ID:         id,
		Name:       "Product " + id,
		PriceCents: int64(100 + n*37%9900),
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

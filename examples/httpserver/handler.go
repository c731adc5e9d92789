package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/flightcache/flightcache"
)

// infoGetter is what a repository implements, beside ProductRepository, to
// say where a product came from. CachedRepository does; HTTPRepository
// does not, and the API then sends no X-Cache or Age header.
type infoGetter interface {
	GetInfo(ctx context.Context, id string) (Product, flightcache.Info, error)
}

// api is the HTTP API in front of a ProductRepository.
type api struct {
	repo ProductRepository

	// stats, if set, is served as JSON on GET /debug/flightcache.
	stats func() flightcache.Stats
	// metrics, if set, is served on GET /metrics.
	metrics http.Handler
	// retryAfter is the Retry-After of a 503 sent while the breaker is
	// open: the breaker's OpenTimeout (0 means its default).
	retryAfter time.Duration
	log        *slog.Logger
}

// routes returns the API's handler.
func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /products/{id}", a.product)
	mux.HandleFunc("POST /products/{id}/refresh", a.refresh)
	if a.stats != nil {
		mux.HandleFunc("GET /debug/flightcache", a.debugStats)
	}
	if a.metrics != nil {
		mux.Handle("GET /metrics", a.metrics)
	}
	return mux
}

// product serves GET /products/{id}:
//
//	200  the product as JSON
//	404  no such product (negatively cached by CachedRepository)
//	502  the pricing service failed and no stale price covers it
//	503  the circuit breaker is open and nothing stale exists (Retry-After),
//	     or the server is shutting down
//	504  the load timed out
//
// With a repository that reports it, X-Cache says where the answer came
// from (hit, stale, stale-on-error, loaded, shared) and, for a product or a
// cached not-found, Age how old it is in seconds. The request's
// Cache-Control is honoured: no-cache is never answered from the cache (the
// price is revalidated with the pricing service, one call for a burst of
// such requests), max-stale=N accepts a price stale for at most N seconds.
// A client that goes away stops only its own wait: the load goes on for
// the others.
func (a *api) product(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx := withRequestFreshness(r.Context(), r.Header.Values("Cache-Control"))
	var (
		p       Product
		info    flightcache.Info
		err     error
		hasInfo bool
	)
	if ig, ok := a.repo.(infoGetter); ok {
		p, info, err = ig.GetInfo(ctx, id)
		hasInfo = true
	} else {
		p, err = a.repo.Get(ctx, id)
	}

	h := w.Header()
	if hasInfo && info.Source != flightcache.SourceNone {
		h.Set("X-Cache", info.Source.String())
		if err == nil || errors.Is(err, ErrNotFound) {
			h.Set("Age", strconv.FormatInt(int64(info.Age/time.Second), 10))
		}
	}
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, p)
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{fmt.Sprintf("no product %q", id)})
	case r.Context().Err() != nil:
		// The client went away: nobody reads an answer. Its leaving ended
		// only its own wait.
		a.log.Debug("client gone", "id", id, "err", err)
	case errors.Is(err, flightcache.ErrBreakerOpen):
		wait := a.retryAfter
		if wait <= 0 {
			wait = flightcache.DefaultOpenTimeout
		}
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		writeJSON(w, http.StatusServiceUnavailable, errorBody{"pricing service unavailable (circuit open)"})
	case errors.Is(err, flightcache.ErrLoadTimeout):
		writeJSON(w, http.StatusGatewayTimeout, errorBody{"pricing service timed out"})
	case errors.Is(err, flightcache.ErrClosed):
		writeJSON(w, http.StatusServiceUnavailable, errorBody{"shutting down"})
	default:
		a.log.Warn("pricing failed", "id", id, "err", err)
		writeJSON(w, http.StatusBadGateway, errorBody{"pricing service failed"})
	}
}

// withRequestFreshness maps the request's Cache-Control onto the Get:
// no-cache to flightcache.WithRevalidate (RFC 9111 5.2.1.4: not answered
// from the cache without revalidation), and max-stale=N to
// WithMaxStale(ctx, N seconds). max-stale without a value accepts any
// staleness, which is the default. Unknown directives and malformed values
// are ignored.
func withRequestFreshness(ctx context.Context, headers []string) context.Context {
	maxStale := time.Duration(-1)
	for _, h := range headers {
		for d := range strings.SplitSeq(h, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), "=")
			switch strings.ToLower(name) {
			case "no-cache":
				return flightcache.WithRevalidate(ctx)
			case "max-stale":
				n, err := strconv.ParseInt(strings.Trim(value, `"`), 10, 32)
				if err == nil && n >= 0 {
					maxStale = time.Duration(n) * time.Second
				}
			}
		}
	}
	if maxStale >= 0 {
		return flightcache.WithMaxStale(ctx, maxStale)
	}
	return ctx
}

// refresher is what a repository implements to reload a product in the
// background. CachedRepository does.
type refresher interface {
	Refresh(ctx context.Context, id string)
}

// refresh serves POST /products/{id}/refresh: the product is reloaded in
// the background (202 Accepted) while GETs keep getting the current price;
// 501 when the repository cannot.
func (a *api) refresh(w http.ResponseWriter, r *http.Request) {
	rf, ok := a.repo.(refresher)
	if !ok {
		writeJSON(w, http.StatusNotImplemented, errorBody{"this repository does not cache"})
		return
	}
	rf.Refresh(r.Context(), r.PathValue("id"))
	w.WriteHeader(http.StatusAccepted)
}

// statsJSON is Stats with the breaker state spelled out.
type statsJSON struct {
	flightcache.Stats
	Breaker string // shadows Stats.Breaker
}

// debugStats serves GET /debug/flightcache: the Loader's Stats as JSON.
func (a *api) debugStats(w http.ResponseWriter, r *http.Request) {
	s := a.stats()
	writeJSON(w, http.StatusOK, statsJSON{Stats: s, Breaker: s.Breaker.String()})
}

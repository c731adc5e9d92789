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
	"go.opentelemetry.io/otel/trace"
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
	// tracer, if set, starts a server span for every request.
	tracer trace.Tracer
}

// routes returns the API's handler.
func (a *api) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /products/{id}", a.product)
	mux.HandleFunc("GET /products", a.products)
	mux.HandleFunc("POST /products/{id}/refresh", a.refresh)
	mux.HandleFunc("POST /categories/{category}/price-changed", a.categoryChanged)
	if a.stats != nil {
		mux.HandleFunc("GET /debug/flightcache", a.debugStats)
	}
	if a.metrics != nil {
		mux.Handle("GET /metrics", a.metrics)
	}
	if a.tracer != nil {
		return traced(a.tracer, mux)
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
// cached not-found, Age how old it is in seconds. A failed answer (502,
// 503, 504) says X-Cache: error: its Info says loaded or shared (it came
// from a load, which failed), and counting those as loads would count the
// pricing service's failures as traffic it served. The request's
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
		if err == nil || errors.Is(err, ErrNotFound) {
			h.Set("X-Cache", info.Source.String())
			h.Set("Age", strconv.FormatInt(int64(info.Age/time.Second), 10))
		} else {
			h.Set("X-Cache", "error") // the load failed: not one "loaded"
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
	default:
		code, msg := a.failure(h, err)
		if code == http.StatusBadGateway {
			a.log.Warn("pricing failed", "id", id, "err", err)
		}
		writeJSON(w, code, errorBody{msg})
	}
}

// failure maps the error of a load that failed to a status code and a
// message, and sets the Retry-After of a 503 caused by the open breaker
// in h:
//
//	503  the circuit breaker is open (Retry-After), or the server is shutting down
//	504  the load timed out
//	502  anything else: the pricing service failed
func (a *api) failure(h http.Header, err error) (int, string) {
	switch {
	case errors.Is(err, flightcache.ErrBreakerOpen):
		wait := a.retryAfter
		if wait <= 0 {
			wait = flightcache.DefaultOpenTimeout
		}
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		return http.StatusServiceUnavailable, "pricing service unavailable (circuit open)"
	case errors.Is(err, flightcache.ErrLoadTimeout):
		return http.StatusGatewayTimeout, "pricing service timed out"
	case errors.Is(err, flightcache.ErrClosed):
		return http.StatusServiceUnavailable, "shutting down"
	}
	return http.StatusBadGateway, "pricing service failed"
}

// maxIDs is the most distinct ids one GET /products?ids= may ask for.
const maxIDs = 100

// productsAnswer is the body of a GET /products?ids= answer.
type productsAnswer struct {
	// Products are the products found, in the order asked, each once.
	Products []Product `json:"products"`
	// Missing lists the ids asked for that name no product, in the
	// order asked.
	Missing []string `json:"missing"`
	// Failed lists the ids that could not be priced, in the order asked;
	// Error then says why (the first failure's reason). Both are left out
	// of a 200.
	Failed []string `json:"failed,omitempty"`
	Error  string   `json:"error,omitempty"`
}

// products serves GET /products?ids=1,2,3: several products in one
// request, looked up together (through the repository's GetMany when it
// has one: the cached repository then loads the ids it misses in batches,
// one pricing call per batch, and shares each id's load with every
// concurrent request for it). The answer is a productsAnswer:
//
//	200  every id was looked up: "products" holds the products found, in
//	     the order asked, duplicates ignored; "missing" lists the ids that
//	     name no product (an empty list when there are none)
//	400  ids is missing or empty, an id is not a product id (a decimal
//	     number written without sign or leading zeros; the error names it),
//	     or more than maxIDs distinct ids are asked for
//	502  some ids could not be priced: "failed" lists them and "error"
//	     says why, while "products" and "missing" still say what is
//	     known of the others; 503 (with Retry-After when the breaker is
//	     open) or 504 instead when every failed id failed that way, as
//	     for GET /products/{id}
//
// The request's Cache-Control applies to every id, as for GET
// /products/{id}. There is no X-Cache or Age: the ids may have come from
// different places.
func (a *api) products(w http.ResponseWriter, r *http.Request) {
	ids, bad := parseIDs(r.URL.Query().Get("ids"))
	if bad != "" {
		writeJSON(w, http.StatusBadRequest, errorBody{bad})
		return
	}
	ctx := withRequestFreshness(r.Context(), r.Header.Values("Cache-Control"))
	var (
		found map[string]Product
		err   error
	)
	if mg, ok := a.repo.(ManyGetter); ok {
		found, err = mg.GetMany(ctx, ids)
	} else {
		found, err = getEach(ctx, a.repo, ids)
	}
	if err != nil && r.Context().Err() != nil {
		a.log.Debug("client gone", "ids", len(ids), "err", err)
		return
	}
	// Which ids failed, and why.
	var failed map[string]error
	if me, ok := errors.AsType[*flightcache.ManyError[string]](err); ok {
		failed = me.Errs
	} else if err != nil {
		failed = make(map[string]error, len(ids))
		for _, id := range ids {
			if _, ok := found[id]; !ok {
				failed[id] = err
			}
		}
	}

	answer := productsAnswer{Products: make([]Product, 0, len(found)), Missing: []string{}}
	for _, id := range ids {
		if p, ok := found[id]; ok {
			answer.Products = append(answer.Products, p)
		} else if _, ok := failed[id]; ok {
			answer.Failed = append(answer.Failed, id)
		} else {
			answer.Missing = append(answer.Missing, id)
		}
	}
	if len(answer.Failed) == 0 {
		writeJSON(w, http.StatusOK, answer)
		return
	}
	// One status for all: that of every failed id if they agree, else 502.
	code := 0
	for _, id := range answer.Failed {
		c, msg := a.failure(w.Header(), failed[id])
		if code == 0 {
			code, answer.Error = c, msg
		} else if c != code {
			code, answer.Error = http.StatusBadGateway, "pricing service failed"
		}
	}
	if code != http.StatusServiceUnavailable {
		w.Header().Del("Retry-After")
	}
	if code == http.StatusBadGateway {
		a.log.Warn("pricing failed", "ids", answer.Failed, "err", err)
	}
	writeJSON(w, code, answer)
}

// parseIDs splits the comma-separated ids of GET /products?ids=, in the
// order given, duplicates dropped. bad, if not empty, is why they are
// refused, naming the first bad id.
func parseIDs(list string) (ids []string, bad string) {
	if list == "" {
		return nil, "ids is required: a comma-separated list of product ids, such as ids=1,2,3"
	}
	seen := make(map[string]bool)
	for id := range strings.SplitSeq(list, ",") {
		id = strings.TrimSpace(id)
		if n, err := strconv.ParseUint(id, 10, 63); err != nil || strconv.FormatUint(n, 10) != id {
			return nil, fmt.Sprintf("bad id %q: a product id is written in decimal digits, without sign or leading zeros", id)
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) > maxIDs {
		return nil, fmt.Sprintf("%d ids; at most %d per request", len(ids), maxIDs)
	}
	return ids, ""
}

// getEach is GetMany for a repository that is no ManyGetter: one Get per
// id, in turn.
func getEach(ctx context.Context, repo ProductRepository, ids []string) (map[string]Product, error) {
	found := make(map[string]Product, len(ids))
	var failed map[string]error
	for _, id := range ids {
		p, err := repo.Get(ctx, id)
		switch {
		case err == nil:
			found[id] = p
		case errors.Is(err, ErrNotFound):
		case ctx.Err() != nil:
			return found, ctx.Err()
		default:
			if failed == nil {
				failed = make(map[string]error)
			}
			failed[id] = err
		}
	}
	if failed != nil {
		return found, &flightcache.ManyError[string]{Errs: failed}
	}
	return found, nil
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

// debugStats serves GET /debug/flightcache: the Loader's Stats as JSON,
// the breaker's state by name.
func (a *api) debugStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.stats())
}

// categoryInvalidator is a repository that can drop every cached product
// of a category at once: CachedRepository is one.
type categoryInvalidator interface {
	InvalidateCategory(category string)
}

// categoryChanged serves POST /categories/{category}/price-changed, which
// the pricing side sends when a category's prices change: every cached
// product of the category is dropped at once (flightcache's InvalidateTag:
// no scan of the cache, whichever products are held), and the next GET of
// each loads its new price. 204 No Content; 404 for a repository that
// caches nothing.
func (a *api) categoryChanged(w http.ResponseWriter, r *http.Request) {
	inv, ok := a.repo.(categoryInvalidator)
	if !ok {
		http.NotFound(w, r)
		return
	}
	inv.InvalidateCategory(r.PathValue("category"))
	w.WriteHeader(http.StatusNoContent)
}

// Httpserver is a product API in front of a slow pricing service, with a
// flightcache.Loader in between.
//
// It starts two HTTP servers on loopback: the pricing service (the
// downstream: every request to it, for one price or a batch, takes
// -latency, and a -fail share of them fail) and the API on -addr:
//
//	GET /products/{id}      a product with its price, as JSON; X-Cache and Age say
//	                        where it came from (X-Cache: error for a failed
//	                        answer); Cache-Control: no-cache and max-stale=N
//	                        bound how stale it may be
//	GET /products?ids=1,2,3 up to 100 products at once, as JSON: "products"
//	                        (in the order asked, duplicates ignored) and
//	                        "missing" (the ids that name no product); 400
//	                        names a bad id; 502 (503, 504) lists the ids
//	                        that failed in "failed", with what it has
//	GET /debug/flightcache  the Loader's Stats, as JSON
//	GET /metrics            Prometheus metrics, from otelflightcache
//
// The Loader reports its metrics and traces through one
// otelflightcache.Observer, set as Options.Observer. Every request is a
// server span; a request that waits on a load has a flightcache.get span
// under it, linked to the load's flightcache.load span, under which the
// pricing call is a client span. -trace stdout prints the spans as JSON
// lines (the bench module's report tool draws them: report trace);
// -otlp host:port sends them to an OpenTelemetry collector over OTLP/HTTP
// (port 4318 by default).
//
// The API reads products through a ProductRepository: HTTPRepository calls
// the pricing service on every Get; CachedRepository, a drop-in with the
// same interface, puts a Loader in front of it. Both are ManyGetters too,
// for GET /products?ids=: CachedRepository answers each id from the cache
// or from a load already in flight for it (flightcache's GetMany), and
// loads the rest together through the pricing service's batch endpoint,
// GET /prices?ids=1,2,3, one call per batch of at most 50 ids. Concurrent
// requests for overlapping lists thus make one pricing call per distinct
// id, in batches.
//
// SIGINT or SIGTERM stops the API gracefully: no new connections, requests
// in progress finish, then the Loader closes.
//
// Usage:
//
//	go run ./examples/httpserver [-addr 127.0.0.1:8080] [-latency 80ms] [-fail 0.05] [-trace stdout] [-otlp host:port]
//	curl -i localhost:8080/products/42
//	curl -i 'localhost:8080/products?ids=1,2,3'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/flightcache/flightcache"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "httpserver:", err)
		}
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	addr, pricingAddr string
	latency           time.Duration
	failRate          float64
	ttl               time.Duration
	loadTimeout       time.Duration
	trace             string // "" or "stdout"
	otlp              string // host:port of an OTLP/HTTP collector, or ""
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("httpserver", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "address of the API")
	fs.StringVar(&cfg.pricingAddr, "pricing-addr", "127.0.0.1:0", "address of the pricing service (port 0: any free port)")
	fs.DurationVar(&cfg.latency, "latency", 80*time.Millisecond, "how long the pricing service takes per price")
	fs.Float64Var(&cfg.failRate, "fail", 0.05, "share of pricing requests that fail, in [0, 1]")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "how long a price is fresh; it is then served stale for as long again while it refreshes")
	fs.DurationVar(&cfg.loadTimeout, "load-timeout", time.Second, "bound on one load of a price, retries included")
	fs.StringVar(&cfg.trace, "trace", "", "where spans are printed: stdout (as JSON lines), or nowhere")
	fs.StringVar(&cfg.otlp, "otlp", "", "host:port of an OpenTelemetry collector to send spans to over OTLP/HTTP")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.failRate < 0 || cfg.failRate > 1:
		return cfg, fmt.Errorf("-fail must be in [0, 1], got %v", cfg.failRate)
	case cfg.latency < 0:
		return cfg, fmt.Errorf("-latency must be >= 0, got %v", cfg.latency)
	case cfg.ttl <= 0 || cfg.loadTimeout <= 0:
		return cfg, errors.New("-ttl and -load-timeout must be > 0")
	case cfg.trace != "" && cfg.trace != "stdout":
		return cfg, fmt.Errorf("-trace must be stdout, got %q", cfg.trace)
	}
	if cfg.otlp != "" {
		if _, _, err := net.SplitHostPort(cfg.otlp); err != nil {
			return cfg, fmt.Errorf("-otlp must be host:port: %w", err)
		}
	}
	return cfg, nil
}

// cacheOptions is how the example configures its Loader.
func cacheOptions(cfg config) flightcache.Options[string, Product] {
	return flightcache.Options[string, Product]{
		TTL:                  cfg.ttl,
		Jitter:               0.1, // products loaded together do not expire together
		StaleWhileRevalidate: cfg.ttl,
		StaleIfError:         5 * time.Minute, // ride out a pricing outage on the last good price
		NotFoundTTL:          30 * time.Second,
		LoadTimeout:          cfg.loadTimeout,
		MaxCost:              100_000,
		// GET /products?ids= loads the ids it misses in batches of at most
		// 50 (one pricing call each, well under the service's 100): a
		// bounded URL, and one slow or failed call holds up 50 prices at
		// most.
		MaxBatch: 50,
		Retry: flightcache.Retry{
			MaxAttempts:     2,
			InitialInterval: 20 * time.Millisecond,
		},
		Breaker: flightcache.Breaker{ConsecutiveFailures: 5, OpenTimeout: 5 * time.Second},
	}
}

// run serves until ctx ends, then shuts down gracefully. It logs to out,
// and prints spans there with -trace stdout.
func run(ctx context.Context, args []string, out io.Writer) (err error) {
	cfg, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(out, nil))

	// Metrics and traces, for the Loader in one value and one field. Its
	// exporters are flushed and stopped on the way out.
	tel, err := newTelemetry(ctx, cfg, out)
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err = errors.Join(err, tel.stop(stopCtx))
	}()

	// The downstream: the pricing service, on its own loopback server.
	pricing := &pricingService{
		Latency: cfg.latency, FailRate: cfg.failRate,
		// Prices say how long they stay valid (the Loader follows them):
		// as long as -ttl, flash-sale products (ids that are multiples of
		// 100) one second.
		MaxAge: cfg.ttl, FlashMaxAge: time.Second, StaleWhileRevalidate: cfg.ttl, StaleIfError: 5 * time.Minute,
	}
	pricingLn, err := net.Listen("tcp", cfg.pricingAddr)
	if err != nil {
		return err
	}
	pricingSrv := &http.Server{Handler: pricing.Handler(), ReadHeaderTimeout: 5 * time.Second}
	pricingDone := make(chan error, 1)
	go func() { pricingDone <- pricingSrv.Serve(pricingLn) }()
	pricingURL := "http://" + pricingLn.Addr().String()
	log.Info("pricing service listening", "url", pricingURL, "latency", cfg.latency, "fail", cfg.failRate)

	// The repository: the plain HTTP one, behind a cached one.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	plain := &HTTPRepository{Client: &http.Client{Transport: tracedTransport{transport, tel.tracer}}, BaseURL: pricingURL}
	opts := cacheOptions(cfg)
	opts.Observer = tel.observer
	products, err := NewCachedRepository(plain, opts)
	if err != nil {
		return errors.Join(err, pricingSrv.Close())
	}

	a := &api{
		repo:       products,
		stats:      products.Stats,
		metrics:    tel.metrics,
		retryAfter: opts.Breaker.OpenTimeout,
		log:        log,
		tracer:     tel.tracer,
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return errors.Join(err, products.Close(), pricingSrv.Close())
	}
	srv := &http.Server{Handler: a.routes(), ReadHeaderTimeout: 5 * time.Second}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(ln) }()
	log.Info("listening", "url", "http://"+ln.Addr().String())

	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveDone:
		return errors.Join(err, products.Close(), pricingSrv.Close())
	case err := <-pricingDone:
		return errors.Join(err, srv.Close(), products.Close())
	}

	// Stop accepting and let the requests in progress finish (their loads
	// still reach the pricing service), then close the Loader, then the
	// downstream.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx)
	err = errors.Join(err, products.Close())
	transport.CloseIdleConnections()
	err = errors.Join(err, pricingSrv.Shutdown(shutdownCtx))
	if err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

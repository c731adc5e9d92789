package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flightcache/flightcache"
)

// Product is what the repository returns: a product with its current price.
// Values handed out by the cached repository are shared between callers:
// treat them as read-only.
type Product struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	PriceCents int64     `json:"price_cents"`
	Currency   string    `json:"currency"`
	PricedAt   time.Time `json:"priced_at"` // when the pricing service computed the price

	// Cache is what the pricing service said about caching this answer;
	// the API does not send it.
	Cache CacheInfo `json:"-"`
}

// CacheInfo is what an HTTP answer says about its own caching.
type CacheInfo struct {
	ETag string
	// MaxAge, StaleWhileRevalidate and StaleIfError are the answer's
	// Cache-Control directives; 0 when absent.
	MaxAge, StaleWhileRevalidate, StaleIfError time.Duration
}

// ErrNotModified is returned by a Revalidator when the product it was
// given is still current.
var ErrNotModified = errors.New("products: not modified")

// Revalidator is a ProductRepository that can check whether a product it
// returned has changed. HTTPRepository is one.
type Revalidator interface {
	// Revalidate returns the product with id if it changed since old was
	// returned, or old and an error matching ErrNotModified if not.
	Revalidate(ctx context.Context, id string, old Product) (Product, error)
}

// ErrNotFound is returned (wrapped) by every ProductRepository for an id
// that does not exist.
var ErrNotFound = errors.New("products: not found")

// ProductRepository finds products by id. Implementations are safe for
// concurrent use.
type ProductRepository interface {
	// Get returns the product with id, or an error matching ErrNotFound
	// if there is none. It returns when ctx ends, with ctx's error.
	Get(ctx context.Context, id string) (Product, error)
}

// ManyGetter is a ProductRepository that can find several products in one
// call. HTTPRepository and CachedRepository are.
type ManyGetter interface {
	// GetMany returns the products with ids, by id: an id that does not
	// exist is absent from the map. If some ids could not be looked up,
	// the error says which: a *flightcache.ManyError[string] names them
	// (the map still holds the products found); any other error means
	// that none of the ids without a product could be. It returns when
	// ctx ends, with ctx's error.
	GetMany(ctx context.Context, ids []string) (map[string]Product, error)
}

// HTTPRepository is the plain ProductRepository: every Get is a request to
// the pricing service. Its zero value is not usable: set BaseURL.
type HTTPRepository struct {
	// Client sends the requests; nil means http.DefaultClient. Set no
	// Timeout on it: the caller's context bounds each request.
	Client *http.Client
	// BaseURL is the pricing service's root, such as http://127.0.0.1:9090.
	BaseURL string
}

// Get asks the pricing service for the product with id, under ctx.
func (r *HTTPRepository) Get(ctx context.Context, id string) (Product, error) {
	return r.fetch(ctx, id, Product{})
}

// GetMany asks the pricing service for the products with ids, under ctx,
// in one batch request per maxPriceBatch ids (GET /prices?ids=1,2,3),
// made one after the other. Each product gets the Cache-Control of the
// answer that held it (one for the whole batch) and its own ETag. An id
// the pricing service does not know is absent from the map. If any
// request fails, GetMany returns no products and that error.
func (r *HTTPRepository) GetMany(ctx context.Context, ids []string) (map[string]Product, error) {
	// An empty id or one with a comma cannot be listed, and names no
	// product: it is not asked for, so it is absent.
	ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == "" || strings.Contains(id, ",") })
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make(map[string]Product, len(ids))
	for chunk := range slices.Chunk(ids, maxPriceBatch) {
		if err := r.fetchMany(ctx, chunk, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fetchMany makes one batch request for ids and adds its products to out.
func (r *HTTPRepository) fetchMany(ctx context.Context, ids []string, out map[string]Product) error {
	u := r.BaseURL + "/prices?" + url.Values{"ids": {strings.Join(ids, ",")}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("products: %w", err)
	}
	resp, err := r.client().Do(req)
	if err != nil {
		return fmt.Errorf("products: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // let the connection be reused
		return fmt.Errorf("products: pricing service answered %s to a batch of %d", resp.Status, len(ids))
	}
	var answer batchAnswer
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return fmt.Errorf("products: decoding a batch of %d prices: %w", len(ids), err)
	}
	for _, item := range answer.Prices {
		if _, asked := slices.BinarySearch(ids, item.ID); asked {
			p := item.Product
			p.Cache = cacheInfo(resp.Header, item.ETag)
			out[p.ID] = p
		}
	}
	return nil
}

// client is Client, or http.DefaultClient.
func (r *HTTPRepository) client() *http.Client {
	if r.Client == nil {
		return http.DefaultClient
	}
	return r.Client
}

// Revalidate asks the pricing service whether old is still the product's
// price (If-None-Match with its ETag): a 304 returns old and ErrNotModified,
// with the freshness the answer gives.
func (r *HTTPRepository) Revalidate(ctx context.Context, id string, old Product) (Product, error) {
	return r.fetch(ctx, id, old)
}

// fetch is Get, or Revalidate when old has an ETag.
func (r *HTTPRepository) fetch(ctx context.Context, id string, old Product) (Product, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.BaseURL+"/prices/"+url.PathEscape(id), nil)
	if err != nil {
		return Product{}, fmt.Errorf("products: %w", err)
	}
	if old.Cache.ETag != "" {
		req.Header.Set("If-None-Match", old.Cache.ETag)
	}
	resp, err := r.client().Do(req)
	if err != nil {
		return Product{}, fmt.Errorf("products: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotModified && old.Cache.ETag != "" {
		old.Cache = cacheInfo(resp.Header, old.Cache.ETag)
		return old, fmt.Errorf("products: id %q: %w", id, ErrNotModified)
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // let the connection be reused
		if resp.StatusCode == http.StatusNotFound {
			return Product{}, fmt.Errorf("products: id %q: %w", id, ErrNotFound)
		}
		return Product{}, fmt.Errorf("products: pricing service answered %s", resp.Status)
	}
	var p Product
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		return Product{}, fmt.Errorf("products: decoding the price of %q: %w", id, err)
	}
	p.Cache = cacheInfo(resp.Header, resp.Header.Get("ETag"))
	return p, nil
}

// cacheInfo reads an answer's ETag and Cache-Control. Unknown directives
// and malformed values are ignored.
func cacheInfo(h http.Header, etag string) CacheInfo {
	c := CacheInfo{ETag: etag}
	for _, v := range h.Values("Cache-Control") {
		for d := range strings.SplitSeq(v, ",") {
			name, value, _ := strings.Cut(strings.TrimSpace(d), "=")
			n, err := strconv.ParseInt(strings.Trim(value, `"`), 10, 32)
			if err != nil || n < 0 {
				continue
			}
			switch strings.ToLower(name) {
			case "max-age":
				c.MaxAge = time.Duration(n) * time.Second
			case "stale-while-revalidate":
				c.StaleWhileRevalidate = time.Duration(n) * time.Second
			case "stale-if-error":
				c.StaleIfError = time.Duration(n) * time.Second
			}
		}
	}
	return c
}

// productFreshness is the Options.Freshness of a CachedRepository: what the
// answer's Cache-Control says, and the Options' values for what it leaves
// out.
func productFreshness(_ string, p Product) flightcache.Freshness {
	return flightcache.Freshness{
		TTL:                  p.Cache.MaxAge,
		StaleWhileRevalidate: p.Cache.StaleWhileRevalidate,
		StaleIfError:         p.Cache.StaleIfError,
	}
}

// CachedRepository is a ProductRepository that puts a flightcache.Loader in
// front of another one: a drop-in for it. Concurrent Gets of one id share
// one call to the repository behind it; not-found answers are cached for
// Options.NotFoundTTL. Create it with NewCachedRepository and Close it when
// done.
type CachedRepository struct {
	loader *flightcache.Loader[string, Product]
}

// NewCachedRepository returns a CachedRepository that loads from next with
// opts. Unless opts says otherwise, each product is cached for as long as
// its answer's Cache-Control says (Options.Freshness); when next is a
// Revalidator a product held is revalidated rather than fetched again
// (Options.Reload: If-None-Match, and a 304 renews it); and when next is a
// ManyGetter, the products a GetMany misses are loaded through next's
// GetMany, in batches of at most Options.MaxBatch (Options.LoadMany).
// Metrics and traces come from opts.Observer (an otelflightcache.Observer
// in main), which the Loader calls for every load and every Get that
// waited on one.
func NewCachedRepository(next ProductRepository, opts flightcache.Options[string, Product]) (*CachedRepository, error) {
	load := func(ctx context.Context, id string) (Product, error) {
		p, err := next.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			// Both sentinels match: the Loader caches it as not-found, and
			// callers still find the repository's own ErrNotFound.
			err = fmt.Errorf("%w (%w)", err, flightcache.ErrNotFound)
		}
		return p, err
	}
	if opts.Freshness == nil {
		opts.Freshness = productFreshness
	}
	if opts.Tags == nil {
		opts.Tags = productTags
	}
	if rv, ok := next.(Revalidator); ok && opts.Reload == nil {
		opts.Reload = func(ctx context.Context, id string, old Product) (Product, error) {
			p, err := rv.Revalidate(ctx, id, old)
			switch {
			case errors.Is(err, ErrNotModified):
				return p, flightcache.ErrNotModified
			case errors.Is(err, ErrNotFound):
				err = fmt.Errorf("%w (%w)", err, flightcache.ErrNotFound)
			}
			return p, err
		}
	}
	if mg, ok := next.(ManyGetter); ok && opts.LoadMany == nil {
		// A product missing from the map does not exist: the Loader treats
		// it as a load that returned flightcache.ErrNotFound.
		opts.LoadMany = mg.GetMany
	}
	l, err := flightcache.New(load, opts)
	if err != nil {
		return nil, err
	}
	return &CachedRepository{loader: l}, nil
}

// Get returns the product with id, from the cache or from one load shared
// with every concurrent caller of id.
func (c *CachedRepository) Get(ctx context.Context, id string) (Product, error) {
	p, _, err := c.GetInfo(ctx, id)
	return p, err
}

// GetInfo is Get that also says where the product came from: the HTTP
// handler turns the Info into its X-Cache and Age headers.
func (c *CachedRepository) GetInfo(ctx context.Context, id string) (Product, flightcache.Info, error) {
	return c.loader.GetInfo(ctx, id)
}

// GetMany returns the products with ids, by id, as ManyGetter says: each
// from the cache or from a load shared with every concurrent caller of
// its id, and the ids that no load is in flight for loaded together, in
// batches (when the repository behind is a ManyGetter). An id that does
// not exist is absent (and its absence cached for Options.NotFoundTTL);
// ids that failed come back in a *flightcache.ManyError[string], the map
// still holding the products found. Duplicate ids are allowed.
func (c *CachedRepository) GetMany(ctx context.Context, ids []string) (map[string]Product, error) {
	return c.loader.GetMany(ctx, ids)
}

// Refresh reloads the product with id in the background (revalidating the
// one held); until then Gets keep getting the current one. ctx gives the
// load its values, not its cancellation.
func (c *CachedRepository) Refresh(ctx context.Context, id string) { c.loader.Refresh(ctx, id) }

// Category returns the category of the product with id: its number's last
// digit (products 3, 13, 23... are of category "3").
func Category(id string) string { return id[len(id)-1:] }

// productTags tags a product (and a cached not-found: the tags come from
// the id alone) with its category, so that InvalidateCategory drops it.
func productTags(id string, _ Product) []string { return []string{"category:" + Category(id)} }

// InvalidateCategory drops every cached product of category, in constant
// time, whichever of them are held: call it when the category's prices
// change. A Get after it loads the new price; a load in flight when it is
// called answers its callers but caches nothing.
func (c *CachedRepository) InvalidateCategory(category string) {
	c.loader.InvalidateTag("category:" + category)
}

// Stats returns the Loader's counters.
func (c *CachedRepository) Stats() flightcache.Stats { return c.loader.Stats() }

// Close stops the Loader (loads in flight are cancelled and waited for).
// Gets after Close fail with flightcache.ErrClosed.
func (c *CachedRepository) Close() error { return c.loader.Close() }

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
)

// A category's price change drops every cached product of it at once, and
// only those: products 3 and 13 (category 3) load their new prices, product
// 4 (category 4) stays a hit.
func TestCategoryPriceChangeDropsItsProducts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, flightcache.Options[string, Product]{})
		price := func(rec *httptest.ResponseRecorder) int64 {
			t.Helper()
			var p Product
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatalf("body %s: %v", rec.Body.String(), err)
			}
			return p.PriceCents
		}
		before := map[string]int64{}
		for _, id := range []string{"3", "13", "4"} {
			rec := get(f.h, "/products/"+id)
			want(t, "first GET "+id, rec, http.StatusOK, "X-Cache", "loaded")
			before[id] = price(rec)
		}
		post := func(h http.Handler, path string) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
			if rec.Code != http.StatusNoContent {
				t.Fatalf("POST %s: %d", path, rec.Code)
			}
		}
		post(f.svc.Handler(), "/categories/3/change") // the pricing side changes category 3
		time.Sleep(time.Second)
		want(t, "GET 3 before the notice", get(f.h, "/products/3"), http.StatusOK, "X-Cache", "hit")
		post(f.h, "/categories/3/price-changed") // and tells the API
		for _, id := range []string{"3", "13"} {
			rec := get(f.h, "/products/"+id)
			want(t, "GET "+id+" after the change", rec, http.StatusOK, "X-Cache", "loaded")
			if p := price(rec); p == before[id] {
				t.Errorf("product %s still priced %d after its category's change", id, p)
			}
		}
		rec := get(f.h, "/products/4")
		want(t, "GET 4, another category", rec, http.StatusOK, "X-Cache", "hit")
		if p := price(rec); p != before["4"] {
			t.Errorf("product 4 priced %d; want %d", p, before["4"])
		}
		if s := f.repo.Stats(); s.TagInvalidations != 1 {
			t.Errorf("Stats.TagInvalidations = %d; want 1", s.TagInvalidations)
		}
	})
}

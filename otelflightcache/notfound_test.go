package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// A not-found is an answer, not a failure: a load that ends in one is
// recorded with the outcome not_found, whether ErrNotFound or the
// Loader's IsNotFound says so, is not in flightcache.load.errors, and
// its spans are not errors. flightcache.load.not_founds counts the keys,
// a LoadMany call's missing ones included; flightcache.downstream.calls
// counts the calls the downstream saw, a retry included.
func TestWiredNotFoundIsNotAnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errNoRow := errors.New("no row")
		tries := map[string]int{}
		load := func(ctx context.Context, key string) (string, error) {
			tries[key]++ // one load at a time: the Gets below run in turn
			switch {
			case key == "gone":
				return "", fmt.Errorf("product %s: %w", key, flightcache.ErrNotFound)
			case key == "norow":
				return "", errNoRow
			case key == "fail", key == "flaky" && tries[key] == 1:
				return "", errBoom
			}
			return "v", nil
		}
		r, l := wired(t, load, flightcache.Options[string, string]{
			IsNotFound: func(err error) bool { return errors.Is(err, errNoRow) },
			Retry:      flightcache.Retry{MaxAttempts: 2},
			Breaker:    flightcache.Breaker{Disabled: true},
			LoadMany: func(ctx context.Context, keys []string) (map[string]string, error) {
				return map[string]string{keys[0]: "v"}, nil // the others are missing: not found
			},
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		reqs := map[string]trace.SpanID{} // each Get's request span: the parent of its get span
		for _, key := range []string{"gone", "norow", "fail", "flaky"} {
			rctx, span := r.app.Start(ctx, "request "+key)
			reqs[key] = span.SpanContext().SpanID()
			_, err := l.Get(rctx, key)
			span.End()
			if want := map[string]error{"gone": flightcache.ErrNotFound, "norow": errNoRow, "fail": errBoom}[key]; !errors.Is(err, want) {
				t.Fatalf("Get(%q) = %v; want %v", key, err, want)
			}
		}
		rctx, span := r.app.Start(ctx, "request many")
		reqs["many"] = span.SpanContext().SpanID()
		m, err := l.GetMany(rctx, []string{"m1", "m2", "m3"})
		span.End()
		if err != nil || len(m) != 1 {
			t.Fatalf("GetMany = %v, %v; want one value, two keys missing", m, err)
		}
		synctest.Wait() // LoadEnd runs after the waiters have the result

		got := collect(t, r.reader)
		for key, v := range map[string]float64{
			`flightcache.loads{flightcache.name=test}`:            5, // gone, norow, fail, flaky, one LoadMany call
			`flightcache.load.errors{flightcache.name=test}`:      1, // fail; not gone, norow
			`flightcache.load.not_founds{flightcache.name=test}`:  4, // gone, norow, m2, m3
			`flightcache.downstream.calls{flightcache.name=test}`: 7, // gone, norow, fail twice, flaky twice, LoadMany
		} {
			wantValue(t, got, key, v)
		}
		for outcome, n := range map[string]uint64{"ok": 2, "not_found": 2, "error": 1} { // ok: flaky, the LoadMany call
			key := `flightcache.load.duration{flightcache.load.background=false,flightcache.load.outcome=` + outcome + `,flightcache.name=test}`
			if got[key].count != n {
				t.Errorf("%s: count %d; want %d", key, got[key].count, n)
			}
		}

		failed := 0
		for _, s := range r.named("flightcache.load") {
			outcome := attrs(s.Attributes)[keyLoadOutcome].Emit()
			_, typed := attrs(s.Attributes)[keyErrorType]
			if wantErr := outcome == "error"; (s.Status.Code == codes.Error) != wantErr || typed != wantErr {
				t.Errorf("load span of outcome %s: status %v, error.type set %v; want an error only for outcome error", outcome, s.Status.Code, typed)
			}
			if outcome == "error" {
				failed++
			}
		}
		if failed != 1 {
			t.Errorf("%d load spans of outcome error; want 1", failed)
		}
		statuses := map[trace.SpanID][]codes.Code{} // get span statuses by request
		for _, g := range r.named("flightcache.get") {
			statuses[g.Parent.SpanID()] = append(statuses[g.Parent.SpanID()], g.Status.Code)
		}
		for key, want := range map[string][]codes.Code{
			"gone": {codes.Unset}, "fail": {codes.Error}, "flaky": {codes.Unset}, "many": {codes.Unset, codes.Unset, codes.Unset},
		} {
			if got := statuses[reqs[key]]; !slices.Equal(got, want) {
				t.Errorf("get spans of request %s: statuses %v; want %v", key, got, want)
			}
		}
	})
}

// flightcache.load.errors is LoadErrors less its not-founds, never below
// 0 whatever Stats it is handed.
func TestLoadFailures(t *testing.T) {
	for _, tc := range []struct{ errs, notFounds, want uint64 }{
		{2, 0, 2}, {3, 1, 2}, {1, 1, 0}, {1, 3, 0},
	} {
		s := flightcache.Stats{LoadErrors: tc.errs, LoadNotFounds: tc.notFounds}
		if got := loadFailures(s); got != tc.want {
			t.Errorf("loadFailures(LoadErrors %d, LoadNotFounds %d) = %d; want %d", tc.errs, tc.notFounds, got, tc.want)
		}
	}
}

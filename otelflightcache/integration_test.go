// These tests run a real Loader with an Observer.

package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// wired returns a rig and a Loader observed by it, with load as its
// LoadFunc. Call it inside the synctest bubble.
func wired(t *testing.T, load flightcache.LoadFunc[string, string], opts flightcache.Options[string, string]) (*rig, *flightcache.Loader[string, string]) {
	t.Helper()
	r := newRig(t)
	if opts.TTL == 0 {
		opts.TTL = time.Minute
	}
	if opts.Observer == nil {
		opts.Observer = r.obs
	}
	l, err := flightcache.New(load, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return r, l
}

// Ten concurrent Gets under ten request spans on one cold key whose load
// fails: one load span (status Error, callers 10), ten get spans, each a
// child of its own request span and linked to the load span; the
// LoadFunc's own span is a child of the load span; a hit afterwards makes
// no span.
func TestWiredTenGetsOneFailedLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errDown := errors.New("pricing down")
		release := make(chan struct{})
		var r *rig
		load := func(ctx context.Context, key string) (string, error) {
			_, span := r.app.Start(ctx, "pricing.query")
			defer span.End()
			if key == "ok" {
				return "value", nil
			}
			<-release
			return "", errDown
		}
		r, l := wired(t, load, flightcache.Options[string, string]{Breaker: flightcache.Breaker{Disabled: true}})

		reqSpans := make([]trace.Span, 10)
		var wg sync.WaitGroup
		for i := range reqSpans {
			ctx, span := r.app.Start(context.Background(), fmt.Sprintf("request %d", i))
			reqSpans[i] = span
			wg.Go(func() {
				defer span.End()
				if _, err := l.Get(ctx, "sku-1"); !errors.Is(err, errDown) {
					t.Errorf("Get = %v; want %v", err, errDown)
				}
			})
		}
		synctest.Wait() // all ten wait on the one load
		close(release)
		wg.Wait()
		synctest.Wait() // LoadEnd runs after the waiters have the result

		loads := r.named("flightcache.load")
		if len(loads) != 1 {
			t.Fatalf("%d load spans; want 1", len(loads))
		}
		ls := loads[0]
		if ls.Status.Code != codes.Error {
			t.Errorf("load span status = %v; want Error", ls.Status.Code)
		}
		wantAttrs(t, "load span", ls.Attributes, map[string]string{"flightcache.load.callers": "10", "flightcache.load.outcome": "error"})
		parentOK := false
		for _, s := range reqSpans {
			parentOK = parentOK || ls.Parent.SpanID() == s.SpanContext().SpanID()
		}
		if !parentOK {
			t.Errorf("the load span's parent is none of the request spans")
		}
		if q := r.named("pricing.query"); len(q) != 1 || q[0].Parent.SpanID() != ls.SpanContext.SpanID() {
			t.Errorf("the LoadFunc's span is not a child of the load span")
		}
		gets := r.named("flightcache.get")
		if len(gets) != 10 {
			t.Fatalf("%d get spans; want 10", len(gets))
		}
		byParent := map[trace.SpanID]bool{}
		for _, g := range gets {
			byParent[g.Parent.SpanID()] = true
			if len(g.Links) != 1 || g.Links[0].SpanContext.SpanID() != ls.SpanContext.SpanID() {
				t.Errorf("a get span links %v; want the load span", g.Links)
			}
			if g.Status.Code != codes.Error {
				t.Errorf("a get span's status = %v; want Error", g.Status.Code)
			}
		}
		for i, s := range reqSpans {
			if !byParent[s.SpanContext().SpanID()] {
				t.Errorf("request %d has no get span of its own", i)
			}
		}

		// A hit makes no span.
		if _, err := l.Get(context.Background(), "ok"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		r.spans.Reset()
		if _, info, err := l.GetInfo(context.Background(), "ok"); err != nil || info.Source != flightcache.SourceHit {
			t.Fatalf("GetInfo = %v, %v; want a hit", info, err)
		}
		synctest.Wait()
		if n := len(r.spans.GetSpans()); n != 0 {
			t.Errorf("a hit made %d spans", n)
		}
	})
}

// A background refresh's load span is a root linked to the Get that
// triggered it.
func TestWiredBackgroundRefreshIsRootLinked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, l := wired(t, func(ctx context.Context, key string) (string, error) { return "v", nil },
			flightcache.Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Minute})
		if _, err := l.Get(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		time.Sleep(2 * time.Second) // stale now
		r.spans.Reset()
		ctx, req := r.app.Start(context.Background(), "request")
		if _, info, err := l.GetInfo(ctx, "k"); err != nil || info.Source != flightcache.SourceStale {
			t.Fatalf("GetInfo = %v, %v; want a stale value", info, err)
		}
		req.End()
		synctest.Wait()
		loads := r.named("flightcache.load")
		if len(loads) != 1 {
			t.Fatalf("%d load spans; want the refresh's", len(loads))
		}
		if loads[0].Parent.IsValid() {
			t.Errorf("the refresh's load span has a parent")
		}
		if l := loads[0].Links; len(l) != 1 || l[0].SpanContext.SpanID() != req.SpanContext().SpanID() {
			t.Errorf("links %v; want the triggering request span", l)
		}
		wantAttrs(t, "refresh span", loads[0].Attributes, map[string]string{"flightcache.load.background": "true"})
		if n := len(r.named("flightcache.get")); n != 0 {
			t.Errorf("a stale hit made %d get spans", n)
		}
	})
}

// panicky panics in every method.
type panicky struct{}

func (panicky) LoadStart(context.Context, flightcache.LoadStartEvent[string]) context.Context {
	panic("LoadStart")
}
func (panicky) LoadEnd(context.Context, flightcache.LoadEvent[string]) { panic("LoadEnd") }
func (panicky) Waited(context.Context, flightcache.WaitEvent[string])  { panic("Waited") }

// A panicking Observer is counted in Stats.Panics, loses no result, and
// keeps the Observers beside it working.
func TestWiredPanickingObserverIsContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		l, err := flightcache.New(func(ctx context.Context, key string) (string, error) { return "v", nil },
			flightcache.Options[string, string]{TTL: time.Minute, Observer: flightcache.Observers[string](panicky{}, r.obs)})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if v, err := l.Get(context.Background(), "k"); err != nil || v != "v" {
			t.Fatalf("Get = %q, %v; want v", v, err)
		}
		synctest.Wait()
		if got := l.Stats().Panics; got != 3 {
			t.Errorf("Stats.Panics = %d; want 3 (LoadStart, LoadEnd, Waited)", got)
		}
		if len(r.named("flightcache.load")) != 1 || len(r.named("flightcache.get")) != 1 {
			t.Errorf("the Observer beside the panicking one did not see the load and the wait")
		}
	})
}

// A retried attempt is an event on the load span.
func TestWiredRetryIsAnEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		r, l := wired(t, func(ctx context.Context, key string) (string, error) {
			calls++
			if calls == 1 {
				return "", errBoom
			}
			return "v", nil
		}, flightcache.Options[string, string]{Retry: flightcache.Retry{MaxAttempts: 2}})
		if _, err := l.Get(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		loads := r.named("flightcache.load")
		if len(loads) != 1 || len(loads[0].Events) != 1 || loads[0].Events[0].Name != "flightcache.retry" {
			t.Fatalf("load spans %+v; want one with a retry event", loads)
		}
		wantAttrs(t, "load span", loads[0].Attributes, map[string]string{"flightcache.load.attempts": "2", "flightcache.load.outcome": "ok"})
	})
}

// The counters from Stats are the Loader's, and still reported after its
// Close; an Invalidate is an eviction.
func TestWiredStatsAndEvictions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, l := wired(t, func(ctx context.Context, key string) (string, error) { return "v", nil }, flightcache.Options[string, string]{})
		for range 3 {
			if _, err := l.Get(context.Background(), "k"); err != nil {
				t.Fatal(err)
			}
		}
		l.Invalidate("k")
		synctest.Wait()
		l.Close()
		got := collect(t, r.reader)
		wantValue(t, got, `flightcache.gets{flightcache.get.result=hit,flightcache.name=test}`, 2)
		wantValue(t, got, `flightcache.gets{flightcache.get.result=loaded,flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.loads{flightcache.name=test}`, 1)
		wantValue(t, got, `flightcache.evictions{flightcache.eviction.cause=invalidated,flightcache.name=test}`, 1)
		wantHistogram(t, got, `flightcache.load.callers{flightcache.load.outcome=ok,flightcache.name=test}`, 1, 1)
		wantHistogram(t, got, `flightcache.get.wait.duration{flightcache.get.source=loaded,flightcache.name=test}`, 1, 0)
	})
}

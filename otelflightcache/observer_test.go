package otelflightcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// rig is an Observer on an in-memory span exporter and a manual metric
// reader, with a tracer of the application's own on the same provider.
type rig struct {
	obs    *Observer[string]
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	app    trace.Tracer
}

func newRig(t *testing.T) *rig {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	obs, err := NewObserver[string](WithName("test"), WithMeterProvider(mp), WithTracerProvider(tp))
	if err != nil {
		t.Fatalf("NewObserver: %v", err)
	}
	return &rig{obs: obs, spans: spans, reader: reader, app: tp.Tracer("app")}
}

// named returns the ended spans called name.
func (r *rig) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range r.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// loadContext is what a Loader hands LoadStart: the starting caller's
// values, not its cancellation, and the load's deadline.
func loadContext(t *testing.T, caller context.Context) context.Context {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(caller), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// attrs returns a span's attributes by key.
func attrs(kvs []attribute.KeyValue) map[string]attribute.Value {
	m := make(map[string]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value
	}
	return m
}

// wantAttrs checks some of a span's (or an event's) attributes, each
// given as the value's Emit().
func wantAttrs(t *testing.T, what string, kvs []attribute.KeyValue, want map[string]string) {
	t.Helper()
	got := attrs(kvs)
	for k, v := range want {
		if g, ok := got[k]; !ok || g.Emit() != v {
			t.Errorf("%s: %s = %q (present: %v); want %q", what, k, g.Emit(), ok, v)
		}
	}
}

// Ten Gets under ten request spans wait on one load that fails: one load
// span, a child of the starter's request span, with the callers and an
// event per attempt; ten wait spans, each a child of its own request span
// and linked to the load span; the LoadFunc's own span is a child of the
// load span.
func TestLoadAndWaitSpans(t *testing.T) {
	r := newRig(t)
	errDown := errors.New("pricing down")
	var reqs []context.Context
	var reqSpans []trace.Span
	for i := range 10 {
		ctx, span := r.app.Start(context.Background(), fmt.Sprintf("request %d", i))
		reqs, reqSpans = append(reqs, ctx), append(reqSpans, span)
	}
	start := time.Now()

	load := r.obs.LoadStart(loadContext(t, reqs[0]), flightcache.LoadStartEvent[string]{Key: "sku-1", Keys: 1})
	_, query := r.app.Start(load, "pricing.query") // the LoadFunc's own span
	query.End()
	r.obs.Attempt(load, flightcache.AttemptEvent[string]{Key: "sku-1", Keys: 1, Attempt: 1, Err: errDown, Delay: 20 * time.Millisecond})
	r.obs.Attempt(load, flightcache.AttemptEvent[string]{Key: "sku-1", Keys: 1, Attempt: 2, Err: flightcache.ErrBreakerOpen, Rejected: true})
	r.obs.LoadEnd(load, flightcache.LoadEvent[string]{
		Key: "sku-1", Keys: 1, Duration: 50 * time.Millisecond, Err: errDown, Attempts: 1, Callers: 10,
	})
	for i, ctx := range reqs {
		src := flightcache.SourceShared
		if i == 0 {
			src = flightcache.SourceLoaded
		}
		r.obs.Waited(ctx, flightcache.WaitEvent[string]{
			Key: "sku-1", Info: flightcache.Info{Source: src, Waited: 50 * time.Millisecond}, Err: errDown, Start: start, Load: load,
		})
	}
	for _, s := range reqSpans {
		s.End()
	}

	loads := r.named("flightcache.load")
	if len(loads) != 1 {
		t.Fatalf("%d flightcache.load spans; want 1", len(loads))
	}
	ls := loads[0]
	if ls.Parent.SpanID() != reqSpans[0].SpanContext().SpanID() || ls.SpanContext.TraceID() != reqSpans[0].SpanContext().TraceID() {
		t.Errorf("the load span's parent is %v; want the starter's request span", ls.Parent.SpanID())
	}
	if ls.Status.Code != codes.Error || ls.Status.Description != errDown.Error() {
		t.Errorf("load span status = %v %q; want Error %q", ls.Status.Code, ls.Status.Description, errDown)
	}
	if ls.InstrumentationScope.Name != ScopeName {
		t.Errorf("instrumentation scope = %q; want %q", ls.InstrumentationScope.Name, ScopeName)
	}
	wantAttrs(t, "load span", ls.Attributes, map[string]string{
		"flightcache.name": "test", "flightcache.load.keys": "1", "flightcache.load.callers": "10",
		"flightcache.load.attempts": "1", "flightcache.load.background": "false", "flightcache.load.reload": "false",
		"flightcache.load.not_modified": "false", "flightcache.load.outcome": "error", "error.type": "error",
	})
	if len(ls.Events) != 2 || ls.Events[0].Name != "flightcache.retry" || ls.Events[1].Name != "flightcache.breaker.rejected" {
		t.Fatalf("load span events = %+v; want a retry, then a breaker refusal", ls.Events)
	}
	wantAttrs(t, "retry event", ls.Events[0].Attributes, map[string]string{
		"flightcache.load.attempt": "1", "flightcache.retry.delay": "0.02", "error.type": "error", "exception.message": "pricing down",
	})
	wantAttrs(t, "refusal event", ls.Events[1].Attributes, map[string]string{"flightcache.load.attempt": "2"})

	if q := r.named("pricing.query"); len(q) != 1 || q[0].Parent.SpanID() != ls.SpanContext.SpanID() {
		t.Errorf("the LoadFunc's span is not a child of the load span")
	}

	gets := r.named("flightcache.get")
	if len(gets) != 10 {
		t.Fatalf("%d flightcache.get spans; want 10", len(gets))
	}
	for i, g := range gets {
		req := reqSpans[i].SpanContext()
		if g.Parent.SpanID() != req.SpanID() || g.SpanContext.TraceID() != req.TraceID() {
			t.Errorf("get span %d is not a child of its own request span", i)
		}
		if len(g.Links) != 1 || g.Links[0].SpanContext.SpanID() != ls.SpanContext.SpanID() {
			t.Errorf("get span %d links %v; want the load span", i, g.Links)
		}
		if g.Status.Code != codes.Error || !g.StartTime.Equal(start) {
			t.Errorf("get span %d: status %v, start %v; want Error, %v", i, g.Status.Code, g.StartTime, start)
		}
		src := "shared"
		if i == 0 {
			src = "loaded"
		}
		wantAttrs(t, "get span", g.Attributes, map[string]string{"flightcache.name": "test", "flightcache.get.source": src, "error.type": "error"})
	}
}

// A background load's span is a root, linked to the Get that triggered it.
func TestBackgroundLoadSpanIsRootLinked(t *testing.T) {
	r := newRig(t)
	trigger, req := r.app.Start(context.Background(), "request")
	load := r.obs.LoadStart(loadContext(t, trigger), flightcache.LoadStartEvent[string]{
		Key: "sku-1", Keys: 1, Background: true, Reload: true, Trigger: trigger,
	})
	r.obs.LoadEnd(load, flightcache.LoadEvent[string]{Key: "sku-1", Keys: 1, Background: true, Reload: true, NotModified: true, Attempts: 1})
	req.End()

	loads := r.named("flightcache.load")
	if len(loads) != 1 {
		t.Fatalf("%d load spans; want 1", len(loads))
	}
	ls := loads[0]
	if ls.Parent.IsValid() || ls.SpanContext.TraceID() == req.SpanContext().TraceID() {
		t.Errorf("the background load span has parent %v in trace %v; want a root of its own", ls.Parent, ls.SpanContext.TraceID())
	}
	if len(ls.Links) != 1 || ls.Links[0].SpanContext.SpanID() != req.SpanContext().SpanID() {
		t.Errorf("links = %v; want the triggering request span", ls.Links)
	}
	if ls.Status.Code != codes.Unset {
		t.Errorf("status = %v; want Unset for a load that did not fail", ls.Status.Code)
	}
	wantAttrs(t, "load span", ls.Attributes, map[string]string{
		"flightcache.load.background": "true", "flightcache.load.reload": "true",
		"flightcache.load.not_modified": "true", "flightcache.load.outcome": "ok", "flightcache.load.callers": "0",
	})
	if _, ok := attrs(ls.Attributes)["error.type"]; ok {
		t.Errorf("a load that did not fail has error.type")
	}
}

// LoadEnd and Attempt with a context LoadStart did not return touch no
// span: never the caller's own. A wait on no load (a caller that left
// first) has no link.
func TestForeignContextsTouchNoSpan(t *testing.T) {
	r := newRig(t)
	ctx, req := r.app.Start(context.Background(), "request")
	r.obs.Attempt(ctx, flightcache.AttemptEvent[string]{Key: "k", Attempt: 1, Err: errBoom})
	r.obs.LoadEnd(ctx, flightcache.LoadEvent[string]{Key: "k", Err: errBoom})
	if n := len(r.spans.GetSpans()); n != 0 {
		t.Fatalf("%d spans ended; want none (the request span is still running)", n)
	}
	r.obs.Waited(ctx, flightcache.WaitEvent[string]{Key: "k", Err: context.Canceled, Start: time.Now()})
	req.End()
	gets := r.named("flightcache.get")
	if len(gets) != 1 || len(gets[0].Links) != 0 {
		t.Fatalf("get spans %+v; want one, without a link", gets)
	}
	if got := gets[0].Status.Code; got != codes.Error {
		t.Errorf("status of a Get that left = %v; want Error", got)
	}
	wantAttrs(t, "get span", gets[0].Attributes, map[string]string{"flightcache.get.source": "none", "error.type": "canceled"})
	if req := r.named("request"); len(req) != 1 || len(req[0].Events) != 0 || req[0].Status.Code != codes.Unset {
		t.Errorf("the request span was changed: %+v", req)
	}
}

// Two Observers on two tracer providers, combined: each ends its own load
// span, and links its own wait span to it.
func TestTwoObserversKeepTheirOwnSpans(t *testing.T) {
	a, b := newRig(t), newRig(t)
	obs := flightcache.Observers[string](a.obs, b.obs)
	ctx, req := a.app.Start(context.Background(), "request")
	load := obs.LoadStart(loadContext(t, ctx), flightcache.LoadStartEvent[string]{Key: "k", Keys: 1})
	obs.LoadEnd(load, flightcache.LoadEvent[string]{Key: "k", Keys: 1, Callers: 1, Attempts: 1})
	obs.Waited(ctx, flightcache.WaitEvent[string]{Key: "k", Info: flightcache.Info{Source: flightcache.SourceLoaded}, Start: time.Now(), Load: load})
	req.End()
	for name, r := range map[string]*rig{"a": a, "b": b} {
		loads, gets := r.named("flightcache.load"), r.named("flightcache.get")
		if len(loads) != 1 || len(gets) != 1 {
			t.Fatalf("%s: %d load spans, %d get spans; want 1 and 1", name, len(loads), len(gets))
		}
		if l := gets[0].Links; len(l) != 1 || l[0].SpanContext.SpanID() != loads[0].SpanContext.SpanID() {
			t.Errorf("%s: its get span links %v; want its own load span", name, l)
		}
	}
}

// unitsOf returns every metric's unit, by name.
func unitsOf(t *testing.T, rd *sdkmetric.ManualReader) map[string]string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	units := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			t.Errorf("metrics in scope %q; want %q", sm.Scope.Name, ScopeName)
		}
		for _, m := range sm.Metrics {
			units[m.Name] = m.Unit
		}
	}
	return units
}

// The instruments, their units and attributes; the counters from Stats
// appear once the Loader hands the Stats over.
func TestObserverMetrics(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.obs.LoadEnd(ctx, flightcache.LoadEvent[string]{Key: "a", Keys: 1, Duration: 50 * time.Millisecond, Callers: 3, Attempts: 1})
	r.obs.LoadEnd(ctx, flightcache.LoadEvent[string]{Key: "b", Keys: 1, Duration: 10 * time.Millisecond, Callers: 1,
		Err: errBoom, NotFound: true, Background: true})
	r.obs.LoadEnd(ctx, flightcache.LoadEvent[string]{Key: "c", Keys: 1, Err: &flightcache.PanicError{Value: "x"}, Callers: 2})
	r.obs.Waited(ctx, flightcache.WaitEvent[string]{Key: "a", Info: flightcache.Info{Source: flightcache.SourceShared, Waited: 50 * time.Millisecond}})
	r.obs.Waited(ctx, flightcache.WaitEvent[string]{Key: "a", Info: flightcache.Info{Source: flightcache.SourceLoaded, Waited: 50 * time.Millisecond}})
	for _, c := range []flightcache.EvictionCause{flightcache.EvictionPolicy, flightcache.EvictionPolicy, flightcache.EvictionExpired, 0, 99} {
		r.obs.Evicted(flightcache.EvictionEvent[string]{Key: "a", Cause: c, Cost: 1})
	}

	got := collect(t, r.reader)
	wantHistogram(t, got, `flightcache.load.duration{flightcache.load.background=false,flightcache.load.outcome=ok,flightcache.name=test}`, 1, 0.05)
	wantHistogram(t, got, `flightcache.load.duration{flightcache.load.background=true,flightcache.load.outcome=not_found,flightcache.name=test}`, 1, 0.01)
	wantHistogram(t, got, `flightcache.load.callers{flightcache.load.outcome=ok,flightcache.name=test}`, 1, 3)
	wantHistogram(t, got, `flightcache.load.callers{flightcache.load.outcome=panic,flightcache.name=test}`, 1, 2)
	wantHistogram(t, got, `flightcache.get.wait.duration{flightcache.get.source=shared,flightcache.name=test}`, 1, 0.05)
	wantHistogram(t, got, `flightcache.get.wait.duration{flightcache.get.source=loaded,flightcache.name=test}`, 1, 0.05)
	wantValue(t, got, `flightcache.evictions{flightcache.eviction.cause=policy,flightcache.name=test}`, 2)
	wantValue(t, got, `flightcache.evictions{flightcache.eviction.cause=expired,flightcache.name=test}`, 1)
	wantValue(t, got, `flightcache.evictions{flightcache.eviction.cause=replaced,flightcache.name=test}`, 0)
	wantValue(t, got, `flightcache.evictions{flightcache.eviction.cause=unknown,flightcache.name=test}`, 2)
	if _, ok := got[`flightcache.gets{flightcache.get.result=hit,flightcache.name=test}`]; ok {
		t.Errorf("counters from Stats before the Loader handed its Stats")
	}

	r.obs.ObserveStats(func() flightcache.Stats {
		return flightcache.Stats{
			Gets: 10, Hits: 5, StaleHits: 1, Misses: 3, Closed: 1, Loads: 4, LoadErrors: 2, Loaded: 1, Shared: 2, SharedErrors: 1,
			Refreshes: 1, BreakerRejected: 1, Panics: 1, InFlight: 2, Waiting: 7, Breaker: flightcache.BreakerOpen,
			NotFounds: 3, DownstreamCalls: 6,
		}
	})
	got = collect(t, r.reader)
	for key, v := range map[string]float64{
		`flightcache.gets{flightcache.get.result=hit,flightcache.name=test}`:                5,
		`flightcache.gets{flightcache.get.result=stale,flightcache.name=test}`:              1,
		`flightcache.gets{flightcache.get.result=loaded,flightcache.name=test}`:             1,
		`flightcache.gets{flightcache.get.result=shared,flightcache.name=test}`:             2,
		`flightcache.gets{flightcache.get.result=closed,flightcache.name=test}`:             1,
		`flightcache.loads{flightcache.name=test}`:                                          4,
		`flightcache.load.errors{flightcache.name=test}`:                                    2,
		`flightcache.load.not_founds{flightcache.name=test}`:                                3,
		`flightcache.downstream.calls{flightcache.name=test}`:                               6,
		`flightcache.shared{flightcache.name=test}`:                                         2,
		`flightcache.shared.errors{flightcache.name=test}`:                                  1,
		`flightcache.refreshes{flightcache.name=test}`:                                      1,
		`flightcache.breaker.rejected{flightcache.name=test}`:                               1,
		`flightcache.panics{flightcache.name=test}`:                                         1,
		`flightcache.load.active{flightcache.name=test}`:                                    2,
		`flightcache.get.active{flightcache.name=test}`:                                     7,
		`flightcache.breaker.state{flightcache.breaker.state=open,flightcache.name=test}`:   1,
		`flightcache.breaker.state{flightcache.breaker.state=closed,flightcache.name=test}`: 0,
	} {
		wantValue(t, got, key, v)
	}

	want := map[string]string{
		"flightcache.load.duration": "s", "flightcache.load.callers": "{get}", "flightcache.get.wait.duration": "s",
		"flightcache.gets": "{get}", "flightcache.loads": "{load}", "flightcache.load.errors": "{load}",
		"flightcache.shared": "{get}", "flightcache.shared.errors": "{get}", "flightcache.refreshes": "{load}",
		"flightcache.evictions": "{entry}", "flightcache.breaker.rejected": "{call}", "flightcache.panics": "{panic}",
		"flightcache.load.active": "{load}", "flightcache.get.active": "{get}", "flightcache.breaker.state": "",
		"flightcache.load.not_founds": "{key}", "flightcache.downstream.calls": "{call}", "flightcache.reloads": "{load}",
		"flightcache.tag.invalidations": "{tag}", "flightcache.tag.errors": "{value}", "flightcache.tag.invalidations.fleet": "{tag}",
	}
	units := unitsOf(t, r.reader)
	for name, unit := range want {
		if u, ok := units[name]; !ok || u != unit {
			t.Errorf("%s: unit %q (present: %v); want %q", name, u, ok, unit)
		}
	}
	for name := range units {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected instrument %s", name)
		}
		if strings.HasSuffix(name, "_total") || strings.HasSuffix(name, ".total") {
			t.Errorf("%s: OpenTelemetry names have no total suffix", name)
		}
	}
	for key := range got {
		if !strings.Contains(key, "flightcache.name=test") {
			t.Errorf("%s lacks flightcache.name", key)
		}
	}
}

func TestNewObserverOptions(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithName(""), "WithName"},
		{WithMeterProvider(nil), "WithMeterProvider"},
		{WithTracerProvider(nil), "WithTracerProvider"},
	} {
		if _, err := NewObserver[string](tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) ||
			!strings.HasPrefix(err.Error(), "otelflightcache: ") {
			t.Errorf("NewObserver(%s) = %v; want an error naming it", tc.want, err)
		}
	}
	// The global providers by default: no-ops until the application sets
	// its own, and every method works on them.
	o, err := NewObserver[int]()
	if err != nil {
		t.Fatalf("NewObserver() = %v", err)
	}
	ctx := o.LoadStart(context.Background(), flightcache.LoadStartEvent[int]{Key: 1})
	o.LoadEnd(ctx, flightcache.LoadEvent[int]{Key: 1})
	o.Waited(context.Background(), flightcache.WaitEvent[int]{Key: 1, Load: ctx})
}

func TestOutcomes(t *testing.T) {
	pe := &flightcache.PanicError{Value: errors.New("x")}
	for _, tc := range []struct {
		ev   flightcache.LoadEvent[string]
		want string
	}{
		{flightcache.LoadEvent[string]{}, "ok"},
		{flightcache.LoadEvent[string]{NotModified: true}, "ok"},
		{flightcache.LoadEvent[string]{Err: errBoom}, "error"},
		{flightcache.LoadEvent[string]{Err: errBoom, NotFound: true}, "not_found"},
		{flightcache.LoadEvent[string]{Err: fmt.Errorf("x: %w", flightcache.ErrNotFound)}, "not_found"},
		{flightcache.LoadEvent[string]{Err: context.Canceled, Abandoned: true}, "canceled"},
		{flightcache.LoadEvent[string]{Err: fmt.Errorf("%w: %w", flightcache.ErrLoadTimeout, context.DeadlineExceeded)}, "timeout"},
		{flightcache.LoadEvent[string]{Err: fmt.Errorf("%w: open", flightcache.ErrBreakerOpen)}, "breaker_open"},
		{flightcache.LoadEvent[string]{Err: fmt.Errorf("%w: %w", flightcache.ErrClosed, context.Canceled)}, "canceled"},
		{flightcache.LoadEvent[string]{Err: pe}, "panic"},
		{flightcache.LoadEvent[string]{Err: flightcache.ErrGoexit}, "error"},
	} {
		if got := loadOutcome(tc.ev); got != tc.want {
			t.Errorf("loadOutcome(%+v) = %q; want %q", tc.ev, got, tc.want)
		}
	}
	if got := classify(context.DeadlineExceeded); got != "timeout" {
		t.Errorf("classify(DeadlineExceeded) = %q; want timeout", got)
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"go.opentelemetry.io/otel/trace/noop"
)

// stubSpan is the part of a span that stdouttrace prints that the tests
// read.
type stubSpan struct {
	Name        string
	SpanKind    int
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ SpanID string }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

// readSpans reads the JSON lines -trace stdout prints, one span a line.
func readSpans(t *testing.T, out []byte) []stubSpan {
	t.Helper()
	var spans []stubSpan
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s stubSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("a line is not one JSON span: %v\n%s", err, sc.Bytes())
		}
		spans = append(spans, s)
	}
	return spans
}

// With -trace stdout, every request is a server span named after its
// route, printed as one JSON line.
func TestTraceStdout(t *testing.T) {
	var out bytes.Buffer
	tp, stop, err := newTracerProvider(context.Background(), config{trace: "stdout"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, flightcache.Options[string, Product]{TTL: time.Minute})
	a := &api{repo: f.repo, log: slog.New(slog.DiscardHandler), tracer: tp.Tracer("test")}
	h := a.routes()
	want(t, "GET", get(h, "/products/9"), http.StatusOK)
	want(t, "GET", get(h, "/products/nope"), http.StatusNotFound)
	if err := stop(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	spans := readSpans(t, out.Bytes())
	if len(spans) != 2 {
		t.Fatalf("%d spans printed; want 2:\n%s", len(spans), out.String())
	}
	for i, code := range []float64{200, 404} {
		s := spans[i]
		if s.Name != "GET /products/{id}" || s.SpanKind != 2 { // 2: server
			t.Errorf("span %d: %q, kind %d; want GET /products/{id}, a server span", i, s.Name, s.SpanKind)
		}
		found := false
		for _, a := range s.Attributes {
			found = found || a.Key == "http.response.status_code" && a.Value.Value == code
		}
		if !found {
			t.Errorf("span %d: no http.response.status_code %v in %+v", i, code, s.Attributes)
		}
	}
}

// Without -trace or -otlp nothing is traced; -otlp makes an exporter that
// connects only when it has spans to send.
func TestTracerProviders(t *testing.T) {
	tp, stop, err := newTracerProvider(context.Background(), config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.(noop.TracerProvider); !ok {
		t.Errorf("no -trace, no -otlp: a %T; want a no-op provider", tp)
	}
	stop(context.Background())

	_, stop, err = newTracerProvider(context.Background(), config{otlp: "127.0.0.1:1"}, nil)
	if err != nil {
		t.Fatalf("-otlp: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := stop(ctx); err != nil {
		t.Errorf("shutdown of an OTLP exporter that sent nothing: %v", err)
	}
}

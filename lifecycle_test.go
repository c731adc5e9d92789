package flightcache

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Close called from a callback on a load goroutine must not wait for
// itself, and the only way to tell is the goroutine's stack (lifecycle.go).
// The lookup is by the address of loaderGoroutine, not by its name: this
// test fails if the lookup stops finding it (a rename that left a string
// behind, an inlined frame), and if it finds it where it is not.
func TestCloseFromLoaderGoroutine(t *testing.T) {
	if onLoaderGoroutine() {
		t.Fatal("onLoaderGoroutine() = true on a test goroutine")
	}
	inLoad, inOnLoad := make(chan bool, 1), make(chan bool, 1)
	closed := make(chan error, 1)
	var l *Loader[string, string]
	l, err := New(func(ctx context.Context, k string) (string, error) {
		inLoad <- onLoaderGoroutine()
		if k == "close" {
			closed <- l.Close() // must return at once
		}
		return k, nil
	}, Options[string, string]{TTL: time.Minute, OnLoad: func(LoadEvent[string]) { inOnLoad <- onLoaderGoroutine() }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Get(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if !<-inLoad || !<-inOnLoad {
		t.Fatal("onLoaderGoroutine() = false inside a LoadFunc or OnLoad")
	}
	if v, err := l.Get(t.Context(), "close"); v != "close" || err != nil {
		t.Errorf(`Get("close") = %q, %v; want the value: Close only starts the shutdown`, v, err)
	}
	<-inLoad
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close from a LoadFunc = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close from a LoadFunc did not return")
	}
	if err := l.Close(); err != nil { // from outside: waits for the rest
		t.Fatal(err)
	}
	if _, err := l.Get(t.Context(), "b"); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %v; want ErrClosed", err)
	}
}

// Shutdown waits at most until its context ends (docs/design.md rule 8,
// bounded): with a LoadFunc that ignores its context, Shutdown returns
// ctx.Err(), the Loader is closed for new work, and a later Shutdown or
// Close returns once the load has ended.
func TestShutdownBoundedByContext(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	l, err := New(func(ctx context.Context, k string) (string, error) {
		close(started)
		<-release // ignores ctx
		return k, nil
	}, Options[string, string]{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := l.Get(context.Background(), "k"); got <- err }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := l.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a load running = %v; want DeadlineExceeded", err)
	}
	if _, err := l.Get(context.Background(), "other"); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Shutdown = %v; want ErrClosed", err)
	}
	close(release)
	if err := l.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown = %v; want nil once the load ended", err)
	}
	if err := <-got; err != nil {
		t.Errorf("the Get whose LoadFunc ignored Close = %v; want its value", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close after Shutdown = %v", err)
	}
}

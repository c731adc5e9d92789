package flightredis

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/sony/gobreaker/v2"
)

func newBreaker(t *testing.T, addr, name string, bo flightcache.Breaker) *Breaker {
	t.Helper()
	b, err := NewBreaker(newClient(t, addr), BreakerOptions{Name: name, Breaker: bo, ProbeTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func breakerName(t *testing.T) string {
	t.Helper()
	name := "fctest-" + unsafeChars.ReplaceAllString(t.Name(), "_") + "-" + token(4)
	c := newClient(t, redisAddr(t))
	t.Cleanup(func() { c.Del(ctx, "gobreaker:state:"+name, "gobreaker:mutex:"+name) })
	return name
}

func fail(t *testing.T, b *Breaker) {
	t.Helper()
	done, err := b.Allow()
	if err != nil {
		t.Fatalf("Allow() = %v; want the call allowed", err)
	}
	done(flightcache.OutcomeFailure)
}

func TestBreakerStateIsShared(t *testing.T) {
	addr := redisAddr(t)
	name := breakerName(t)
	bo := flightcache.Breaker{ConsecutiveFailures: 3, OpenTimeout: 300 * time.Millisecond}
	a := newBreaker(t, addr, name, bo)
	b := newBreaker(t, addr, name, bo)

	for range 3 {
		fail(t, a)
	}
	if _, err := b.Allow(); !errors.Is(err, gobreaker.ErrOpenState) {
		t.Fatalf("b.Allow() after 3 failures in a = %v; want ErrOpenState", err)
	}
	if s := b.State(); s != flightcache.BreakerOpen {
		t.Errorf("b.State() = %v; want open", s)
	}
	time.Sleep(400 * time.Millisecond) // past OpenTimeout: half-open

	// One probe for the whole fleet: b's probe holds the shared mutex, so a
	// fails fast instead of probing too.
	done, err := b.Allow()
	if err != nil {
		t.Fatalf("b.Allow() half-open = %v; want a probe", err)
	}
	if _, err := a.Allow(); !errors.Is(err, gobreaker.ErrTooManyRequests) {
		t.Errorf("a.Allow() during b's probe = %v; want ErrTooManyRequests", err)
	}
	done(flightcache.OutcomeSuccess)
	eventually(t, 5*time.Second, "the probe's success to close the breaker", func() bool {
		d, err := a.Allow()
		if err != nil {
			return false
		}
		d(flightcache.OutcomeSuccess)
		return a.State() == flightcache.BreakerClosed
	})
	if s := b.Stats(); s.Probes != 1 {
		t.Errorf("b stats %+v; want 1 probe", s)
	}
}

// TestBreakerNoLostUpdates checks that concurrent failures from several
// processes all land in the shared counts (gobreaker reads the state before
// it locks; the store reads it under the mutex instead).
func TestBreakerNoLostUpdates(t *testing.T) {
	addr := redisAddr(t)
	name := breakerName(t)
	bo := flightcache.Breaker{ConsecutiveFailures: 1000}
	const procs, each = 4, 15
	bs := make([]*Breaker, procs)
	for i := range bs {
		bs[i] = newBreaker(t, addr, name, bo)
		bs[i].opts.LockWait = 5 * time.Second // nothing dropped: every outcome counts
		bs[i].store.lockWait = 5 * time.Second
	}
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Go(func() {
			for range each {
				fail(t, b)
			}
		})
	}
	wg.Wait()
	var recorded, dropped uint64
	for _, b := range bs {
		s := b.Stats()
		recorded += s.Recorded
		dropped += s.Dropped + s.Stale
	}
	data, err := newClient(t, addr).Get(ctx, "gobreaker:state:"+name).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var st gobreaker.SharedState
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	if recorded != procs*each || dropped != 0 {
		t.Errorf("recorded %d, dropped %d; want %d, 0", recorded, dropped, procs*each)
	}
	if got := st.Counts.ConsecutiveFailures; got != procs*each {
		t.Errorf("shared ConsecutiveFailures = %d; want %d (lost updates)", got, procs*each)
	}
}

func TestBreakerSharedByLoaders(t *testing.T) {
	addr := redisAddr(t)
	name := breakerName(t)
	bo := flightcache.Breaker{ConsecutiveFailures: 2, OpenTimeout: time.Minute}
	d := newDownstream()
	d.fail(errors.New("downstream down"))
	loader := func() *flightcache.Loader[string, string] {
		l, err := flightcache.New(d.load, flightcache.Options[string, string]{
			TTL: time.Minute, Breaker: flightcache.Breaker{Custom: newBreaker(t, addr, name, bo)},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	a, b := loader(), loader()
	for i := range 2 {
		if _, err := a.Get(ctx, fmt.Sprint("k", i)); err == nil {
			t.Fatal("a.Get succeeded; want the downstream's error")
		}
	}
	_, err := b.Get(ctx, "other")
	if !errors.Is(err, flightcache.ErrBreakerOpen) {
		t.Errorf("b.Get after a's failures = %v; want ErrBreakerOpen", err)
	}
	if n := d.calls.Load(); n != 2 {
		t.Errorf("downstream calls = %d; want 2 (b's call refused)", n)
	}
	if s := b.Stats().Breaker; s != flightcache.BreakerOpen {
		t.Errorf("b.Stats().Breaker = %v; want open", s)
	}
}

func TestBreakerWithoutRedisDecidesLocally(t *testing.T) {
	// A port nothing listens on: every Redis round trip fails at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b, err := NewBreaker(newClient(t, addr), BreakerOptions{
		Name: "nowhere", Breaker: flightcache.Breaker{ConsecutiveFailures: 2, OpenTimeout: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 2 {
		fail(t, b)
	}
	if _, err := b.Allow(); !errors.Is(err, gobreaker.ErrOpenState) {
		t.Errorf("Allow() after 2 local failures = %v; want the local breaker open", err)
	}
	if s := b.Stats(); s.RedisErrors == 0 || s.Local != 3 {
		t.Errorf("stats %+v; want Redis errors and 3 local decisions", s)
	}
}

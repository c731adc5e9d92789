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
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// newBreaker returns a Breaker on a client of its own, closed when the
// test ends. Its Timeout is generous: a round trip slowed down by a loaded
// machine (a Cluster client's first, which loads the slot map, say) would
// otherwise have it decide locally, which these tests do not test.
func newBreaker(t *testing.T, addr, name string, bo flightcache.Breaker) *Breaker {
	t.Helper()
	b, err := NewBreaker(newClient(t, addr), BreakerOptions{Name: name, Breaker: bo, ProbeTimeout: 5 * time.Second, Timeout: 5 * time.Second})
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
// it locks; the store reads it under the mutex instead). The breakers'
// Timeout is generous, for a loaded machine; a process that still found
// Redis too slow decided locally (Local) or dropped the outcome it could
// not write (Dropped, with a Redis error), and what reached Redis is
// counted exactly all the same. The idle twin asserts, for a run without
// a Redis error, that every outcome was recorded in the shared count.
func TestBreakerNoLostUpdates(t *testing.T) {
	addr := redisAddr(t)
	name := breakerName(t)
	bo := flightcache.Breaker{ConsecutiveFailures: 1000}
	const procs, each = 4, 15
	bs := make([]*Breaker, procs)
	for i := range bs {
		b, err := NewBreaker(newClient(t, addr), BreakerOptions{Name: name, Breaker: bo, ProbeTimeout: 5 * time.Second,
			Timeout: 5 * time.Second, LockWait: 5 * time.Second}) // nothing dropped for a busy mutex: every outcome counts
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs[i] = b
	}
	var wg sync.WaitGroup
	for _, b := range bs {
		wg.Go(func() {
			for range each {
				fail(t, b)
			}
		})
	}
	waitAll(t, &wg, time.Minute, "end of the failures")
	var s BreakerStats
	for _, b := range bs {
		bs := b.Stats()
		s.Recorded += bs.Recorded
		s.Dropped += bs.Dropped
		s.Stale += bs.Stale
		s.Local += bs.Local
		s.RedisErrors += bs.RedisErrors
	}
	var st gobreaker.SharedState // none if no outcome reached Redis
	data, err := newClient(t, addr).Get(ctx, "gobreaker:state:"+name).Bytes()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("the shared state: %v (breakers %+v)", err, s)
	}
	if err == nil {
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("breakers: %+v", s)
	// Every outcome was written, or decided locally, or dropped for a
	// Redis failure; none was dropped for the mutex or found stale.
	if s.Recorded+s.Local+s.Dropped != procs*each || s.Stale != 0 || s.Dropped > s.RedisErrors {
		t.Errorf("breakers %+v; want %d outcomes recorded, local, or dropped for a Redis error", s, procs*each)
	}
	// No lost update: every outcome recorded is in the shared count. An
	// outcome dropped when its write timed out may have landed too.
	if got := uint64(st.Counts.ConsecutiveFailures); got < s.Recorded || got > s.Recorded+s.Dropped {
		t.Errorf("shared ConsecutiveFailures = %d; want the %d recorded (lost updates)", got, s.Recorded)
	}
	// With Redis answering in time, as it does but on an overloaded
	// machine, every outcome is in the shared count.
	if s.RedisErrors == 0 && (s.Recorded != procs*each || st.Counts.ConsecutiveFailures != procs*each) {
		t.Errorf("recorded %d, shared ConsecutiveFailures %d without a Redis error; want %d", s.Recorded, st.Counts.ConsecutiveFailures, procs*each)
	}
	// The idle twin: without a Redis error nothing was decided locally or
	// dropped either.
	idleTwin(t, []loadSign{{"RedisErrors", s.RedisErrors}}, func(t *testing.T) {
		if s.Recorded != procs*each || s.Local != 0 || s.Dropped != 0 || st.Counts.ConsecutiveFailures != procs*each {
			t.Errorf("breakers %+v, shared ConsecutiveFailures %d; want %d recorded, none local or dropped, %d shared",
				s, st.Counts.ConsecutiveFailures, procs*each, procs*each)
		}
	})
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

package flightredis

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// The benchmarks measure what the tier and the shared breaker add to a
// call, on the Redis of REDIS_ADDR (loopback: a round trip is ~0.1ms):
//
//	go test -run '^$' -bench . -benchtime 2000x ./redis
//
// docs/measured.md and docs/distributed-cluster.md record the figures.

func benchProc(b *testing.B, addr, prefix string, tier bool) *flightcache.Loader[string, string] {
	b.Helper()
	lo := flightcache.Options[string, string]{TTL: time.Minute, MaxCost: 1 << 20}
	return benchLoader(b, addr, prefix, tier, lo)
}

// benchLoader builds one process's Loader with lo, on the tier if tier.
func benchLoader(b *testing.B, addr, prefix string, tier bool, lo flightcache.Options[string, string]) *flightcache.Loader[string, string] {
	b.Helper()
	if tier {
		t, err := NewTier(newClient(b, addr), Options[string, string]{Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = t.Close() })
		lo.Remote = t
	}
	l, err := flightcache.New(func(_ context.Context, k string) (string, error) { return k, nil }, lo)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

// BenchmarkColdGet is one Get of a key nobody has: "local" is the Loader
// alone; "lease" adds the tier (read, lease, write + publish: the cost of a
// lease to the process that holds it); "shared" reads a key another
// process loaded (one round trip instead of a downstream call).
func BenchmarkColdGet(b *testing.B) {
	addr := redisAddr(b)
	prefix := testPrefix(b, newClient(b, addr))
	for _, mode := range []string{"local", "lease", "shared"} {
		b.Run(mode, func(b *testing.B) {
			l := benchProc(b, addr, prefix, mode != "local")
			other := benchProc(b, addr, prefix, true)
			run := token(4)
			i := 0
			for b.Loop() {
				i++
				key := fmt.Sprint(mode, run, i)
				if mode == "shared" {
					b.StopTimer()
					if _, err := other.Get(ctx, key); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				if _, err := l.Get(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkColdGetMany is one GetMany of 100 keys nobody has, with an
// instant LoadMany: "local" is the Loader alone; "batch" goes through the
// tier as one batch (read, acquire, write: 3 round trips); "per-key" is the
// Loader without LoadMany, whose GetMany loads each key through Tier.Load
// at once (3 round trips per key); "shared" reads 100 keys another process
// loaded (1 round trip).
func BenchmarkColdGetMany(b *testing.B) {
	addr := redisAddr(b)
	prefix := testPrefix(b, newClient(b, addr))
	const n = 100
	for _, mode := range []string{"local", "batch", "per-key", "shared"} {
		b.Run(mode, func(b *testing.B) {
			l := benchManyProc(b, addr, prefix, mode != "local", mode != "per-key")
			other := benchManyProc(b, addr, prefix, true, true)
			run := token(4)
			i := 0
			keys := make([]string, n)
			for b.Loop() {
				i++
				for j := range keys {
					keys[j] = fmt.Sprint(mode, run, i, "-", j)
				}
				if mode == "shared" {
					b.StopTimer()
					if _, err := other.GetMany(ctx, keys); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				if m, err := l.GetMany(ctx, keys); err != nil || len(m) != n {
					b.Fatal(len(m), err)
				}
			}
		})
	}
}

func benchManyProc(b *testing.B, addr, prefix string, tier, many bool) *flightcache.Loader[string, string] {
	b.Helper()
	lo := flightcache.Options[string, string]{TTL: time.Minute, MaxCost: 1 << 20}
	if many {
		lo.LoadMany = func(_ context.Context, keys []string) (map[string]string, error) {
			m := make(map[string]string, len(keys))
			for _, k := range keys {
				m[k] = k
			}
			return m, nil
		}
	}
	return benchLoader(b, addr, prefix, tier, lo)
}

// BenchmarkBreaker is one Allow and its done on a shared Breaker: closed
// with successes (two reads), and failures (under the shared mutex).
func BenchmarkBreaker(b *testing.B) {
	addr := redisAddr(b)
	for _, o := range []flightcache.Outcome{flightcache.OutcomeSuccess, flightcache.OutcomeFailure} {
		name := map[flightcache.Outcome]string{flightcache.OutcomeSuccess: "success", flightcache.OutcomeFailure: "failure"}[o]
		b.Run(name, func(b *testing.B) {
			br, err := NewBreaker(newClient(b, addr), BreakerOptions{
				Name: "fcbench-" + token(4), Breaker: flightcache.Breaker{ConsecutiveFailures: 1 << 30},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			c := newClient(b, addr)
			defer c.Del(ctx, "gobreaker:state:"+br.opts.Name)
			for b.Loop() {
				done, err := br.Allow()
				if err != nil {
					b.Fatal(err)
				}
				done(o)
			}
		})
	}
}

// BenchmarkBreakerFleet runs 4 simulated processes (one breaker each, 2
// goroutines each) making 2ms calls through one shared breaker. "execute"
// is gobreaker's DistributedCircuitBreaker.Execute as shipped, which holds
// the shared mutex for the whole call (with a plain SET NX store: gobreaker
// sleeps 500ms when the mutex is busy); "two-step" is Breaker. Compare the
// calls/s metric.
func BenchmarkBreakerFleet(b *testing.B) {
	addr := redisAddr(b)
	const procs, perProc, call = 4, 2, 2 * time.Millisecond
	settings := gobreaker.Settings{ReadyToTrip: func(gobreaker.Counts) bool { return false }}
	b.Run("execute", func(b *testing.B) {
		settings.Name = "fcbench-" + token(4)
		c := newClient(b, addr)
		defer c.Del(ctx, "gobreaker:state:"+settings.Name)
		var dcbs []*gobreaker.DistributedCircuitBreaker[struct{}]
		for range procs {
			dcb, err := gobreaker.NewDistributedCircuitBreaker[struct{}](&plainStore{rdb: newClient(b, addr)}, settings)
			if err != nil {
				b.Fatal(err)
			}
			dcbs = append(dcbs, dcb)
		}
		fleet(b, procs*perProc, func(i int) error {
			_, err := dcbs[i%procs].Execute(func() (struct{}, error) { time.Sleep(call); return struct{}{}, nil })
			return err
		})
	})
	b.Run("two-step", func(b *testing.B) {
		name := "fcbench-" + token(4)
		c := newClient(b, addr)
		defer c.Del(ctx, "gobreaker:state:"+name)
		var brs []*Breaker
		for range procs {
			br, err := NewBreaker(newClient(b, addr), BreakerOptions{Name: name, Breaker: flightcache.Breaker{ConsecutiveFailures: 1 << 30}})
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			brs = append(brs, br)
		}
		fleet(b, procs*perProc, func(i int) error {
			done, err := brs[i%procs].Allow()
			if err != nil {
				return err
			}
			time.Sleep(call)
			done(flightcache.OutcomeSuccess)
			return nil
		})
	})
}

// fleet runs b.N calls of f over n goroutines and reports calls/s.
func fleet(b *testing.B, n int, f func(i int) error) {
	var next, failed atomic.Int64
	start := time.Now()
	done := make(chan struct{})
	for g := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			for next.Add(1) <= int64(b.N) {
				if err := f(g); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	for range n {
		<-done
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "errors/call")
}

// plainStore is the SharedDataStore gobreaker's documentation suggests: a
// SET NX mutex that fails when busy (gobreaker then sleeps and retries).
type plainStore struct{ rdb redis.UniversalClient }

func (s *plainStore) Lock(name string) error {
	ok, err := s.rdb.SetNX(ctx, name, "1", 5*time.Second).Result()
	if err == nil && !ok {
		err = errors.New("busy")
	}
	return err
}
func (s *plainStore) Unlock(name string) error { return s.rdb.Del(ctx, name).Err() }
func (s *plainStore) GetData(name string) ([]byte, error) {
	data, err := s.rdb.Get(ctx, name).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return data, err
}
func (s *plainStore) SetData(name string, data []byte) error {
	return s.rdb.Set(ctx, name, data, 0).Err()
}

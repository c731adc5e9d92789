package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache"
	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/redis/go-redis/v9"
)

// realProc is one real process's worth of the fleet, in this one: a
// Loader on a flightredis.Tier with a Redis client of its own, whose
// connections count what the tier's subscription hears.
type realProc struct {
	rdb   redis.UniversalClient
	tier  *flightredis.Tier[string, string]
	l     *flightcache.Loader[string, string]
	heard counts
}

// newReal starts a real process on fl's Redis and Prefix, and waits for
// its tier to listen. A holder's Loader tells fl.drops when a key's copy
// is dropped by an invalidation.
func newReal(ctx context.Context, fl *fleet, holder bool) (*realProc, error) {
	p := &realProc{}
	p.heard.msgs = make([]atomic.Int64, 4)
	p.heard.from = 1
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, m: tierMatcher(fl.loaded), c: &p.heard}, nil
	}
	p.rdb = fl.tgt.client(dial)
	tier, err := flightredis.NewTier(p.rdb, flightredis.Options[string, string]{Prefix: fl.prefix})
	if err != nil {
		_ = p.rdb.Close()
		return nil, err
	}
	p.tier = tier
	opts := flightcache.Options[string, string]{
		TTL:     10 * time.Minute, // nothing expires during a run
		MaxCost: int64(2*fl.cfg.entries + 2*fl.cfg.loads*int(fl.cfg.dur.Seconds()+1) + 1000),
		Remote:  tier,
	}
	if holder {
		opts.Observer = dropObserver{fl.drops}
	}
	if p.l, err = flightcache.New(fl.down.load, opts); err != nil {
		p.close()
		return nil, err
	}
	for !tier.Stats().Listening {
		if ctx.Err() != nil {
			p.close()
			return nil, errors.New("a real process's tier did not subscribe")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p, nil
}

func (p *realProc) close() {
	if p.l != nil {
		_ = p.l.Close()
	}
	_ = p.tier.Close()
	_ = p.rdb.Close()
}

// warm has p hold keys: a Get of each, 32 at a time.
func (p *realProc) warm(ctx context.Context, keys []string) error {
	var failed atomic.Int64
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for _, k := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := p.l.Get(ctx, k); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("warm-up: %d Gets failed", n)
	}
	return nil
}

// downstream is the fleet's fake downstream: it counts the calls per key
// of the cold keys (those starting with "c:") and answers at once.
type downstream struct {
	mu   sync.Mutex
	cold map[string]int // guarded by mu
	all  atomic.Int64
}

func (d *downstream) load(_ context.Context, key string) (string, error) {
	d.all.Add(1)
	if len(key) > 2 && key[:2] == "c:" {
		d.mu.Lock()
		d.cold[key]++
		d.mu.Unlock()
	}
	return "v:" + key, nil
}

// perKey returns the cold keys' calls: the mean per key, the most one
// key had, and the total.
func (d *downstream) perKey() (keys int, mean float64, most, total int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.cold {
		total += n
		most = max(most, n)
	}
	if len(d.cold) > 0 {
		mean = float64(total) / float64(len(d.cold))
	}
	return len(d.cold), mean, most, total
}

// dropObserver tells a dropClock when its Loader drops a copy because
// of an invalidation: flightcache calls Evicted on the goroutine that
// drops it, the tier's subscription reader, right when it does, so this
// is the most exact moment there is without changing the tier.
type dropObserver struct{ clock *dropClock }

func (dropObserver) LoadStart(ctx context.Context, _ flightcache.LoadStartEvent[string]) context.Context {
	return ctx
}
func (dropObserver) LoadEnd(context.Context, flightcache.LoadEvent[string]) {}
func (dropObserver) Waited(context.Context, flightcache.WaitEvent[string])  {}

func (o dropObserver) Evicted(ev flightcache.EvictionEvent[string]) {
	if ev.Cause == flightcache.EvictionInvalidated {
		o.clock.dropped(ev.Key, time.Now())
	}
}

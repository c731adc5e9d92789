package flightredis

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// events owns the tier's subscription to the "invalidated" channel: it
// hands its messages (another process's Set or Invalidate, an
// InvalidateAll) to onDrop. The wake-ups of waiting Loads are not here:
// each key has its own channel, subscribed only while a Load waits on it
// (wakeups.go).
//
// Invalidations must not be lost silently: onUp and onDown are called
// when the subscription is confirmed (the first time and after every
// reconnect) and when it is found lost, so the tier can distrust what it
// may have missed (invalidate.go).
type events struct {
	done chan struct{} // closed when the loop has exited

	mu      sync.Mutex
	ps      *redis.PubSub // the current subscription; guarded by mu
	stopped bool          // guarded by mu

	up      atomic.Bool   // the subscription is confirmed and healthy
	startup chan struct{} // closed when it is first confirmed, or a Timeout after start
	once    sync.Once
}

// handlers are what the tier does with the subscription's news.
type handlers struct {
	invalidated  string               // the channel
	onDrop       func(payload string) // a message of the invalidated channel
	onUp, onDown func()
	onRetry      func() // after an attempt that did not confirm the subscription
	onTick       func() // every check while the subscription is up
}

// start starts the loop, which subscribes and resubscribes until stop. It
// does not wait for Redis: every round trip is bounded by timeout, and a
// subscription found dead (an error, or no answer to a ping within check)
// is dropped and made again, after a jittered pause.
func (ev *events) start(ctx context.Context, rdb redis.UniversalClient, h handlers, timeout time.Duration) {
	ev.done = make(chan struct{})
	ev.startup = make(chan struct{})
	starting := time.AfterFunc(timeout, ev.started)
	check := max(remote.Mul(timeout, 4), 500*time.Millisecond)
	go func() {
		defer starting.Stop()
		defer close(ev.done)
		pause := 50 * time.Millisecond
		for ctx.Err() == nil {
			if ev.listen(ctx, rdb, h, timeout, check) {
				pause = 50 * time.Millisecond // it had worked: come back quickly
			} else if ctx.Err() == nil {
				h.onRetry()
			}
			t := time.NewTimer(jitter(pause))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			pause = min(2*pause, time.Second)
		}
	}()
}

// listen makes one subscription and reads it until it fails or stop. It
// reports whether the subscription was confirmed.
func (ev *events) listen(ctx context.Context, rdb redis.UniversalClient, h handlers, timeout, check time.Duration) (confirmed bool) {
	ps := rdb.Subscribe(ctx) // no channel yet: no connection
	ev.mu.Lock()
	if ev.stopped {
		ev.mu.Unlock()
		_ = ps.Close()
		return false
	}
	ev.ps = ps
	ev.mu.Unlock()
	defer func() {
		ev.up.Store(false)
		if confirmed && ctx.Err() == nil { // not a loss when the tier closes
			h.onDown() // first: closing may take a while with Redis hung
		}
		ev.mu.Lock()
		ev.ps = nil
		ev.mu.Unlock()
		_ = ps.Close()
	}()
	c, cancel := context.WithTimeout(ctx, timeout)
	err := ps.Subscribe(c, h.invalidated)
	cancel()
	if err != nil {
		return false
	}
	pinged := false
	tick := time.Now()
	for {
		if confirmed && time.Since(tick) >= check {
			tick = time.Now()
			h.onTick()
		}
		msg, err := ps.ReceiveTimeout(ctx, check)
		if err != nil {
			var ne net.Error
			if ctx.Err() == nil && !pinged && errors.As(err, &ne) && ne.Timeout() {
				// Quiet for a while: make sure the server is still there.
				c, cancel := context.WithTimeout(ctx, timeout)
				err = ps.Ping(c)
				cancel()
				if err == nil {
					pinged = true
					continue
				}
			}
			return confirmed
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == h.invalidated && !confirmed {
				confirmed = true
				ev.up.Store(true)
				h.onUp()
				ev.started()
			}
		case *redis.Message:
			if m.Channel == h.invalidated {
				h.onDrop(m.Payload)
			}
		}
	}
}

// stop closes the subscription and waits for the loop; ctx (start's) must
// have been cancelled first. With Redis hung, go-redis may hold the
// subscription's lock for a connection attempt until the client's
// DialTimeout or ReadTimeout.
func (ev *events) stop() {
	ev.mu.Lock()
	ev.stopped = true
	ps := ev.ps
	ev.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	<-ev.done
}

func (ev *events) started() { ev.once.Do(func() { close(ev.startup) }) }

// awaitStartup waits, at most until ctx ends, for the subscription to be
// confirmed for the first time, or for the tier's first Timeout to pass:
// the first Loads of a tier do not start before it listens, when Redis
// answers. It is cheap afterwards.
func (ev *events) awaitStartup(ctx context.Context) {
	select {
	case <-ev.startup:
	case <-ctx.Done():
	}
}

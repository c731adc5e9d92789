// Package events owns a tier's subscription to its classic invalidation
// channel: it hands the channel's messages (another process's Set or
// Invalidate, an InvalidateAll) to a handler, and says when the
// subscription is confirmed and when it is lost. The wake-ups of waiting
// Loads are not here: each key has its own channel, subscribed only while
// a Load waits on it (package wake).
//
// Invalidations must not be lost silently: OnUp and OnDown are called when
// the subscription is confirmed (the first time and after every reconnect)
// and when it is found lost, so the tier can distrust what it may have
// missed.
package events

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/redis/internal/listen"
	"github.com/redis/go-redis/v9"
)

// Subscription is the subscription to one channel. Its zero value is ready
// to Start.
type Subscription struct {
	done chan struct{} // closed when the loop has exited

	mu      sync.Mutex
	ps      *redis.PubSub // the current subscription; guarded by mu
	stopped bool          // guarded by mu

	up      atomic.Bool   // the subscription is confirmed and healthy
	startup chan struct{} // closed when it is first confirmed, or a Timeout after start
	once    sync.Once

	rdb     redis.UniversalClient
	h       Handlers
	timeout time.Duration
}

// Handlers are what the tier does with the subscription's news.
type Handlers struct {
	Channel      string               // the channel
	OnMessage    func(payload string) // a message of the channel
	OnUp, OnDown func()               // confirmed; found lost
	OnRetry      func()               // after an attempt that did not confirm the subscription
	OnTick       func()               // every health check while the subscription is up
}

// Start starts the loop, which subscribes and resubscribes until Stop. It
// does not wait for Redis: every round trip is bounded by timeout, and a
// subscription found dead (an error, or no answer to a ping within a
// health check) is dropped and made again, after a jittered pause.
func (s *Subscription) Start(ctx context.Context, rdb redis.UniversalClient, h Handlers, timeout time.Duration) {
	s.rdb, s.h, s.timeout = rdb, h, timeout
	s.done = make(chan struct{})
	s.startup = make(chan struct{})
	starting := time.AfterFunc(timeout, s.started)
	go func() {
		defer starting.Stop()
		defer close(s.done)
		listen.Loop(ctx, func() listen.Result {
			if s.listen(ctx) {
				return listen.Worked // it had worked: come back quickly
			}
			return listen.Failed
		}, h.OnRetry)
	}()
}

// Up reports whether the subscription is confirmed and healthy.
func (s *Subscription) Up() bool { return s.up.Load() }

// listen makes one subscription and reads it until it fails or Stop. It
// reports whether the subscription was confirmed.
func (s *Subscription) listen(ctx context.Context) (confirmed bool) {
	ps := s.rdb.Subscribe(ctx) // no channel yet: no connection
	if !s.hold(ps) {
		_ = ps.Close()
		return false
	}
	defer func() {
		s.up.Store(false)
		if confirmed && ctx.Err() == nil { // not a loss when the tier closes
			s.h.OnDown() // first: closing may take a while with Redis hung
		}
		s.hold(nil)
		_ = ps.Close()
	}()
	c, cancel := context.WithTimeout(ctx, s.timeout)
	err := ps.Subscribe(c, s.h.Channel)
	cancel()
	if err != nil {
		return false
	}
	return s.receive(ctx, ps)
}

// hold makes ps the current subscription (nil: none), unless Stop came; it
// reports whether it did.
func (s *Subscription) hold(ps *redis.PubSub) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped && ps != nil {
		return false
	}
	s.ps = ps
	return true
}

// receive reads ps until it fails. It reports whether the subscription
// was confirmed.
func (s *Subscription) receive(ctx context.Context, ps *redis.PubSub) (confirmed bool) {
	check := listen.Check(s.timeout)
	pinged := false
	tick := time.Now()
	for {
		if confirmed && time.Since(tick) >= check {
			tick = time.Now()
			s.h.OnTick()
		}
		msg, err := listen.Receive(ctx, ps, check, s.timeout, &pinged)
		if err != nil {
			return confirmed
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == s.h.Channel && !confirmed {
				confirmed = true
				s.up.Store(true)
				s.h.OnUp()
				s.started()
			}
		case *redis.Message:
			if m.Channel == s.h.Channel {
				s.h.OnMessage(m.Payload)
			}
		}
	}
}

// Stop closes the subscription and waits for the loop; ctx (Start's) must
// have been cancelled first. With Redis hung, go-redis may hold the
// subscription's lock for a connection attempt until the client's
// DialTimeout or ReadTimeout.
func (s *Subscription) Stop() {
	s.mu.Lock()
	s.stopped = true
	ps := s.ps
	s.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	<-s.done
}

func (s *Subscription) started() { s.once.Do(func() { close(s.startup) }) }

// AwaitStartup waits, at most until ctx ends, for the subscription to be
// confirmed for the first time, or for the tier's first Timeout to pass:
// the first Loads of a tier do not start before it listens, when Redis
// answers. It is cheap afterwards.
func (s *Subscription) AwaitStartup(ctx context.Context) {
	select {
	case <-s.startup:
	case <-ctx.Done():
	}
}

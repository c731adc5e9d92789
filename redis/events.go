package flightredis

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// events routes the tier's pub/sub messages (the name of a key whose load
// ended) to the Loads of this process that wait on that key. Pub/sub only
// shortens waits: a message lost while the subscription reconnects costs a
// poll, never a result.
type events struct {
	ps   *redis.PubSub
	done chan struct{} // closed when the dispatcher has exited

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // keys.base → waiting Loads; guarded by mu
}

// start starts the dispatcher, which subscribes to channel and routes its
// messages. It does not wait for Redis: the first SUBSCRIBE is bounded by
// timeout, and go-redis retries it (and resubscribes after any reconnect)
// in the background.
func (ev *events) start(ctx context.Context, rdb redis.UniversalClient, channel string, timeout time.Duration) {
	ev.subs = make(map[string]map[chan struct{}]struct{})
	ev.done = make(chan struct{})
	ev.ps = rdb.Subscribe(ctx) // no channel yet: no connection
	go func() {
		defer close(ev.done)
		c, cancel := context.WithTimeout(ctx, timeout)
		_ = ev.ps.Subscribe(c, channel) // recorded even if it fails now
		cancel()
		msgs := ev.ps.Channel(
			redis.WithChannelHealthCheckInterval(time.Second),
			redis.WithChannelPingTimeout(timeout),
			redis.WithChannelReconnectTimeout(max(4*timeout, time.Second)),
			redis.WithChannelSendTimeout(time.Second),
		)
		for m := range msgs {
			ev.notify(m.Payload)
		}
	}()
}

// stop closes the subscription and waits for the dispatcher. With Redis
// hung, go-redis may hold the subscription's lock for a connection attempt
// until the client's DialTimeout or ReadTimeout.
func (ev *events) stop() {
	_ = ev.ps.Close()
	<-ev.done
}

// watch registers a waiter for base; the channel receives (without
// blocking the dispatcher) when a message for base arrives.
func (ev *events) watch(base string) chan struct{} {
	return ev.watchAll([]string{base})
}

// watchAll registers one waiter for every one of bases (a batch's keys):
// the channel receives when a message for any of them arrives. unwatch
// drops one base at a time.
func (ev *events) watchAll(bases []string) chan struct{} {
	w := make(chan struct{}, 1)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for _, base := range bases {
		m := ev.subs[base]
		if m == nil {
			m = make(map[chan struct{}]struct{})
			ev.subs[base] = m
		}
		m[w] = struct{}{}
	}
	return w
}

func (ev *events) unwatch(base string, w chan struct{}) {
	ev.unwatchAll([]string{base}, w)
}

// unwatchAll drops w's registration for each of bases (none is an error).
func (ev *events) unwatchAll(bases []string, w chan struct{}) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for _, base := range bases {
		if m := ev.subs[base]; m != nil {
			delete(m, w)
			if len(m) == 0 {
				delete(ev.subs, base)
			}
		}
	}
}

func (ev *events) notify(base string) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for w := range ev.subs[base] {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

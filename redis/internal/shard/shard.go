// Package shard is the fallback of tracking where Redis refuses CLIENT
// TRACKING (an ACL without client|tracking, a proxy that does not pass
// it): a fixed number of invalidation channels, "<prefix>inv:{tag}", whose
// hash tags spread them over the hash items, hence the masters. Every
// process listens to all of them (SSUBSCRIBE on a Cluster, one per
// channel; SUBSCRIBE of them all on one node), and a writer publishes its
// invalidation message on the channel of the key's name, in a command of
// its own right after the write: a writer that crashes between the two
// loses that invalidation until the entry's lifetime ends. Every process
// hears every Set and Invalidate, as with the classic channel, but a
// Cluster spreads them over its masters.
package shard

import (
	"context"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/redis/internal/listen"
	"github.com/redis/go-redis/v9"
)

// Count is the number of invalidation channels.
const Count = 16

// Handlers are what the tier does with the channels' news.
type Handlers struct {
	OnMessage func(payload string) // an invalidation heard
	OnUp      func()               // a subscription confirmed
	OnDown    func()               // a confirmed subscription lost
	OnRetry   func()               // an attempt that did not confirm one
}

// Channels owns the subscriptions to the invalidation channels.
type Channels struct {
	rdb     redis.UniversalClient
	h       Handlers
	timeout time.Duration
	names   []string     // the channels
	cluster bool         // sharded pub/sub (SSUBSCRIBE, SPUBLISH)
	loops   int          // subscriptions wanted; set before they start
	up      atomic.Int32 // subscriptions confirmed
	wg      sync.WaitGroup
}

// Names names the invalidation channels of prefix: channel i's hash tag is
// the first number whose hash slot is in the i-th sixteenth of the hash slots.
func Names(prefix string) []string {
	names := make([]string, Count)
	found := 0
	for n := 0; found < Count; n++ {
		tag := strconv.Itoa(n)
		i := int(SlotCRC(tag)%16384) * Count / 16384
		if names[i] == "" {
			names[i] = prefix + "inv:{" + tag + "}"
			found++
		}
	}
	return names
}

// SlotCRC is Redis Cluster's key hash (CRC16-CCITT, XMODEM).
func SlotCRC(s string) uint16 {
	var crc uint16
	for i := range len(s) {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Init names the channels of prefix, for client, whose round trips take at
// most timeout; h hears what they carry once they are started.
func (c *Channels) Init(prefix string, client redis.UniversalClient, timeout time.Duration, h Handlers) {
	c.rdb, c.timeout, c.h = client, timeout, h
	c.names = Names(prefix)
	_, c.cluster = client.(*redis.ClusterClient)
	c.loops = 1
	if c.cluster {
		c.loops = Count
	}
}

// of is the invalidation channel of the key named name.
func (c *Channels) of(name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return c.names[h.Sum32()%Count]
}

// AllUp reports whether every subscription is confirmed.
func (c *Channels) AllUp() bool {
	return c.loops > 0 && int(c.up.Load()) == c.loops
}

// Start subscribes to the invalidation channels, until ctx ends: tracking
// was refused. It runs once; Wait waits for its goroutines.
func (c *Channels) Start(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		for _, ch := range c.names {
			c.wg.Go(func() {
				c.loop(ctx, func(ctx context.Context) *redis.PubSub { return cc.SSubscribe(ctx) },
					func(ctx context.Context, ps *redis.PubSub) error { return ps.SSubscribe(ctx, ch) }, 1)
			})
		}
		return
	}
	c.wg.Go(func() {
		c.loop(ctx, func(ctx context.Context) *redis.PubSub { return c.rdb.Subscribe(ctx) },
			func(ctx context.Context, ps *redis.PubSub) error { return ps.Subscribe(ctx, c.names...) }, Count)
	})
}

// Wait waits for the subscriptions' goroutines; Start's ctx must have
// ended first.
func (c *Channels) Wait() { c.wg.Wait() }

// loop makes one subscription (open, then sub, confirmed by want replies)
// and makes it again whenever it is lost, until ctx ends.
func (c *Channels) loop(ctx context.Context, open func(context.Context) *redis.PubSub, sub func(context.Context, *redis.PubSub) error, want int) {
	listen.Loop(ctx, func() listen.Result {
		if c.listen(ctx, open(ctx), sub, want) {
			return listen.Worked
		}
		return listen.Failed
	}, c.h.OnRetry)
}

// listen reads one subscription until it fails. It reports whether it was
// confirmed.
func (c *Channels) listen(ctx context.Context, ps *redis.PubSub, sub func(context.Context, *redis.PubSub) error, want int) (confirmed bool) {
	defer listen.CloseOnCancel(ctx, ps)()
	op, cancel := context.WithTimeout(ctx, c.timeout)
	err := sub(op, ps)
	cancel()
	if err != nil {
		return false
	}
	defer func() {
		if confirmed {
			c.up.Add(-1)
			if ctx.Err() == nil {
				c.h.OnDown()
			}
		}
	}()
	check := listen.Check(c.timeout)
	subscribed, pinged := 0, false
	for {
		msg, err := listen.Receive(ctx, ps, check, c.timeout, &pinged)
		if err != nil {
			return confirmed
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if subscribed++; subscribed == want && !confirmed {
				confirmed = true
				c.up.Add(1)
				c.h.OnUp()
			}
		case *redis.Message:
			c.h.OnMessage(m.Payload)
		}
	}
}

// Publish sends msg, the invalidation of the key named name, on its
// channel, after its write reached Redis: nil when Redis took it.
func (c *Channels) Publish(ctx context.Context, name, msg string) error {
	op, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.cluster {
		return c.rdb.SPublish(op, c.of(name), msg).Err()
	}
	return c.rdb.Publish(op, c.of(name), msg).Err()
}

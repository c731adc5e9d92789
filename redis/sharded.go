package flightredis

import (
	"context"
	"errors"
	"hash/fnv"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file is the fallback of tracking (tracking.go) where Redis refuses
// CLIENT TRACKING (an ACL without client|tracking, a proxy that does not
// pass it): a fixed number of invalidation channels, "<prefix>inv:{tag}",
// whose hash tags spread them over the slots, hence the masters. Every
// process listens to all of them (SSUBSCRIBE on a Cluster, one per
// channel; SUBSCRIBE of them all on one node), and a writer publishes
// today's invalidation message on the channel of the key's name, in a
// command of its own right after the write: a writer that crashes between
// the two loses that invalidation until the entry's lifetime ends. Every
// process hears every Set and Invalidate, as with the classic channel, but
// a Cluster spreads them over its masters.

// invShards is the number of invalidation channels.
const invShards = 16

// shards owns the subscriptions to the invalidation channels.
type shards struct {
	names   []string     // the channels
	cluster bool         // sharded pub/sub (SSUBSCRIBE, SPUBLISH)
	loops   int          // subscriptions wanted; set before they start
	up      atomic.Int32 // subscriptions confirmed
	wg      sync.WaitGroup
}

// shardNames names the invalidation channels of prefix: channel i's hash
// tag is the first number whose slot is in the i-th sixteenth of the
// slots.
func shardNames(prefix string) []string {
	names := make([]string, invShards)
	found := 0
	for n := 0; found < invShards; n++ {
		tag := strconv.Itoa(n)
		i := int(slotCRC(tag)%16384) * invShards / 16384
		if names[i] == "" {
			names[i] = prefix + "inv:{" + tag + "}"
			found++
		}
	}
	return names
}

// slotCRC is Redis Cluster's key hash (CRC16-CCITT, XMODEM).
func slotCRC(s string) uint16 {
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

// shardOf is the invalidation channel of the key named name.
func (sh *shards) shardOf(name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return sh.names[h.Sum32()%invShards]
}

// allUp reports whether every subscription is confirmed.
func (sh *shards) allUp() bool {
	return sh.loops > 0 && int(sh.up.Load()) == sh.loops
}

// init names the channels of prefix, for client.
func (sh *shards) init(prefix string, client redis.UniversalClient) {
	sh.names = shardNames(prefix)
	_, sh.cluster = client.(*redis.ClusterClient)
	sh.loops = 1
	if sh.cluster {
		sh.loops = invShards
	}
}

// startShards subscribes to the invalidation channels: tracking was
// refused. It runs once, on the tracker's goroutine (Close waits for it).
func (t *Tier[K, V]) startShards() {
	sh := &t.shards
	if t.ctx.Err() != nil {
		return
	}
	if cc, ok := t.rdb.(*redis.ClusterClient); ok {
		for _, ch := range sh.names {
			sh.wg.Go(func() {
				t.shardLoop(func(ctx context.Context) *redis.PubSub { return cc.SSubscribe(ctx) },
					func(c context.Context, ps *redis.PubSub) error { return ps.SSubscribe(c, ch) }, 1)
			})
		}
		return
	}
	sh.wg.Go(func() {
		t.shardLoop(func(ctx context.Context) *redis.PubSub { return t.rdb.Subscribe(ctx) },
			func(c context.Context, ps *redis.PubSub) error { return ps.Subscribe(c, sh.names...) }, invShards)
	})
}

// shardLoop makes one subscription (open, then sub, confirmed by want
// replies) and makes it again whenever it is lost, until the tier closes.
func (t *Tier[K, V]) shardLoop(open func(context.Context) *redis.PubSub, sub func(context.Context, *redis.PubSub) error, want int) {
	pause := 50 * time.Millisecond
	for t.ctx.Err() == nil {
		if t.shardListen(open(t.ctx), sub, want) {
			pause = 50 * time.Millisecond
		} else if t.ctx.Err() == nil {
			t.onRetry()
		}
		tm := time.NewTimer(jitter(pause))
		select {
		case <-t.ctx.Done():
		case <-tm.C:
		}
		tm.Stop()
		pause = min(2*pause, time.Second)
	}
}

// shardListen reads one subscription until it fails. It reports whether it
// was confirmed.
func (t *Tier[K, V]) shardListen(ps *redis.PubSub, sub func(context.Context, *redis.PubSub) error, want int) (confirmed bool) {
	ctx := t.ctx
	defer closeOnCancel(ctx, ps)()
	c, cancel := t.op(ctx)
	err := sub(c, ps)
	cancel()
	if err != nil {
		return false
	}
	defer func() {
		if confirmed {
			t.shards.up.Add(-1)
			if ctx.Err() == nil {
				t.onDown()
			}
		}
	}()
	check := max(t.opts.Timeout*4, 500*time.Millisecond)
	subscribed, pinged := 0, false
	for {
		msg, err := ps.ReceiveTimeout(ctx, check)
		var ne net.Error
		switch {
		case err != nil && ctx.Err() == nil && !pinged && errors.As(err, &ne) && ne.Timeout():
			c, cancel := t.op(ctx)
			err = ps.Ping(c)
			cancel()
			if err != nil {
				return confirmed
			}
			pinged = true
			continue
		case err != nil:
			return confirmed
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if subscribed++; subscribed == want && !confirmed {
				confirmed = true
				t.shards.up.Add(1)
				t.onNodeUp()
			}
		case *redis.Message:
			t.onInvalidated(m.Payload)
		}
	}
}

// publishShard sends the invalidation of key (named name) on its channel,
// after its write reached Redis: nil when Redis took it.
func (t *Tier[K, V]) publishShard(ctx context.Context, name string, key K) error {
	ch, msg := t.shards.shardOf(name), t.invalidation(name, key)
	c, cancel := t.op(ctx)
	defer cancel()
	if t.shards.cluster {
		return t.rdb.SPublish(c, ch, msg).Err()
	}
	return t.rdb.Publish(c, ch, msg).Err()
}

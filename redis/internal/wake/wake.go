// Package wake delivers per-key wake-ups to the Loads of this process that
// wait on a key another process is loading. It knows keys only by the
// names of their channels.
package wake

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/redis/internal/listen"
	"github.com/redis/go-redis/v9"
)

// Hub holds the per-key wake-ups. When a load ends (a fill, a release, a not-found
// marker, an Invalidate or a Set that drops a lease), the lease scripts
// publish on the key's own wake-up channel, keys.wake ("<base>:w", which
// shares the key's hash tag and so its Cluster hash slot): with SPUBLISH on a
// Cluster client, so the message stays on the shard of its hash slot, and with
// PUBLISH on a single node or a Sentinel failover client. Nothing is
// broadcast: a process hears the wake-ups of the keys it waits on, and no
// others.
//
// A process subscribes to a key's channel only while a Load (or a batch's
// key) of it waits on that key: the first watcher of a channel subscribes,
// the last one to leave unsubscribes. The subscriptions share one PubSub
// connection per Redis server: one for a single node, one per master that
// owns a watched hash slot on a Cluster (ClusterClient.MasterForKey, then that
// node's SSUBSCRIBE, one channel per command, since the channels of one
// SSUBSCRIBE must share a hash slot). Each connection has two goroutines, one
// that reads it and one that sends the (un)subscriptions in the order the
// watchers asked for them; nothing runs per watched key.
//
// A subscription confirmed late must not lose a wake-up silently: a Load
// that finds the key held subscribes, waits (at most Options.Timeout) for
// Redis to confirm the subscription, then looks at the key once more
// before it waits. A wake-up lost anyway (the connection broke and
// go-redis made it again, Redis dropped the subscription when the hash slot
// moved to another master, a confirmation that never came) costs the
// waiter one poll (Options.PollInterval), as a wake-up lost always did.
type Hub struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil on a single node (or a Sentinel failover client)
	ctx     context.Context      // the tier's: cancelled by Close
	timeout time.Duration

	// Counts for the tier's Stats.
	Subscribes        atomic.Uint64 // SUBSCRIBEs sent
	Heard             atomic.Uint64 // wake-ups heard
	SubscriptionsLost atomic.Uint64 // subscriptions Redis dropped or a broken connection lost

	mu     sync.Mutex
	chans  map[string]*wakeChan // channel → its watchers and state; guarded by mu
	conns  map[string]*wakeConn // server address ("" on a single node) → its connection; guarded by mu
	closed bool                 // guarded by mu
	wg     sync.WaitGroup       // the connections' goroutines
}

// wakeChan is one key's wake-up channel, while a Load of this process
// waits on the key or (un)subscriptions of it are in flight.
type wakeChan struct {
	name      string
	conn      *wakeConn
	ws        []chan struct{} // the waiting Loads (a batch counts once)
	sent      bool            // a SUBSCRIBE was sent after the last UNSUBSCRIBE
	lost      bool            // Redis dropped it (its hash slot moved): not made again
	dirty     bool            // queued in conn.dirty
	confirmed bool            // ready is closed
	ready     chan struct{}   // closed when Redis confirmed the subscription, or it was given up
}

// wakeConn is the PubSub connection to one server.
type wakeConn struct {
	addr   string
	ps     *redis.PubSub
	n      int            // entries of chans on it; guarded by Hub.mu
	dirty  []*wakeChan    // channels whose subscription may have to change; guarded by Hub.mu
	forget []string       // channels Redis dropped, for go-redis to forget; guarded by Hub.mu
	pend   map[string]int // SUBSCRIBEs sent and not confirmed yet, per channel; guarded by Hub.mu
	ours   map[string]int // SUNSUBSCRIBEs sent and not confirmed yet (Cluster); guarded by Hub.mu
	kick   chan struct{}  // wakes the sender
	done   chan struct{}  // closed when the connection is dropped
	gone   bool           // dropped; guarded by Hub.mu
}

// Channel is the name of the wake-up channel of the key whose Redis names
// start with base.
func Channel(base string) string { return base + ":w" }

// Command is the command the lease scripts publish wake-ups with on
// client: SPUBLISH on a Cluster, PUBLISH otherwise.
func Command(client redis.UniversalClient) string {
	if _, ok := client.(*redis.ClusterClient); ok {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

// Init readies wk for client, whose round trips take at most timeout,
// until ctx ends.
func (wk *Hub) Init(ctx context.Context, client redis.UniversalClient, timeout time.Duration) {
	wk.rdb, wk.ctx, wk.timeout = client, ctx, timeout
	wk.cluster, _ = client.(*redis.ClusterClient)
	wk.chans = make(map[string]*wakeChan)
	wk.conns = make(map[string]*wakeConn)
}

// Watch registers w for the wake-ups of the keys of bases (w receives,
// without blocking the reader, when one is heard), subscribing to each
// channel no other Load of this process watches yet. It returns the
// confirmations still to come, for await.
func (wk *Hub) Watch(w chan struct{}, bases ...string) (pending []chan struct{}) {
	var nodes []*redis.Client // each channel's master, on a Cluster
	if wk.cluster != nil {
		nodes = make([]*redis.Client, len(bases))
		for i, base := range bases {
			// The hash slot map the client has (it loads it once): no round trip.
			c, cancel := context.WithTimeout(wk.ctx, wk.timeout)
			nodes[i], _ = wk.cluster.MasterForKey(c, Channel(base))
			cancel()
		}
	}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if wk.closed {
		return nil
	}
	for i, base := range bases {
		name := Channel(base)
		e := wk.chans[name]
		if e == nil {
			addr := ""
			var node *redis.Client
			if wk.cluster != nil {
				if node = nodes[i]; node == nil {
					continue // no master known for the hash slot: the Load polls
				}
				addr = node.Options().Addr
			}
			e = &wakeChan{name: name, conn: wk.connFor(addr, node), confirmed: true}
			e.conn.n++
			wk.chans[name] = e
		}
		e.ws = append(e.ws, w)
		if !e.sent && !e.lost {
			if e.confirmed {
				e.confirmed, e.ready = false, make(chan struct{})
			}
			wk.queue(e)
		}
		if !e.confirmed {
			pending = append(pending, e.ready)
		}
	}
	return pending
}

// Await waits until Redis has confirmed the subscriptions pending, at
// most Options.Timeout, or until ctx ends.
func (wk *Hub) Await(ctx context.Context, pending []chan struct{}) {
	if len(pending) == 0 {
		return
	}
	t := time.NewTimer(wk.timeout)
	defer t.Stop()
	for _, r := range pending {
		select {
		case <-r:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Unwatch drops w's registration for each of bases (none is an error),
// and unsubscribes from the channels no Load watches any more.
func (wk *Hub) Unwatch(w chan struct{}, bases ...string) {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	for _, base := range bases {
		e := wk.chans[Channel(base)]
		if e == nil {
			continue
		}
		i := slices.Index(e.ws, w)
		if i < 0 {
			continue
		}
		e.ws[i] = e.ws[len(e.ws)-1]
		e.ws[len(e.ws)-1] = nil
		e.ws = e.ws[:len(e.ws)-1]
		if len(e.ws) > 0 {
			continue
		}
		if e.sent {
			wk.queue(e)
		} else {
			wk.drop(e)
		}
	}
}

// connFor returns the connection to addr (node's on a Cluster), made if
// there is none. Under mu.
func (wk *Hub) connFor(addr string, node *redis.Client) *wakeConn {
	if c := wk.conns[addr]; c != nil {
		return c
	}
	c := &wakeConn{addr: addr, pend: make(map[string]int), ours: make(map[string]int),
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	if node != nil {
		c.ps = node.SSubscribe(wk.ctx) // no channel yet: no connection
	} else {
		c.ps = wk.rdb.Subscribe(wk.ctx)
	}
	wk.conns[addr] = c
	wk.wg.Add(2)
	go wk.send(c)
	go wk.read(c)
	return c
}

// queue has e's connection reconsider e's subscription. Under mu.
func (wk *Hub) queue(e *wakeChan) {
	if !e.dirty {
		e.dirty = true
		e.conn.dirty = append(e.conn.dirty, e)
	}
	select {
	case e.conn.kick <- struct{}{}:
	default:
	}
}

// drop forgets e, which nobody watches and which is not subscribed. Under
// mu.
func (wk *Hub) drop(e *wakeChan) {
	if wk.chans[e.name] == e {
		delete(wk.chans, e.name)
		e.conn.n--
	}
	e.release()
}

// release lets the Loads waiting for e's confirmation go on.
func (e *wakeChan) release() {
	if !e.confirmed {
		e.confirmed = true
		close(e.ready)
	}
}

// send is c's sender: it (un)subscribes the channels queued on c, in the
// order they were queued, until c is dropped or the tier closes.
func (wk *Hub) send(c *wakeConn) {
	defer wk.wg.Done()
	var subs, unsubs, forget []string
	for {
		select {
		case <-c.kick:
		case <-c.done:
			return
		case <-wk.ctx.Done():
			return
		}
		subs, unsubs, forget = wk.collect(c, subs[:0], unsubs[:0], forget[:0])
		wk.Subscribes.Add(uint64(len(subs)))
		wk.apply(c, subs, unsubs, forget)
	}
}

// collect takes the channels queued on c: those to subscribe, to
// unsubscribe, and those Redis dropped, for go-redis to forget, appended to
// subs, unsubs and forget.
func (wk *Hub) collect(c *wakeConn, subs, unsubs, forget []string) ([]string, []string, []string) {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	for _, e := range c.dirty {
		e.dirty = false
		want := len(e.ws) > 0 && !e.lost
		switch {
		case want && !e.sent:
			e.sent = true
			c.pend[e.name]++
			subs = append(subs, e.name)
		case !want && e.sent:
			e.sent = false
			if wk.cluster != nil {
				c.ours[e.name]++
			}
			unsubs = append(unsubs, e.name)
		}
		if len(e.ws) == 0 && !e.sent {
			wk.drop(e)
		}
	}
	clear(c.dirty)
	c.dirty = c.dirty[:0]
	for _, name := range c.forget {
		c.ours[name]++
		forget = append(forget, name)
	}
	c.forget = c.forget[:0]
	return subs, unsubs, forget
}

// apply sends c's (un)subscriptions. An error is the connection's:
// go-redis makes it again, and subscribes to every channel it was given,
// which confirms them.
func (wk *Hub) apply(c *wakeConn, subs, unsubs, forget []string) {
	ctx, cancel := context.WithTimeout(wk.ctx, wk.timeout)
	defer cancel()
	if wk.cluster != nil {
		// One hash slot per SSUBSCRIBE: one channel per command.
		for _, name := range subs {
			_ = c.ps.SSubscribe(ctx, name)
		}
		for _, name := range append(unsubs, forget...) {
			_ = c.ps.SUnsubscribe(ctx, name)
		}
		return
	}
	if len(subs) > 0 {
		_ = c.ps.Subscribe(ctx, subs...)
	}
	if len(unsubs) > 0 { // none would mean all
		_ = c.ps.Unsubscribe(ctx, unsubs...)
	}
}

// read is c's reader: it hands each wake-up to its watchers and each
// confirmation to its channel, until the tier closes or c, found broken
// with no channel on it, is dropped.
func (wk *Hub) read(c *wakeConn) {
	defer wk.wg.Done()
	pause := listen.First
	for {
		msg, err := c.ps.Receive(wk.ctx)
		if err != nil {
			if wk.ctx.Err() != nil {
				return
			}
			var reply redis.Error
			if errors.As(err, &reply) {
				continue // a refused (un)subscription (MOVED): its waiters poll
			}
			if !wk.broken(c) {
				_ = c.ps.Close() // outside mu: the sender may hold the PubSub's lock
				return
			}
			listen.Sleep(wk.ctx, listen.Jitter(pause))
			pause = min(2*pause, listen.Longest)
			continue
		}
		pause = listen.First
		switch m := msg.(type) {
		case *redis.Message:
			wk.notify(m.Channel)
		case *redis.Subscription:
			wk.confirm(c, m)
		}
	}
}

// notify wakes the Loads that wait on the key of channel.
func (wk *Hub) notify(channel string) {
	wk.Heard.Add(1)
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if e := wk.chans[channel]; e != nil {
		for _, w := range e.ws {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
}

// confirm handles Redis's answer to a (un)subscription on c, or its own
// unsubscription of a channel whose hash slot moved away.
func (wk *Hub) confirm(c *wakeConn, m *redis.Subscription) {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	switch m.Kind {
	case "subscribe", "ssubscribe":
		n := c.pend[m.Channel]
		if n == 0 {
			return // go-redis subscribing again after a reconnection
		}
		if n > 1 {
			c.pend[m.Channel] = n - 1
			return // an earlier SUBSCRIBE's: the latest one is still on its way
		}
		delete(c.pend, m.Channel)
		if e := wk.chans[m.Channel]; e != nil && e.conn == c && e.sent {
			e.release()
		}
	case "sunsubscribe":
		if n := c.ours[m.Channel]; n > 0 {
			if n == 1 {
				delete(c.ours, m.Channel)
			} else {
				c.ours[m.Channel] = n - 1
			}
			return
		}
		// Redis's own: the hash slot moved to another master. Lost: the
		// waiters poll; the channel is subscribed again, where its hash slot
		// is, by the next Load that waits on the key once these are done.
		e := wk.chans[m.Channel]
		if e == nil || e.conn != c || !e.sent {
			return
		}
		wk.SubscriptionsLost.Add(1)
		e.sent, e.lost = false, true
		e.release()
		c.forget = append(c.forget, m.Channel)
		select {
		case c.kick <- struct{}{}:
		default:
		}
		if len(e.ws) == 0 {
			wk.drop(e)
		}
	}
}

// broken handles the loss of c's connection, which go-redis makes again
// at its next use (and subscribes again to every channel it was given):
// the wake-ups meanwhile are lost, and the Loads that wait for a
// confirmation go on. It reports whether c is kept: one with no channel
// is dropped (its server may be gone for good: a Cluster failover), and
// the caller closes it.
func (wk *Hub) broken(c *wakeConn) (kept bool) {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	clear(c.pend)
	clear(c.ours)
	if c.n == 0 {
		if !c.gone {
			c.gone = true
			close(c.done)
			delete(wk.conns, c.addr)
		}
		return false
	}
	lost := 0
	for _, e := range wk.chans {
		if e.conn == c && e.sent {
			lost++
			e.release()
		}
	}
	wk.SubscriptionsLost.Add(uint64(lost))
	return true
}

// Close closes every connection and waits for their goroutines; the
// tier's context must have been cancelled first.
func (wk *Hub) Close() {
	wk.mu.Lock()
	wk.closed = true
	var pss []*redis.PubSub
	for _, c := range wk.conns {
		if !c.gone {
			c.gone = true
			close(c.done)
			pss = append(pss, c.ps)
		}
	}
	clear(wk.conns)
	for _, e := range wk.chans {
		e.release()
	}
	wk.mu.Unlock()
	for _, ps := range pss {
		_ = ps.Close()
	}
	wk.wg.Wait()
}

// PubSubOf returns the connection channel is subscribed on, nil if none:
// for tests that break a subscription behind the Hub's back.
func (wk *Hub) PubSubOf(channel string) *redis.PubSub {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	if e := wk.chans[channel]; e != nil {
		return e.conn.ps
	}
	return nil
}

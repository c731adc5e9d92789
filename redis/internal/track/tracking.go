// Package track is the tier's listener of Redis's server-assisted
// client-side caching: per master node an invalidation connection and a
// tracked client, the tracked reads, the echoes of this process's own
// writes, and the notice of a tracked connection's loss. It knows keys
// only by their Redis names.
package track

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/redis/internal/listen"
	"github.com/redis/go-redis/v9"
)

// The tracking listener: Redis's server-assisted client-side
// caching, so that an invalidation reaches only the processes that hold
// the key (invalidate.go describes the protocol).
//
// Per master node the tier keeps an invalidation connection, a RESP2
// subscription to "__redis__:invalidate" whose CLIENT ID it records, and a
// small client for tracked reads whose connections run CLIENT TRACKING on
// REDIRECT <that id> OPTIN. A tracked read is CLIENT CACHING yes then one
// read of a key's entry, pipelined on one connection: Redis then sends the
// entry key's name to the invalidation connection the next time the entry
// changes, expires or is evicted. Never a script after CLIENT CACHING yes:
// it would track every key it declares (leases, alive keys), whose churn
// would come back as invalidations.
//
// go-redis has client-side caching of its own, which refuses a user's
// CLIENT TRACKING, but only when it is enabled; the tier never enables it.

// Mode is how the tier hears the fleet's Sets and Invalidates
// (Stats.Invalidations).
type Mode int32

const (
	Unknown  Mode = iota // not known yet: writes publish on the classic channel
	Tracking             // server-assisted tracking
	Channels             // tracking refused: sharded channels (package shard)
	Classic              // a client the tier cannot track per node (a Ring): the classic channel
)

// String is the mode's name in Stats.
func (m Mode) String() string { return [...]string{"", "tracking", "channels", "classic"}[m] }

// trackChannel is where Redis sends the names of tracked keys that changed.
const trackChannel = "__redis__:invalidate"

// trackPoolSize is the size of each node's pool of tracked connections:
// one, so that Redis tracks a key once per process (each tracked
// connection is a client of its own in Redis's tracking table, and each
// would send its own invalidation of the key). The process's tracked reads
// of one master share that connection, a round trip at a time.
const trackPoolSize = 1

// Handlers are what the tier does with the listener's news.
type Handlers struct {
	OnKeys            func(names []string) // the Redis names of tracked keys that changed
	OnFlush           func()               // a FLUSHALL or FLUSHDB: every tracked key
	OnUp, OnDown      func()               // a node armed; a node's tracking lost
	OnRetry           func()               // an attempt that did not arm a node
	OnRefused         func()               // Redis refuses CLIENT TRACKING
	OnConnLost        func()               // a tracked connection closed (connloss.go)
	Timeout, Interval time.Duration        // a round trip; the health check
}

// Tracker owns the invalidation connections and tracked clients.
type Tracker struct {
	ctx     context.Context // start's: the tier's
	mode    atomic.Int32    // a Mode
	h       Handlers
	single  *redis.Client // the client, when it is one node
	cluster *redis.ClusterClient

	mu    sync.Mutex
	nodes map[string]*Node // address → node; guarded by mu
	wg    sync.WaitGroup

	startup chan struct{} // closed when every node is first armed, tracking is refused, or a Timeout after start
	once    sync.Once

	Echoes        Echoes
	rearms, reads atomic.Uint64 // for Stats: Rearms, TrackedReads
}

// Node is one master's invalidation connection and tracked client.
type Node struct {
	opt      redis.Options // what its clients are made of
	inv      *redis.Client // its connections record their CLIENT ID
	id       atomic.Int64  // the CLIENT ID of the invalidation connection
	reads    atomic.Pointer[redis.Client]
	redirect int64       // the id reads redirect to; the node's loop only
	up       atomic.Bool // armed and listening
	armed    bool        // armed once; the node's loop only
	swaps    int64       // Redis's count of SWAPDB calls at the last check, -1 unknown; the node's loop only
	cancel   context.CancelFunc
}

// Start starts the listener for client, or reports (false) that the tier
// cannot track per node with that kind of client.
func (tr *Tracker) Start(ctx context.Context, client redis.UniversalClient, h Handlers) bool {
	tr.ctx, tr.h = ctx, h
	tr.nodes = make(map[string]*Node)
	tr.startup = make(chan struct{})
	switch c := client.(type) {
	case *redis.Client:
		tr.single = c
		tr.add(ctx, c.Options())
	case *redis.ClusterClient:
		tr.cluster = c
		tr.wg.Go(func() { tr.discover(ctx) })
	default:
		tr.mode.Store(int32(Classic))
		tr.started()
		return false
	}
	starting := time.AfterFunc(h.Timeout, tr.started)
	tr.wg.Go(func() {
		<-ctx.Done()
		starting.Stop()
	})
	return true
}

// Stop waits for the listener's goroutines; ctx (start's) must have been
// cancelled first.
func (tr *Tracker) Stop() { tr.wg.Wait() }

func (tr *Tracker) started() { tr.once.Do(func() { close(tr.startup) }) }

// AwaitStartup waits, at most until ctx ends, for the listener's startup.
func (tr *Tracker) AwaitStartup(ctx context.Context) {
	if tr.startup == nil {
		return
	}
	select {
	case <-tr.startup:
	case <-ctx.Done():
	}
}

// discover keeps one node per master of a Cluster, checking the masters
// every health check: a new master gets a node, a node whose address is
// no longer a master's is stopped.
func (tr *Tracker) discover(ctx context.Context) {
	for {
		seen := make(map[string]bool)
		var mu sync.Mutex
		c, cancel := context.WithTimeout(ctx, tr.h.Timeout)
		err := tr.cluster.ForEachMaster(c, func(_ context.Context, m *redis.Client) error {
			mu.Lock()
			seen[m.Options().Addr] = true
			mu.Unlock()
			tr.add(ctx, m.Options())
			return nil
		})
		cancel()
		if err == nil {
			tr.prune(seen)
		}
		listen.Sleep(ctx, listen.Jitter(tr.h.Interval))
		if ctx.Err() != nil {
			return
		}
	}
}

// prune stops the nodes whose address is not in seen.
func (tr *Tracker) prune(seen map[string]bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for addr, n := range tr.nodes {
		if !seen[addr] {
			n.cancel()
			delete(tr.nodes, addr)
		}
	}
}

// add starts a node for the master whose client options are src, unless
// there is one.
func (tr *Tracker) add(ctx context.Context, src *redis.Options) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if _, ok := tr.nodes[src.Addr]; ok || ctx.Err() != nil || tr.mode.Load() == int32(Channels) {
		return
	}
	n := &Node{opt: nodeOptions(src)}
	o := n.opt
	o.PoolSize = 1
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		n.id.Store(id)
		return err
	}
	n.inv = redis.NewClient(&o)
	nctx, cancel := context.WithCancel(ctx)
	n.cancel = cancel
	tr.nodes[src.Addr] = n
	tr.wg.Go(func() { tr.run(nctx, n) })
}

// nodeOptions are the options of a node's own clients: those of the
// tier's client for that node (address, credentials, TLS, timeouts), in
// RESP2, with no hook of the original. Pipelines run on the client's one
// pooled connection: go-redis would run them on a pool of their own
// (PipelinePoolSize, 10 by default), which PoolSize does not bound, and
// every tracked read is a pipeline.
func nodeOptions(src *redis.Options) redis.Options {
	return redis.Options{
		Network: src.Network, Addr: src.Addr, Dialer: src.Dialer,
		Username: src.Username, Password: src.Password, DB: src.DB,
		CredentialsProvider:        src.CredentialsProvider,
		CredentialsProviderContext: src.CredentialsProviderContext,
		DialTimeout:                src.DialTimeout, ReadTimeout: src.ReadTimeout, WriteTimeout: src.WriteTimeout,
		ContextTimeoutEnabled: true, TLSConfig: src.TLSConfig, MaxRetries: -1,
		Protocol: 2, PoolSize: trackPoolSize, PipelinePoolSize: -1, DisableIdentity: true,
	}
}

// listenResult is how one attempt at a node's listener ended.
type listenResult int

const (
	listenFailed  listenResult = iota // it never armed
	listenLost                        // it had armed, then was lost
	listenRefused                     // Redis refuses CLIENT TRACKING
)

// run arms and listens on n until ctx ends or tracking is refused; it
// closes n's clients when it returns.
func (tr *Tracker) run(ctx context.Context, n *Node) {
	defer func() {
		if r := n.reads.Swap(nil); r != nil {
			_ = r.Close()
		}
		_ = n.inv.Close()
	}()
	listen.Loop(ctx, func() listen.Result {
		switch tr.listen(ctx, n) {
		case listenRefused:
			tr.refused()
			return listen.Stop
		case listenLost:
			return listen.Worked
		}
		return listen.Failed
	}, tr.h.OnRetry)
}

// refused switches the tier to sharded channels, once.
func (tr *Tracker) refused() {
	if tr.mode.Swap(int32(Channels)) != int32(Channels) {
		tr.h.OnRefused()
	}
	tr.started()
}

// listen subscribes n's invalidation connection, arms n's tracked client
// on it, and hands the invalidations it hears over until it fails.
func (tr *Tracker) listen(ctx context.Context, n *Node) listenResult {
	ps := n.inv.Subscribe(ctx)
	defer listen.CloseOnCancel(ctx, ps)()
	c, cancel := context.WithTimeout(ctx, tr.h.Timeout)
	err := ps.Subscribe(c, trackChannel)
	var msg any
	if err == nil {
		msg, err = ps.ReceiveTimeout(c, tr.h.Timeout)
	}
	cancel()
	if s, ok := msg.(*redis.Subscription); err != nil || !ok || s.Kind != "subscribe" {
		if trackingRefused(err) { // CLIENT ID, or the channel, refused
			return listenRefused
		}
		return listenFailed
	}
	if res, ok := tr.arm(ctx, n, n.id.Load()); !ok {
		return res
	}
	n.up.Store(true)
	tr.h.OnUp()
	if tr.AllUp() {
		tr.started()
	}
	tr.receive(ctx, n, ps)
	n.up.Store(false)
	if ctx.Err() == nil {
		tr.h.OnDown()
	}
	return listenLost
}

// receive reads n's invalidations until the connection fails, a check
// finds the redirect broken, or ctx ends.
func (tr *Tracker) receive(ctx context.Context, n *Node, ps *redis.PubSub) {
	pinged := false
	tick := time.Now()
	for ctx.Err() == nil {
		if time.Since(tick) >= tr.h.Interval {
			tick = time.Now()
			if tr.broken(ctx, n) {
				return
			}
		}
		msg, err := listen.Receive(ctx, ps, tr.h.Interval, tr.h.Timeout, &pinged)
		switch {
		case err != nil && strings.Contains(err.Error(), "payload: <nil>"):
			tr.h.OnFlush() // a null array: FLUSHALL or FLUSHDB
		case err != nil:
			return
		default:
			if m, ok := msg.(*redis.Message); ok && m.Channel == trackChannel {
				tr.h.OnKeys(append(m.PayloadSlice, nonEmpty(m.Payload)...))
			}
		}
	}
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// arm makes n a tracked client redirecting to id, and retires the one it
// replaces. ok is false when Redis refused or could not be reached.
func (tr *Tracker) arm(ctx context.Context, n *Node, id int64) (res listenResult, ok bool) {
	o := n.opt
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		return cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", id, "OPTIN").Err()
	}
	o.Dialer = WatchDialer(&n.opt, tr.connLost)
	reads := redis.NewClient(&o)
	c, cancel := context.WithTimeout(ctx, tr.h.Timeout)
	err := reads.Ping(c).Err()
	cancel()
	if err != nil {
		_ = reads.Close()
		if trackingRefused(err) {
			return listenRefused, false
		}
		return listenFailed, false
	}
	n.redirect = id
	n.swaps = tr.swapCount(ctx, reads)
	if old := n.reads.Swap(reads); old != nil {
		tr.retire(ctx, old)
	}
	if n.armed {
		tr.rearms.Add(1)
	}
	n.armed = true
	tr.mode.CompareAndSwap(int32(Unknown), int32(Tracking))
	return 0, true
}

// connLost runs when a tracked connection that carried a tracked read
// closes, for any reason, but the tier's Close: Redis forgot what it
// tracked for this process.
func (tr *Tracker) connLost() {
	if tr.ctx.Err() == nil {
		tr.h.OnConnLost()
	}
}

// retire closes a tracked client that was replaced, once the reads in
// flight on it are done (a Timeout later).
func (tr *Tracker) retire(ctx context.Context, old *redis.Client) {
	tr.wg.Go(func() {
		t := time.NewTimer(listen.Times(tr.h.Timeout, 2))
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		_ = old.Close()
	})
}

// trackingRefused reports whether err is Redis refusing CLIENT TRACKING
// (an ACL without it, a server or proxy that does not know it), rather
// than a failure to reach it.
func trackingRefused(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return redis.HasErrorPrefix(err, "NOPERM") || strings.Contains(msg, "noperm") || strings.Contains(msg, "unknown command") ||
		strings.Contains(msg, "unknown subcommand")
}

// broken reports whether n's tracked connections lost their redirect (the
// invalidation connection they name is gone, or another one took its
// place): CLIENT TRACKINGINFO, RESP2's form of the tracking-redir-broken
// push. A check that fails to reach Redis reports nothing: the
// subscription's own health says that. On a single node it also has every
// copy distrusted when Redis ran a SWAPDB since the last check
// (swapCount).
func (tr *Tracker) broken(ctx context.Context, n *Node) bool {
	reads := n.reads.Load()
	if reads == nil {
		return true
	}
	c, cancel := context.WithTimeout(ctx, tr.h.Timeout)
	defer cancel()
	res, err := reads.Do(c, "CLIENT", "TRACKINGINFO").Slice()
	if err != nil {
		return false
	}
	if swaps := tr.swapCount(c, reads); swaps >= 0 {
		if n.swaps >= 0 && swaps != n.swaps {
			tr.h.OnFlush()
		}
		n.swaps = swaps
	}
	return TrackingBroken(res, n.redirect)
}

// swapCount returns how many SWAPDB calls a single Redis node ran (INFO
// commandstats), or -1 when it is not known (a Cluster, which has one
// database; INFO refused or failed). SWAPDB swaps the contents of two
// databases under the names Redis tracks and sends no invalidation
// (Redis 7): this count is its only trace, and a change of it, at a health
// check, distrusts every copy as a FLUSHDB does.
func (tr *Tracker) swapCount(ctx context.Context, reads *redis.Client) int64 {
	if tr.single == nil {
		return -1
	}
	info, err := reads.Info(ctx, "commandstats").Result()
	if err != nil {
		return -1
	}
	return SwapdbCalls(info)
}

// SwapdbCalls reads the calls of SWAPDB in an INFO commandstats reply
// ("cmdstat_swapdb:calls=N,..."); 0 when it has none.
func SwapdbCalls(info string) int64 {
	_, rest, ok := strings.Cut(info, "cmdstat_swapdb:calls=")
	if !ok {
		return 0
	}
	n, _, _ := strings.Cut(rest, ",")
	calls, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
	if err != nil {
		return -1
	}
	return calls
}

// TrackingBroken reads a CLIENT TRACKINGINFO reply: tracking off, a broken
// redirect, or a redirect to another id than want.
func TrackingBroken(res []any, want int64) bool {
	for i := 0; i+1 < len(res); i += 2 {
		switch res[i] {
		case "flags":
			flags, _ := res[i+1].([]any)
			for _, f := range flags {
				if f == "off" || f == "broken_redirect" {
					return true
				}
			}
		case "redirect":
			if id, ok := res[i+1].(int64); ok && id != want {
				return true
			}
		}
	}
	return false
}

// AllUp reports whether every node is armed and listening.
func (tr *Tracker) AllUp() bool {
	if tr.mode.Load() != int32(Tracking) {
		return false
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.nodes) == 0 {
		return false
	}
	for _, n := range tr.nodes {
		if !n.up.Load() {
			return false
		}
	}
	return true
}

// reader returns the tracked client of the master of key, or nil when it
// is not armed (or not known yet: then the node is started).
func (tr *Tracker) reader(ctx context.Context, key string) *redis.Client {
	if tr.mode.Load() != int32(Tracking) {
		return nil
	}
	var src *redis.Options
	if tr.single != nil {
		src = tr.single.Options()
	} else {
		m, err := tr.cluster.MasterForKey(ctx, key)
		if err != nil {
			return nil
		}
		src = m.Options()
	}
	tr.mu.Lock()
	n := tr.nodes[src.Addr]
	tr.mu.Unlock()
	if n == nil {
		tr.add(tr.ctx, src) // the tier's context: the node outlives this read
		return nil
	}
	if !n.up.Load() {
		return nil
	}
	return n.reads.Load()
}

// Mode returns how the tier hears the fleet's writes now.
func (tr *Tracker) Mode() Mode { return Mode(tr.mode.Load()) }

// SetMode sets the mode, for a client the tier cannot track per node.
func (tr *Tracker) SetMode(m Mode) { tr.mode.Store(int32(m)) }

// Rearms counts the nodes armed again after they were lost.
func (tr *Tracker) Rearms() uint64 { return tr.rearms.Load() }

// Reads counts the tracked reads.
func (tr *Tracker) Reads() uint64 { return tr.reads.Load() }

// ID is the CLIENT ID of n's invalidation connection.
func (n *Node) ID() int64 { return n.id.Load() }

// Reads is n's tracked client, nil when it is not armed.
func (n *Node) Reads() *redis.Client { return n.reads.Load() }

// Nodes returns the nodes (one per master), by address.
func (tr *Tracker) Nodes() map[string]*Node {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return maps.Clone(tr.nodes)
}

// NodeOf returns the node of the master of the Redis key key, and its
// address (nil if it has none yet).
func (tr *Tracker) NodeOf(ctx context.Context, key string) (*Node, string, error) {
	var addr string
	if tr.single != nil {
		addr = tr.single.Options().Addr
	} else {
		m, err := tr.cluster.MasterForKey(ctx, key)
		if err != nil {
			return nil, "", err
		}
		addr = m.Options().Addr
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.nodes[addr], addr, nil
}

// Go runs f on a goroutine of the tracker's, which Stop waits for.
func (tr *Tracker) Go(f func()) { tr.wg.Go(f) }

// Package flightredis is a second tier for a [flightcache.Loader], shared
// by every process of a fleet through Redis: when N processes miss the same
// key at once, one of them calls the downstream and the others use its
// value, so the downstream sees one call per key, not N.
//
// # Tier
//
// A [Tier] is a [remote.Remote]: make it with [NewTier], set it as
// [flightcache.Options.Remote], and a Loader that misses locally asks it
// before calling its LoadFunc. [flightcache.New] hands the tier the
// Loader's rules ([Tier.Attach]): one Tier serves one Loader. The tier
// keeps, per key:
//
//   - a shared entry: the value (encoded by a [Codec], JSON by default) with
//     when it was loaded, how long the load took, and until when it is fresh
//     and usable stale, by the Loader's own rules ([remote.Bounds]).
//     Its freshness is drawn once, as the Loader draws each entry's
//     ([remote.Windows.Draw]: with Jitter, anywhere from TTL·(1−Jitter)
//     to TTL), and Redis keeps it until it is past that freshness and its
//     windows. With the Loader's [flightcache.Options.Version] it keeps the
//     value's version too, and no write of the fleet (a lease holder's
//     fill, a Set) replaces it with a value of a lower version
//     ([Stats].WritesOutdated);
//   - a lease: the process that holds it loads the key for the fleet, writes
//     the entry and publishes a wake-up on the key's own channel; the
//     others wait for it, subscribed to that channel while they wait, so
//     they read the entry as soon as it is written (a wake-up lost costs
//     one poll, [Options.PollInterval]), and take the lease over if its
//     holder stops proving it is alive ([Options.HolderTimeout]).
//
// Redis down or slow never fails a Get: every round trip is bounded by
// [Options.Timeout], and after a failure the tier steps aside for
// [Options.RetryAfter] while the Loader loads locally. [Tier.Stats] counts
// what happened.
//
// The client is the application's own go-redis client: a single node
// (redis.NewClient), a Sentinel failover client or a Cluster client. It
// must be created with ContextTimeoutEnabled: true, or [NewTier] refuses
// it (a slow Redis would otherwise hold loads past Options.Timeout):
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	tier, err := flightredis.NewTier(rdb, flightredis.Options[string, Price]{Prefix: "prices:"})
//
// A Cluster client needs a few more settings (MaxRetries, MaxRedirects,
// MaxRetryBackoff) so that hash slot migrations do not make the tier step
// aside: docs/distributed-cluster.md, "Client settings", has them and why.
//
// # Invalidation
//
// A Tier is also a [remote.Watcher]: a Loader.Set or
// Loader.Invalidate in one process drops the key's local copy in the
// other processes that hold it. The tier reads shared entries with Redis's
// client-side caching (CLIENT TRACKING), so Redis tells each process of
// the keys it read, and no other; where Redis refuses it, every process
// hears every write on a few sharded channels ([Stats].Invalidations
// says which). When an invalidation connection or subscription is lost
// the tier has its Loader read every local copy again before serving it,
// and a write that could not reach Redis is replayed as an invalidation
// once it can. [Stats] says whether the tier is listening.
//
// And a [remote.AllInvalidator]: a Loader.InvalidateAll moves
// the shared tier on to a new generation in one Redis command
// ([Tier.InvalidateAll]), which makes every older entry absent for every
// process at once, and every other process drops its local copies when it
// hears of it.
//
// # Batches
//
// A Tier is also a [remote.Many]: with
// [flightcache.Options.LoadMany] set, the misses of a
// [flightcache.Loader.GetMany] go through [Tier.LoadMany] together. Every
// key follows the same protocol as with [Tier.Load], but each step is one
// pipelined round trip for the whole batch, and the keys the batch leases
// are loaded by one LoadMany call: a batch of keys nobody has costs three
// round trips (read, acquire, write) whatever its size, a batch Redis
// already has one.
//
// # Breaker
//
// [Breaker] is a [flightcache.CircuitBreaker] whose state the fleet shares,
// built on gobreaker's DistributedCircuitBreaker with a Redis
// SharedDataStore; set it as [flightcache.Breaker.Custom]. It is opt-in.
//
// docs/distributed.md in the repository has the protocol step by step and
// the failure modes and what each costs; docs/distributed-invalidation.md
// how a write reaches the other processes' copies and how fast;
// docs/distributed-cluster.md the Cluster settings; docs/measured.md the
// other measured figures (one downstream call per key for a fleet, the
// fleet at scale).
package flightredis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightcache/flightcache/redis/internal/events"
	"github.com/flightcache/flightcache/redis/internal/handover"
	"github.com/flightcache/flightcache/redis/internal/shard"
	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/flightcache/flightcache/redis/internal/wake"
	"github.com/flightcache/flightcache/remote"
	"github.com/redis/go-redis/v9"
)

// Defaults for the zero values of [Options].
const (
	DefaultPrefix        = "flightcache:"         // Options.Prefix
	DefaultTimeout       = 250 * time.Millisecond // Options.Timeout, BreakerOptions.Timeout
	DefaultRetryAfter    = time.Second            // Options.RetryAfter, BreakerOptions.RetryAfter
	DefaultHolderTimeout = 2 * time.Second        // Options.HolderTimeout
	DefaultPollInterval  = 100 * time.Millisecond // Options.PollInterval
)

// Options configures a [Tier]. Its zero value is a sensible configuration;
// every zero field means the default its comment gives. The freshness
// windows are not here: the tier is given the Loader's when it is
// attached ([Tier.Attach]).
type Options[K comparable, V any] struct {
	// Prefix starts the name of every Redis key and pub/sub channel the
	// tier uses (the invalidation channel, <Prefix>invalidated, and each
	// key's wake-up channel, named after the key's Redis keys), so several
	// tiers (or programs) can share one Redis.
	// It must not contain '{' or '}' (they delimit Redis Cluster hash
	// tags). "" means DefaultPrefix ("flightcache:").
	Prefix string

	// Key returns the string that names key in Redis. Two keys must never
	// share a string, or they would share a value across the fleet. nil
	// means the key itself for a string key and fmt.Sprint(key) otherwise.
	//
	// WARNING: fmt.Sprint is not injective for every type (pointers,
	// structs with pointer fields, keys whose String method drops
	// fields): give Key for such key types.
	Key func(K) string

	// Codec encodes values for Redis. nil means [JSON]. Every process of a
	// fleet must use compatible codecs; an entry that does not decode (or
	// makes Unmarshal panic) is treated as missing and reloaded, and a
	// value Marshal fails or panics on is served but not shared.
	Codec Codec[V]

	// Timeout bounds each Redis round trip. When one fails or times out,
	// the load goes on locally, as if the tier were absent. 0 means
	// DefaultTimeout (250ms).
	Timeout time.Duration

	// RetryAfter is how long the tier steps aside after a Redis failure:
	// loads in that time go straight to the downstream, without a Redis
	// round trip. 0 means DefaultRetryAfter (1s).
	RetryAfter time.Duration

	// LeaseTTL is how long a lease lives in Redis. It must be longer than
	// the Loader's LoadTimeout, so a live holder never loses its lease in
	// mid-load (or, for a LoadTimeout of math.MaxInt64, math.MaxInt64
	// too), and at least 1ms; it bounds how long a lease can outlive a
	// holder that could not release it. 0 means LoadTimeout +
	// max(LoadTimeout/2, 1s), at most math.MaxInt64.
	LeaseTTL time.Duration

	// HolderTimeout is how long a lease holder may go without proving it is
	// alive (it does every HolderTimeout/3 while it loads) before a waiting
	// process takes its lease over. It bounds the wait when a holder dies
	// (SIGKILL, OOM, a lost machine) and is far shorter than LeaseTTL. It
	// must exceed Timeout and be at least 1ms. 0 means
	// DefaultHolderTimeout (2s).
	HolderTimeout time.Duration

	// PollInterval caps the wait between two looks at Redis while a process
	// waits for another's load; the wake-up published on the key's own
	// channel usually wakes it sooner, and one lost (or published by an
	// older version of the tier, which broadcasts it on <Prefix>loaded
	// instead) costs a poll. Polls
	// start at PollInterval/8 and double, with jitter. It must be at
	// least 1ms. 0 means DefaultPollInterval (100ms).
	PollInterval time.Duration
}

// Tier is the Redis tier of a [flightcache.Loader]: a [remote.Remote]
// shared by every process that uses the same Redis and Prefix. Create it
// with [NewTier] and set it as [flightcache.Options.Remote]; it
// serves the one Loader it is attached to. It is safe for concurrent use.
// Close it after the Loader: Close stops its pub/sub subscriptions; the
// Redis client stays the caller's to close.
type Tier[K comparable, V any] struct {
	rdb   redis.UniversalClient
	link  link          // the round trips to Redis, and the step aside after a failure
	opts  Options[K, V] // defaults applied, but LeaseTTL's (it needs the Loader's LoadTimeout: see attachment)
	key   func(K) string
	codec Codec[V]

	// What the tier knows of its Loader (attach.go): nil until the tier
	// is attached, then set once and never changed.
	att     atomic.Pointer[attachment[K, V]]
	claimed atomic.Bool // a Loader has attached the tier: another may not

	invChannel string // fleet-wide invalidation (invalidate.go)
	origin     string // this tier's name in its invalidations
	fleet      fleetState[K]

	// The generation of the shared tier (generation.go).
	genKey    string       // the counter in Redis
	tags      tagger[K]    // the stamps, and InvalidateTag calls kept for replay (tags.go)
	gen       atomic.Int64 // the newest generation this tier knows
	allMu     sync.Mutex   // one generation move at a time
	allKept   atomic.Int64 // InvalidateAll calls not in Redis yet (in progress or failed)
	allRetry  atomic.Int64 // of allKept, those whose own attempt failed or was not made
	allFailed atomic.Int64 // moves that failed for Redis's sake (not their caller's ctx); written under allMu
	ownAll    atomic.Int32 // this process's InvalidateAll moves in progress
	used      atomic.Bool  // the Loader has called the tier: its cache may hold what a move drops

	ahead  handover.Ahead      // keys this process may have served newer values of than Redis holds (package handover)
	events events.Subscription // the classic invalidation channel's subscription
	wake   wake.Hub            // the wake-up channels of the keys this process waits on
	track  track.Tracker       // how the tier hears the fleet's writes
	shards shard.Channels      // the fallback of tracking
	copies copies[K]           // the Loader's copies: what was handed over, the Loads running (copies.go)
	stats  counters

	ctx    context.Context // parent of the tier's own work; cancelled by Close
	cancel context.CancelFunc
	closed atomic.Bool
	once   sync.Once
}

var (
	_ remote.Remote[string, int] = (*Tier[string, int])(nil)
	_ remote.Many[string, int]   = (*Tier[string, int])(nil)
	_ remote.Watcher[string]     = (*Tier[string, int])(nil)
)

// NewTier returns a Tier on client, to be set as the
// [flightcache.Options.Remote] of one Loader: [flightcache.New] then
// hands the tier the Loader's rules ([Tier.Attach]), the freshness
// windows, each value's own (Options.Freshness), the not-found rule and
// NotFoundTTL, so every process applies the same rules to a shared entry
// and the Loader's Options are given once. Lifetimes saturate: a TTL or
// LoadTimeout of math.MaxInt64 ("never") gives a shared entry or a lease
// of the largest lifetime, about 292 years, never a wrapped-around short
// one. An option the tier cannot honour (see each field of [Options])
// makes NewTier return an error naming it; one that depends on the Loader
// (LeaseTTL, against its LoadTimeout) makes flightcache.New return it.
//
// A Tier not attached yet refuses to load ([ErrNotAttached]); a Set
// before then drops the key's shared entry instead of writing it.
//
// client may be a single node, a Sentinel failover client or a Cluster
// client (give a Cluster client MaxRedirects and MaxRetryBackoff as
// docs/distributed-cluster.md says, so hash slot migrations do not step the tier
// aside; after a failure the tier has a Cluster client reload its hash slot
// map, so a failover is found at once). It must have been created with
// ContextTimeoutEnabled, or a slow Redis would hold loads past Timeout;
// NewTier returns an error otherwise. NewTier does not contact Redis: a
// tier created while Redis is down starts working when Redis is back.
func NewTier[K comparable, V any](client redis.UniversalClient, opts Options[K, V]) (*Tier[K, V], error) {
	if err := checkClient(client); err != nil {
		return nil, err
	}
	if err := opts.validate(0, 0); err != nil { // the lease is checked at Attach
		return nil, err
	}
	return newTier(client, opts.withDefaults()), nil
}

// newTier makes a Tier of valid opts, defaults applied, not attached, and
// starts its pub/sub subscription.
func newTier[K comparable, V any](client redis.UniversalClient, opts Options[K, V]) *Tier[K, V] {
	t := &Tier[K, V]{
		rdb:        client,
		opts:       opts,
		key:        opts.Key,
		codec:      opts.Codec,
		invChannel: opts.Prefix + "invalidated",
		origin:     token(8),
		genKey:     opts.Prefix + "generation",
	}
	if t.key == nil {
		t.key = keyString[K]
	}
	if t.codec == nil {
		t.codec = JSON[V]{}
	}
	t.fleet.jsonKeys = jsonSafe(reflect.TypeFor[K]())
	_, str := any(*new(K)).(string)
	t.fleet.defaultNames = str && opts.Key == nil
	t.fleet.track = &t.track
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.link = link{rdb: client, scripts: patient{client}, timeout: opts.Timeout, retryAfter: opts.RetryAfter,
		holderTimeout: opts.HolderTimeout, aliveMS: px(opts.HolderTimeout),
		failMS: px(max(remote.Mul(opts.PollInterval, 4), time.Second)), wakeCmd: wake.Command(client),
		ctx: t.ctx, stats: &t.stats}
	t.copies = copies[K]{fleet: &t.fleet, track: &t.track, link: &t.link, stats: &t.stats, genKey: t.genKey,
		timeout: opts.Timeout, ctx: t.ctx}
	t.copies.served.Init()
	t.tags = tagger[K]{rdb: client, link: &t.link, stats: &t.stats, fleet: &t.fleet, prefix: opts.Prefix,
		clock: opts.Prefix + "tagclock", origin: t.origin, channel: t.invChannel, ctx: t.ctx, closed: &t.closed,
		distrust: t.distrust}
	t.wake.Init(t.ctx, client, opts.Timeout)
	t.events.Start(t.ctx, client, events.Handlers{
		Channel:   t.invChannel,
		OnMessage: t.onInvalidated, OnUp: t.onUp, OnDown: t.onDown, OnRetry: t.onRetry,
		OnTick: t.onTick,
	}, opts.Timeout)
	t.shards.Init(opts.Prefix, client, opts.Timeout, shard.Handlers{
		OnMessage: t.onInvalidated, OnUp: t.onNodeUp, OnDown: t.onDown, OnRetry: t.onRetry,
	})
	t.startTracking()
	return t
}

// checkClient rejects a nil client, and one whose commands ignore context
// deadlines.
func checkClient(c redis.UniversalClient) error {
	if c == nil {
		return errors.New("flightredis: nil client")
	}
	enabled := true
	switch c := c.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		enabled = c.Options().ContextTimeoutEnabled
	}
	if !enabled {
		return errors.New("flightredis: the client must be created with ContextTimeoutEnabled: true, or a slow Redis would hold loads past Options.Timeout")
	}
	return nil
}

// validate checks the tier's own options; loadTimeout is the Loader's, or
// 0 before the tier knows it (which leaves LeaseTTL unchecked against it),
// and maxWait how long its loads may wait for a Limit slot, holding
// their lease (Limit.MaxWait; 0 without a Limit).
func (o *Options[K, V]) validate(loadTimeout, maxWait time.Duration) error {
	hold := remote.Add(loadTimeout, maxWait)
	switch {
	case strings.ContainsAny(o.Prefix, "{}"):
		return fmt.Errorf("flightredis: Options.Prefix must not contain '{' or '}', got %q", o.Prefix)
	case o.Timeout < 0:
		return fmt.Errorf("flightredis: Options.Timeout must be >= 0, got %v", o.Timeout)
	case o.RetryAfter < 0:
		return fmt.Errorf("flightredis: Options.RetryAfter must be >= 0, got %v", o.RetryAfter)
	case o.PollInterval < 0:
		return fmt.Errorf("flightredis: Options.PollInterval must be >= 0, got %v", o.PollInterval)
	case o.PollInterval != 0 && o.PollInterval < time.Millisecond:
		return fmt.Errorf("flightredis: Options.PollInterval must be 0 or at least 1ms, got %v", o.PollInterval)
	case o.LeaseTTL < 0:
		return fmt.Errorf("flightredis: Options.LeaseTTL must be >= 0, got %v", o.LeaseTTL)
	case o.LeaseTTL != 0 && o.LeaseTTL < time.Millisecond:
		return fmt.Errorf("flightredis: Options.LeaseTTL must be 0 or at least 1ms (Redis takes whole milliseconds), got %v", o.LeaseTTL)
	case o.LeaseTTL != 0 && o.LeaseTTL <= hold && o.LeaseTTL != maxDuration && maxWait == 0:
		return fmt.Errorf("flightredis: Options.LeaseTTL must be longer than the Loader's LoadTimeout (%v), got %v", loadTimeout, o.LeaseTTL)
	case o.LeaseTTL != 0 && o.LeaseTTL <= hold && o.LeaseTTL != maxDuration:
		return fmt.Errorf("flightredis: Options.LeaseTTL must be longer than the Loader's LoadTimeout plus its Limit.MaxWait (%v + %v), got %v",
			loadTimeout, maxWait, o.LeaseTTL)
	case o.HolderTimeout < 0:
		return fmt.Errorf("flightredis: Options.HolderTimeout must be >= 0, got %v", o.HolderTimeout)
	case o.HolderTimeout != 0 && o.HolderTimeout < time.Millisecond:
		return fmt.Errorf("flightredis: Options.HolderTimeout must be 0 or at least 1ms (Redis takes whole milliseconds), got %v", o.HolderTimeout)
	}
	timeout := cmp(o.Timeout, DefaultTimeout)
	if h := cmp(o.HolderTimeout, DefaultHolderTimeout); h <= timeout {
		return fmt.Errorf("flightredis: Options.HolderTimeout (%v) must be longer than Options.Timeout (%v)", h, timeout)
	}
	return nil
}

// cmp returns d, or def when d is 0.
func cmp(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// withDefaults applies the defaults of every field but LeaseTTL, whose
// default depends on the Loader (see leaseTTL).
func (o Options[K, V]) withDefaults() Options[K, V] {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	o.Timeout = cmp(o.Timeout, DefaultTimeout)
	o.RetryAfter = cmp(o.RetryAfter, DefaultRetryAfter)
	o.HolderTimeout = cmp(o.HolderTimeout, DefaultHolderTimeout)
	o.PollInterval = cmp(o.PollInterval, DefaultPollInterval)
	return o
}

// leaseTTL is LeaseTTL with its default applied, for a Loader whose loads
// hold their lease for at most hold: LoadTimeout, plus Limit.MaxWait with
// a Limit.
func (o Options[K, V]) leaseTTL(hold time.Duration) time.Duration {
	return cmp(o.LeaseTTL, remote.Add(hold, max(hold/2, time.Second)))
}

// Close stops the tier's pub/sub subscriptions and its background work.
// Call it after [flightcache.Loader.Close]; a Load after Close goes
// straight to the downstream. Sets and Invalidates still waiting to be
// replayed are dropped (Stats.InvalidationsLost), and so are
// InvalidateAll calls (Stats.InvalidateAllsLost). Close does not close the
// Redis client. It is idempotent and always returns nil.
//
// NOTE: with Redis hung, Close waits for go-redis to give up setting up the
// subscription's connection, which only the client's ReadTimeout bounds
// (about twice ReadTimeout); keep ReadTimeout short (1s).
func (t *Tier[K, V]) Close() error {
	t.once.Do(func() {
		t.closed.Store(true)
		t.cancel()
		t.events.Stop()
		t.track.Stop()
		t.shards.Wait()
		t.wake.Close()
		t.dropPending()
		t.tags.dropKept()
	})
	return nil
}

// jitter spreads d uniformly over [d/2, 3d/2), saturated at the largest
// duration.
func jitter(d time.Duration) time.Duration {
	return remote.Scale(d, 0.5+rand.Float64())
}

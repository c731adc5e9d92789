package flightpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lease lets one [Source] of a fleet consume the change stream at a time
// ([Options.Lease]): the Sources of every process share one permanent
// slot ([Options.Slot]) and one Lease, the holder reads the slot and
// invalidates through its Loader (whose Redis tier tells every other
// process holding a key), and when the holder dies or closes another
// Source takes the lease and resumes from the slot's confirmed position.
// [RedisLease] is one on Redis.
//
// An implementation must be safe for concurrent use by the Sources of a
// process, each with its own Lease value: a Lease value is one
// candidate holder.
type Lease interface {
	// Acquire takes the lease when no one holds it, or extends it for
	// another TTL when this Lease holds it already. It returns whether
	// this Lease holds it now and, either way, the name of the holder
	// ("" when it cannot tell). The Source counts the lease as its own
	// for TTL from the moment it called Acquire, and no longer: it calls
	// Acquire again every TTL/3 while it holds it.
	Acquire(ctx context.Context) (held bool, holder string, err error)
	// Release gives the lease up when this Lease holds it, and does
	// nothing otherwise.
	Release(ctx context.Context) error
	// TTL is how long the lease lasts from an Acquire: after it, another
	// candidate may take it. It must be > 0.
	TTL() time.Duration
}

// RedisLeaseOptions configures a [RedisLease].
type RedisLeaseOptions struct {
	// Key is the Redis key the lease lives under: one per fleet and slot,
	// e.g. "products:flightpg:lease". Required.
	Key string
	// TTL is how long the lease lasts without renewal: how long a fleet
	// goes without a consumer after its holder dies without releasing it
	// (SIGKILL, a lost host). The holder renews it every TTL/3, and stops
	// applying and confirming once TTL has passed since its last
	// renewal's start. Default 1s; at least 100ms.
	TTL time.Duration
	// Name names this candidate in [LeaseStatus.Holder] and
	// [LeaseEvent.Holder] of every process. Default: the host name and
	// the process id ("host:1234").
	Name string
}

// RedisLease is a [Lease] in one Redis key: SET NX PX with a token of its
// own (its Name and random hex), extended and released by scripts that
// first check the token, so that a candidate never extends or drops a
// lease another one took after its own expired. Make one per [Source]
// with [NewRedisLease].
type RedisLease struct {
	client redis.UniversalClient
	key    string
	ttl    time.Duration
	token  string
}

const (
	defaultLeaseTTL = time.Second
	minLeaseTTL     = 100 * time.Millisecond
)

// NewRedisLease returns a [RedisLease] on client (a go-redis v9 client:
// a single node, Sentinel or Cluster). It does not contact Redis.
func NewRedisLease(client redis.UniversalClient, opts RedisLeaseOptions) (*RedisLease, error) {
	switch {
	case client == nil:
		return nil, errors.New("flightpg: NewRedisLease needs a client, got nil")
	case opts.Key == "":
		return nil, leaseOptionError("Key", "is required")
	case opts.TTL < 0:
		return nil, leaseOptionError("TTL", "must be >= 0, got %v", opts.TTL)
	case opts.TTL != 0 && opts.TTL < minLeaseTTL:
		return nil, leaseOptionError("TTL", "must be at least %v (or 0: %v), got %v", minLeaseTTL, defaultLeaseTTL, opts.TTL)
	case strings.ContainsRune(opts.Name, '#'):
		return nil, leaseOptionError("Name", "must not contain '#', got %q", opts.Name)
	}
	if opts.TTL == 0 {
		opts.TTL = defaultLeaseTTL
	}
	if opts.Name == "" {
		host, _ := os.Hostname()
		opts.Name = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	return &RedisLease{client: client, key: opts.Key, ttl: opts.TTL, token: opts.Name + "#" + randomHex(8)}, nil
}

func leaseOptionError(field, format string, args ...any) error {
	return fmt.Errorf("flightpg: RedisLeaseOptions.%s %s", field, fmt.Sprintf(format, args...))
}

// acquireScript: KEYS[1] the lease, ARGV[1] the token, ARGV[2] the TTL in
// ms. Takes a free lease, extends one the token holds; returns
// {1 or 0, the holder's token}.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, ARGV[1]}
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, v}
end
return {0, v}
`)

// releaseScript: KEYS[1] the lease, ARGV[1] the token. Drops the lease
// only when the token holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Acquire takes the lease when it is free, or extends it when this
// RedisLease holds it; see [Lease].
func (l *RedisLease) Acquire(ctx context.Context) (bool, string, error) {
	res, err := acquireScript.Run(ctx, l.client, []string{l.key}, l.token, l.ttl.Milliseconds()).Slice()
	if err != nil {
		return false, "", fmt.Errorf("flightpg: lease %s: acquire: %w", l.key, err)
	}
	if len(res) != 2 {
		return false, "", fmt.Errorf("flightpg: lease %s: acquire: unexpected reply %v", l.key, res)
	}
	won, _ := res[0].(int64)
	holder, _ := res[1].(string)
	return won == 1, holderName(holder), nil
}

// Release drops the lease when this RedisLease holds it.
func (l *RedisLease) Release(ctx context.Context) error {
	if err := releaseScript.Run(ctx, l.client, []string{l.key}, l.token).Err(); err != nil {
		return fmt.Errorf("flightpg: lease %s: release: %w", l.key, err)
	}
	return nil
}

// TTL returns [RedisLeaseOptions.TTL].
func (l *RedisLease) TTL() time.Duration {
	if l == nil {
		return 0
	}
	return l.ttl
}

// Name returns the name this candidate is known by ([RedisLeaseOptions.Name]).
func (l *RedisLease) Name() string { return holderName(l.token) }

// holderName is a token's name: what comes before its last '#'.
func holderName(token string) string {
	if i := strings.LastIndexByte(token, '#'); i >= 0 {
		return token[:i]
	}
	return token
}

package flightcache

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// Defaults for the zero values of [Options].
const (
	DefaultMaxCost             = 10_000
	DefaultLoadTimeout         = 10 * time.Second
	DefaultMaxRefreshes        = 64
	DefaultRetryInitial        = 50 * time.Millisecond
	DefaultRetryMax            = 2 * time.Second
	DefaultConsecutiveFailures = 5
	DefaultOpenTimeout         = 5 * time.Second
	DefaultHalfOpenRequests    = 1
	DefaultMaxBatch            = 100
	DefaultMaxPendingWrites    = 4096
)

// The bounds of NumCounters: ristretto allocates its counters at New,
// about 4 bytes each once rounded up to a power of two.
const (
	// defaultMaxNumCounters caps the default, 10 × MaxCost: 64 MiB of
	// counters, so a huge MaxCost (math.MaxInt64: no bound) neither
	// overflows nor allocates the machine's memory.
	defaultMaxNumCounters = 1 << 24
	// maxNumCounters is the most a user may set: 16 GiB of counters; past
	// it ristretto's allocation fails the process (or panics) in New.
	maxNumCounters = 1 << 32
)

// Options configures a [Loader]. It is a plain struct passed by value to
// [New]; its zero value plus a TTL is a safe configuration, and every zero
// field means the default its comment gives. New rejects an invalid value
// with an error that names the field. Every callback (Cost, Freshness,
// Version, Tags, IsNotFound, ValidateKey, Hash, OnLoad, the Observer) runs
// outside every lock and through one guard: a panic is recovered and
// counted in Stats.Panics. Each field in full: docs/options.md.
type Options[K comparable, V any] struct {
	// TTL is how long a loaded value is fresh. Required, > 0.
	TTL time.Duration

	// Jitter, in [0, 1], spreads expiry: each entry's freshness is drawn
	// uniformly from [TTL·(1−Jitter), TTL]. 0 means exactly TTL.
	Jitter float64

	// StaleWhileRevalidate is how long after freshness ends a Get still
	// returns the stale value at once ([SourceStale]) while one background
	// refresh of the key runs; a failed refresh backs off (docs/design.md
	// rule 5). 0 = off.
	StaleWhileRevalidate time.Duration

	// StaleIfError is how long after that window a stale value still
	// covers a failed load ([SourceStaleOnError]), the breaker's refusal
	// included; never a not-found. 0 = off.
	StaleIfError time.Duration

	// EarlyRefresh is the XFetch β: each entry is refreshed in the
	// background δ·(1+β·X) before it expires (δ its load time, X drawn once
	// per entry from Exp(1)), so hot keys never go stale in front of
	// readers. Set values are not refreshed early. 0 = off.
	EarlyRefresh float64

	// MaxCost bounds the cache, in the units of Cost. Without Cost every
	// entry costs 1 and 0 means DefaultMaxCost; with Cost it is required.
	MaxCost int64

	// Cost, if set, returns the cost of a value (its size in bytes, say),
	// once per stored value. A value costing more than MaxCost is never
	// cached. Keys are not costed.
	Cost func(V) int64

	// NumCounters is the number of ristretto's TinyLFU counters (about 4
	// bytes each). 0 means 10 × MaxCost without Cost, at most 1<<24, and
	// 1,000,000 with Cost; New refuses more than 1<<32.
	NumCounters int64

	// Policy says what happens to a load once every caller waiting on it
	// has left. The zero value is FinishAndFill.
	Policy Policy

	// LoadTimeout bounds one load, retries included, inside the shared
	// load, never per waiter; a load that runs to it fails with an error
	// matching [ErrLoadTimeout]. 0 means DefaultLoadTimeout (10s).
	LoadTimeout time.Duration

	// Retry configures retries of a failed downstream call inside a load.
	Retry Retry

	// Breaker configures the circuit breaker around the downstream call.
	Breaker Breaker

	// Limit bounds the downstream calls made at once (see [Limit]). The
	// zero value bounds nothing.
	Limit Limit

	// MaxRefreshes bounds the background refreshes running at once; past
	// it the stale value serves and no refresh starts. 0 means
	// DefaultMaxRefreshes (64).
	MaxRefreshes int

	// OnLoad, if set, is called once after every downstream load, on the
	// load's goroutine, once its waiters have the result. It must not block
	// for long: [Loader.Close] waits for it.
	OnLoad func(LoadEvent[K])

	// Observer, if set, sees every load and every Get that waited on one,
	// never a hit, for metrics and traces (see [Observer]; [Observers]
	// combines several). nil means nothing is observed.
	Observer Observer[K]

	// Freshness, if set, gives each value loaded, reloaded or Set its own
	// lifetime: a zero field takes the Options' value, a negative one means
	// none, and a negative TTL means the value reaches its callers but is
	// not cached (docs/design.md rule 11). Not asked for a not-found.
	Freshness func(key K, v V) Freshness

	// Version, if set, gives a value's version (a row's version column):
	// no write of a key (a Set, a load's fill, a Restore) replaces a value
	// held of a higher version; an outdated write is dropped and counted in
	// Stats.WritesOutdated, and its load's callers still get its value
	// (docs/design.md rule 30). nil: the last write wins.
	Version func(v V) uint64

	// Tags, if set, names a value's tags as it is stored, at most
	// [MaxTags], for [Loader.InvalidateTag]; a value with more
	// ([ErrTooManyTags]) is not cached (docs/design.md rules 36 to 38).
	// nil costs nothing.
	Tags func(key K, v V) []string

	// Reload, if set, is used instead of the LoadFunc for every load of a
	// key the Loader holds a value for (a refresh, a revalidating Get, a
	// Get past the stale window): it receives that value and may return
	// [ErrNotModified] (docs/design.md rule 13). nil means the LoadFunc.
	Reload ReloadFunc[K, V]

	// LoadMany, if set, loads [Loader.GetMany]'s misses together, in calls
	// of at most MaxBatch keys; with it, [New] needs no LoadFunc. nil means
	// each missing key through the LoadFunc (docs/design.md rule 15).
	LoadMany LoadManyFunc[K, V]

	// MaxBatch bounds the keys of one LoadMany call. 0 means
	// DefaultMaxBatch (100).
	MaxBatch int

	// BatchWindow, with LoadMany, gathers the loads of single keys (misses
	// and refreshes, not a Reload) into LoadMany calls: each waits up to
	// BatchWindow, or until MaxBatch keys wait, then they go out as one
	// call; a call that fails as a whole is split down to the failing key.
	// The wait is a miss's latency, unless [Loader.Flush] sends the window
	// at once. With it the LoadFunc is never called: pass New nil. 0 (the
	// default) means no waiting (docs/design.md rules 31 and 39).
	BatchWindow time.Duration

	// MaxPendingWrites bounds the writes waiting for the cache to apply
	// them, per share (the fills of loads; Set and Invalidate), and so
	// their memory: a fill past it is not cached (Stats.FillsDropped); a
	// Set or Invalidate waits its turn (Stats.WriteWaits), never for a
	// load. 0 means DefaultMaxPendingWrites (4096) (docs/design.md rule 19).
	MaxPendingWrites int

	// NotFoundTTL, if > 0, caches a not-found (see IsNotFound) for this
	// long, jittered like TTL; later Gets return the same error as a hit.
	// 0: not-founds are not cached. Either way a not-found drops the value
	// held.
	NotFoundTTL time.Duration

	// IsNotFound, if set, reports whether a load error means that the key
	// does not exist, besides the errors matching [ErrNotFound], which
	// always do (sql.ErrNoRows, say). A not-found is an answer: never
	// retried, a success for the breaker, never covered by a stale value,
	// cached for NotFoundTTL (docs/design.md rule 25). Its callers' error
	// matches ErrNotFound and the error itself. nil: ErrNotFound only.
	IsNotFound func(error) bool

	// ValidateKey, if set, is asked about a key before anything else is
	// done with it, on every Get (hits too: keep it cheap): a key it
	// rejects fails at once for its own callers, with an error matching
	// [ErrInvalidKey] and its own, and no load (docs/design.md rule 33;
	// counted in Stats.InvalidKeys, not Gets). nil: every key is valid.
	ValidateKey func(K) error

	// Remote, if set, is a second tier shared between processes (see
	// [remote.Remote]): a local miss asks it before the downstream, and Set
	// and Invalidate are passed on to it. nil = local only.
	Remote remote.Remote[K, V]

	// Hash, if set, replaces the default hash of keys (hash/maphash with a
	// per-Loader seed). Keys are always compared exactly, so keys whose
	// hashes collide never see each other's values. A key that cannot be
	// hashed fails with a [*PanicError]; one not equal to itself (a NaN) is
	// never cached (docs/design.md rule 24).
	//
	// NOTE: normalise a key as the database compares it before Get, Set and
	// Invalidate: "P1" and "p1 " are two keys here, one row to a case- and
	// space-insensitive collation.
	Hash func(K) uint64
}

// Freshness is one value's lifetime, from [Options.Freshness]: how long
// it is fresh and its stale windows, as an HTTP response's Cache-Control
// max-age, stale-while-revalidate and stale-if-error give them (RFC 5861),
// or a token's stated expiry. A zero field takes the Options' value; a
// negative one means none for this value.
type Freshness struct {
	// TTL is how long the value is fresh; < 0: return it to its callers
	// but do not cache it.
	TTL time.Duration
	// StaleWhileRevalidate is the value's own [Options.StaleWhileRevalidate].
	StaleWhileRevalidate time.Duration
	// StaleIfError is the value's own [Options.StaleIfError].
	StaleIfError time.Duration
}

// Retry configures retries inside one load, built on
// github.com/cenkalti/backoff/v4's exponential backoff with jitter. Retries
// stop at MaxAttempts, at the load's deadline ([Options.LoadTimeout]), or at
// the first error that is not retryable. Breaker refusals, a not-found
// ([Options.IsNotFound]), an invalid key ([ErrInvalidKey]), panics and
// context errors are never retried.
type Retry struct {
	// MaxAttempts is the number of downstream calls one load may make.
	// 0 or 1 means no retry.
	MaxAttempts int
	// InitialInterval is the wait before the first retry (jittered ±50%,
	// growing 1.5× per retry). 0 means DefaultRetryInitial (50ms).
	InitialInterval time.Duration
	// MaxInterval caps the wait between retries. 0 means DefaultRetryMax (2s).
	MaxInterval time.Duration
	// Retryable, if set, reports whether an error is worth another attempt.
	// nil means every error not excluded above is retryable.
	Retryable func(error) bool
}

// NotFound reports whether err means that the key does not exist, by o's
// rule (see [Options.IsNotFound]): err matches [ErrNotFound], or
// IsNotFound reports true; nil, a [*PanicError], [ErrGoexit] and an error
// matching [ErrInvalidKey] never do.
// A [Remote] uses it to judge a load's error as the Loader does (the
// flightredis tier shares a not-found with the fleet), and a caller to
// tell a Get's not-found from a failure. A panic in IsNotFound is
// recovered and reported as false, as the Loader does (which also counts
// it in Stats.Panics). It is safe for concurrent use if IsNotFound is.
func (o Options[K, V]) NotFound(err error) (nf bool) {
	if nf, sure := plainNotFound(err); sure || o.IsNotFound == nil {
		return nf
	}
	defer func() {
		if recover() != nil {
			nf = false
		}
	}()
	return o.IsNotFound(err)
}

// plainNotFound is the not-found rule without Options.IsNotFound: sure
// is false when it is IsNotFound's call.
func plainNotFound(err error) (nf, sure bool) {
	var pe *PanicError
	switch {
	case err == nil, err == ErrGoexit, errors.As(err, &pe), invalidKey(err):
		return false, true
	case errors.Is(err, ErrNotFound):
		return true, true
	}
	return false, false
}

// validate checks every field and returns the first problem, naming it.
func (o *Options[K, V]) validate() error {
	switch {
	case o.TTL <= 0:
		return optionError("TTL", "must be > 0, got %v", o.TTL)
	case math.IsNaN(o.Jitter) || o.Jitter < 0 || o.Jitter > 1:
		return optionError("Jitter", "must be in [0, 1], got %v", o.Jitter)
	case o.StaleWhileRevalidate < 0:
		return optionError("StaleWhileRevalidate", "must be >= 0, got %v", o.StaleWhileRevalidate)
	case o.StaleIfError < 0:
		return optionError("StaleIfError", "must be >= 0, got %v", o.StaleIfError)
	case math.IsNaN(o.EarlyRefresh) || math.IsInf(o.EarlyRefresh, 0) || o.EarlyRefresh < 0:
		return optionError("EarlyRefresh", "must be a finite number >= 0, got %v", o.EarlyRefresh)
	case o.MaxCost < 0:
		return optionError("MaxCost", "must be >= 0, got %d", o.MaxCost)
	case o.Cost != nil && o.MaxCost == 0:
		return optionError("MaxCost", "must be set when Options.Cost is set")
	case o.NumCounters < 0:
		return optionError("NumCounters", "must be >= 0, got %d", o.NumCounters)
	case o.NumCounters > maxNumCounters:
		return optionError("NumCounters", "must be at most %d (1<<32, 16 GiB of counters), got %d", int64(maxNumCounters), o.NumCounters)
	case o.Policy != FinishAndFill && o.Policy != CancelAtZero:
		return optionError("Policy", "is unknown: %v", o.Policy)
	case o.LoadTimeout < 0:
		return optionError("LoadTimeout", "must be >= 0, got %v", o.LoadTimeout)
	case o.Retry.MaxAttempts < 0:
		return optionError("Retry.MaxAttempts", "must be >= 0, got %d", o.Retry.MaxAttempts)
	case o.Retry.InitialInterval < 0:
		return optionError("Retry.InitialInterval", "must be >= 0, got %v", o.Retry.InitialInterval)
	case o.Retry.MaxInterval < 0:
		return optionError("Retry.MaxInterval", "must be >= 0, got %v", o.Retry.MaxInterval)
	case o.Breaker.OpenTimeout < 0:
		return optionError("Breaker.OpenTimeout", "must be >= 0, got %v", o.Breaker.OpenTimeout)
	case o.MaxRefreshes < 0:
		return optionError("MaxRefreshes", "must be >= 0, got %d", o.MaxRefreshes)
	case o.MaxBatch < 0:
		return optionError("MaxBatch", "must be >= 0, got %d", o.MaxBatch)
	case o.BatchWindow < 0:
		return optionError("BatchWindow", "must be >= 0, got %v", o.BatchWindow)
	case o.BatchWindow > 0 && o.LoadMany == nil:
		return optionError("BatchWindow", "needs LoadMany, which is nil")
	case o.MaxPendingWrites < 0:
		return optionError("MaxPendingWrites", "must be >= 0, got %d", o.MaxPendingWrites)
	case o.NotFoundTTL < 0:
		return optionError("NotFoundTTL", "must be >= 0, got %v", o.NotFoundTTL)
	}
	return o.Limit.validate()
}

// withDefaults returns a copy with every zero field that has a default set.
func (o Options[K, V]) withDefaults() Options[K, V] {
	if o.MaxCost == 0 {
		o.MaxCost = DefaultMaxCost
	}
	if o.NumCounters == 0 {
		if o.Cost == nil {
			o.NumCounters = defaultMaxNumCounters
			if o.MaxCost <= defaultMaxNumCounters/10 {
				o.NumCounters = 10 * o.MaxCost
			}
		} else {
			o.NumCounters = 1_000_000
		}
	}
	if o.LoadTimeout == 0 {
		o.LoadTimeout = DefaultLoadTimeout
	}
	if o.MaxRefreshes == 0 {
		o.MaxRefreshes = DefaultMaxRefreshes
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxPendingWrites == 0 {
		o.MaxPendingWrites = DefaultMaxPendingWrites
	}
	if o.Retry.MaxAttempts == 0 {
		o.Retry.MaxAttempts = 1
	}
	if o.Retry.InitialInterval == 0 {
		o.Retry.InitialInterval = DefaultRetryInitial
	}
	if o.Retry.MaxInterval == 0 {
		o.Retry.MaxInterval = max(DefaultRetryMax, o.Retry.InitialInterval)
	}
	o.Retry.MaxInterval = max(o.Retry.MaxInterval, o.Retry.InitialInterval)
	o.Breaker = o.Breaker.WithDefaults()
	o.Limit = o.Limit.withDefaults(o.LoadTimeout)
	return o
}

// Policy says what happens to a load when every caller waiting on it has
// left (their contexts ended). The zero value is [FinishAndFill].
type Policy uint8

const (
	// FinishAndFill lets an abandoned load run on, bounded by
	// [Options.LoadTimeout], and fill the cache: the next Get of the key is
	// a hit. Best for idempotent reads that will be asked for again.
	FinishAndFill Policy = iota
	// CancelAtZero cancels the load's context as soon as its last waiter
	// leaves, and removes the load from the in-flight map under the same
	// lock, so a later Get starts a fresh load and never inherits the
	// cancelled one. Best when abandoned work holds scarce resources.
	CancelAtZero
)

// String returns "finish-and-fill" or "cancel-at-zero".
func (p Policy) String() string {
	switch p {
	case FinishAndFill:
		return "finish-and-fill"
	case CancelAtZero:
		return "cancel-at-zero"
	default:
		return fmt.Sprintf("Policy(%d)", uint8(p))
	}
}

// errAbandoned is the cancellation cause of a load whose last waiter left
// under CancelAtZero.
var errAbandoned = fmt.Errorf("flightcache: load abandoned by every caller: %w", context.Canceled)

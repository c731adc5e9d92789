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
// with an error that names the field.
type Options[K comparable, V any] struct {
	// TTL is how long a loaded value is fresh. Required, > 0.
	TTL time.Duration

	// Jitter, in [0, 1], spreads expiry: each entry's freshness is drawn
	// uniformly from [TTL·(1−Jitter), TTL], so keys loaded together do not
	// expire together. 0 (the default) means every entry lives exactly TTL.
	Jitter float64

	// StaleWhileRevalidate is how long after freshness ends a Get still
	// returns the stale value at once ([SourceStale]) while one background
	// refresh of the key runs. A failed refresh is not retried for that key
	// before a jittered delay: the first is drawn from [I/2, I], I being
	// Retry.InitialInterval, and the range doubles per consecutive failure
	// up to [M/2, M], M being Retry.MaxInterval. 0 = off.
	StaleWhileRevalidate time.Duration

	// StaleIfError is how long after the StaleWhileRevalidate window a stale
	// value still covers a failure: a Get waits for a load, and if that load
	// fails (the breaker refusing included) it returns the stale value
	// ([SourceStaleOnError]) instead of the error. A not-found
	// ([Options.IsNotFound]) is never covered: the key is gone. 0 = off.
	StaleIfError time.Duration

	// EarlyRefresh is the XFetch β: each entry is refreshed in the background
	// before it expires, so hot keys never go stale in front of readers. The
	// refresh starts δ + β·δ·X before expiry, where δ is how long the value
	// took to load (LoadEvent.Duration: a wait for an [Options.Limit] slot
	// is not part of it) and X is drawn once per entry from Exp(1) (capped
	// at half the entry's life): keys loaded together refresh apart, slow loads
	// refresh earlier, and a larger β spreads refreshes wider at the cost of
	// more of them. The draw is per entry, not per Get as in the paper, so
	// the refresh rate does not grow with the request rate. Values stored
	// with Set (no load time) are not refreshed early. 0 = off.
	EarlyRefresh float64

	// MaxCost bounds the cache, in the units of Cost. Without Cost every
	// entry costs 1, MaxCost is an entry count, and 0 means
	// DefaultMaxCost. With Cost, MaxCost is required.
	MaxCost int64

	// Cost, if set, returns the cost of a value (for example its size in
	// bytes). It is called once per stored value, outside every lock, and
	// must not block. A panic in Cost is recovered: the value is returned
	// to its callers but not cached, and Stats.Panics counts it. Every
	// costed write, a reload or Set of a cached key included, goes through
	// ristretto's admission, so what is cached never costs more than
	// MaxCost; a value costing more is never cached (Stats.SetsRejected).
	//
	// NOTE: keys are not costed. With large keys, leave room for them.
	Cost func(V) int64

	// NumCounters is the number of TinyLFU frequency counters ristretto
	// keeps (ristretto rounds it up to a power of two; about 4 bytes
	// each). 0 means 10 × MaxCost without Cost, at most 1<<24 (about
	// 64 MiB of counters, so that a MaxCost of math.MaxInt64, "no bound",
	// works), and 1,000,000 with Cost. For a cache of more than about
	// 1.7 million entries, set it to 10 × the entries you expect. At most
	// 1<<32 (16 GiB): New refuses more.
	NumCounters int64

	// Policy says what happens to a load once every caller waiting on it
	// has left. The zero value is FinishAndFill.
	Policy Policy

	// LoadTimeout bounds one load, retries included. It lives inside the
	// shared load, never per waiter. 0 means DefaultLoadTimeout (10s). A
	// load that ran to it fails with an error matching [ErrLoadTimeout],
	// also when the LoadFunc returned an error of its own at the deadline
	// (a dial deadline taken from the load's context).
	LoadTimeout time.Duration

	// Retry configures retries of a failed downstream call inside a load.
	Retry Retry

	// Breaker configures the circuit breaker around the downstream call.
	Breaker Breaker

	// Limit bounds the downstream calls made at once, for a storm of many
	// distinct keys (see [Limit]): a load that finds no slot free serves a
	// stale value if the Get holds one within StaleIfError, or waits its
	// turn, or fails with [ErrLimited]. The zero value bounds nothing.
	Limit Limit

	// MaxRefreshes bounds the background refreshes running at once (stale
	// revalidation and early refresh together). When it is reached the
	// stale value is served and no refresh starts. 0 means
	// DefaultMaxRefreshes (64).
	MaxRefreshes int

	// OnLoad, if set, is called once after every downstream load, foreground
	// or background, on the load's own goroutine, after the load's waiters
	// have been given the result. It must not block for long: [Loader.Close]
	// waits for it. A panic in OnLoad is recovered and counted in
	// Stats.Panics.
	OnLoad func(LoadEvent[K])

	// Observer, if set, sees every load, from its start to its end, and
	// every Get that waited on one, for metrics and traces (the
	// otelflightcache module has one for OpenTelemetry): see [Observer].
	// The context its LoadStart returns is the load's context, which the
	// LoadFunc receives. It is never called on a hit or a stale hit. Its
	// calls go through the guard, as OnLoad's do: a panic is counted in
	// Stats.Panics and loses no result. OnLoad is called as well. To set
	// several, combine them with [Observers]. nil means nothing is
	// observed.
	Observer Observer[K]

	// Freshness, if set, gives each value its own lifetime: it is called for
	// every value loaded, reloaded or Set, on the goroutine that stores it,
	// outside every lock and through the guard that every callback goes
	// through (a panic: the value is returned but not cached, counted in
	// Stats.Panics). A zero field of the Freshness it returns takes the
	// Options' value, a negative one means none; a negative TTL means the
	// value reaches its callers but is not cached (and the key keeps no
	// older value). Jitter and EarlyRefresh apply to the TTL it returns.
	// nil means every value gets TTL, StaleWhileRevalidate and
	// StaleIfError. A cached not-found ([NotFoundTTL]) is not passed to it.
	Freshness func(key K, v V) Freshness

	// Version, if set, gives a value's version (a row's version column,
	// its update time in nanoseconds, a sequence number): a write of a key
	// never replaces a value held for it of a higher version. A write is
	// a [Loader.Set], or the fill of any load (a miss, a background or
	// early refresh, [Loader.Refresh], a reload, a revalidating Get,
	// GetMany). An outdated write is dropped and counted in
	// Stats.WritesOutdated (an outdated Set is not passed to the Remote);
	// the callers of an outdated load still get its value, while the
	// cache keeps the newer value with its freshness. An equal version
	// wins, as every write does without Version. So two writers that each
	// Set the row their database write returned leave the newer row
	// cached, in whichever order their Sets come, and a load from a
	// lagging replica never puts an older row back. Not versioned, and so
	// never refused: a not-found, [Loader.Invalidate] and
	// [Loader.InvalidateAll] drop the value held whatever its version, and
	// so does a value not to be cached (a negative Freshness TTL, too big
	// for the cache). A value held past every window, served by no Get,
	// stops nothing, as if evicted. Version is called once per value
	// written, on the goroutine that writes it, outside every lock and
	// through the guard: if it panics, the value (of unknown version) is
	// not cached and the value held is dropped, as when Freshness panics,
	// and the panic counts in Stats.Panics; a load's callers still get
	// its value. nil (the default) means no versions: the last write wins.
	Version func(v V) uint64

	// Tags, if set, names the tags of a value as it is stored (a load's
	// fill, [Loader.Set]; [Loader.Restore] takes an [Entry]'s own), at
	// most [MaxTags]: [Loader.InvalidateTag] drops every value that
	// carries a tag, in constant time. A cached not-found carries the
	// tags Tags gives for the zero V. It is called once per value stored,
	// on the goroutine that stores it, outside every lock and through the
	// guard: a value whose Tags panics or gives more than MaxTags
	// ([ErrTooManyTags]) is not cached and the value held is dropped, as
	// when Freshness panics (counted in Stats.TagErrors); a load's
	// callers still get it. nil (the default) costs nothing (docs/design.md
	// rules 36 to 38).
	Tags func(key K, v V) []string

	// Reload, if set, is used instead of the LoadFunc for every load of a
	// key the Loader holds a value for (fresh, stale, or within
	// StaleIfError): a background or early refresh, [Loader.Refresh], a
	// revalidating Get ([WithRevalidate]), a Get past the stale window. It
	// receives that value, so it can ask the downstream whether it changed
	// (If-None-Match) and return [ErrNotModified] if not. nil means the
	// LoadFunc always.
	Reload ReloadFunc[K, V]

	// LoadMany, if set, is how [Loader.GetMany] loads the keys it misses
	// that no load is in flight for: together, in calls of at most MaxBatch
	// keys (⌈misses / MaxBatch⌉ calls, each key in exactly one), and the
	// background refreshes of the stale keys one GetMany finds likewise.
	// Every key of a call is a load of its own for everyone else: a Get of
	// one of them joins the call, a Set or Invalidate of one detaches it.
	// A key with a value held is reloaded through Reload when Reload is set,
	// alone. nil means GetMany loads each missing key through the LoadFunc,
	// all at once. With LoadMany set, [New] needs no LoadFunc: a key loaded
	// alone is then a LoadMany call for that one key (BatchWindow gathers
	// such keys into one call). With a Remote, the
	// batch goes through it if it implements [RemoteMany]; otherwise
	// GetMany loads key by key through Remote.Load.
	LoadMany LoadManyFunc[K, V]

	// MaxBatch bounds the keys of one LoadMany call. 0 means
	// DefaultMaxBatch (100).
	MaxBatch int

	// BatchWindow, with LoadMany set, gathers the loads of single keys into
	// LoadMany calls: a Get's or GetInfo's miss, a revalidating Get
	// ([WithRevalidate]), [Loader.Refresh], a background or early refresh
	// each wait up to BatchWindow (or until MaxBatch keys wait) in an open
	// window, and go out together in one LoadMany call under
	// [Loader.GetMany]'s rules: coalescing stays per key (a Get of a key
	// already waiting joins it), and the retries, the breaker, one
	// [Options.Limit] slot, [Options.LoadTimeout] (counted from when the
	// call goes out) and one [LoadEvent] (its Keys) are per call. Misses
	// and background refreshes wait in windows of their own: a window of
	// refreshes takes one MaxRefreshes permit, as a GetMany's refreshes do.
	// A window holds no Limit slot while it waits, so it never holds up a
	// miss: its call takes one as it goes out (a window of refreshes only
	// if a background slot is free, else it is dropped, as a refresh
	// refused at its start is, unless a Get already waits on one of its
	// keys).
	// Under [CancelAtZero] a key whose callers all left before its window
	// went out is dropped from the call, and a window left empty makes no
	// call; under [FinishAndFill] the key stays.
	//
	// A window's call that fails as a whole is split in halves, each tried
	// again once, down to single keys, so that a key that fails every call
	// it is in (a malformed id the database rejects the whole query for)
	// fails only its own callers: with one such key among n, at most
	// 2·⌈log2 n⌉+1 calls (the whole call's retries aside). The tries run one after another under the call's
	// context (its LoadTimeout from when it went out), Limit slot and
	// breaker, both halves of a part before either is split again; a try
	// the breaker refuses is not split (a downstream that is down opens the
	// breaker after ConsecutiveFailures calls, and it answers the rest),
	// and under CancelAtZero a part whose callers all left is not tried.
	// Without a breaker a failing window of n keys makes up to 2n−1 calls.
	// A GetMany's own batch is split the same way once another caller has
	// joined one of its keys; until then its keys are its caller's choice,
	// and the call's error is each key's.
	//
	// What does not wait: a key the Loader holds a value for, loaded
	// through Reload (it takes the old value, so it goes alone), GetMany's
	// own batches (they go out at once), a key not equal to itself (see
	// [Options.Hash]), and every load when a Remote is set that is not a
	// [RemoteMany].
	//
	// With a BatchWindow the LoadFunc given to [New] is never called: every
	// load is a LoadMany call (or a Reload), but for a key not equal to
	// itself and the loads through a Remote that is not a RemoteMany. Give
	// New a nil LoadFunc rather than one that is never used.
	//
	// NOTE: the window is latency: a miss waits up to BatchWindow before its
	// call even starts (part of its [Info.Waited]; not of
	// [LoadEvent.Duration], which is the downstream call's). At Close an
	// open window goes out at once, and its keys get what any load in
	// flight at Close gets. 0 (the default) means no waiting: a key loaded
	// alone is its own call. It needs LoadMany; New rejects a negative value.
	BatchWindow time.Duration

	// MaxPendingWrites bounds the writes waiting for the cache to apply
	// them, and so the memory they hold (one value each), whatever storm of
	// writes comes in: the fills of loads may hold up to MaxPendingWrites,
	// and Set, Invalidate and a Remote's drops another MaxPendingWrites.
	// When the fills' share is taken, a load still answers its callers but
	// its value is not cached (Stats.FillsDropped), as ristretto's
	// admission may refuse one; when the writes' share is taken, Set and
	// Invalidate wait their turn, first come first served, for the cache to
	// catch up (Stats.WriteWaits), never for a load. 0 means
	// DefaultMaxPendingWrites (4096).
	MaxPendingWrites int

	// NotFoundTTL, if > 0, caches a not-found for this long (jittered like
	// TTL): a load error matching [ErrNotFound], or one [Options.IsNotFound]
	// says is a not-found (sql.ErrNoRows, say). Gets in that time return the
	// same error as a hit: the one the load's callers got, which matches
	// ErrNotFound (see there), kept as it is so a hit costs nothing more.
	// Any other error is never cached, however it reads: a LoadFunc that
	// returns its own not-found error without IsNotFound gets it retried,
	// counted against the breaker and loaded again by every Get. 0 =
	// not-found errors are not cached. Either way a not-found drops the
	// value held for the key: a revalidating Get, a Refresh, a Reload or a
	// background refresh that finds the key gone leaves no old value
	// behind to be served or to cover a failure.
	NotFoundTTL time.Duration

	// IsNotFound, if set, reports whether a load error means that the key
	// does not exist downstream, besides the errors matching [ErrNotFound],
	// which always do: for a LoadFunc that returns its own not-found
	// error (sql.ErrNoRows, a 404 mapped to ErrProductNotFound). Wrapping
	// it does the same without IsNotFound:
	//
	//	return p, fmt.Errorf("%w: %w", flightcache.ErrNotFound, err)
	//
	// An error matching [ErrInvalidKey] is never a not-found, whatever it
	// wraps, and IsNotFound is not asked about it.
	//
	// A not-found is the downstream's answer, not a failure: it is never
	// retried, counts as a success for the breaker, is never covered by a
	// stale value (StaleIfError), drops the value held, is cached for
	// NotFoundTTL, is absent from GetMany's map rather than failed in its
	// [ManyError], and a
	// Remote shares it as such ([Options.NotFound]). It is judged once per
	// load (and per attempt, for retries and the breaker), on the load's
	// goroutine, through the guard: a panic counts in Stats.Panics and
	// means "not a not-found". A panic of the LoadFunc and [ErrGoexit] are
	// never a not-found. nil means the errors matching ErrNotFound only.
	//
	// Its callers receive such an error wrapped, made once per load, so
	// that it matches both ErrNotFound and the error itself (errors.Is,
	// errors.As), its text ErrNotFound's followed by its own. A not-found
	// the Loader makes itself, a key missing from the map of LoadMany or a
	// Remote's shared not-found, matches ErrNotFound alone: to tell a
	// Get's not-found from a failure, match ErrNotFound, which every
	// not-found a caller receives does.
	IsNotFound func(error) bool

	// ValidateKey, if set, is asked about a key before anything else is
	// done with it: a key it returns an error for is the caller's fault,
	// and fails at once, with no load, no cache lookup and no Remote, for
	// that caller only. Its error matches [ErrInvalidKey] and ValidateKey's
	// own, its text "flightcache: invalid key (Options.ValidateKey): "
	// followed by ValidateKey's (the key itself is not formatted: it may be
	// long or not fit for a log). It is asked by Get and GetInfo, for each
	// distinct key of GetMany and GetManyInfo (a rejected key fails alone,
	// in the [ManyError], and the others are answered), by Refresh (which
	// then does nothing), by Set (which then stores nothing and tells the
	// Remote nothing: no Get could ever read it) and by Restore (which skips
	// the entry). Invalidate and Peek do not ask: dropping a key, or
	// looking without loading, is harmless for any key. A rejected key is
	// not counted in Stats.Gets, nor as a load, and the Observer sees
	// nothing of it; Stats.InvalidKeys counts it. It runs on the caller's
	// goroutine, on every Get (hits too: keep it cheap), through the guard:
	// a panic is counted in Stats.Panics and rejects the key, with the
	// [*PanicError] as ValidateKey's error. A key that the LoadFunc finds
	// invalid on its own reports it by wrapping ErrInvalidKey (see there).
	// nil means every key is valid.
	ValidateKey func(K) error

	// Remote, if set, is a second tier shared between processes (see
	// [remote.Remote]): a local miss asks it before the downstream, so a
	// fleet makes one downstream call per key instead of one per process.
	// Set and Invalidate are passed on to it. A Remote that implements
	// [remote.Attacher] is handed the Loader's [remote.Rules] by New, so it
	// needs no copy of these Options. nil = local only.
	Remote remote.Remote[K, V]

	// Hash, if set, replaces the default hash of keys (hash/maphash's
	// Comparable with a per-Loader seed). Keys are always compared exactly,
	// so two keys with the same hash never see each other's values; they
	// only share one cache slot: a write of one replaces the other, and
	// while one's write is still being applied by ristretto a write of the
	// other may be refused (Stats.SetsRejected) and simply not cached. It
	// runs on the caller's goroutine. A panic in Hash is recovered: Get
	// returns it as a *PanicError, Set and Invalidate of the key do nothing.
	//
	// NOTE: keys are compared exactly, as Go compares them: "P1", "p1 " and
	// "p1" are three keys, loaded and cached apart, though a database whose
	// collation ignores case and trailing spaces finds one row for all
	// three; and an Invalidate of one leaves the others serving the row as
	// it was. Normalise a key as the database compares it (for example
	// strings.ToLower(strings.TrimSpace(id))) before Get, Set and
	// Invalidate, so that one row is one key.
	//
	// NOTE: like map keys, keys must be comparable at run time: with an
	// interface K, a key holding a slice, map or func cannot be hashed, and
	// Get returns a *PanicError for it where a map would panic. A key not
	// equal to itself (one holding a float NaN) is never cached: every Get
	// of it loads it, for that caller alone (in GetMany, through the
	// LoadFunc), and Set and Refresh of it do nothing.
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

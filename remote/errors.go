package remote

import "errors"

// The errors a Loader and its tier both match (with errors.Is). Each is
// also a flightcache name of the same value (flightcache.ErrNotFound is
// ErrNotFound), whose doc there says what the Loader does with it.
var (
	// ErrClosed is the error of a Get after the Loader's Close, and of
	// callers whose load Close stopped.
	ErrClosed = errors.New("flightcache: loader closed")
	// ErrNotFound is the error of a key that does not exist downstream. A
	// tier returns it (wrapped or not) for a not-found it shares, and every
	// not-found a caller receives matches it.
	ErrNotFound = errors.New("flightcache: not found")
	// ErrNotModified is what a Reload returns when the value it was given
	// is still current: the value is kept, its freshness renewed.
	ErrNotModified = errors.New("flightcache: not modified")
	// ErrBreakerOpen matches the error of a call the circuit breaker
	// refused: it says nothing about the key.
	ErrBreakerOpen = errors.New("flightcache: circuit breaker open")
	// ErrLimited is the error of a load that found no free downstream slot
	// and could not wait for one: it says nothing about the key.
	ErrLimited = errors.New("flightcache: downstream load limit reached")
	// ErrLoadTimeout matches the error of a load that ran past the
	// Options' LoadTimeout, retries included.
	ErrLoadTimeout = errors.New("flightcache: load timed out")
	// ErrInvalidKey matches the error of a key that is the caller's fault,
	// not the downstream's: never retried, cached or covered by a stale
	// value.
	ErrInvalidKey = errors.New("flightcache: invalid key")
)

// StaleMayCover reports whether a stale value may be served in place of
// the error err of a failed load, within its StaleIfError window: for any
// error but a not-found (the key is gone, not the downstream: notFound is
// err judged by the Loader's rule, Options.NotFound, which the caller has
// already applied), an error matching [ErrInvalidKey] (the caller's key,
// not the downstream, is at fault) and [ErrClosed] (the Loader is shutting
// down). A nil err has nothing to cover. It is the rule the Loader
// applies, for a [Remote] to decide what to offer with an error as the
// Loader would serve it.
func StaleMayCover(err error, notFound bool) bool {
	return err != nil && !notFound && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrInvalidKey)
}

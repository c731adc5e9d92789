// Package timing is the pure time arithmetic of flightcache: the lifetime
// of a cached value (its jittered freshness, its early refresh, the delay
// before another background refresh of a failing key) and the saturating
// sums and products of durations and times the Loader and its shared tier
// make.
//
// Nothing here reads a clock or draws a random number: callers pass the
// current time (as a Duration offset from an epoch of their own, or as a
// time.Time) and uniform random numbers in, so every function can be
// tested and fuzzed exhaustively.
//
// Every sum and product saturates at the largest (or smallest) value its
// type holds instead of overflowing: a TTL, a window or a retry interval of
// math.MaxInt64 is a natural "never", and must not wrap into the past, nor
// into a loop that never ends.
package timing

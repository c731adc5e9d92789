package remote

import (
	"context"
	"time"
)

// maxStaleKey is the context key of WithMaxStale.
type maxStaleKey struct{}

// WithMaxStale returns a context that makes a Get accept a stale value only
// if it went stale at most d ago, like HTTP's Cache-Control max-stale.
// WithMaxStale(ctx, 0) demands a fresh value, like no-cache: the Get waits
// for a load (which still coalesces with other callers). A negative d is 0.
// flightcache.WithMaxStale is the same function.
func WithMaxStale(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxStaleKey{}, max(d, 0))
}

// MaxStale returns the bound [WithMaxStale] put on ctx, if any. A load's
// context keeps the values of the Get that started it, so a [Remote] can
// honour the caller's bound too.
func MaxStale(ctx context.Context) (d time.Duration, ok bool) {
	d, ok = ctx.Value(maxStaleKey{}).(time.Duration)
	return d, ok
}

// AcceptsStale reports whether a Get made under ctx accepts a value that
// went stale d ago, by the bound [WithMaxStale] put on ctx (no bound: any
// stale value the windows allow; a bound of 0: none). A [Remote] uses it
// to judge a shared value by the caller's bound, as the Loader does.
func AcceptsStale(ctx context.Context, d time.Duration) bool {
	max, bounded := MaxStale(ctx)
	return !bounded || (max > 0 && d <= max)
}

// reloadValueKey is the context key of WithReloadValue.
type reloadValueKey struct{}

// reloadValue boxes the value WithReloadValue carries.
type reloadValue[V any] struct{ v V }

// WithReloadValue returns a context that, passed by a [Remote] to the load
// function it was given, makes that load an Options.Reload of v: the
// value the shared tier holds for the key, which may be newer than the
// Loader's own (or the Loader may hold none). An [ErrNotModified] then
// keeps v. Without Options.Reload it changes nothing.
func WithReloadValue[V any](ctx context.Context, v V) context.Context {
	return context.WithValue(ctx, reloadValueKey{}, &reloadValue[V]{v: v})
}

// ReloadValue returns the value [WithReloadValue] put on ctx, if it put
// one of type V: what the Loader hands its Reload.
func ReloadValue[V any](ctx context.Context) (v V, ok bool) {
	r, ok := ctx.Value(reloadValueKey{}).(*reloadValue[V])
	if !ok {
		return v, false
	}
	return r.v, true
}

// Package flightcache is a cache-aside loader for an expensive downstream
// call. When a hot key expires and hundreds of requests miss at once, one
// load serves them all, so the downstream sees one call instead of hundreds.
//
// # Layers
//
// A [Loader] answers [Loader.Get] through these layers, outside in:
//
//   - a ristretto cache with jittered expiry and stale serving
//     ([Options.StaleWhileRevalidate], [Options.StaleIfError],
//     [Options.EarlyRefresh]);
//   - a single-flight registry: one load per key serves every concurrent
//     caller, and [Options.Policy] decides what happens when they all leave;
//   - retries with jittered backoff ([Options.Retry]);
//   - a circuit breaker ([Options.Breaker]);
//   - the [LoadFunc], under [Options.LoadTimeout].
//
// # Observability
//
// [Loader.GetInfo] says where one value came from ([Info]); [Options.OnLoad]
// reports every load, with how many callers its result reached
// ([LoadEvent.Callers]: the blast radius of a failure); [Loader.Stats] gives
// cumulative counters. [Options.Observer] sees every load from its start to
// its end and every Get that waited on one, never a hit, and puts what it
// likes in the load's context ([Observer]): the otelflightcache module's
// makes OpenTelemetry metrics and traces in which every waiting Get is
// linked to its load.
//
// # Errors and shutdown
//
// A panic in any user code (the LoadFunc, Cost, OnLoad, Hash, a Remote...)
// is recovered and reaches callers as a [*PanicError]; a runtime.Goexit in
// a LoadFunc reaches them as [ErrGoexit]. [Loader.Close] stops the Loader
// and waits for every goroutine it started; [Loader.Shutdown] waits at
// most until its context ends.
//
// # Freshness from the data
//
// [Options.Freshness] gives each value its own lifetime ([Freshness]: a
// token's expiry, a response's max-age and stale windows). [Options.Reload]
// reloads a key given the value held, and may answer [ErrNotModified] to
// keep it, as an HTTP 304 does. [Loader.Refresh] reloads a key in the
// background while its current value serves.
//
// # Batches
//
// [Loader.GetMany] answers many keys at once, each as Get would, and loads
// the misses together through [Options.LoadMany], at most
// [Options.MaxBatch] keys per downstream call. Coalescing stays per key,
// across single and batch Gets; the keys that failed come back in a
// [*ManyError]. [Loader.Peek] returns a value the Loader holds without
// loading anything.
//
// # Per-call freshness
//
// [WithMaxStale] bounds how stale a value one Get accepts, like HTTP's
// Cache-Control max-stale; WithMaxStale(ctx, 0) refuses any stale value.
// [WithRevalidate] makes a Get skip the cache altogether, like no-cache,
// while still sharing the key's load.
//
// # Beyond one process
//
// [Options.Remote] adds a tier shared by processes (the flightredis module
// implements one on Redis), and [Breaker.Custom] a breaker whose state they
// share, so a fleet makes one downstream call per key, not one per process.
// [New] hands a [RemoteAttacher] the Loader's [Rules]; with them and
// [AcceptsStale] a Remote judges a shared value's age by the Loader's own
// rules, and draws its freshness as the Loader draws each entry's
// ([Windows.Draw]). A Remote that is a [RemoteWatcher] keeps the
// local copies in step with the fleet: another process's Set or Invalidate
// drops this process's copy, and when the Remote may have missed such
// writes it has every copy read again before it is served.
package flightcache

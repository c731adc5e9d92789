package flightcache

import (
	"context"
	"time"
)

// Windows is how a Loader judges a value's age, in a form a [Remote] can
// use to judge a value it shares with other processes exactly as the
// Loader will: the same freshness, the same stale windows, the same load
// timeout. Get it from [Options.Windows].
type Windows struct {
	// Fresh is the shortest time any value stays fresh: TTL·(1−Jitter),
	// never 0. Each cached value draws its own freshness from [Fresh, TTL];
	// a value judged by Fresh is never served fresh past any process's
	// draw.
	Fresh time.Duration
	// StaleWhileRevalidate and StaleIfError are the Options' windows.
	StaleWhileRevalidate time.Duration
	StaleIfError         time.Duration
	// EarlyRefresh is true when fresh values are refreshed before they
	// expire ([Options.EarlyRefresh] > 0).
	EarlyRefresh bool
	// LoadTimeout bounds one load, its default applied.
	LoadTimeout time.Duration
}

// Windows validates o as [New] does (the error names the bad field) and
// returns the windows a Loader made with o applies.
func (o Options[K, V]) Windows() (Windows, error) {
	if err := o.validate(); err != nil {
		return Windows{}, err
	}
	o.Freshness = nil
	w, _ := o.WindowsOf(*new(K), *new(V))
	return w, nil
}

// WindowsOf returns the windows of one value v of key: o's windows (as
// [Options.Windows] gives them, without validating o again) with what
// [Options.Freshness], if set, says of v; cache is false for a value not to
// be cached (a negative TTL). A Remote uses it to store each shared value
// with its own lifetime, so every process applies the same one. Freshness
// is called on the caller's goroutine.
func (o Options[K, V]) WindowsOf(key K, v V) (w Windows, cache bool) {
	o = o.withDefaults()
	w = Windows{
		Fresh:                jitter(o.TTL, o.Jitter, 1),
		StaleWhileRevalidate: o.StaleWhileRevalidate,
		StaleIfError:         o.StaleIfError,
		EarlyRefresh:         o.EarlyRefresh > 0,
		LoadTimeout:          o.LoadTimeout,
	}
	if o.Freshness == nil {
		return w, true
	}
	f := o.Freshness(key, v)
	if f.TTL < 0 {
		return w, false
	}
	if f.TTL > 0 {
		w.Fresh = jitter(f.TTL, o.Jitter, 1)
	}
	w.StaleWhileRevalidate = pick(f.StaleWhileRevalidate, w.StaleWhileRevalidate)
	w.StaleIfError = pick(f.StaleIfError, w.StaleIfError)
	return w, true
}

// AcceptsStale reports whether a Get made under ctx accepts a value that
// went stale d ago, by the bound [WithMaxStale] put on ctx (no bound: any
// stale value the windows allow; a bound of 0: none). A [Remote] uses it
// to judge a shared value by the caller's bound, as the Loader does.
func AcceptsStale(ctx context.Context, d time.Duration) bool {
	max, ok := MaxStale(ctx)
	return withinMaxStale(max, ok, d)
}

// withinMaxStale is AcceptsStale's rule, for a max-stale read beforehand
// (MaxStale): no bound accepts any staleness, a bound of 0 none.
func withinMaxStale(max time.Duration, bounded bool, d time.Duration) bool {
	return !bounded || (max > 0 && d <= max)
}

package flightcache

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// newRecovering is New with a panic turned into an error, so that a test
// of options reports a panic as a failure instead of crashing.
func newRecovering(opts Options[string, string]) (l *Loader[string, string], err error) {
	defer func() {
		if p := recover(); p != nil {
			l, err = nil, fmt.Errorf("New panicked: %v", p)
		}
	}()
	return New(func(_ context.Context, k string) (string, error) { return "v-" + k, nil }, opts)
}

// A MaxCost up to math.MaxInt64 ("no bound") works without NumCounters:
// the default, 10 × MaxCost, saturates at a ceiling instead of
// overflowing, and a Get and a Set work as with any MaxCost.
func TestHugeMaxCostNeedsNoNumCounters(t *testing.T) {
	costs := []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 10, math.MaxInt64/10 + 1, 1 << 40}
	for _, costed := range []bool{false, true} {
		for _, mc := range costs {
			opts := Options[string, string]{TTL: time.Minute, MaxCost: mc}
			if costed {
				opts.Cost = func(v string) int64 { return int64(len(v)) }
			}
			l, err := newRecovering(opts)
			if err != nil {
				t.Errorf("New(MaxCost %d, Cost set %v) = %v; want a Loader", mc, costed, err)
				continue
			}
			if n := l.opts.NumCounters; n <= 0 || n > defaultMaxNumCounters {
				t.Errorf("MaxCost %d: NumCounters = %d; want in (0, %d]", mc, n, defaultMaxNumCounters)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if v, err := l.Get(ctx, "k"); v != "v-k" || err != nil {
				t.Errorf("MaxCost %d: Get(%q) = %q, %v; want %q, nil", mc, "k", v, err, "v-k")
			}
			l.Set("s", "set")
			if v, err := l.Get(ctx, "s"); v != "set" || err != nil {
				t.Errorf("MaxCost %d: Get(%q) after Set = %q, %v; want %q, nil", mc, "s", v, err, "set")
			}
			cancel()
			l.Close()
		}
	}
}

// The default NumCounters is 10 × MaxCost up to its ceiling; a NumCounters
// the user sets is kept, and one past what can be allocated is refused
// with an error naming NumCounters, never a panic.
func TestNumCountersDefaultAndCeiling(t *testing.T) {
	for _, tt := range []struct {
		maxCost, numCounters, want int64
	}{
		{0, 0, 10 * DefaultMaxCost},
		{1000, 0, 10_000},
		{defaultMaxNumCounters / 10, 0, defaultMaxNumCounters / 10 * 10},
		{defaultMaxNumCounters, 0, defaultMaxNumCounters},
		{math.MaxInt64, 0, defaultMaxNumCounters},
		{math.MaxInt64, 5000, 5000},
		{1000, defaultMaxNumCounters * 2, defaultMaxNumCounters * 2}, // set by the user: kept, not allocated here
	} {
		o := Options[string, string]{TTL: time.Minute, MaxCost: tt.maxCost, NumCounters: tt.numCounters}.withDefaults()
		if o.NumCounters != tt.want {
			t.Errorf("MaxCost %d, NumCounters %d: NumCounters = %d; want %d", tt.maxCost, tt.numCounters, o.NumCounters, tt.want)
		}
	}
	for _, n := range []int64{maxNumCounters + 1, math.MaxInt64 / 10, math.MaxInt64} {
		l, err := newRecovering(Options[string, string]{TTL: time.Minute, NumCounters: n})
		if err == nil {
			l.Close()
			t.Errorf("New(NumCounters %d) = nil error; want one naming NumCounters", n)
			continue
		}
		if !strings.Contains(err.Error(), "Options.NumCounters ") {
			t.Errorf("New(NumCounters %d) error = %q; want one naming Options.NumCounters", n, err)
		}
	}
}

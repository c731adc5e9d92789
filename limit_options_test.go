package flightcache

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/flightcache/flightcache/internal/limit"
)

// New rejects a bad Limit with an error that names the field.
func TestLimitOptionsRejected(t *testing.T) {
	load := func(context.Context, string) (int, error) { return 0, nil }
	tests := []struct {
		name  string
		limit Limit
		field string
	}{
		{"negative MaxLoads", Limit{MaxLoads: -1}, "Limit.MaxLoads"},
		{"negative MinLoads", Limit{Adaptive: true, MinLoads: -1}, "Limit.MinLoads"},
		{"negative MaxQueue", Limit{MaxLoads: 5, MaxQueue: -1}, "Limit.MaxQueue"},
		{"negative MaxWait", Limit{MaxLoads: 5, MaxWait: -time.Second}, "Limit.MaxWait"},
		{"MinLoads above MaxLoads", Limit{Adaptive: true, MinLoads: 11, MaxLoads: 10}, "Limit.MinLoads"},
		{"MinLoads above the default ceiling", Limit{Adaptive: true, MinLoads: DefaultAdaptiveMaxLoads + 1}, "Limit.MinLoads"},
		{"MinLoads without Adaptive", Limit{MaxLoads: 10, MinLoads: 2}, "Limit.MinLoads"},
		{"MaxQueue bounding nothing", Limit{MaxQueue: 10}, "Limit.MaxQueue"},
		{"MaxWait bounding nothing", Limit{MaxWait: time.Second}, "Limit.MaxWait"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(load, Options[string, int]{TTL: time.Second, Limit: tt.limit})
			if err == nil {
				l.Close()
				t.Fatalf("New with Limit %+v = nil error; want one naming %s", tt.limit, tt.field)
			}
			if want := "flightcache: Options." + tt.field + " "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("New with Limit %+v: error %q; want it to start %q", tt.limit, err, want)
			}
		})
	}
}

// The defaults of a Limit, as New applies them: MaxQueue's is no bound
// (math.MaxInt), MaxWait's the Loader's LoadTimeout.
func TestLimitOptionsDefaults(t *testing.T) {
	load := func(context.Context, string) (int, error) { return 0, nil }
	tests := []struct {
		name        string
		limit       Limit
		loadTimeout time.Duration
		want        Limit
	}{
		{"zero: no limit", Limit{}, 0, Limit{}},
		{"fixed", Limit{MaxLoads: 50}, 0,
			Limit{MaxLoads: 50, MaxQueue: math.MaxInt, MaxWait: DefaultLoadTimeout}},
		{"fixed, MaxWait from LoadTimeout", Limit{MaxLoads: 50, MaxQueue: 7}, 3 * time.Second,
			Limit{MaxLoads: 50, MaxQueue: 7, MaxWait: 3 * time.Second}},
		{"adaptive", Limit{Adaptive: true}, 0,
			Limit{Adaptive: true, MaxLoads: DefaultAdaptiveMaxLoads, MinLoads: 1, MaxQueue: math.MaxInt, MaxWait: DefaultLoadTimeout}},
		{"adaptive, own ceiling and wait", Limit{Adaptive: true, MaxLoads: 30, MinLoads: 5, MaxWait: time.Second}, 0,
			Limit{Adaptive: true, MaxLoads: 30, MinLoads: 5, MaxQueue: math.MaxInt, MaxWait: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(load, Options[string, int]{TTL: time.Second, LoadTimeout: tt.loadTimeout, Limit: tt.limit})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if got := l.opts.Limit; got != tt.want {
				t.Errorf("Limit %+v with defaults = %+v; want %+v", tt.limit, got, tt.want)
			}
		})
	}
	// MaxQueue's default is no bound, whatever MaxLoads is.
	if got := (Limit{MaxLoads: math.MaxInt}).withDefaults(time.Second).MaxQueue; got != math.MaxInt {
		t.Errorf("default MaxQueue for MaxLoads %d = %d; want %d", math.MaxInt, got, math.MaxInt)
	}
}

// A Limit that bounds nothing gives no limiter (nil: no limit), and
// another the bound it asks for; a LoadTimeout of 0 leaves the wait
// unbounded but for the load's context.
func TestNewLimiter(t *testing.T) {
	now := func() time.Duration { return 0 }
	if lm := limit.New(Limit{}.config(time.Second), now); lm != nil {
		t.Errorf("limit.New(zero Limit) = %+v; want nil", lm)
	}
	for _, tt := range []struct {
		limit   Limit
		bound   int
		maxWait time.Duration
	}{
		{Limit{MaxLoads: 50}, 50, time.Second},
		{Limit{Adaptive: true}, limit.AdaptiveStart, time.Second},
		{Limit{Adaptive: true, MaxLoads: 8}, 8, time.Second},
		{Limit{Adaptive: true, MinLoads: 30, MaxLoads: 40}, 30, time.Second},
	} {
		c := tt.limit.config(time.Second)
		var s Stats
		s.fillLimit(limit.New(c, now).Counts())
		if s.LoadLimit != int64(tt.bound) || c.MaxWait != tt.maxWait {
			t.Errorf("limit.New(%+v): bound %d, MaxWait %v; want %d, %v", tt.limit, s.LoadLimit, c.MaxWait, tt.bound, tt.maxWait)
		}
	}
	if c := (Limit{MaxLoads: 1}).config(0); c.MaxWait != 0 {
		t.Errorf("Limit without a LoadTimeout: MaxWait %v; want 0 (no bound)", c.MaxWait)
	}
}

func TestLimitNames(t *testing.T) {
	if got := SourceStaleLimited.String(); got != "stale-limited" {
		t.Errorf("SourceStaleLimited.String() = %q; want %q", got, "stale-limited")
	}
	if SourceStaleLimited <= SourceShared {
		t.Errorf("SourceStaleLimited = %d; want it after SourceShared (%d): the Source values before it keep theirs", SourceStaleLimited, SourceShared)
	}
	if got, want := ErrLimited.Error(), "flightcache: downstream load limit reached"; got != want {
		t.Errorf("ErrLimited = %q; want %q", got, want)
	}
	if errors.Is(ErrLimited, ErrBreakerOpen) || errors.Is(ErrBreakerOpen, ErrLimited) {
		t.Error("ErrLimited and ErrBreakerOpen match each other; they are distinct states")
	}
}

// The largest values a Limit's fields take are accepted and saturate: the
// bound is never negative, and a Loader with them answers its Gets, at once
// and together, without ErrLimited.
func TestLimitOptionsHugeValues(t *testing.T) {
	tests := []struct {
		name  string
		limit Limit
		bound int64 // Stats.LoadLimit
	}{
		{"MaxLoads", Limit{MaxLoads: math.MaxInt}, math.MaxInt},
		{"MaxLoads and MaxQueue", Limit{MaxLoads: math.MaxInt, MaxQueue: math.MaxInt}, math.MaxInt},
		{"MaxQueue", Limit{MaxLoads: 1, MaxQueue: math.MaxInt}, 1},
		{"adaptive MaxLoads", Limit{Adaptive: true, MaxLoads: math.MaxInt}, limit.AdaptiveStart},
		{"adaptive MaxQueue", Limit{Adaptive: true, MaxQueue: math.MaxInt}, limit.AdaptiveStart},
		{"adaptive MinLoads and MaxLoads", Limit{Adaptive: true, MinLoads: math.MaxInt, MaxLoads: math.MaxInt}, math.MaxInt},
		{"adaptive, all three", Limit{Adaptive: true, MinLoads: math.MaxInt, MaxLoads: math.MaxInt, MaxQueue: math.MaxInt}, math.MaxInt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &downstream{delay: time.Millisecond}
				l := newLoader(t, d, Options[string, string]{Limit: tt.limit})
				if s := l.Stats(); s.LoadLimit != tt.bound {
					t.Errorf("Limit %+v: Stats.LoadLimit %d; want %d", tt.limit, s.LoadLimit, tt.bound)
				}
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				var wg sync.WaitGroup
				for i := range 50 {
					wg.Go(func() {
						key := strconv.Itoa(i)
						if v, err := l.Get(ctx, key); err != nil {
							t.Errorf("Limit %+v: Get(%q) = %q, %v; want a value", tt.limit, key, v, err)
						}
					})
				}
				wg.Wait()
				if s := l.Stats(); s.LoadLimit < 1 || s.Limited != 0 {
					t.Errorf("Limit %+v after 50 loads: LoadLimit %d, Limited %d; want a bound of 1 or more, nothing limited", tt.limit, s.LoadLimit, s.Limited)
				}
			})
		})
	}
}

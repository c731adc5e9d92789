package flightcache

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Stats marshals the breaker's state by name, and reads it back.
func TestStatsJSONBreakerByName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &downstream{fail: func(int64, string) error { return errBoom }}
		l := newLoader(t, d, Options[string, string]{Breaker: Breaker{ConsecutiveFailures: 1, OpenTimeout: time.Hour}})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if _, err := l.Get(ctx, "k"); !errors.Is(err, errBoom) {
			t.Fatalf("Get(%q) = %v; want errBoom", "k", err)
		}
		s := l.Stats()
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("json.Marshal(Stats) = %v", err)
		}
		if !strings.Contains(string(b), `"Breaker":"open"`) {
			t.Errorf("json.Marshal(Stats) = %s; want \"Breaker\":\"open\"", b)
		}
		var back Stats
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("json.Unmarshal(%s) = %+v, %v; want %+v", b, back, err, s)
		}
	})
}

func TestBreakerStateText(t *testing.T) {
	for _, st := range []BreakerState{BreakerClosed, BreakerHalfOpen, BreakerOpen} {
		text, err := st.MarshalText()
		if err != nil || string(text) != st.String() {
			t.Errorf("%v.MarshalText() = %q, %v; want %q", st, text, err, st.String())
		}
		var back BreakerState
		if err := back.UnmarshalText(text); err != nil || back != st {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, st)
		}
	}
	// A map keyed by state marshals its keys by name too.
	b, err := json.Marshal(map[BreakerState]int{BreakerHalfOpen: 1})
	if err != nil || string(b) != `{"half-open":1}` {
		t.Errorf("json.Marshal(map[BreakerState]int) = %s, %v; want {\"half-open\":1}", b, err)
	}
	for _, bad := range []string{"", "Open", "2", "shut"} {
		st := BreakerOpen
		if err := st.UnmarshalText([]byte(bad)); err == nil || !strings.HasPrefix(err.Error(), "flightcache: ") || st != BreakerOpen {
			t.Errorf("UnmarshalText(%q) = %v, %v; want a flightcache error, the state unchanged", bad, st, err)
		}
	}
}

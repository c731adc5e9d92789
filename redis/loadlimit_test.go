package flightredis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// With a flightcache.Limit, a holder may wait Limit.MaxWait for a
// downstream slot before its load's LoadTimeout starts: its lease must
// outlive both, and by default does.
func TestLeaseCoversTheLimitsWait(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	for _, tc := range []struct {
		name  string
		limit flightcache.Limit
		lease time.Duration // Options.LeaseTTL; 0: the default
		want  time.Duration // the lease; 0: refused at Attach
	}{
		{"no limit, default", flightcache.Limit{}, 0, 3 * time.Second},
		{"no limit, past LoadTimeout", flightcache.Limit{}, 2500 * time.Millisecond, 2500 * time.Millisecond},
		{"MaxWait, default", flightcache.Limit{MaxLoads: 5, MaxWait: time.Second}, 0, 4500 * time.Millisecond},
		{"MaxWait's default, default", flightcache.Limit{Adaptive: true}, 0, 6 * time.Second},
		{"MaxWait, past LoadTimeout only", flightcache.Limit{MaxLoads: 5, MaxWait: time.Second}, 2500 * time.Millisecond, 0},
		{"MaxWait, past both", flightcache.Limit{MaxLoads: 5, MaxWait: time.Second}, 3500 * time.Millisecond, 3500 * time.Millisecond},
	} {
		lo := flightcache.Options[string, int]{TTL: time.Second, LoadTimeout: 2 * time.Second, Limit: tc.limit}
		tier, err := attachedTier(t, client, lo, Options[string, int]{LeaseTTL: tc.lease})
		if tc.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "Options.LeaseTTL") || !strings.Contains(err.Error(), "Limit.MaxWait") {
				t.Errorf("%s: NewTier, attached = %v; want an error naming LeaseTTL and Limit.MaxWait", tc.name, err)
			}
			if tier != nil {
				tier.Close()
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: NewTier, attached = %v", tc.name, err)
			continue
		}
		if got := tier.attached().leaseTTL; got != tc.want {
			t.Errorf("%s: LeaseTTL = %v; want %v", tc.name, got, tc.want)
		}
		tier.Close()
	}
}

// A load the Loader's Limit refused (ErrLimited) says nothing about the
// downstream, like one its breaker refused: it is not shared with the
// processes waiting on the lease, which load for themselves.
func TestLimitedLoadIsNotShared(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	tier, err := attachedTier(t, client, flightcache.Options[string, int]{TTL: time.Second}, Options[string, int]{})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	for _, err := range []error{
		flightcache.ErrLimited,
		fmt.Errorf("wrapped: %w", flightcache.ErrLimited),
		flightcache.ErrBreakerOpen,
	} {
		if got := tier.failure(context.Background(), "token", err); got != "" {
			t.Errorf("failure(%v) = %q; want \"\" (not shared)", err, got)
		}
	}
	if got := tier.failure(context.Background(), "token", fmt.Errorf("downstream down")); got == "" {
		t.Error("failure(downstream down) = \"\"; want it shared")
	}
}

// A tier made with NewTier learns the Limit's wait when its Loader
// attaches it, and flightcache.New refuses a lease too short for it.
func TestAttachedLeaseCoversTheLimitsWait(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	load := func(context.Context, string) (int, error) { return 1, nil }
	limit := flightcache.Limit{MaxLoads: 5, MaxWait: time.Second}
	short, err := NewTier(client, Options[string, int]{LeaseTTL: 2500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	_, err = flightcache.New(load, flightcache.Options[string, int]{TTL: time.Second, LoadTimeout: 2 * time.Second, Limit: limit, Remote: short})
	if err == nil || !strings.Contains(err.Error(), "Limit.MaxWait") {
		t.Errorf("flightcache.New with a lease shorter than LoadTimeout + MaxWait = %v; want an error naming Limit.MaxWait", err)
	}
	tier, err := NewTier(client, Options[string, int]{})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	l, err := flightcache.New(load, flightcache.Options[string, int]{TTL: time.Second, LoadTimeout: 2 * time.Second, Limit: limit, Remote: tier})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := tier.attached().leaseTTL; got != 4500*time.Millisecond {
		t.Errorf("attached LeaseTTL = %v; want 4.5s, LoadTimeout + MaxWait and half again", got)
	}
}

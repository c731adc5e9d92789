package flightredis

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

func TestKeysShareOneHashTag(t *testing.T) {
	tag := func(name string) string { // Redis Cluster's rule
		i := strings.IndexByte(name, '{')
		if i < 0 {
			return name
		}
		j := strings.IndexByte(name[i+1:], '}')
		if j <= 0 {
			return name
		}
		return name[i+1 : i+1+j]
	}
	bases := map[string]string{}
	names := map[string]string{}
	for _, k := range []string{"", "%", "}", "{", "a}b", "%7D", "%25", "{x}", "plain", "g1", ":g1"} {
		want := tag(keysFor("p:", k).base)
		if want == keysFor("p:", k).base {
			t.Errorf("keysFor(%q).base = %q has no hash tag", k, keysFor("p:", k).base)
		}
		// Every generation of a key keeps its slot, and no two keys or
		// generations share a name.
		for _, gen := range []int64{0, 1, 12} {
			ks := keysAt("p:", k, gen)
			if gen == 0 && ks != keysFor("p:", k) {
				t.Errorf("keysAt(%q, 0) = %+v; want keysFor's %+v", k, ks, keysFor("p:", k))
			}
			id := fmt.Sprintf("%q in generation %d", k, gen)
			if got := tag(ks.base); got != want {
				t.Errorf("key %s: base %q has tag %q; want %q", id, ks.base, got, want)
			}
			for _, name := range []string{ks.entry, ks.lease, ks.alive, ks.fail} {
				if got := tag(name); got != want {
					t.Errorf("key %s: %q has tag %q; want %q", id, name, got, want)
				}
				if other, dup := names[name]; dup {
					t.Errorf("keys %s and %s share the name %q", id, other, name)
				}
				names[name] = id
			}
			if other, dup := bases[ks.base]; dup {
				t.Errorf("keys %s and %s share the base %q", id, other, ks.base)
			}
			bases[ks.base] = id
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	good := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer good.Close()
	bad := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer bad.Close()
	lo := flightcache.Options[string, int]{TTL: time.Second, LoadTimeout: 2 * time.Second}
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		lo     flightcache.Options[string, int]
		o      Options[string, int]
		want   string
	}{
		{"no context timeouts", bad, lo, Options[string, int]{}, "ContextTimeoutEnabled"},
		{"no TTL", good, flightcache.Options[string, int]{}, Options[string, int]{}, "TTL"},
		{"short lease", good, lo, Options[string, int]{LeaseTTL: 2 * time.Second}, "LeaseTTL"},
		{"brace", good, lo, Options[string, int]{Prefix: "a{"}, "Prefix"},
		{"holder vs timeout", good, lo, Options[string, int]{HolderTimeout: time.Second, Timeout: time.Second}, "HolderTimeout"},
	} {
		_, err := attachedTier(t, tc.client, tc.lo, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) ||
			!strings.HasPrefix(err.Error(), "flightredis: ") && !strings.HasPrefix(err.Error(), "flightcache: ") {
			t.Errorf("%s: NewTier, attached = %v; want an error naming %s", tc.name, err, tc.want)
		}
	}
	tier, err := attachedTier(t, good, lo, Options[string, int]{})
	if err != nil {
		t.Fatal(err)
	}
	defer tier.Close()
	if got, want := tier.attached().leaseTTL, 3*time.Second; got != want {
		t.Errorf("default LeaseTTL = %v; want %v (LoadTimeout + max(LoadTimeout/2, 1s))", got, want)
	}
}

// TestNewRejectsOptionsItCannotHonour: durations that Redis cannot take as
// a PX (under 1ms, which rounds to 0) or that would spin a timer are
// refused by NewTier or Attach with an error naming the field; the largest ones are
// accepted.
func TestNewRejectsOptionsItCannotHonour(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	lo := flightcache.Options[string, int]{TTL: time.Second, LoadTimeout: time.Microsecond}
	for _, tc := range []struct {
		name string
		o    Options[string, int]
		want string
	}{
		{"sub-ms lease", Options[string, int]{LeaseTTL: 500 * time.Microsecond}, "LeaseTTL"},
		{"sub-ms holder timeout", Options[string, int]{HolderTimeout: 500 * time.Microsecond, Timeout: time.Microsecond}, "HolderTimeout"},
		{"sub-ms poll interval", Options[string, int]{PollInterval: 7 * time.Nanosecond}, "PollInterval"},
		{"negative lease", Options[string, int]{LeaseTTL: -time.Second}, "LeaseTTL"},
	} {
		_, err := attachedTier(t, client, lo, tc.o)
		if err == nil || !strings.Contains(err.Error(), "Options."+tc.want) {
			t.Errorf("%s: NewTier, attached = %v; want an error naming Options.%s", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		lo   flightcache.Options[string, int]
		o    Options[string, int]
	}{
		{"largest everything", flightcache.Options[string, int]{TTL: forever, StaleWhileRevalidate: forever, StaleIfError: forever, LoadTimeout: forever, NotFoundTTL: forever},
			Options[string, int]{Timeout: forever - 1, RetryAfter: forever, LeaseTTL: forever, HolderTimeout: forever, PollInterval: forever}},
		{"largest LoadTimeout, default lease", flightcache.Options[string, int]{TTL: time.Second, LoadTimeout: forever}, Options[string, int]{}},
		{"1ms everything", flightcache.Options[string, int]{TTL: time.Millisecond, LoadTimeout: time.Microsecond},
			Options[string, int]{Timeout: time.Microsecond, LeaseTTL: time.Millisecond, HolderTimeout: time.Millisecond, PollInterval: time.Millisecond}},
	} {
		tier, err := attachedTier(t, client, tc.lo, tc.o)
		if err != nil {
			t.Errorf("%s: NewTier, attached = %v; want a tier", tc.name, err)
			continue
		}
		if tier.attached().leaseMS < 1 || tier.link.aliveMS < 1 || tier.link.failMS < 1 {
			t.Errorf("%s: PX arguments lease %d, alive %d, fail %d; want all >= 1", tc.name, tier.attached().leaseMS, tier.link.aliveMS, tier.link.failMS)
		}
		_ = tier.Close()
	}
}

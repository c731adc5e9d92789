package flightredis

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// User code the tier runs after the downstream returned, while it still
// holds the lease: Options.Freshness (through Rules.WindowsOf) and the
// Codec's Marshal. When it panics, the value still reaches the caller, as
// without the tier, nothing is shared, and the lease is released at once,
// so a process waiting on it loads for itself without waiting for
// HolderTimeout.

// panicCodec panics when it encodes.
type panicCodec struct{ JSON[string] }

func (panicCodec) Marshal(string) ([]byte, error) { panic("Marshal panics") }

func panickyFreshness(string, string) flightcache.Freshness { panic("Freshness panics") }

func goexitFreshness(string, string) flightcache.Freshness {
	runtime.Goexit()
	return flightcache.Freshness{}
}

// afterLoadCases are the user code that fails after the load, and what the
// caller of the process that loaded gets.
var afterLoadCases = []struct {
	name   string
	setup  func(lo *flightcache.Options[string, string], to *Options[string, string])
	goexit bool // the caller gets ErrGoexit, not the value
}{
	{"Freshness panics", func(lo *flightcache.Options[string, string], _ *Options[string, string]) {
		lo.Freshness = panickyFreshness
	}, false},
	{"the Codec panics", func(_ *flightcache.Options[string, string], to *Options[string, string]) {
		to.Codec = panicCodec{}
	}, false},
	{"Freshness ends its goroutine", func(lo *flightcache.Options[string, string], _ *Options[string, string]) {
		lo.Freshness = goexitFreshness
	}, true},
}

type result[T any] struct {
	v   T
	err error
}

func TestPanicAfterTheLoadReleasesTheLease(t *testing.T) {
	for _, tc := range afterLoadCases {
		t.Run(tc.name, func(t *testing.T) {
			addr := redisAddr(t)
			c := newClient(t, addr)
			p := testPrefix(t, c)
			d := newDownstream()
			d.gate = make(chan struct{})
			// Waiting for a leaked lease would take HolderTimeout; the
			// LoadTimeout does not cut it shorter.
			lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 2 * time.Minute}
			to := Options[string, string]{HolderTimeout: time.Minute}
			tc.setup(&lo, &to)
			a := newProc(t, addr, p, lo, to, d)
			b := newProc(t, addr, p, lo, to, d)

			ra, rb := make(chan result[string], 1), make(chan result[string], 1)
			go func() { v, err := a.l.Get(ctx, "k"); ra <- result[string]{v, err} }()
			within(t, d.started, 10*time.Second, "downstream call by a")
			go func() { v, err := b.l.Get(ctx, "k"); rb <- result[string]{v, err} }()
			eventually(t, 10*time.Second, "b to wait on a's lease", func() bool { return b.t.Stats().Waits == 1 })
			close(d.gate)

			r := within(t, ra, 10*time.Second, "answer to a.Get")
			switch {
			case tc.goexit && !errors.Is(r.err, flightcache.ErrGoexit):
				t.Errorf("a.Get(k) = %q, %v; want ErrGoexit", r.v, r.err)
			case !tc.goexit && (r.err != nil || r.v != "k-v1"):
				t.Errorf("a.Get(k) = %q, %v; want the value loaded, k-v1", r.v, r.err)
			}
			// b loads for itself once a's lease is released, long before
			// a minute's HolderTimeout.
			r = within(t, rb, 10*time.Second, "answer to b.Get (the lease leaked?)")
			if !tc.goexit && (r.err != nil || r.v != "k-v2") {
				t.Errorf("b.Get(k) = %q, %v; want its own load's k-v2", r.v, r.err)
			}
			ks := keysFor(p, "k")
			if n := c.Exists(ctx, ks.lease, ks.alive, ks.entry).Val(); n != 0 {
				t.Errorf("%d of the lease, alive key and entry exist; want none (nothing shared, lease released)", n)
			}
			if n := d.calls.Load(); n != 2 {
				t.Errorf("downstream calls = %d; want 2 (a's, then b's own)", n)
			}
			if s := b.t.Stats(); s.Leases != 1 || s.Takeovers != 0 || s.RedisErrors != 0 {
				t.Errorf("b stats %+v; want its own lease, no takeover", s)
			}
			if s := a.t.Stats(); !tc.goexit && s.EncodeErrors != 1 {
				t.Errorf("a stats %+v; want 1 encode error", s)
			}
		})
	}
}

func TestGetManyPanicAfterTheLoadReleasesTheLeases(t *testing.T) {
	for _, tc := range afterLoadCases {
		t.Run(tc.name, func(t *testing.T) {
			addr := redisAddr(t)
			c := newClient(t, addr)
			p := testPrefix(t, c)
			d := newBatchDownstream()
			d.gate = make(chan struct{})
			lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 2 * time.Minute}
			to := Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: time.Minute}
			tc.setup(&lo, &to)
			a := newBatchProc(t, addr, nil, p, lo, to, d)
			b := newBatchProc(t, addr, nil, p, lo, to, d)
			keys := []string{"x", "y"}

			ra, rb := make(chan result[map[string]string], 1), make(chan result[map[string]string], 1)
			go func() { m, err := a.l.GetMany(ctx, keys); ra <- result[map[string]string]{m, err} }()
			within(t, d.started, 10*time.Second, "downstream call by a")
			go func() { m, err := b.l.GetMany(ctx, keys); rb <- result[map[string]string]{m, err} }()
			eventually(t, 10*time.Second, "b to wait on a's leases", func() bool { return b.t.Stats().Waits == 2 })
			close(d.gate)

			r := within(t, ra, 10*time.Second, "answer to a.GetMany")
			switch {
			case tc.goexit && !errors.Is(r.err, flightcache.ErrGoexit):
				t.Errorf("a.GetMany = %v, %v; want ErrGoexit", r.v, r.err)
			case !tc.goexit && (r.err != nil || r.v["x"] != "x-v1" || r.v["y"] != "y-v1"):
				t.Errorf("a.GetMany = %v, %v; want the values loaded, x-v1 and y-v1", r.v, r.err)
			}
			r = within(t, rb, 10*time.Second, "answer to b.GetMany (a lease leaked?)")
			if !tc.goexit && (r.err != nil || r.v["x"] != "x-v2" || r.v["y"] != "y-v2") {
				t.Errorf("b.GetMany = %v, %v; want its own load's x-v2 and y-v2", r.v, r.err)
			}
			for _, k := range keys {
				ks := keysFor(p, k)
				if n := c.Exists(ctx, ks.lease, ks.alive, ks.entry).Val(); n != 0 {
					t.Errorf("%s: %d of the lease, alive key and entry exist; want none", k, n)
				}
			}
			if calls := d.allCalls(); len(calls) != 2 {
				t.Errorf("downstream calls %v; want 2 (a's, then b's own)", calls)
			}
			if s := b.t.Stats(); s.Leases != 2 || s.Takeovers != 0 || s.RedisErrors != 0 {
				t.Errorf("b stats %+v; want its own 2 leases, no takeover", s)
			}
			if s := a.t.Stats(); !tc.goexit && s.EncodeErrors != 2 {
				t.Errorf("a stats %+v; want 2 encode errors", s)
			}
		})
	}
}

// TestSetWithPanickingFreshnessDropsTheSharedEntry: a Set whose value's
// Freshness panics is not cached by the Loader, and not shared either: the
// older shared entry is deleted, so no process is handed the value the
// Set replaced.
func TestSetWithPanickingFreshnessDropsTheSharedEntry(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, Freshness: func(_, v string) flightcache.Freshness {
		if v == "bad" {
			panic("Freshness panics")
		}
		return flightcache.Freshness{}
	}}
	a := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if v, err := a.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Fatalf("a.Get(k) = %q, %v; want k-v1", v, err)
	}
	a.l.Set("k", "bad")
	if n := c.Exists(ctx, keysFor(p, "k").entry).Val(); n != 0 {
		t.Errorf("the shared entry survived a Set whose value is not shared")
	}
	b := newProc(t, addr, p, lo, Options[string, string]{}, d)
	if v, err := b.l.Get(ctx, "k"); err != nil || v != "k-v2" {
		t.Errorf("b.Get(k) = %q, %v; want a new load, k-v2, not the value the Set replaced", v, err)
	}
	if s := a.t.Stats(); s.EncodeErrors != 1 {
		t.Errorf("a stats %+v; want 1 encode error", s)
	}
}

// panicDecoder panics when it decodes.
type panicDecoder struct{ JSON[string] }

func (panicDecoder) Unmarshal([]byte) (string, error) { panic("Unmarshal panics") }

// TestPanickingUnmarshalIsADecodeError: an entry the Codec panics on is
// treated as one that does not decode (reloaded under the lease and
// overwritten), never a panic for the caller nor a lease left behind,
// whether the tier decodes it to serve it ("k", fresh) or to hand it to
// the load that revalidates it ("s", past its stale window, still inside
// StaleIfError, decoded once the lease is taken).
func TestPanickingUnmarshalIsADecodeError(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "Get"
		if batch {
			name = "GetMany"
		}
		t.Run(name, func(t *testing.T) {
			addr := redisAddr(t)
			c := newClient(t, addr)
			p := testPrefix(t, c)
			lo := flightcache.Options[string, string]{TTL: time.Minute, StaleIfError: time.Hour}
			to := Options[string, string]{Codec: panicDecoder{}, Timeout: 2 * time.Second, HolderTimeout: time.Minute}
			now := micros(time.Now())
			c.HSet(ctx, keysFor(p, "k").entry, "id", "x", "v", `"old"`, "at", now, "took", 0, "fresh", now+60e6, "stale", now+60e6, "until", now+60e6)
			c.HSet(ctx, keysFor(p, "s").entry, "id", "y", "v", `"old"`, "at", now-120e6, "took", 0, "fresh", now-60e6, "stale", now-60e6, "until", now+3600e6)

			got := map[string]string{}
			var tier *Tier[string, string]
			if batch {
				d := newBatchDownstream()
				pr := newBatchProc(t, addr, nil, p, lo, to, d)
				tier = pr.t
				m, err := pr.l.GetMany(ctx, []string{"k", "s"})
				if err != nil {
					t.Fatalf("GetMany(k, s) = %v, %v; want both loaded", m, err)
				}
				got = m
			} else {
				d := newDownstream()
				pr := newProc(t, addr, p, lo, to, d)
				tier = pr.t
				for _, k := range []string{"k", "s"} {
					v, err := pr.l.Get(ctx, k)
					if err != nil {
						t.Errorf("Get(%s) = %q, %v; want it loaded", k, v, err)
					}
					got[k] = v
				}
			}
			for _, k := range []string{"k", "s"} {
				if got[k] == "" || got[k] == "old" {
					t.Errorf("%s = %q; want a new load", k, got[k])
				}
				ks := keysFor(p, k)
				if n := c.Exists(ctx, ks.lease, ks.alive).Val(); n != 0 {
					t.Errorf("the lease of %s survived", k)
				}
				if v := c.HGet(ctx, ks.entry, "v").Val(); v != `"`+got[k]+`"` {
					t.Errorf("the entry of %s holds %s; want the new load's", k, v)
				}
			}
			if s := tier.Stats(); s.DecodeErrors == 0 || s.Leases != 2 {
				t.Errorf("stats %+v; want decode errors and 2 leases", s)
			}
		})
	}
}

package flightredis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// batchDownstream is a fake downstream with a LoadMany, shared by the
// Loaders of one test: it records the keys of each call and answers
// "key-vN", N the call's number. The keys of absent are left out (not
// found); with err set every call fails; with gate set every call waits
// for it.
type batchDownstream struct {
	mu      sync.Mutex
	calls   [][]string
	absent  map[string]bool
	keyErrs map[string]error // keys that fail alone, in a *flightcache.ManyError
	poison  string           // a call that holds this key fails as a whole, with errBoom
	err     error
	gate    chan struct{}
	started chan struct{} // receives (without blocking) when a call starts
	panics  bool          // every call panics
	goexits bool          // every call ends its goroutine
}

func newBatchDownstream() *batchDownstream {
	return &batchDownstream{started: make(chan struct{}, 64)}
}

func (d *batchDownstream) loadMany(ctx context.Context, keys []string) (map[string]string, error) {
	d.mu.Lock()
	d.calls = append(d.calls, slices.Clone(keys))
	n, err, gate := len(d.calls), d.err, d.gate
	panics, goexits := d.panics, d.goexits
	d.mu.Unlock()
	select {
	case d.started <- struct{}{}:
	default:
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	switch {
	case panics:
		panic("loadMany panics")
	case goexits:
		runtime.Goexit()
	case err != nil:
		return nil, err
	case d.poison != "" && slices.Contains(keys, d.poison):
		return nil, errBoom
	}
	m := make(map[string]string, len(keys))
	errs := map[string]error{}
	for _, k := range keys {
		if err, ok := d.keyErrs[k]; ok {
			errs[k] = err
		} else if !d.absent[k] {
			m[k] = fmt.Sprintf("%s-v%d", k, n)
		}
	}
	if len(errs) > 0 {
		return m, &flightcache.ManyError[string]{Errs: errs}
	}
	return m, nil
}

// load is the LoadFunc: a LoadMany call of one key.
func (d *batchDownstream) load(ctx context.Context, key string) (string, error) {
	m, err := d.loadMany(ctx, []string{key})
	if me, ok := err.(*flightcache.ManyError[string]); ok {
		err = me.Errs[key]
	}
	if err != nil {
		return "", err
	}
	v, ok := m[key]
	if !ok {
		return "", flightcache.ErrNotFound
	}
	return v, nil
}

func (d *batchDownstream) set(f func(d *batchDownstream)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

// allCalls returns the keys of every call so far, each call's sorted.
func (d *batchDownstream) allCalls() [][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([][]string, len(d.calls))
	for i, c := range d.calls {
		out[i] = slices.Sorted(slices.Values(c))
	}
	return out
}

// loadsOf counts the calls that loaded key.
func (d *batchDownstream) loadsOf(key string) int {
	n := 0
	for _, c := range d.allCalls() {
		if slices.Contains(c, key) {
			n++
		}
	}
	return n
}

// newBatchProc is newProc with Options.LoadMany, on client (a new one when
// nil).
func newBatchProc(t *testing.T, addr string, client redis.UniversalClient, prefix string, lo flightcache.Options[string, string], to Options[string, string], d *batchDownstream) proc {
	t.Helper()
	if client == nil {
		client = newClient(t, addr)
	}
	if to.Timeout == 0 && to.HolderTimeout == 0 {
		// Generous, so that a round trip slowed down by a loaded machine
		// does not turn into a local load; the outage tests set their own.
		to.Timeout, to.HolderTimeout = 2*time.Second, 6*time.Second
	}
	to.Prefix = prefix
	lo.LoadMany = d.loadMany
	tier, err := NewTier(client, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	lo.Remote = tier
	l, err := flightcache.New(d.load, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return proc{l: l, t: tier}
}

func keyRange(prefix string, from, to int) []string {
	var keys []string
	for i := from; i < to; i++ {
		keys = append(keys, fmt.Sprintf("%s%02d", prefix, i))
	}
	return keys
}

// manyResult is what one GetMany returned.
type manyResult struct {
	m   map[string]string
	err error
}

func getMany(pr proc, keys []string) <-chan manyResult {
	ch := make(chan manyResult, 1)
	go func() {
		m, err := pr.l.GetMany(ctx, keys)
		ch <- manyResult{m, err}
	}()
	return ch
}

func waitStarted(t *testing.T, d *batchDownstream, n int) {
	t.Helper()
	for range n {
		select {
		case <-d.started:
		case <-time.After(30 * time.Second):
			t.Fatalf("the downstream was not called (calls so far %v)", d.allCalls())
		}
	}
}

// A GetMany of N keys nobody has makes one LoadMany call with the N keys;
// the same GetMany in another process, with nothing locally, gets the
// same values from the tier without a downstream call, in one round trip.
func TestGetManyOneBatchForTheFleet(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	keys := keyRange("k", 0, 20)

	got, err := a.l.GetMany(ctx, keys)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("a.GetMany = %v, %v; want %d values", got, err, len(keys))
	}
	for _, k := range keys {
		if got[k] != k+"-v1" {
			t.Errorf("a.GetMany[%s] = %q; want %s-v1", k, got[k], k)
		}
	}
	if calls := d.allCalls(); len(calls) != 1 || !slices.Equal(calls[0], keys) {
		t.Fatalf("downstream calls %v; want one LoadMany call with the %d keys", calls, len(keys))
	}

	got2, err := b.l.GetMany(ctx, keys)
	if err != nil || !equalMaps(got, got2) {
		t.Errorf("b.GetMany = %v, %v; want a's values %v", got2, err, got)
	}
	if n := len(d.allCalls()); n != 1 {
		t.Errorf("downstream calls after b's GetMany = %d; want still 1", n)
	}
	sa, sb := a.t.Stats(), b.t.Stats()
	if sa.Leases != 20 || sa.Batches != 1 || sb.Hits != 20 || sb.Leases != 0 || sb.Batches != 1 || sb.BatchRoundTrips != 1 {
		t.Errorf("stats: a %+v, b %+v; want a: 20 leases in 1 batch, b: 20 hits in 1 batch and 1 round trip", sa, sb)
	}
	if ls := b.l.Stats(); ls.BatchLoads != 1 || ls.BatchKeys != 20 {
		t.Errorf("b's Loader stats %+v; want one batch of 20 keys", ls)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Two processes' GetManys of overlapping keys at once load each key once
// between them: each process leases the keys it gets first, waits for the
// others, and both see the same values.
func TestGetManyOverlappingBatches(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	keysA, keysB := keyRange("k", 0, 6), keyRange("k", 3, 10) // k03..k05 in both

	ra, rb := getMany(a, keysA), getMany(b, keysB)
	// Each process has keys of its own, so each makes one call; the keys
	// they share are leased by one and waited on by the other.
	waitStarted(t, d, 2)
	eventually(t, 30*time.Second, "the shared keys' waits", func() bool {
		return a.t.Stats().Waits+b.t.Stats().Waits == 3
	})
	close(d.gate)
	gotA, gotB := within(t, ra, 30*time.Second, "answer to a's GetMany"), within(t, rb, 30*time.Second, "answer to b's GetMany")
	if gotA.err != nil || len(gotA.m) != len(keysA) || gotB.err != nil || len(gotB.m) != len(keysB) {
		t.Fatalf("a.GetMany = %v, %v; b.GetMany = %v, %v; want every value", gotA.m, gotA.err, gotB.m, gotB.err)
	}
	for _, k := range keyRange("k", 3, 6) {
		if gotA.m[k] != gotB.m[k] {
			t.Errorf("%s: a got %q, b got %q; want the same value", k, gotA.m[k], gotB.m[k])
		}
	}
	calls := d.allCalls()
	for _, k := range keyRange("k", 0, 10) {
		if n := d.loadsOf(k); n != 1 {
			t.Errorf("%s loaded %d times; want once (calls %v)", k, n, calls)
		}
	}
	if len(calls) != 2 {
		t.Errorf("downstream calls %v; want 2", calls)
	}
	sa, sb := a.t.Stats(), b.t.Stats()
	if sa.Leases+sb.Leases != 10 || sa.Shared+sb.Shared != 3 {
		t.Errorf("stats: a %+v, b %+v; want 10 leases and 3 shared in all", sa, sb)
	}
	t.Logf("a leased %d keys, b %d; the waiting batch resumed %d times by pub/sub, %d by poll",
		sa.Leases, sb.Leases, sa.Wakeups+sb.Wakeups, sa.Polls+sb.Polls)
}

// A key the batch loader does not return is not found, and the processes
// that waited on its lease share that not-found (the failure marker):
// neither gets it, and the downstream was asked once. A later GetMany asks
// again (the fleet does not cache a not-found).
func TestGetManyNotFoundIsShared(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.gate = make(chan struct{})
	d.absent = map[string]bool{"gone": true}
	lo := flightcache.Options[string, string]{TTL: time.Minute, Breaker: flightcache.Breaker{Disabled: true}}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)

	ra := getMany(a, []string{"a1", "gone"})
	waitStarted(t, d, 1)
	rb := getMany(b, []string{"gone", "b1"})
	waitStarted(t, d, 1) // b's call for b1
	eventually(t, 30*time.Second, "b to wait on a's lease of gone", func() bool { return b.t.Stats().Waits == 1 })
	close(d.gate)
	for _, r := range []manyResult{within(t, ra, 30*time.Second, "answer to a's GetMany"), within(t, rb, 30*time.Second, "answer to b's GetMany")} {
		if _, ok := r.m["gone"]; ok || r.err != nil || len(r.m) != 1 {
			t.Errorf("GetMany = %v, %v; want the other key only, no error", r.m, r.err)
		}
	}
	if n := d.loadsOf("gone"); n != 1 {
		t.Errorf("gone loaded %d times; want once (calls %v)", n, d.allCalls())
	}
	if s := b.t.Stats(); s.PeerErrors != 1 || s.Leases != 1 {
		t.Errorf("b stats %+v; want a peer error (the shared not-found) and the lease of b1", s)
	}
	if m, err := b.l.GetMany(ctx, []string{"gone"}); len(m) != 0 || err != nil {
		t.Errorf("b.GetMany(gone) again = %v, %v; want not found", m, err)
	}
	if n := d.loadsOf("gone"); n != 2 {
		t.Errorf("gone loaded %d times after a later GetMany; want 2", n)
	}
}

// A failing batch fails each of its keys; a key with an older shared entry
// inside StaleIfError is covered by it, in the process that ran the batch
// and in the one that waited on it (which shares the failure).
func TestGetManyFailedBatchCoveredByTheFleet(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	lo := flightcache.Options[string, string]{TTL: time.Minute, StaleIfError: 5 * time.Minute,
		Breaker: flightcache.Breaker{Disabled: true}}
	plant(t, addr, p, lo, "old", "old-value", 2*time.Minute) // stale for 1m: no use but as a cover
	d := newBatchDownstream()
	d.gate = make(chan struct{})
	d.err = errBoom
	// a's failure marker lives 4 PollIntervals (at least a second): long
	// enough here for b to read it however late a loaded machine wakes b.
	to := Options[string, string]{PollInterval: 2 * time.Second}
	a := newBatchProc(t, addr, nil, p, lo, to, d)
	b := newBatchProc(t, addr, nil, p, lo, to, d)
	keys := []string{"old", "new"}

	ra := getMany(a, keys)
	waitStarted(t, d, 1)
	rb := getMany(b, keys)
	eventually(t, 30*time.Second, "b to wait on a's leases", func() bool { return b.t.Stats().Waits == 2 })
	close(d.gate)
	for i, r := range []manyResult{within(t, ra, 30*time.Second, "answer to a's GetMany"), within(t, rb, 30*time.Second, "answer to b's GetMany")} {
		var me *flightcache.ManyError[string]
		if !errors.As(r.err, &me) {
			t.Fatalf("GetMany %d = %v, %v; want a ManyError for new", i, r.m, r.err)
		}
		if r.m["old"] != "old-value" || len(r.m) != 1 || len(me.Errs) != 1 || !errors.Is(me.Errs["new"], errBoom) && !errors.Is(me.Errs["new"], ErrPeerFailed) {
			t.Errorf("GetMany %d = %v, %v; want old covered by the shared entry, new failed", i, r.m, r.err)
		}
		if i == 1 && (!errors.Is(me.Errs["new"], ErrPeerFailed) || !strings.Contains(me.Errs["new"].Error(), errBoom.Error())) {
			t.Errorf("b's error for new = %v; want ErrPeerFailed with a's error", me.Errs["new"])
		}
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want 1 (the failure is shared)", calls)
	}
	sa, sb := a.t.Stats(), b.t.Stats()
	if sa.Leases != 2 || sa.StaleOffers != 1 || sb.PeerErrors != 2 || sb.StaleOffers != 1 {
		t.Errorf("stats: a %+v, b %+v; want a's 2 leases and b's 2 peer errors, old covered in each", sa, sb)
	}
	if la, lb := a.l.Stats(), b.l.Stats(); la.StaleOnError != 1 || lb.StaleOnError != 1 {
		t.Errorf("Loader stats StaleOnError: a %d, b %d; want 1 each", la.StaleOnError, lb.StaleOnError)
	}
}

// With Redis gone, GetMany still works: the batch is loaded locally in one
// call, counted per key in LocalLoads; while the tier steps aside, a batch
// makes no Redis round trip at all.
func TestGetManyRedisDown(t *testing.T) {
	srv := startOwnRedis(t)
	d := newBatchDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 10 * time.Second}
	to := Options[string, string]{Timeout: 200 * time.Millisecond, RetryAfter: time.Minute}
	a := newBatchProc(t, srv.addr, nil, "fctest:", lo, to, d)
	if m, err := a.l.GetMany(ctx, []string{"w1", "w2"}); err != nil || len(m) != 2 {
		t.Fatalf("GetMany with Redis up = %v, %v", m, err)
	}
	if s := a.t.Stats(); s.Leases != 2 {
		t.Fatalf("stats with Redis up %+v; want 2 leases", s)
	}
	srv.stop()

	keys := keyRange("down", 0, 5)
	start := time.Now()
	m, err := a.l.GetMany(ctx, keys)
	took := time.Since(start)
	if err != nil || len(m) != len(keys) {
		t.Fatalf("GetMany with Redis down = %v, %v; want the downstream's values", m, err)
	}
	calls := d.allCalls()
	if last := calls[len(calls)-1]; len(calls) != 2 || !slices.Equal(last, keys) {
		t.Errorf("downstream calls %v; want one more, with the 5 keys", calls)
	}
	s := a.t.Stats()
	if s.RedisErrors != 1 || s.LocalLoads != 5 {
		t.Errorf("stats with Redis down %+v; want 1 Redis error and 5 local loads", s)
	}
	t.Logf("with Redis down, the batch that found it gone took %v (Timeout %v)", took.Round(time.Millisecond), to.Timeout)
	if took > lo.LoadTimeout/2 {
		t.Errorf("GetMany with Redis down took %v", took)
	}

	// The tier steps aside: the next batch goes straight to the downstream.
	trips := s.BatchRoundTrips
	if m, err := a.l.GetMany(ctx, keyRange("aside", 0, 3)); err != nil || len(m) != 3 {
		t.Fatalf("GetMany while the tier steps aside = %v, %v", m, err)
	}
	if s := a.t.Stats(); s.LocalLoads != 8 || s.BatchRoundTrips != trips || s.Batches != 3 {
		t.Errorf("stats %+v; want 8 local loads, no new round trip, 3 batches", s)
	}
}

// tripCounter is a go-redis hook that counts the round trips of the
// tier's protocol: each pipeline, and each single command, that carries a
// read or a script (connection set-up, pub/sub and the heartbeats of
// leases are left out).
type tripCounter struct {
	mu    sync.Mutex
	trips int
	log   []string
}

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.note([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.note(cmds)
		return next(ctx, cmds)
	}
}

func (h *tripCounter) note(cmds []redis.Cmder) {
	names := map[string]int{}
	for _, c := range cmds {
		args := c.Args()
		switch n := c.Name(); {
		case n == "evalsha" && len(args) > 1 && args[1] == beatScript.Hash():
		case n == "hmget", n == "evalsha", n == "eval":
			names[n]++
		}
	}
	if len(names) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips++
	h.log = append(h.log, fmt.Sprint(names))
}

func (h *tripCounter) take() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, log := h.trips, h.log
	h.trips, h.log = 0, nil
	return n, log
}

// A batch of N cold keys costs a constant number of Redis round trips,
// whatever N: one pipelined read, one pipelined acquire, one pipelined
// write; a batch of N keys another process loaded costs one. N single Gets
// cost 3 per key.
func TestGetManyRoundTrips(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	ca, cb := newClient(t, addr), newClient(t, addr)
	ha, hb := &tripCounter{}, &tripCounter{}
	ca.AddHook(ha)
	cb.AddHook(hb)
	a := newBatchProc(t, addr, ca, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, cb, p, lo, Options[string, string]{}, d)
	// Warm up: connections open, and Redis (every master of a cluster)
	// knows the scripts (a batch sends a script Redis lacks once more, with
	// EVAL).
	loadScripts(t, ca)
	for _, pr := range []proc{a, b} {
		if _, err := pr.l.GetMany(ctx, []string{"warm-" + token(4)}); err != nil {
			t.Fatal(err)
		}
	}
	ha.take()
	hb.take()

	for _, n := range []int{1, 10, 100} {
		keys := keyRange(fmt.Sprintf("cold%d-", n), 0, n)
		before := a.t.Stats().BatchRoundTrips
		start := time.Now()
		if m, err := a.l.GetMany(ctx, keys); err != nil || len(m) != n {
			t.Fatalf("a.GetMany(%d keys) = %d values, %v", n, len(m), err)
		}
		took := time.Since(start)
		trips, log := ha.take()
		if trips != 3 || a.t.Stats().BatchRoundTrips-before != 3 {
			t.Errorf("a batch of %d cold keys made %d round trips %v (Stats: %d); want 3: read, acquire, write",
				n, trips, log, a.t.Stats().BatchRoundTrips-before)
		}
		start = time.Now()
		if m, err := b.l.GetMany(ctx, keys); err != nil || len(m) != n {
			t.Fatalf("b.GetMany(%d keys) = %d values, %v", n, len(m), err)
		}
		tookShared := time.Since(start)
		shared, log := hb.take()
		if shared != 1 {
			t.Errorf("a batch of %d keys in Redis made %d round trips %v; want 1: read", n, shared, log)
		}
		// The same number of cold keys, one Get each: 3 round trips per key.
		for _, k := range keyRange(fmt.Sprintf("single%d-", n), 0, n) {
			if _, err := a.l.Get(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		singles, _ := ha.take()
		if singles != 3*n {
			t.Errorf("%d single Gets of cold keys made %d round trips; want %d", n, singles, 3*n)
		}
		t.Logf("%3d cold keys: a batch made %d round trips (%v), %d Gets %d; a batch from the tier %d (%v)",
			n, trips, took.Round(time.Microsecond), n, singles, shared, tookShared.Round(time.Microsecond))
	}
}

// A batch whose loader does not return (runtime.Goexit) releases its
// leases on the way out: another process loads the keys at once, without
// waiting for HolderTimeout. A batch loader that panics is recovered by the
// Loader into an error, which releases the leases as any failure does.
// (User code that panics after the loader returned: panic_test.go.)
func TestGetManyReleasesLeasesWhenItDoesNotReturn(t *testing.T) {
	tests := []struct {
		name  string
		setup func(d *batchDownstream, to *Options[string, string])
		want  func(err error) bool
	}{
		{"LoadMany panics", func(d *batchDownstream, _ *Options[string, string]) { d.panics = true },
			func(err error) bool { var pe *flightcache.PanicError; return errors.As(err, &pe) }},
		{"LoadMany ends its goroutine", func(d *batchDownstream, _ *Options[string, string]) { d.goexits = true },
			func(err error) bool { return errors.Is(err, flightcache.ErrGoexit) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := redisAddr(t)
			c := newClient(t, addr)
			p := testPrefix(t, c)
			d := newBatchDownstream()
			lo := flightcache.Options[string, string]{TTL: time.Minute, Breaker: flightcache.Breaker{Disabled: true}}
			to := Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: time.Minute}
			broken := to
			tt.setup(d, &broken)
			a := newBatchProc(t, addr, nil, p, lo, broken, d)
			keys := []string{"x", "y"}
			_, err := a.l.GetMany(ctx, keys)
			var me *flightcache.ManyError[string]
			if !errors.As(err, &me) || len(me.Errs) != 2 || !tt.want(err) {
				t.Fatalf("GetMany = %v; want both keys failed, with the cause", err)
			}
			if s := a.t.Stats(); s.Leases != 2 {
				t.Errorf("stats %+v; want 2 leases", s)
			}
			for _, k := range keys {
				if n := c.Exists(ctx, keysFor(p, k).lease, keysFor(p, k).alive).Val(); n != 0 {
					t.Errorf("the lease of %s survived its batch", k)
				}
			}
			d.set(func(d *batchDownstream) { d.panics, d.goexits = false, false })
			b := newBatchProc(t, addr, nil, p, lo, to, d)
			start := time.Now()
			if m, err := b.l.GetMany(ctx, keys); err != nil || len(m) != 2 {
				t.Errorf("b.GetMany = %v, %v", m, err)
			}
			if took := time.Since(start); took > 10*time.Second || b.t.Stats().Waits != 0 {
				t.Errorf("b.GetMany took %v, stats %+v; want no wait", took, b.t.Stats())
			}
		})
	}
}

// A key whose holder died is taken over by the batch that waits on it and
// loaded by a second call of the batch loader; the first call loaded the
// keys nobody held.
func TestGetManyTakesOverADeadHolder(t *testing.T) {
	addr := redisAddr(t)
	c := newClient(t, addr)
	p := testPrefix(t, c)
	d := newBatchDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 10 * time.Second}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{Timeout: time.Second, HolderTimeout: 3 * time.Second}, d)
	ks := keysFor(p, "dead")
	c.Set(ctx, ks.lease, "dead", time.Minute)
	c.Set(ctx, ks.alive, "dead", time.Second) // it stopped beating: gone in a second

	m, err := a.l.GetMany(ctx, []string{"dead", "live1", "live2"})
	if err != nil || m["dead"] != "dead-v2" || m["live1"] != "live1-v1" || m["live2"] != "live2-v1" {
		t.Fatalf("GetMany = %v, %v; want live keys from the first call, dead from the second", m, err)
	}
	want := [][]string{{"live1", "live2"}, {"dead"}}
	if calls := d.allCalls(); !slices.EqualFunc(calls, want, slices.Equal) {
		t.Errorf("downstream calls %v; want %v", calls, want)
	}
	if s := a.t.Stats(); s.Takeovers != 1 || s.Waits != 1 || s.Leases != 3 {
		t.Errorf("stats %+v; want 1 wait, 1 takeover, 3 leases", s)
	}
}

// A batch beats its leases while it loads: a load longer than
// HolderTimeout is not taken over by a process that waits on it.
func TestGetManyBeatsItsLeases(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute, LoadTimeout: 20 * time.Second}
	to := Options[string, string]{Timeout: 800 * time.Millisecond, HolderTimeout: 1200 * time.Millisecond}
	a := newBatchProc(t, addr, nil, p, lo, to, d)
	b := newBatchProc(t, addr, nil, p, lo, to, d)
	keys := keyRange("k", 0, 3)

	ra := getMany(a, keys)
	waitStarted(t, d, 1)
	rb := getMany(b, keys)
	eventually(t, 30*time.Second, "b to wait on a's leases", func() bool { return b.t.Stats().Waits == 3 })
	time.Sleep(5 * to.HolderTimeout / 2) // the alive keys would have lapsed twice without beats
	close(d.gate)
	gotA, gotB := within(t, ra, 30*time.Second, "answer to a's GetMany"), within(t, rb, 30*time.Second, "answer to b's GetMany")
	if gotA.err != nil || gotB.err != nil || !equalMaps(gotA.m, gotB.m) || len(gotA.m) != 3 {
		t.Errorf("a: %v, %v; b: %v, %v; want the same 3 values", gotA.m, gotA.err, gotB.m, gotB.err)
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want 1", calls)
	}
	if s := b.t.Stats(); s.Takeovers != 0 || s.Shared != 3 {
		t.Errorf("b stats %+v; want no takeover, 3 shared", s)
	}
}

// GetMany's background refreshes go through the tier as batches too: a
// stale shared entry is handed to a process once, then that process's
// refresh batch reloads it under the lease, and another process's refresh
// picks the new value up from Redis.
func TestGetManyStaleEntriesRefreshedOnce(t *testing.T) {
	addr := redisAddr(t)
	p := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	lo := flightcache.Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Minute}
	a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
	keys := []string{"k1", "k2"}
	v1 := map[string]string{"k1": "k1-v1", "k2": "k2-v1"}
	v2 := map[string]string{"k1": "k1-v2", "k2": "k2-v2"}

	if m, err := a.l.GetMany(ctx, keys); err != nil || !equalMaps(m, v1) {
		t.Fatalf("a.GetMany = %v, %v; want %v", m, err, v1)
	}
	time.Sleep(1200 * time.Millisecond) // stale everywhere
	if m, err := b.l.GetMany(ctx, keys); err != nil || !equalMaps(m, v1) {
		t.Fatalf("b.GetMany = %v, %v; want the stale %v", m, err, v1)
	}
	if s := b.t.Stats(); s.StaleHits != 2 || len(d.allCalls()) != 1 {
		t.Fatalf("b stats %+v, downstream calls %v; want 2 stale hits, no new call", s, d.allCalls())
	}
	eventually(t, 10*time.Second, "b's refresh batch", func() bool {
		m, _ := b.l.GetMany(ctx, keys)
		return equalMaps(m, v2)
	})
	eventually(t, 10*time.Second, "a's refresh batch", func() bool {
		m, _ := a.l.GetMany(ctx, keys)
		return equalMaps(m, v2)
	})
	want := [][]string{keys, keys}
	if calls := d.allCalls(); !slices.EqualFunc(calls, want, slices.Equal) {
		t.Errorf("downstream calls %v; want %v", calls, want)
	}
	if s := b.t.Stats(); s.Leases != 2 {
		t.Errorf("b stats %+v; want the 2 leases of its refresh", s)
	}
	// With tracking, b's refresh writes come back to a as invalidations of
	// the copies it holds; one that drops a copy while a's own refresh of
	// it is in flight costs a one more read of the tier, never a load.
	if s := a.t.Stats(); s.Hits < 2 {
		t.Errorf("a stats %+v; want at least 2 hits (its refresh found b's values)", s)
	}
}

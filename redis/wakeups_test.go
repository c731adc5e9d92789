package flightredis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// The per-key wake-ups (wakeups.go), on one node and on a Cluster.

// slowPolls are tier options under which a wait resumes by a poll only
// after seconds: the first poll comes after PollInterval/8 (jittered, at
// least 2.5s here), and the holder's alive key, which a waiter also
// watches, lives for HolderTimeout. A wait that ends within a second was
// woken.
var slowPolls = Options[string, string]{PollInterval: 40 * time.Second, HolderTimeout: 30 * time.Second}

// subscribers returns how many clients of Redis are subscribed to the
// wake-up channel of key: PUBSUB NUMSUB on one node, PUBSUB SHARDNUMSUB on
// the master of the channel's slot of a Cluster.
func subscribers(t *testing.T, c redis.UniversalClient, prefix, key string) int64 {
	t.Helper()
	ch := keysFor(prefix, key).wake
	var m map[string]int64
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		node, nerr := cc.MasterForKey(ctx, ch)
		if nerr != nil {
			t.Fatal(nerr)
		}
		m, err = node.PubSubShardNumSub(ctx, ch).Result()
	} else {
		m, err = c.PubSubNumSub(ctx, ch).Result()
	}
	if err != nil {
		t.Fatal(err)
	}
	return m[ch]
}

// waitingOn waits until pr's tier waits on key, subscribed: its
// subscription is confirmed (Redis counts it) and it looked once more.
func waitingOn(t *testing.T, admin redis.UniversalClient, prefix string, pr proc, key string, waits uint64) {
	t.Helper()
	eventually(t, 10*time.Second, "a wait, subscribed to "+key, func() bool {
		return pr.t.Stats().Waits >= waits && subscribers(t, admin, prefix, key) >= 1
	})
	time.Sleep(50 * time.Millisecond) // its look after subscribing
}

// A wake-up goes to the processes that wait on the key, and to no other:
// a process that loads other keys hears nothing of k, the waiter is woken
// long before its first poll, and its subscription is dropped when its
// wait ends.
func TestWakeupsOnlyToWaiters(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	p := testPrefix(t, admin)
	d := newDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	a := newProc(t, addr, p, lo, slowPolls, d)
	b := newProc(t, addr, p, lo, slowPolls, d)
	c := newProc(t, addr, p, lo, slowPolls, newDownstream())
	if _, err := c.l.Get(ctx, "other"); err != nil { // c is in use, on other keys
		t.Fatal(err)
	}

	got := make(chan error, 2)
	go func() { _, err := a.l.Get(ctx, "k"); got <- err }()
	within(t, d.started, 10*time.Second, "a's downstream call") // a holds k's lease
	go func() {
		v, err := b.l.Get(ctx, "k")
		if err == nil && v != "k-v1" {
			err = fmt.Errorf("b: Get(k) = %q; want a's k-v1", v)
		}
		got <- err
	}()
	waitingOn(t, admin, p, b, "k", 1)
	if n := subscribers(t, admin, p, "k"); n != 1 {
		t.Fatalf("%d subscribers to k's wake-ups while b waits; want 1 (b's)", n)
	}
	start := time.Now()
	close(d.gate)
	for range 2 {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the Gets did not return")
		}
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("b's wait ended %v after a's load; want a wake-up, within 1s (its first poll is at least 2.5s away)", el)
	}
	sa, sb, sc := a.t.Stats(), b.t.Stats(), c.t.Stats()
	if sb.Wakeups != 1 || sb.Polls != 0 || sb.WakeupSubscribes != 1 || sb.WakeupsHeard != 1 {
		t.Errorf("b: Wakeups %d, Polls %d, WakeupSubscribes %d, WakeupsHeard %d; want 1, 0, 1, 1",
			sb.Wakeups, sb.Polls, sb.WakeupSubscribes, sb.WakeupsHeard)
	}
	if sa.WakeupsHeard != 0 || sa.WakeupSubscribes != 0 || sc.WakeupsHeard != 0 || sc.WakeupSubscribes != 0 {
		t.Errorf("a (the holder) heard %d wake-ups in %d subscriptions, c (other keys) %d in %d; want none",
			sa.WakeupsHeard, sa.WakeupSubscribes, sc.WakeupsHeard, sc.WakeupSubscribes)
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("downstream calls = %d; want 1", n)
	}
	eventually(t, 5*time.Second, "b's subscription to be dropped", func() bool {
		return subscribers(t, admin, p, "k") == 0
	})
}

// pubsubClients returns the ids of the pub/sub connections of the server
// of key's wake-up channel (CLIENT LIST TYPE pubsub).
func pubsubClients(t *testing.T, c redis.UniversalClient, prefix, key string) map[string]bool {
	t.Helper()
	node := c
	if cc, ok := c.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, keysFor(prefix, key).wake)
		if err != nil {
			t.Fatal(err)
		}
		node = n
	}
	list, err := node.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids[id] = true
			}
		}
	}
	return ids
}

// A wake-up lost costs one poll, and the Get still returns: once with the
// subscription dropped behind the tier's back (as Redis drops a shard
// channel's subscribers when its slot moves), once with the wake-up
// connection killed; after which the next wait is woken again.
func TestWakeupLostCostsAPoll(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	p := testPrefix(t, admin)
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	// Timeout generous for a loaded machine: a round trip of b that
	// outlasted it would have b load the key itself.
	to := Options[string, string]{Timeout: 2 * time.Second, PollInterval: 2 * time.Second, HolderTimeout: 30 * time.Second}
	d := newDownstream()
	a := newProc(t, addr, p, lo, to, d)
	b := newProc(t, addr, p, lo, to, d)

	// wait has a hold key while b waits on it; lose runs while b waits,
	// then a's load ends; it returns how long b's wait lasted after that.
	wait := func(key string, lose func()) time.Duration {
		t.Helper()
		d.gate = make(chan struct{})
		for len(d.started) > 0 { // an earlier step's: the next is a's call
			<-d.started
		}
		got := make(chan error, 2)
		go func() { _, err := a.l.Get(ctx, key); got <- err }()
		within(t, d.started, 10*time.Second, "a's downstream call")
		go func() { _, err := b.l.Get(ctx, key); got <- err }()
		waitingOn(t, admin, p, b, key, b.t.Stats().Waits+1)
		lose()
		start := time.Now()
		close(d.gate)
		for range 2 {
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the Gets did not return")
			}
		}
		return time.Since(start)
	}

	// Unsubscribed behind the tier's back.
	before := b.t.Stats()
	took := wait("k1", func() {
		ch := keysFor(p, "k1").wake
		ps := b.t.wake.PubSubOf(ch)
		if onCluster() {
			_ = ps.SUnsubscribe(ctx, ch)
		} else {
			_ = ps.Unsubscribe(ctx, ch)
		}
		eventually(t, 5*time.Second, "the subscription gone", func() bool { return subscribers(t, admin, p, "k1") == 0 })
	})
	after := b.t.Stats()
	if after.Polls == before.Polls || after.WakeupsHeard != before.WakeupsHeard {
		t.Errorf("lost subscription: polls %d → %d, wake-ups heard %d → %d; want a poll, no wake-up",
			before.Polls, after.Polls, before.WakeupsHeard, after.WakeupsHeard)
	}
	t.Logf("with its subscription lost, b's wait ended %v after a's load (by a poll)", took.Round(time.Millisecond))

	// The wake-up connection killed.
	ids := pubsubClients(t, admin, p, "k2")
	d.gate = nil
	took = wait("k2", func() {
		for id := range pubsubClients(t, admin, p, "k2") {
			if !ids[id] { // b's wake-up connection: new since
				if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		eventually(t, 5*time.Second, "the loss to be seen", func() bool {
			return b.t.Stats().WakeupSubscriptionsLost > after.WakeupSubscriptionsLost
		})
	})
	t.Logf("with its connection killed, b's wait ended %v after a's load", took.Round(time.Millisecond))

	// Then a wait is woken again.
	before = b.t.Stats()
	took = wait("k3", func() {})
	if after := b.t.Stats(); after.Wakeups == before.Wakeups || took > time.Second {
		t.Errorf("after the losses: wake-ups %d → %d, the wait ended %v after the load; want a wake-up, within 1s",
			before.Wakeups, after.Wakeups, took)
	}
	for _, k := range []string{"k1", "k2", "k3"} {
		eventually(t, 5*time.Second, "the subscriptions to be dropped", func() bool {
			return subscribers(t, admin, p, k) == 0
		})
	}
}

// A storm: 3 processes, 20 goroutines each, Get the same 50 keys at once,
// each Get with a deadline. Every key is loaded once for the fleet, every
// Get returns its value, and no subscription outlives the storm.
func TestWakeupStorm(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	p := testPrefix(t, admin)
	d := newDownstream()
	d.delay = 50 * time.Millisecond
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	to := Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: 6 * time.Second, PollInterval: 2 * time.Second}
	procs := []proc{newProc(t, addr, p, lo, to, d), newProc(t, addr, p, lo, to, d), newProc(t, addr, p, lo, to, d)}
	keys := keyRange("s", 0, 50)

	var wg sync.WaitGroup
	errs := make(chan error, 3*20)
	for _, pr := range procs {
		for g := range 20 {
			wg.Go(func() {
				c, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				for i := range keys {
					k := keys[(i+g)%len(keys)]
					v, err := pr.l.Get(c, k)
					if err != nil || !strings.HasPrefix(v, k+"-v") {
						errs <- fmt.Errorf("Get(%s) = %q, %v", k, v, err)
						return
					}
				}
			})
		}
	}
	waitAll(t, &wg, time.Minute, "end of the Gets")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := d.calls.Load(); n != int64(len(keys)) {
		t.Errorf("downstream calls = %d; want %d, one per key", n, len(keys))
	}
	var waits, subs, heard, wakeups, polls uint64
	for _, pr := range procs {
		s := pr.t.Stats()
		waits, subs, heard, wakeups, polls = waits+s.Waits, subs+s.WakeupSubscribes, heard+s.WakeupsHeard, wakeups+s.Wakeups, polls+s.Polls
		if s.WakeupSubscribes > s.Waits {
			t.Errorf("a process made %d wake-up subscriptions for %d waits; want at most one per wait", s.WakeupSubscribes, s.Waits)
		}
	}
	t.Logf("fleet: %d waits, %d subscriptions, %d wake-ups heard, resumed by %d wake-ups and %d polls", waits, subs, heard, wakeups, polls)
	for _, k := range keys {
		eventually(t, 5*time.Second, "the subscriptions to be dropped", func() bool {
			return subscribers(t, admin, p, k) == 0
		})
	}
}

// The keys of a batch that wait on another process's batch are woken by
// that batch's writes, key by key, long before a poll; a process that
// does not wait on them hears nothing; the subscriptions end with the
// batch.
func TestWakeupsOfABatch(t *testing.T) {
	addr := redisAddr(t)
	admin := newClient(t, addr)
	p := testPrefix(t, admin)
	d := newBatchDownstream()
	d.gate = make(chan struct{})
	lo := flightcache.Options[string, string]{TTL: time.Minute}
	to := slowPolls
	to.Timeout = 2 * time.Second
	a := newBatchProc(t, addr, nil, p, lo, to, d)
	b := newBatchProc(t, addr, nil, p, lo, to, d)
	c := newBatchProc(t, addr, nil, p, lo, to, newBatchDownstream())
	if _, err := c.l.GetMany(ctx, []string{"x", "y"}); err != nil {
		t.Fatal(err)
	}
	keys := keyRange("b", 0, 10)

	ra := getMany(a, keys)
	waitStarted(t, d, 1)
	rb := getMany(b, keys)
	for _, k := range keys {
		eventually(t, 10*time.Second, "b's batch to wait, subscribed", func() bool {
			return b.t.Stats().Waits == uint64(len(keys)) && subscribers(t, admin, p, k) == 1
		})
	}
	time.Sleep(50 * time.Millisecond) // its look after subscribing
	start := time.Now()
	close(d.gate)
	for _, r := range []<-chan manyResult{ra, rb} {
		select {
		case res := <-r:
			if res.err != nil || len(res.m) != len(keys) {
				t.Fatalf("GetMany = %v, %v; want %d values", res.m, res.err, len(keys))
			}
			for _, k := range keys {
				if res.m[k] != k+"-v1" {
					t.Errorf("GetMany: %s = %q; want %s-v1", k, res.m[k], k)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the batches did not return")
		}
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("b's batch ended %v after a's; want wake-ups, within 1s", el)
	}
	sb, sc := b.t.Stats(), c.t.Stats()
	if sb.Polls != 0 || sb.Wakeups == 0 || sb.WakeupSubscribes != uint64(len(keys)) || sb.WakeupsHeard == 0 {
		t.Errorf("b: Polls %d, Wakeups %d, WakeupSubscribes %d, WakeupsHeard %d; want 0, > 0, %d, > 0",
			sb.Polls, sb.Wakeups, sb.WakeupSubscribes, sb.WakeupsHeard, len(keys))
	}
	if sc.WakeupsHeard != 0 || sc.WakeupSubscribes != 0 {
		t.Errorf("c (other keys) heard %d wake-ups in %d subscriptions; want none", sc.WakeupsHeard, sc.WakeupSubscribes)
	}
	if calls := d.allCalls(); len(calls) != 1 {
		t.Errorf("downstream calls %v; want one batch", calls)
	}
	for _, k := range keys {
		eventually(t, 5*time.Second, "the subscriptions to be dropped", func() bool {
			return subscribers(t, admin, p, k) == 0
		})
	}
}

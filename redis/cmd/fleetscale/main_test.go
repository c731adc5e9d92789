package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTarget returns the Redis the module's tests use (redis/main_test.go):
// REDIS_CLUSTER when set, else REDIS_ADDR; without either the test is
// skipped, except under CI, where a missing Redis fails it.
func testTarget(t *testing.T) target {
	t.Helper()
	if addrs := os.Getenv("REDIS_CLUSTER"); addrs != "" {
		return target{cluster: strings.Split(addrs, ",")}
	}
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("REDIS_ADDR is not set: CI must start a Redis (redis/testdata/start-redis.sh)")
		}
		t.Skip("REDIS_ADDR is not set: start one with redis/testdata/start-redis.sh to run this test")
	}
	return target{addr: addr}
}

// runRow runs the benchmark for cfg's one P, logs its table and returns
// its row.
func runRow(t *testing.T, cfg config) row {
	t.Helper()
	var out bytes.Buffer
	rows, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	return rows[0]
}

// TestBroadcastRow runs the benchmark tiny (P = 5, 1s) in broadcast mode,
// whose light processes listen as a tier of before did, on
// <Prefix>loaded and <Prefix>invalidated: the tier of now publishes
// nothing there (its wake-ups are per key, its invalidations tracked),
// so they hear nothing, and neither does a real tier. The row is
// otherwise sane: the real tiers track, the holders' drops are timed,
// and the tier still calls the downstream once per cold key.
//
// A run whose tiers lost Redis for a moment (a loaded machine: a round
// trip past the Timeout) may time no drop in its one second, their copies
// distrusted or loaded aside; it runs again, up to three times. A run
// with no Redis error and no local load must time drops the first time.
func TestBroadcastRow(t *testing.T) {
	cfg := config{tgt: testTarget(t), procs: []int{5}, mode: "broadcast", real: 3, keys: 200,
		writes: 100, loads: 100, entries: 200, dur: time.Second}
	r := runRow(t, cfg)
	for run := 2; r.dropN == 0 && (r.redisErrors > 0 || r.localLoads > 0) && run <= 3; run++ {
		t.Logf("run %d: no drop timed, with %d Redis errors and %d local loads in the run before", run, r.redisErrors, r.localLoads)
		r = runRow(t, cfg)
	}
	if r.procs != 5 || r.real != 3 || r.light != 2 {
		t.Errorf("P = %d (%d real + %d light); want 5 (3 + 2)", r.procs, r.real, r.light)
	}
	if r.lightMean != 0 || r.broadcasts != 0 {
		t.Errorf("broadcast listeners heard %v msgs/s, a real tier %v wake-up broadcasts/s; want none", r.lightMean, r.broadcasts)
	}
	if r.realHeard <= 0 || !strings.HasPrefix(r.tiers, "tracking;") {
		t.Errorf("real tiers heard %v msgs/s, invalidations by %q; want some, tracking", r.realHeard, r.tiers)
	}
	checkColdCalls(t, r)
	if r.dropN == 0 || r.drop[2] <= 0 {
		t.Errorf("Invalidate→drop timed %d writes, p99 %v; want some, > 0", r.dropN, r.drop[2])
	}
	if r.lightLost != 0 {
		t.Errorf("%d light connections lost; want 0", r.lightLost)
	}
}

// checkColdCalls checks what the downstream saw of the cold keys against
// what the real tiers counted. One call per key is the tier's promise: a
// lease, the other processes waiting for it. On a machine loaded enough
// for a round trip to outlast the tier's Timeout, a process steps aside
// and loads for itself (a local load), a holder too slow to prove it is
// alive has its lease taken over, and a holder whose write failed leaves
// the key to another lease: each is one call more, counted, and nothing
// else is.
func checkColdCalls(t *testing.T, r row) {
	t.Helper()
	if r.coldKeys == 0 {
		t.Fatalf("no cold key loaded")
	}
	t.Logf("cold keys: %d, %d downstream calls; the real tiers' leases %d (takeovers %d), local loads %d, Redis errors %d",
		r.coldKeys, r.coldCalls, r.leases, r.takeovers, r.localLoads, r.redisErrors)
	if uint64(r.coldCalls) != r.leases+r.localLoads {
		t.Errorf("%d downstream calls of cold keys; want the real tiers' %d leases + %d local loads", r.coldCalls, r.leases, r.localLoads)
	}
	if r.leases > uint64(r.coldKeys)+r.takeovers+r.redisErrors {
		t.Errorf("%d leases of %d cold keys with %d takeovers and %d Redis errors; want at most one per key, plus those", r.leases, r.coldKeys, r.takeovers, r.redisErrors)
	}
	if r.localLoads == 0 && r.takeovers == 0 && r.redisErrors == 0 && (r.coldCalls != r.coldKeys || r.mostPerCold != 1) {
		t.Errorf("%d downstream calls of %d cold keys (most %d), none loaded locally or taken over; want one per key", r.coldCalls, r.coldKeys, r.mostPerCold)
	}
}

// TestMatcherSplitReads feeds the matcher a stream of messages cut at
// every possible place and checks each is counted once.
func TestMatcherSplitReads(t *testing.T) {
	push := func(ch, payload string) string { return ">3\r\n" + bulk("message") + bulk(ch) + bulk(payload) }
	stream := "*3\r\n" + bulk("subscribe") + bulk("p:loaded") + ":1\r\n" +
		push("p:loaded", "k1") + push("p:invalidated", "x") + push("p:loaded", "p:loaded") + push("other", "y")
	for cut := range len(stream) {
		m := newMatcher("message", "subscribe", "p:loaded", "p:invalidated")
		c := &counts{msgs: make([]atomic.Int64, 2)}
		m.feed([]byte(stream[:cut]), c)
		m.feed([]byte(stream[cut:]), c)
		if l, i, a := c.msgs[0].Load(), c.msgs[1].Load(), c.acks.Load(); l != 2 || i != 1 || a != 1 {
			t.Fatalf("cut at %d: loaded %d, invalidated %d, acks %d; want 2, 1, 1", cut, l, i, a)
		}
	}
}

// TestTrackingRow runs the benchmark tiny in tracking mode: a light
// process hears the writes of the keys it holds, about entries/keys of
// them, not every message of the fleet, and Redis's tracking table grows
// by the keys the light processes read.
func TestTrackingRow(t *testing.T) {
	cfg := config{tgt: testTarget(t), procs: []int{6}, mode: "tracking", real: 3,
		writes: 400, loads: 50, entries: 100, keys: 1000, dur: 2 * time.Second}
	r := runRow(t, cfg)
	// Each light process holds 100 of the 1,000 keys, and the writes go
	// over all of them: about a tenth of the writes reach it (fewer when
	// a loaded machine delays them past the run's end), never all.
	want := r.writes * float64(cfg.entries) / float64(cfg.keys)
	if r.lightMean <= 0 || r.lightMean > 3*want {
		t.Errorf("light processes heard %.1f msgs/s at %.0f writes/s; want about %.1f, and some", r.lightMean, r.writes, want)
	}
	if r.lightLost != 0 {
		t.Errorf("%d light connections lost; want 0", r.lightLost)
	}
	if r.tracking == "—" {
		t.Errorf("tracking memory not measured")
	}
	checkColdCalls(t, r)
}

// TestSlotOf checks the slot arithmetic against CLUSTER KEYSLOT's answers
// for names with and without hash tags, and that the sharded channels
// fall one in each sixteenth of the slots.
func TestSlotOf(t *testing.T) {
	for name, want := range map[string]int{"foo": 12182, "bar": 5061, "{foo}:v": 12182, "p{}x": slotOf("p{}x"), "{a}{b}": slotOf("a")} {
		if got := slotOf(name); got != want {
			t.Errorf("slotOf(%q) = %d; want %d", name, got, want)
		}
	}
	seen := map[int]bool{}
	for _, ch := range shardNames("p:") {
		seen[slotOf(ch)*invShards/16384] = true
	}
	if len(seen) != invShards {
		t.Errorf("the sharded channels fall in %d sixteenths of the slots; want %d", len(seen), invShards)
	}
}

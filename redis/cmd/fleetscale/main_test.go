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

// TestBroadcastRow runs the benchmark tiny (P = 5, 1s) in broadcast mode
// and checks that its row is sane: every process hears the fleet's
// messages, the light ones as the real ones, the holders' drops are
// timed, and the tier still calls the downstream once per cold key.
func TestBroadcastRow(t *testing.T) {
	cfg := config{tgt: testTarget(t), procs: []int{5}, mode: "broadcast", real: 3,
		writes: 100, loads: 100, entries: 200, dur: time.Second}
	var out bytes.Buffer
	rows, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	r := rows[0]
	if r.procs != 5 || r.real != 3 || r.light != 2 {
		t.Errorf("P = %d (%d real + %d light); want 5 (3 + 2)", r.procs, r.real, r.light)
	}
	// The tier hears a key's wake-ups only while it waits on the key
	// (flightredis's per-key wake-up channels): none is a fair count.
	if r.realHeard <= 0 || r.lightMean <= 0 || r.wakeups < 0 {
		t.Errorf("heard per process per second: real %v, light %v, wake-ups %v; want > 0, > 0, >= 0", r.realHeard, r.lightMean, r.wakeups)
	}
	// Every listener hears every message: a light one hears what a real
	// one does, give or take the messages in flight at either end.
	if r.lightMean < r.realHeard/2 || r.lightMean > 2*r.realHeard {
		t.Errorf("light processes heard %v msgs/s, real ones %v; want about the same", r.lightMean, r.realHeard)
	}
	if r.coldKeys == 0 || r.callsPerCold != 1 || r.mostPerCold != 1 {
		t.Errorf("downstream calls per cold key = %v (most %d) over %d keys; want 1 (1), keys > 0", r.callsPerCold, r.mostPerCold, r.coldKeys)
	}
	if r.dropN == 0 || r.drop[2] <= 0 {
		t.Errorf("Invalidate→drop timed %d writes, p99 %v; want some, > 0", r.dropN, r.drop[2])
	}
	if r.lightLost != 0 {
		t.Errorf("%d light connections lost; want 0", r.lightLost)
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

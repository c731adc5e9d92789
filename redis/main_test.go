package flightredis

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// childEnv selects a child role when the test binary is re-executed by a
// multi-process test (fleet_test.go); the child runs that role, not tests.
const childEnv = "FLIGHTREDIS_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m)
}

// The suite runs on one Redis node (REDIS_ADDR, started by
// testdata/start-redis.sh) or on a Redis Cluster (REDIS_CLUSTER, the
// comma-separated addresses of its nodes, started by
// testdata/start-cluster.sh). REDIS_CLUSTER wins when both are set. On a
// cluster every client the tests build is a *redis.ClusterClient; the few
// tests that need a single server skip (see singleNodeOnly), and
// cluster_test.go moves slots and fails masters over.

// redisAddr returns the address of the Redis the tests use: REDIS_CLUSTER
// when set (several addresses, comma-separated), else REDIS_ADDR. Without
// either the test is skipped, except under CI (CI=true), where a missing
// Redis fails the run.
func redisAddr(t testing.TB) string {
	t.Helper()
	if addrs := os.Getenv("REDIS_CLUSTER"); addrs != "" {
		return addrs
	}
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("REDIS_ADDR is not set: CI must start a Redis (redis/testdata/start-redis.sh)")
		}
		t.Skip("REDIS_ADDR is not set: start one with redis/testdata/start-redis.sh to run this test")
	}
	return addr
}

// onCluster reports whether the suite runs on the Redis Cluster of
// REDIS_CLUSTER.
func onCluster() bool { return os.Getenv("REDIS_CLUSTER") != "" }

// singleNodeOnly skips a test that cannot run on a Redis Cluster, saying
// why, when the suite runs on one. Such a test runs in the single-node
// pass.
func singleNodeOnly(t testing.TB, why string) {
	t.Helper()
	if onCluster() {
		t.Skip("single-node only (REDIS_CLUSTER is set): " + why)
	}
}

// newClient returns a client for addr that the test closes when it ends:
// a *redis.ClusterClient when addr is the cluster's (see isCluster), a
// *redis.Client otherwise.
func newClient(t testing.TB, addr string) redis.UniversalClient {
	t.Helper()
	c := dial(addr)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// dial returns a client for addr, as newClient does, that the caller
// closes: child processes (fleet_test.go) use it too.
func dial(addr string) redis.UniversalClient {
	if isCluster(addr) {
		return redis.NewClusterClient(clusterOptions(addr))
	}
	return redis.NewClient(clientOptions(addr))
}

// isCluster reports whether addr names a Redis Cluster: several addresses,
// comma-separated, or the value of REDIS_CLUSTER.
func isCluster(addr string) bool {
	return strings.Contains(addr, ",") || (addr != "" && addr == os.Getenv("REDIS_CLUSTER"))
}

func clientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // a failed round trip falls back at once; the tier retries later
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second, // bounds what ctx does not: the pub/sub connection's setup
		WriteTimeout:          time.Second,
	}
}

// clusterOptions are clientOptions for the cluster whose nodes addrs lists
// (comma-separated; any one of them would do as a seed), plus what a
// Cluster needs for the tier to ride through slot migrations and
// failovers (cluster_test.go measures both):
//
//   - MaxRedirects 16 and MaxRetryBackoff 100ms: while a slot migrates,
//     the tier's scripts (several keys of one slot) get TRYAGAIN, which
//     go-redis retries after a backoff; with its defaults (3 attempts
//     after the first, a backoff of 10ms plus up to 20, 40 then 80ms) it
//     gives up within 30 to 170ms, and the tier steps aside. These retry
//     every 100ms or less until the tier's Timeout ends them (16 attempts,
//     ASK redirects included, last about 1.4s at most);
//   - ClusterStateReloadInterval 1s: go-redis reloads its slot map on a
//     MOVED or ASK reply, but a dead master answers nothing, so after a
//     failover the client keeps sending its slots there until the next
//     periodic reload (60s by default). redis.UniversalOptions has no such
//     field (go-redis v9.23.0): build the client with NewClusterClient.
func clusterOptions(addrs string) *redis.ClusterOptions {
	o := clientOptions("")
	return &redis.ClusterOptions{
		Addrs:                      strings.Split(addrs, ","),
		MaxRedirects:               16,
		MaxRetryBackoff:            100 * time.Millisecond,
		ClusterStateReloadInterval: time.Second,
		ContextTimeoutEnabled:      o.ContextTimeoutEnabled,
		MaxRetries:                 o.MaxRetries,
		DialTimeout:                o.DialTimeout,
		ReadTimeout:                o.ReadTimeout,
		WriteTimeout:               o.WriteTimeout,
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// testPrefix returns a Prefix unique to this test run, and deletes every
// key under it when the test ends.
func testPrefix(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	p := "fctest:" + unsafeChars.ReplaceAllString(t.Name(), "_") + ":" + token(4) + ":"
	t.Cleanup(func() { deletePrefix(c, p) })
	return p
}

// deletePrefix deletes every key under p: on a cluster, on every master.
func deletePrefix(c redis.UniversalClient, p string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = forEachMaster(ctx, c, func(ctx context.Context, node redis.UniversalClient) error {
		// A round trip per page of keys, not per key: a test may leave
		// thousands.
		var cursor uint64
		for {
			page, next, err := node.Scan(ctx, cursor, p+"*", 500).Result()
			if err != nil {
				return err
			}
			if _, err := node.Pipelined(ctx, func(pl redis.Pipeliner) error {
				for _, k := range page {
					pl.Del(ctx, k) // one by one: keys of other slots may not share a DEL
				}
				return nil
			}); err != nil {
				return err
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
}

// forEachMaster calls fn with a client of each master of c's cluster, or
// with c itself when it is not a *redis.ClusterClient; it returns the first
// error.
func forEachMaster(ctx context.Context, c redis.UniversalClient, fn func(context.Context, redis.UniversalClient) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return fn(ctx, node)
		})
	}
	return fn(ctx, c)
}

// loadScripts loads the lease protocol's scripts into c's Redis (every
// master of a cluster), so that a test counting round trips meets no
// NOSCRIPT (the tier sends a script a server lacks once more, with EVAL).
func loadScripts(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	err := forEachMaster(ctx, c, func(ctx context.Context, node redis.UniversalClient) error {
		for _, s := range []*redis.Script{acquireScript, writeScript, releaseScript, notFoundScript} {
			if err := s.Load(ctx, node).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

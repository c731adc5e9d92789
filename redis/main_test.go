package flightredis

import (
	"context"
	"os"
	"regexp"
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

// redisAddr returns the address of the Redis the tests use (REDIS_ADDR).
// Without it the test is skipped, except under CI (CI=true), where a
// missing Redis fails the run.
func redisAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("REDIS_ADDR is not set: CI must start a Redis (redis/testdata/start-redis.sh)")
		}
		t.Skip("REDIS_ADDR is not set: start one with redis/testdata/start-redis.sh to run this test")
	}
	return addr
}

// newClient returns a client for addr that the test closes when it ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(clientOptions(addr))
	t.Cleanup(func() { _ = c.Close() })
	return c
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

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// testPrefix returns a Prefix unique to this test run, and deletes every
// key under it when the test ends.
func testPrefix(t testing.TB, c redis.UniversalClient) string {
	t.Helper()
	p := "fctest:" + unsafeChars.ReplaceAllString(t.Name(), "_") + ":" + token(4) + ":"
	t.Cleanup(func() { deletePrefix(c, p) })
	return p
}

func deletePrefix(c redis.UniversalClient, p string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, p+"*", 100).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

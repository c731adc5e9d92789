package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// target is the Redis the fleet shares: one node, or a Cluster.
type target struct {
	addr    string   // one node's host:port, or ""
	cluster []string // the Cluster's nodes, or nil
}

// client returns a client for the target (a ClusterClient for a
// Cluster), with the options the tier's tests use. dial, if not nil,
// dials its connections.
func (t target) client(dial func(ctx context.Context, network, addr string) (net.Conn, error)) redis.UniversalClient {
	if t.cluster != nil {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                      t.cluster,
			Dialer:                     dial,
			ContextTimeoutEnabled:      true,
			MaxRetries:                 -1,
			ReadTimeout:                time.Second,
			WriteTimeout:               time.Second,
			MaxRedirects:               16,
			MaxRetryBackoff:            100 * time.Millisecond,
			ClusterStateReloadInterval: time.Second,
		})
	}
	return redis.NewClient(&redis.Options{
		Addr:                  t.addr,
		Dialer:                dial,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
	})
}

func (t target) String() string {
	if t.cluster != nil {
		return fmt.Sprintf("a Redis Cluster (seeds %s)", strings.Join(t.cluster, ","))
	}
	return "one Redis node at " + t.addr
}

// nodeStats is what one Redis node says of itself at one moment.
type nodeStats struct {
	master     bool
	cpu        float64 // seconds of CPU: main thread's, or the process's (mainThread false)
	mainThread bool    // cpu is used_cpu_{sys,user}_main_thread
	busPublish int64   // cluster_stats_messages_publish_sent; -1 when not a cluster node
	usedMemory int64   // used_memory
	tracking   int64   // tracking_total_keys
}

// snapshot reads every node's stats, keyed by address: every master and
// every replica of a Cluster, or the one node.
func snapshot(ctx context.Context, rdb redis.UniversalClient) (map[string]nodeStats, error) {
	out := map[string]nodeStats{}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		c := rdb.(*redis.Client)
		s, err := readNode(ctx, c, true)
		out[c.Options().Addr] = s
		return out, err
	}
	var mu sync.Mutex // ForEachMaster and ForEachSlave call fn concurrently
	read := func(master bool) func(context.Context, *redis.Client) error {
		return func(ctx context.Context, c *redis.Client) error {
			s, err := readNode(ctx, c, master)
			mu.Lock()
			out[c.Options().Addr] = s
			mu.Unlock()
			return err
		}
	}
	if err := cc.ForEachMaster(ctx, read(true)); err != nil {
		return nil, err
	}
	if err := cc.ForEachSlave(ctx, read(false)); err != nil {
		return nil, err
	}
	return out, nil
}

// readNode reads one node's INFO cpu, memory and stats, and its CLUSTER
// INFO.
func readNode(ctx context.Context, c *redis.Client, master bool) (nodeStats, error) {
	s := nodeStats{master: master, busPublish: -1}
	txt, err := c.Info(ctx, "cpu", "memory", "stats").Result()
	if err != nil {
		return s, err
	}
	f := fields(txt)
	if _, ok := f["used_cpu_sys_main_thread"]; ok {
		s.mainThread = true
		s.cpu = num(f["used_cpu_sys_main_thread"]) + num(f["used_cpu_user_main_thread"])
	} else {
		s.cpu = num(f["used_cpu_sys"]) + num(f["used_cpu_user"])
	}
	s.usedMemory = int64(num(f["used_memory"]))
	s.tracking = int64(num(f["tracking_total_keys"]))
	if ci, err := c.ClusterInfo(ctx).Result(); err == nil {
		// A message type never sent is not listed: 0.
		s.busPublish = int64(num(fields(ci)["cluster_stats_messages_publish_sent"]))
	}
	return s, nil
}

// fields parses the "name:value" lines of an INFO reply.
func fields(info string) map[string]string {
	f := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	return f
}

func num(s string) float64 {
	v, _ := strconv.ParseFloat(s, 64)
	return v
}

// masters returns the masters' addresses of a snapshot, sorted.
func masters(s map[string]nodeStats) []string {
	var as []string
	for a, n := range s {
		if n.master {
			as = append(as, a)
		}
	}
	slices.Sort(as)
	return as
}

// subscriptionNode returns the address of the node that go-redis
// subscribes to channel on: the master of its slot on a Cluster
// (ClusterClient.MasterForKey computes the same slot as pubSub's
// newConn), the one node otherwise.
func subscriptionNode(ctx context.Context, rdb redis.UniversalClient, channel string) (string, error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		c, err := cc.MasterForKey(ctx, channel)
		if err != nil {
			return "", err
		}
		return c.Options().Addr, nil
	}
	return rdb.(*redis.Client).Options().Addr, nil
}

// deletePrefix deletes every key under prefix, on every master.
func deletePrefix(ctx context.Context, rdb redis.UniversalClient, prefix string) {
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		p := c.Pipeline()
		for iter.Next(ctx) {
			p.Unlink(ctx, iter.Val())
			if p.Len() >= 500 {
				_, _ = p.Exec(ctx)
			}
		}
		_, _ = p.Exec(ctx)
		return iter.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, del)
		return
	}
	_ = del(ctx, rdb.(*redis.Client))
}

package flightredis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/redis/go-redis/v9"
)

// trackedConns returns the CLIENT IDs of the connections of the Redis
// node admin speaks to that redirect their tracking to the connection of
// id inv: a node's tracked connections.
func trackedConns(t *testing.T, admin *redis.Client, inv int64) []int64 {
	t.Helper()
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for line := range strings.Lines(list) {
		var id, redir int64 = -1, -1
		for f := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				id, _ = strconv.ParseInt(v, 10, 64)
			case "redir":
				redir, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if redir == inv && id >= 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// nodesOf returns a tier's nodes (one per master), by address.
func nodesOf(tier *Tier[string, string]) map[string]*track.Node {
	return tier.track.Nodes()
}

// A process has one tracked connection per master, as the docs say, however
// many of its Gets read at once: after 50 concurrent Gets of cold keys,
// each master holds exactly one connection redirecting to the process's
// invalidation connection there, and CLIENT TRACKINGINFO on the tracked
// client (the health check's) names that redirect.
func TestTrackedConnectionOnePerMaster(t *testing.T) {
	ps, _ := trackingProcs(t, 1, Options[string, string]{Timeout: 2 * time.Second, HolderTimeout: 6 * time.Second})
	p := ps[0]
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if _, err := p.l.Get(c, fmt.Sprint("k", i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s := p.t.Stats(); s.TrackedReads < 50 {
		t.Fatalf("TrackedReads = %d, want >= 50", s.TrackedReads)
	}
	nodes := nodesOf(p.t)
	if len(nodes) == 0 {
		t.Fatal("no node")
	}
	for addr, n := range nodes {
		if got := trackedConns(t, nodeClient(t, addr), n.ID()); len(got) != 1 {
			t.Errorf("master %s: %d tracked connections of the process (ids %v), want 1", addr, len(got), got)
		}
		res, err := n.Reads().Do(ctx, "CLIENT", "TRACKINGINFO").Slice()
		if err != nil || track.TrackingBroken(res, n.ID()) {
			t.Errorf("master %s: CLIENT TRACKINGINFO %v, %v; want tracking on, redirecting to %d", addr, res, err, n.ID())
		}
	}
}

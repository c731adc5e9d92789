package flightredis

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/track"
	"github.com/redis/go-redis/v9"
)

// notServedOld waits until holder no longer answers k with old as a fresh
// hit, and returns how long after since that was; it fails after d.
func notServedOld(t *testing.T, holder proc, k, old string, since time.Time, d time.Duration) time.Duration {
	t.Helper()
	eventually(t, d, "the holder to stop serving its old copy as a hit", func() bool {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		v, info, err := holder.l.GetInfo(c, k)
		return err == nil && !(v == old && info.Source == flightcache.SourceHit)
	})
	return time.Since(since)
}

// A tracked connection killed (CLIENT KILL by its ID, or of every normal
// connection) takes with it what Redis tracked for the process: the
// holder distrusts every copy it tracked, and another process's Set then
// reaches it. The time from the kill to the distrust is logged: the next
// health check (every max(4 × Timeout, 500ms), 1s here) finds the
// connection closed.
func TestTrackedConnectionKilled(t *testing.T) {
	for _, by := range []string{"ID", "TYPE normal"} {
		t.Run(strings.ReplaceAll(by, " ", "_"), func(t *testing.T) {
			ps, _ := trackingProcs(t, 2, Options[string, string]{})
			writer, holder := ps[0], ps[1]
			old, err := holder.l.Get(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			n, addr := invNode(t, holder.t, "k")
			admin := nodeClient(t, addr)
			ids := trackedConns(t, admin, n.ID())
			if len(ids) == 0 {
				t.Fatal("the holder has no tracked connection")
			}
			distrusts := holder.t.Stats().Distrusts
			killed := time.Now()
			if by == "ID" {
				for _, id := range ids {
					if err := admin.ClientKillByFilter(ctx, "ID", fmt.Sprint(id)).Err(); err != nil {
						t.Fatal(err)
					}
				}
			} else if err := admin.ClientKillByFilter(ctx, "TYPE", "normal").Err(); err != nil {
				t.Fatal(err)
			}
			writer.l.Set("k", "new")
			took := notServedOld(t, holder, "k", old, killed, 10*time.Second)
			eventually(t, 10*time.Second, "the distrust", func() bool { return holder.t.Stats().Distrusts > distrusts })
			t.Logf("killed %d tracked connection(s); the old copy stopped answering %v after the kill; holder %+v",
				len(ids), took, holder.t.Stats())
			if v, _ := holder.l.Get(ctx, "k"); v == old {
				t.Fatalf("after the distrust: %q, the old value", v)
			}
			checkTracks(t, writer, holder)
		})
	}
}

// checkTracks checks that the holder hears the writer's Sets again: a
// tracked read, a Set, the holder's drop.
func checkTracks(t *testing.T, writer, holder proc) {
	t.Helper()
	eventually(t, 10*time.Second, "the holder to listen", func() bool { return holder.t.Stats().Listening })
	for round := 1; ; round++ {
		failures := writer.t.Stats().RedisErrors + holder.t.Stats().RedisErrors
		holder.l.Get(ctx, "j")
		drops := holder.l.Stats().RemoteDrops
		want := fmt.Sprint("j-set-", round)
		writer.l.Set("j", want)
		heard := holds(5*time.Second, func() bool { return holder.l.Stats().RemoteDrops > drops })
		if v, _ := holder.l.Get(ctx, "j"); heard && v == want {
			return
		}
		if writer.t.Stats().RedisErrors+holder.t.Stats().RedisErrors == failures || round == 5 {
			t.Fatalf("round %d: the holder did not hear the Set of j (heard %v); holder %+v", round, heard, holder.t.Stats())
		}
	}
}

// Redis's idle timeout closes a tracked connection between two health
// checks: the holder distrusts what it tracked, and another process's Set
// reaches it. The tiers' Timeout of 1s makes the health check run every
// 4s, so the tracked connection idles past Redis's timeout of 1s; the
// invalidation connection, subscribed, is exempt from it.
func TestTrackedConnectionIdleTimeout(t *testing.T) {
	ps, _ := trackingProcs(t, 2, Options[string, string]{Timeout: time.Second, HolderTimeout: 3 * time.Second})
	writer, holder := ps[0], ps[1]
	old, err := holder.l.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	n, addr := invNode(t, holder.t, "k")
	admin := nodeClient(t, addr)
	ids := trackedConns(t, admin, n.ID())
	if len(ids) == 0 {
		t.Fatal("the holder has no tracked connection")
	}
	was, err := admin.ConfigGet(ctx, "timeout").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "timeout", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.ConfigSet(context.Background(), "timeout", was["timeout"]).Err() })
	eventually(t, 10*time.Second, "Redis to close the idle tracked connections", func() bool {
		now := trackedConns(t, admin, n.ID())
		return !slices.ContainsFunc(ids, func(id int64) bool { return slices.Contains(now, id) })
	})
	closed := time.Now()
	writer.l.Set("k", "new")
	took := notServedOld(t, holder, "k", old, closed, 20*time.Second)
	t.Logf("the old copy stopped answering %v after Redis closed its connection; holder %+v", took, holder.t.Stats())
	if s := holder.t.Stats(); s.TrackedConnsLost == 0 || s.Distrusts == 0 {
		t.Fatalf("TrackedConnsLost %d, Distrusts %d; want > 0", s.TrackedConnsLost, s.Distrusts)
	}
}

// A tracked client's connection reports its close once, whoever closes it,
// if it carried a tracked read (CLIENT CACHING yes): one that only armed
// tracking, or answered the health check, tracked nothing. A TCP
// connection keeps its file descriptor visible, which go-redis peeks at to
// find a connection Redis closed.
func TestWatchedConnectionReportsClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	for _, tc := range []struct {
		name   string
		writes []string
		lost   int
	}{
		{"nothing tracked", []string{"*5\r\n$6\r\nCLIENT\r\n$8\r\nTRACKING\r\n$2\r\non\r\n", "*2\r\n$6\r\nCLIENT\r\n$12\r\nTRACKINGINFO\r\n"}, 0},
		{"a tracked read", []string{"*3\r\n$6\r\nCLIENT\r\n$7\r\nCACHING\r\n$3\r\nyes\r\n*3\r\n$5\r\nHMGET\r\n$1\r\nk\r\n$2\r\nid\r\n"}, 1},
	} {
		var lost atomic.Int32
		dial := track.WatchDialer(&redis.Options{Addr: ln.Addr().String()}, func() { lost.Add(1) })
		cn, err := dial(ctx, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := cn.(syscall.Conn); !ok {
			t.Errorf("%s: the connection hides its file descriptor", tc.name)
		}
		for _, w := range tc.writes {
			if _, err := cn.Write([]byte(w)); err != nil {
				t.Fatal(err)
			}
		}
		_ = cn.Close()
		_ = cn.Close()
		if n := int(lost.Load()); n != tc.lost {
			t.Errorf("%s: lost reported %d times, want %d", tc.name, n, tc.lost)
		}
	}
}

// A listener whose backlog is full drops the copy it cannot queue for a
// check: an invalidation is never set aside. The checker is held in a
// round trip (every master paused, for less than the tier's Timeout), the
// backlog of checks filled, and an invalidation of a copy handed over
// within the echo window (which would be checked) comes: the copy is
// dropped at once.
func TestTrackingFullBacklogDropsCopy(t *testing.T) {
	ps, _ := trackingProcs(t, 1, Options[string, string]{Timeout: 5 * time.Second, HolderTimeout: 15 * time.Second})
	holder := ps[0]
	for _, k := range []string{"k", "blocker"} {
		if _, err := holder.l.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	ksOf := func(k string) keys { return keysAt(holder.t.opts.Prefix, holder.t.key(k), holder.t.gen.Load()) }
	admin := newClient(t, redisAddr(t))
	err := forEachMaster(ctx, admin, func(ctx context.Context, n redis.UniversalClient) error {
		return n.Do(ctx, "CLIENT", "PAUSE", 2000, "ALL").Err() // it ends by itself: an UNPAUSE would wait for it
	})
	if err != nil {
		t.Fatal(err)
	}

	holder.t.copies.verify("blocker", ksOf("blocker")) // the checker takes it, and waits for Redis
	eventually(t, time.Second, "the checker to take its check", func() bool { return len(holder.t.copies.checks) == 0 })
	for i := 0; ; i++ {
		select {
		case holder.t.copies.checks <- check[string]{fmt.Sprint("filler", i), ksOf(fmt.Sprint("filler", i))}:
			continue
		default:
		}
		break
	}
	if n, c := len(holder.t.copies.checks), cap(holder.t.copies.checks); n != c {
		t.Fatalf("backlog %d of %d: not full", n, c)
	}
	drops := holder.l.Stats().RemoteDrops
	holder.t.onTracked([]string{ksOf("k").entry}) // the listener hears k's entry changed
	if got := holder.l.Stats().RemoteDrops - drops; got != 1 {
		t.Fatalf("RemoteDrops +%d with the backlog full, want +1: the invalidation was set aside", got)
	}
	if got := len(holder.t.copies.checks); got != cap(holder.t.copies.checks) {
		t.Fatalf("backlog %d after the invalidation, want %d (full)", got, cap(holder.t.copies.checks))
	}
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, info, err := holder.l.GetInfo(c, "k"); err != nil || info.Source == flightcache.SourceHit {
		t.Fatalf("after the drop: %v, %v; want the entry read again, not a hit", info.Source, err)
	}
}

// A SWAPDB swaps the contents of two databases under the names Redis
// tracks and sends no invalidation: the next health check finds Redis's
// count of SWAPDB calls changed and distrusts every copy, as a FLUSHDB
// does. The test swaps database 0 with an empty one and back at once, so
// that the other tests' keys stay where they are.
func TestTrackingSwapDBDistrusts(t *testing.T) {
	singleNodeOnly(t, "a Cluster has one database")
	ps, _ := trackingProcs(t, 1, Options[string, string]{})
	p := ps[0]
	if _, err := p.l.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	before := p.t.Stats().Distrusts
	admin := nodeClient(t, redisAddr(t))
	if _, err := admin.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.SwapDB(ctx, 0, 14)
		pl.SwapDB(ctx, 0, 14)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the distrust", func() bool { return p.t.Stats().Distrusts > before })
	if _, info, _ := p.l.GetInfo(ctx, "k"); info.Source == flightcache.SourceHit {
		t.Fatal("a distrusted copy was served without being read again")
	}
}

// swapdbCalls reads INFO commandstats as Redis 7 writes it.
func TestSwapdbCalls(t *testing.T) {
	for _, tc := range []struct {
		info string
		want int64
	}{
		{"# Commandstats\r\ncmdstat_get:calls=5,usec=1\r\n", 0},
		{"# Commandstats\r\ncmdstat_swapdb:calls=3,usec=10,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n", 3},
		{"cmdstat_swapdb:calls=x,usec=1\r\n", -1},
	} {
		if got := track.SwapdbCalls(tc.info); got != tc.want {
			t.Errorf("swapdbCalls(%q) = %d, want %d", tc.info, got, tc.want)
		}
	}
}

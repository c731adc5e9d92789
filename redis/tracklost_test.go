package flightredis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
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
			ids := trackedConns(t, admin, n.id.Load())
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

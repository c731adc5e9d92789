package track

import (
	"context"
	"sync"

	"github.com/flightcache/flightcache/redis/internal/listen"
	"github.com/redis/go-redis/v9"
)

// ReadMany reads fields of entries tracked (CLIENT CACHING yes, then
// HMGET): one pipeline per master, at once. ok is false when one of them
// could not be tracked; the caller then reads them all untracked.
func (tr *Tracker) ReadMany(ctx context.Context, entries, fields []string) (cmds []*redis.SliceCmd, ok bool) {
	byNode := make(map[*redis.Client][]int)
	for i, e := range entries {
		rc := tr.reader(ctx, e)
		if rc == nil {
			return nil, false
		}
		byNode[rc] = append(byNode[rc], i)
	}
	c, cancel := context.WithTimeout(ctx, tr.h.Timeout)
	defer cancel()
	cmds = make([]*redis.SliceCmd, len(entries))
	caching := make([]*redis.Cmd, len(entries))
	var wg sync.WaitGroup
	for rc, idx := range byNode {
		wg.Go(func() {
			_, _ = rc.Pipelined(c, func(p redis.Pipeliner) error {
				for _, i := range idx {
					caching[i] = p.Do(c, "CLIENT", "CACHING", "yes")
					cmds[i] = p.HMGet(c, entries[i], fields...)
				}
				return nil
			})
		})
	}
	wg.Wait()
	if !tr.allTracked(cmds, caching) {
		return nil, false
	}
	tr.reads.Add(uint64(len(entries)))
	for _, e := range entries {
		tr.Echoes.Tracked(e)
	}
	return cmds, true
}

// allTracked reports whether every read of cmds was tracked (caching, its
// CLIENT CACHING yes, answered) on the node of its key; a MOVED has a
// Cluster client reload its hash slot map.
func (tr *Tracker) allTracked(cmds []*redis.SliceCmd, caching []*redis.Cmd) bool {
	for i, cmd := range cmds {
		if listen.Moved(cmd.Err()) && tr.cluster != nil {
			tr.cluster.ReloadState(tr.ctx)
		}
		if listen.Moved(cmd.Err()) || (cmd.Err() == nil && caching[i].Err() != nil) {
			return false // read, but not tracked
		}
	}
	return true
}

// ReadID reads the id of entry tracked ([CLIENT CACHING yes, HGET entry
// id] on its master's tracked client). ok is false when it could not be
// tracked.
func (tr *Tracker) ReadID(ctx context.Context, entry string) (id string, ok bool) {
	rc := tr.reader(ctx, entry)
	if rc == nil {
		return "", false
	}
	var got *redis.StringCmd
	var caching *redis.Cmd
	c, cancel := context.WithTimeout(ctx, tr.h.Timeout)
	_, _ = rc.Pipelined(c, func(p redis.Pipeliner) error {
		caching = p.Do(c, "CLIENT", "CACHING", "yes")
		got = p.HGet(c, entry, "id")
		return nil
	})
	cancel()
	tr.reads.Add(1)
	tr.Echoes.Tracked(entry)
	return got.Val(), caching.Err() == nil
}

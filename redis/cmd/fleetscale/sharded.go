package main

import (
	"context"
	"strconv"
)

// invShards is the number of the tier's sharded invalidation channels
// (flightredis's sharded.go).
const invShards = 16

// sharded listens as a process of a tier whose Redis refuses CLIENT
// TRACKING does: it subscribes to every one of the tier's sharded
// invalidation channels, on the master of each (SSUBSCRIBE on a Cluster,
// one channel a command; SUBSCRIBE to them all on one node), and hears
// every Set and Invalidate of the fleet, spread over the masters.
type sharded struct{}

func (sharded) New(ctx context.Context, fl *fleet) (listener, error) {
	msg, kind, sub := "message", "subscribe", "SUBSCRIBE"
	if fl.slots != nil {
		msg, kind, sub = "smessage", "ssubscribe", "SSUBSCRIBE"
	}
	byNode := map[string][]byte{}
	n := map[string]int64{}
	for _, ch := range shardNames(fl.prefix) {
		node := fl.masterOf(ch)
		byNode[node] = append(byNode[node], command(sub, ch)...)
		n[node]++
	}
	var g group
	for node, cmds := range byNode {
		l, err := dialListener(ctx, node, newRawMatcher(bulk(kind), bulk(msg)), cmds, n[node])
		if err != nil {
			_ = g.Close()
			return nil, err
		}
		g = append(g, l)
	}
	return g, nil
}

// shardNames names the tier's invalidation channels for prefix, as the
// tier does: channel i's hash tag is the first number whose slot falls
// in the i-th of invShards equal ranges of the slots.
func shardNames(prefix string) []string {
	names := make([]string, invShards)
	for n, found := 0, 0; found < invShards; n++ {
		tag := strconv.Itoa(n)
		if i := slotOf(tag) * invShards / 16384; names[i] == "" {
			names[i] = prefix + "inv:{" + tag + "}"
			found++
		}
	}
	return names
}

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/redis/go-redis/v9"
)

// tracking listens as a process of a tier with invalidations by CLIENT
// TRACKING holds its keys: on each master that holds some of its
// entries, one RESP3 connection with CLIENT TRACKING on OPTIN, on which
// it reads each entry once after CLIENT CACHING yes. Redis then pushes
// an invalidation on that connection when one of them changes, and
// nothing else: a light process never loads, so it never waits for a
// wake-up. (The tier redirects its invalidations to a RESP2 connection
// subscribed to __redis__:invalidate; Redis sends one message either
// way.) Each light process holds -entries keys drawn at random from the
// fleet's -keys, so a write reaches the share of the fleet that holds
// its key, as in a fleet whose processes serve different users.
type tracking struct{}

func (tracking) New(ctx context.Context, fl *fleet) (listener, error) {
	rng := rand.New(rand.NewPCG(uint64(fl.lights.Add(1)), 1))
	byNode := map[string][]byte{}
	n := map[string]int64{}
	for _, i := range sample(rng, len(fl.universe), fl.cfg.entries) {
		name := fl.entryName(fl.universe[i])
		node := fl.masterOf(name)
		if n[node] == 0 {
			byNode[node] = append(command("HELLO", "3"), command("CLIENT", "TRACKING", "on", "OPTIN")...)
		}
		byNode[node] = append(byNode[node], command("CLIENT", "CACHING", "yes")...)
		byNode[node] = append(byNode[node], command("HGET", name, "id")...)
		n[node]++
	}
	var g group
	for node, cmds := range byNode {
		m := newRawMatcher("+OK\r\n", bulk("invalidate"))
		l, err := dialListener(ctx, node, m, cmds, 1+n[node])
		if err != nil {
			_ = g.Close()
			return nil, err
		}
		g = append(g, l)
	}
	return g, nil
}

// sample returns k distinct numbers of [0, n), at random.
func sample(rng *rand.Rand, n, k int) []int {
	k = min(k, n)
	seen := make(map[int]struct{}, k)
	out := make([]int, 0, k)
	for len(out) < k {
		i := rng.IntN(n)
		if _, ok := seen[i]; !ok {
			seen[i] = struct{}{}
			out = append(out, i)
		}
	}
	return out
}

// memoryUse is what opening the light processes' listening added to
// Redis: used_memory and tracked keys (tracking_total_keys) per master.
type memoryUse struct {
	bytes, keys map[string]int64
}

func memoryOf(before, after map[string]nodeStats) memoryUse {
	m := memoryUse{bytes: map[string]int64{}, keys: map[string]int64{}}
	for addr, a := range after {
		if a.master {
			m.bytes[addr] = a.usedMemory - before[addr].usedMemory
			m.keys[addr] = a.tracking - before[addr].tracking
		}
	}
	return m
}

// String gives the largest master's growth, and the growth per key and
// light process tracking it (pairs), over the fleet.
func (m memoryUse) String(pairs int64) string {
	var most, sum int64
	for _, b := range m.bytes {
		most = max(most, b)
		sum += b
	}
	if pairs == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f MB max per master, %.0f B per key·process", float64(most)/(1<<20), float64(sum)/float64(pairs))
}

// entryName is the Redis name of key's shared entry (the tier's keysAt,
// generation 0; the fleet's keys need no escaping).
func (fl *fleet) entryName(key string) string {
	return fl.prefix + "{" + key + "}:v"
}

// masterOf returns the address of the master that holds name.
func (fl *fleet) masterOf(name string) string {
	if fl.slots == nil {
		return fl.subNode
	}
	return fl.slots[slotOf(name)]
}

// slotMasters maps every slot of a Cluster to its master's address; nil
// for one node.
func slotMasters(ctx context.Context, rdb redis.UniversalClient) ([]string, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return nil, nil
	}
	ranges, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	slots := make([]string, 16384)
	for _, r := range ranges {
		for s := r.Start; s <= r.End; s++ {
			slots[s] = r.Nodes[0].Addr
		}
	}
	return slots, nil
}

// slotOf is Redis Cluster's slot of a key name: CRC16 (XMODEM) of its
// hash tag, or of the whole name when it has none, mod 16384.
func slotOf(name string) int {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		if j := strings.IndexByte(name[i+1:], '}'); j > 0 {
			name = name[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(name); k++ {
		crc ^= uint16(name[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

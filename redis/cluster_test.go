package flightredis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/flightcache/flightcache/redis/internal/shard"
	"github.com/redis/go-redis/v9"
)

// The tests of this file run on a real Redis Cluster: REDIS_CLUSTER, the
// comma-separated addresses of its nodes as testdata/start-cluster.sh
// prints them (3 masters with one replica each). They skip without it.
// Each changes the cluster's layout while a fleet reads through the tier:
//
//   - TestClusterSlotMove moves the slot of several keys to another master
//     and back, as redis-cli --cluster reshard does (CLUSTER SETSLOT
//     IMPORTING and MIGRATING, MIGRATE in batches of 10 keys, SETSLOT NODE
//     on every master);
//   - TestClusterFailover promotes a master's replica, once with CLUSTER
//     FAILOVER and once by killing the master, then fails back.
//
// The fleet (clusterFleet) is a few simulated processes, each a Loader
// with its own Tier and ClusterClient (clusterOptions: the retries and
// slot-map reloads these tests show a Cluster needs), whose goroutines Get
// a set of keys in turn, a Get every millisecond or so, from a versioned
// downstream: each call for a key returns the key's next version and
// records when it ran. With a short TTL the fleet reloads every key about
// once a second, so loads, leases and writes go on throughout the change.
// The tests assert that no Get fails (the downstream never does: an error
// would be the tier's), that no Get returns a value older than the
// Loader's windows allow, and count the downstream calls made beyond one
// per generation of a key's value.
//
// Each test leaves the cluster as it found it: the slot back on its
// master, the masters back in their roles, and every node healthy.

// clusterAddrs returns REDIS_CLUSTER, or skips the test when it is unset.
func clusterAddrs(t *testing.T) string {
	t.Helper()
	addrs := os.Getenv("REDIS_CLUSTER")
	if addrs == "" {
		t.Skip("REDIS_CLUSTER is not set: start a cluster with redis/testdata/start-cluster.sh to run this test")
	}
	return addrs
}

// keySlot returns the Cluster slot of the Redis key name: the CRC16 of its
// hash tag (what lies between its first '{' and the next '}', if not
// empty), or of the whole name, modulo 16384.
func keySlot(name string) int {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		if j := strings.IndexByte(name[i+1:], '}'); j > 0 {
			name = name[i+1 : i+1+j]
		}
	}
	return int(shard.SlotCRC(name) % 16384)
}

// sameSlotKeys returns n keys whose Redis names (keysFor under prefix)
// share one slot, and that slot: "mv-0" and the next "mv-<i>" in its slot.
func sameSlotKeys(prefix string, n int) ([]string, int) {
	keys := []string{"mv-0"}
	slot := keySlot(keysFor(prefix, keys[0]).base)
	for i := 1; len(keys) < n; i++ {
		if k := fmt.Sprint("mv-", i); keySlot(keysFor(prefix, k).base) == slot {
			keys = append(keys, k)
		}
	}
	return keys, slot
}

// TestKeySlot checks keySlot against Redis Cluster's own CLUSTER KEYSLOT
// and the specification's example (CRC16 of "123456789" is 0x31C3).
func TestKeySlot(t *testing.T) {
	if got := shard.SlotCRC("123456789"); got != 0x31C3 {
		t.Fatalf("shard.SlotCRC(123456789) = %#x; want 0x31c3", got)
	}
	c := newClient(t, clusterAddrs(t))
	keys, _ := sameSlotKeys("p:", 3)
	for _, k := range append(keys, "", "%", "a}b", "{x}", "plain") {
		name := keysFor("p:", k).entry
		want, err := c.ClusterKeySlot(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(name); got != int(want) {
			t.Errorf("keySlot(%q) = %d; CLUSTER KEYSLOT says %d", name, got, want)
		}
	}
}

// nodeInfo is a node as one line of CLUSTER NODES describes it.
type nodeInfo struct {
	id, addr  string
	master    bool     // flags "master"
	failing   bool     // flags "fail" or "fail?"
	connected bool     // link-state "connected"
	masterID  string   // a replica's master
	slots     [][2]int // a master's slot ranges, inclusive
}

// serves reports whether n is a master that serves slot.
func (n nodeInfo) serves(slot int) bool {
	for _, r := range n.slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// parseClusterNodes parses the reply of CLUSTER NODES. Slots in migration
// ("[slot->-id]", "[slot-<-id]") are left out.
func parseClusterNodes(s string) []nodeInfo {
	var ns []nodeInfo
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := nodeInfo{id: f[0], addr: f[1], masterID: f[3], connected: f[7] == "connected"}
		if i := strings.IndexAny(n.addr, "@,"); i >= 0 {
			n.addr = n.addr[:i]
		}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.master = true
			case "fail", "fail?":
				n.failing = true
			}
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		ns = append(ns, n)
	}
	slices.SortFunc(ns, func(a, b nodeInfo) int { return strings.Compare(a.id, b.id) })
	return ns
}

// clusterAdmin is the operator of a test: it reads and changes the
// cluster's layout through a client per node.
type clusterAdmin struct {
	t     *testing.T
	addrs []string // every node, as REDIS_CLUSTER lists them

	mu      sync.Mutex
	clients map[string]*redis.Client // guarded by mu
}

func newClusterAdmin(t *testing.T, addrs string) *clusterAdmin {
	a := &clusterAdmin{t: t, addrs: strings.Split(addrs, ","), clients: map[string]*redis.Client{}}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range a.clients {
			_ = c.Close()
		}
	})
	return a
}

// node returns the client of the node at addr: no retries, and timeouts
// long enough for a MIGRATE.
func (a *clusterAdmin) node(addr string) *redis.Client {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.clients[addr]
	if c == nil {
		o := clientOptions(addr)
		o.ReadTimeout, o.WriteTimeout = 10*time.Second, 10*time.Second
		c = redis.NewClient(o)
		a.clients[addr] = c
	}
	return c
}

// layout returns the cluster's nodes as the first node that answers sees
// them.
func (a *clusterAdmin) layout() ([]nodeInfo, error) {
	var err error
	for _, addr := range a.addrs {
		var s string
		if s, err = a.node(addr).ClusterNodes(ctx).Result(); err == nil {
			return parseClusterNodes(s), nil
		}
	}
	return nil, fmt.Errorf("no node answers CLUSTER NODES: %w", err)
}

// mustLayout is layout for the test's goroutine.
func (a *clusterAdmin) mustLayout() []nodeInfo {
	a.t.Helper()
	ns, err := a.layout()
	if err != nil {
		a.t.Fatal(err)
	}
	return ns
}

// masters returns the masters of ns that serve slots and are not failing.
func masters(ns []nodeInfo) []nodeInfo {
	var ms []nodeInfo
	for _, n := range ns {
		if n.master && !n.failing && len(n.slots) > 0 {
			ms = append(ms, n)
		}
	}
	return ms
}

// owner returns the master of ns that serves slot.
func owner(ns []nodeInfo, slot int) (nodeInfo, bool) {
	for _, n := range masters(ns) {
		if n.serves(slot) {
			return n, true
		}
	}
	return nodeInfo{}, false
}

// healthy returns nil when the cluster is whole: every node answers,
// reports cluster_state:ok with all 16384 slots served, and sees the same
// 3 masters serving the same slots and the same replicas, with no node
// failing and every link connected; and every replica's replication link
// is up.
func (a *clusterAdmin) healthy() error {
	var ref string
	for _, addr := range a.addrs {
		c := a.node(addr)
		info, err := c.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: cluster not ok: %q", addr, info)
		}
		raw, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", addr, err)
		}
		ns := parseClusterNodes(raw)
		var view strings.Builder
		replicas := map[string]int{}
		for _, n := range ns {
			if n.failing || !n.connected {
				return fmt.Errorf("%s sees %s failing or disconnected", addr, n.addr)
			}
			if n.master {
				fmt.Fprintf(&view, "%s master %v\n", n.addr, n.slots)
			} else {
				fmt.Fprintf(&view, "%s replica of %s\n", n.addr, n.masterID)
				replicas[n.masterID]++
			}
		}
		ms := masters(ns)
		if len(ns) != len(a.addrs) || len(ms) != len(a.addrs)/2 {
			return fmt.Errorf("%s sees %d nodes, %d masters serving slots", addr, len(ns), len(ms))
		}
		for _, m := range ms {
			if replicas[m.id] != 1 {
				return fmt.Errorf("%s sees %d replicas of %s", addr, replicas[m.id], m.addr)
			}
		}
		if ref == "" {
			ref = view.String()
		} else if view.String() != ref {
			return fmt.Errorf("the nodes disagree: %s sees\n%s", addr, view.String())
		}
		repl, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("%s: INFO: %w", addr, err)
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("%s: replication link down", addr)
		}
	}
	return nil
}

// waitHealthy waits until the cluster is healthy, or fails the test after
// d.
func (a *clusterAdmin) waitHealthy(d time.Duration) {
	a.t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := a.healthy()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("the cluster is not healthy after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// moveSlot moves slot from the master serving it to dst, as redis-cli
// --cluster reshard does: dst IMPORTING, the source MIGRATING, MIGRATE of
// the slot's keys in batches of 10 (reshard's default pipeline), then
// SETSLOT NODE on dst, on the source and on the other masters. It calls
// during (if not nil) once the first batch has moved, the slot's keys then
// split between the two masters. It returns the number of Redis keys moved
// and how long the slot was in migration (from MIGRATING to the last
// SETSLOT NODE).
func (a *clusterAdmin) moveSlot(slot int, dst nodeInfo, during func()) (int, time.Duration, error) {
	ns, err := a.layout()
	if err != nil {
		return 0, 0, err
	}
	src, ok := owner(ns, slot)
	if !ok || src.id == dst.id {
		return 0, 0, fmt.Errorf("slot %d: served by %+v, cannot move it to %s", slot, src, dst.addr)
	}
	s, d := a.node(src.addr), a.node(dst.addr)
	if err := d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id).Err(); err != nil {
		return 0, 0, fmt.Errorf("SETSLOT IMPORTING: %w", err)
	}
	start := time.Now()
	if err := s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id).Err(); err != nil {
		return 0, 0, fmt.Errorf("SETSLOT MIGRATING: %w", err)
	}
	host, port, _ := net.SplitHostPort(dst.addr)
	moved := 0
	for {
		batch, err := s.ClusterGetKeysInSlot(ctx, slot, 10).Result()
		if err != nil {
			return moved, 0, fmt.Errorf("GETKEYSINSLOT: %w", err)
		}
		if len(batch) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range batch {
			args = append(args, k)
		}
		if err := s.Do(ctx, args...).Err(); err != nil {
			return moved, 0, fmt.Errorf("MIGRATE %v: %w", batch, err)
		}
		if moved == 0 && during != nil {
			during()
		}
		moved += len(batch)
	}
	order := []nodeInfo{dst, src}
	for _, m := range masters(ns) {
		if m.id != src.id && m.id != dst.id {
			order = append(order, m)
		}
	}
	for _, m := range order {
		if err := a.node(m.addr).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.id).Err(); err != nil {
			return moved, 0, fmt.Errorf("SETSLOT NODE on %s: %w", m.addr, err)
		}
	}
	return moved, time.Since(start), nil
}

// serverInfo returns a field of INFO server of the node at addr.
func (a *clusterAdmin) serverInfo(addr, field string) (string, error) {
	info, err := a.node(addr).Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s: INFO server has no %s", addr, field)
}

// role returns "master" or "slave", as the node at addr sees itself.
func (a *clusterAdmin) role(addr string) string {
	info, err := a.node(addr).Info(ctx, "replication").Result()
	if err != nil {
		return ""
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "role:"); ok {
			return v
		}
	}
	return ""
}

// failBack makes each of want a master again where it is now a replica
// (CLUSTER FAILOVER on it), then waits for the cluster to be healthy.
func (a *clusterAdmin) failBack(want []string) {
	a.t.Helper()
	a.waitHealthy(30 * time.Second)
	for _, addr := range want {
		if a.role(addr) == "master" {
			continue
		}
		if err := a.node(addr).ClusterFailover(ctx).Err(); err != nil {
			a.t.Fatalf("CLUSTER FAILOVER on %s: %v", addr, err)
		}
		eventually(a.t, 30*time.Second, addr+" to be a master again", func() bool { return a.role(addr) == "master" })
	}
	a.waitHealthy(30 * time.Second)
}

// span is one downstream call: when it ran, and for which process.
type span struct {
	start, end time.Time
	proc       int
}

// versioned is the downstream of the cluster tests: each call for a key
// returns the key's next version, "key#N" with N from 1, and records when
// it ran. It never fails.
type versioned struct {
	mu    sync.Mutex
	calls map[string][]span // per key, by version; guarded by mu
}

func newVersioned() *versioned { return &versioned{calls: map[string][]span{}} }

// loadFor returns the LoadFunc of process proc.
func (d *versioned) loadFor(proc int) flightcache.LoadFunc[string, string] {
	return func(ctx context.Context, key string) (string, error) {
		start := time.Now()
		time.Sleep(2 * time.Millisecond) // a downstream call takes time
		d.mu.Lock()
		defer d.mu.Unlock()
		d.calls[key] = append(d.calls[key], span{start, time.Now(), proc})
		return fmt.Sprintf("%s#%d", key, len(d.calls[key])), nil
	}
}

// call returns the call that produced version n of key.
func (d *versioned) call(key string, n int) (span, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n < 1 || n > len(d.calls[key]) {
		return span{}, false
	}
	return d.calls[key][n-1], true
}

// extraCall is a downstream call made for a generation of a key's value
// that another call had already loaded.
type extraCall struct {
	key string
	at  time.Time
}

// extras groups each key's calls into generations, and returns the calls
// past the first of their generation, and the largest generation. A
// generation is the calls that start less than gap after the first one
// ended. With gap = TTL/2, two calls of one generation are two loads of
// one value: once the Loader (or the tier) has a value, it loads the key
// again only when that value is TTL old.
func (d *versioned) extras(gap time.Duration) (extra []extraCall, largest []span) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for key, calls := range d.calls {
		calls = slices.Clone(calls)
		slices.SortFunc(calls, func(a, b span) int { return a.start.Compare(b.start) })
		gen := calls[:1]
		for i, c := range calls[1:] {
			if c.start.Before(gen[0].end.Add(gap)) {
				extra = append(extra, extraCall{key, c.start})
				gen = calls[i+1-len(gen) : i+2]
			} else {
				gen = calls[i+1 : i+2]
			}
			if len(gen) > len(largest) {
				largest = gen
			}
		}
		if len(largest) == 0 {
			largest = gen
		}
	}
	return extra, largest
}

// repeat is a process's two calls for one key.
type repeat struct {
	key           string
	proc          int
	first, second time.Time
}

// repeats returns the calls a process made for a key less than gap after
// its previous call for that key ended.
func (d *versioned) repeats(gap time.Duration) []repeat {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []repeat
	for key, calls := range d.calls {
		last := map[int]span{}
		for _, c := range calls { // in the order they ended
			if prev, ok := last[c.proc]; ok && c.start.Before(prev.end.Add(gap)) {
				out = append(out, repeat{key, c.proc, prev.start, c.start})
			}
			last[c.proc] = c
		}
	}
	return out
}

// describe says which processes made calls, and when, relative to t0.
func describe(calls []span, t0 time.Time) string {
	var b strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&b, " p%d@%v", c.proc, c.start.Sub(t0).Round(time.Millisecond))
	}
	return strings.TrimSpace(b.String())
}

// countIn counts the calls of extra that started in [from, to).
func countIn(extra []extraCall, from, to time.Time) int {
	n := 0
	for _, e := range extra {
		if !e.at.Before(from) && e.at.Before(to) {
			n++
		}
	}
	return n
}

// clusterFleet is the fleet of a cluster test: simulated processes, each
// a Loader with its own Tier and ClusterClient, with goroutines that Get
// every key in turn until stop, and check what they get.
type clusterFleet struct {
	t      *testing.T
	d      *versioned
	procs  []proc
	keys   []string
	oldest time.Duration // the oldest a value may be when a Get starts

	gets      atomic.Int64
	errKinds  errorKinds // the errors of the tiers' Redis commands
	nodeKinds errorKinds // the errors of their commands to each node, redirects and retries included

	mu     sync.Mutex
	errs   []string      // failed Gets; guarded by mu
	bad    []string      // values older than oldest, or never loaded; guarded by mu
	maxAge time.Duration // the oldest value served; guarded by mu

	stopc    chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// startClusterFleet starts procs processes with readers goroutines each,
// reading keys through tiers on the cluster at addrs under prefix. Values
// may be served until TTL + StaleWhileRevalidate old (lo's windows, with
// no StaleIfError), plus margin: the time between the downstream's return
// and the Loader's own clock reading.
func startClusterFleet(t *testing.T, addrs, prefix string, lo flightcache.Options[string, string], to Options[string, string], procs, readers int, keys []string, d *versioned) *clusterFleet {
	t.Helper()
	const margin = 250 * time.Millisecond
	f := &clusterFleet{t: t, d: d, keys: keys, oldest: lo.TTL + lo.StaleWhileRevalidate + margin, stopc: make(chan struct{})}
	to.Prefix = prefix
	for range procs {
		c := newClient(t, addrs)
		c.AddHook(&f.errKinds)
		c.(*redis.ClusterClient).OnNewNode(func(n *redis.Client) { n.AddHook(&f.nodeKinds) })
		tier, err := NewTier(c, to)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tier.Close() })
		plo := lo
		plo.Remote = tier
		l, err := flightcache.New(d.loadFor(len(f.procs)), plo)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		f.procs = append(f.procs, proc{l: l, t: tier})
	}
	for i, pr := range f.procs {
		for r := range readers {
			f.wg.Go(func() { f.read(pr, i*readers+r) })
		}
	}
	t.Cleanup(f.stop)
	return f
}

// read Gets every key in turn, from the i-th, until stop, pausing a
// millisecond between Gets (5 under the race detector: each key is still
// read hundreds of times a second, for a fraction of the CPU).
func (f *clusterFleet) read(pr proc, i int) {
	pause := time.Millisecond
	if raceEnabled {
		pause = 5 * time.Millisecond
	}
	for ; ; i++ {
		select {
		case <-f.stopc:
			return
		default:
		}
		key := f.keys[i%len(f.keys)]
		start := time.Now()
		v, err := pr.l.Get(ctx, key)
		f.gets.Add(1)
		f.check(key, v, err, start)
		time.Sleep(pause)
	}
}

// check records a failed Get, or a value that is not one the downstream
// loaded for key or is older than the windows allow.
func (f *clusterFleet) check(key, v string, err error, start time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.errs = append(f.errs, fmt.Sprintf("%s Get(%s): %v", start.Format("15:04:05.000"), key, err))
		return
	}
	name, ver, _ := strings.Cut(v, "#")
	n, _ := strconv.Atoi(ver)
	c, ok := f.d.call(key, n)
	if name != key || !ok {
		f.bad = append(f.bad, fmt.Sprintf("Get(%s) = %q: not a value loaded for it", key, v))
		return
	}
	age := start.Sub(c.end)
	f.maxAge = max(f.maxAge, age)
	if age > f.oldest {
		f.bad = append(f.bad, fmt.Sprintf("Get(%s) at %s = %q, loaded %v before; the Loader's windows allow %v",
			key, start.Format("15:04:05.000"), v, age.Round(time.Millisecond), f.oldest))
	}
}

// stop stops the readers and waits for them.
func (f *clusterFleet) stop() {
	f.stopOnce.Do(func() { close(f.stopc) })
	waitAll(f.t, &f.wg, 30*time.Second, "end of the fleet's readers")
}

// tierStats sums the tiers' RedisErrors, LocalLoads, Takeovers and
// AheadLoads, the counters the tests report.
func (f *clusterFleet) tierStats() (s Stats) {
	for _, pr := range f.procs {
		ps := pr.t.Stats()
		s.RedisErrors += ps.RedisErrors
		s.LocalLoads += ps.LocalLoads
		s.Takeovers += ps.Takeovers
		s.AheadLoads += ps.AheadLoads
	}
	return s
}

// verify fails the test for every failed Get and every value served too
// old or never loaded, and logs what the fleet did.
func (f *clusterFleet) verify() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t.Logf("%d Gets by %d processes of %d keys; the oldest value served was %v old (the windows allow %v)",
		f.gets.Load(), len(f.procs), len(f.keys), f.maxAge.Round(time.Millisecond), f.oldest)
	if len(f.errs) > 0 {
		f.t.Errorf("%d Gets failed (the downstream never fails), the first: %s", len(f.errs), strings.Join(f.errs[:min(len(f.errs), 5)], "; "))
	}
	if len(f.bad) > 0 {
		f.t.Errorf("%d Gets returned a bad value, the first: %s", len(f.bad), strings.Join(f.bad[:min(len(f.bad), 5)], "; "))
	}
}

// The cluster tests' freshness windows and tier options: every key is
// reloaded about once a second, so loads, leases and writes run
// throughout a change; Timeout is generous so that a machine under load
// (-race, 2 cores) does not turn a slow round trip into a local load.
var (
	clusterLoader = flightcache.Options[string, string]{TTL: time.Second, StaleWhileRevalidate: time.Second}
	clusterTier   = Options[string, string]{Timeout: time.Second, HolderTimeout: 3 * time.Second}
)

const (
	clusterProcs   = 4 // simulated processes
	clusterReaders = 2 // goroutines per process
)

// errorKinds is a go-redis hook that counts the errors of commands, by
// kind: the first word of a Redis error (TRYAGAIN, CLUSTERDOWN...),
// "deadline" for the tier's Timeout, or the error itself.
type errorKinds struct {
	mu       sync.Mutex
	n        map[string]int // guarded by mu
	timeouts int            // guarded by mu; the errors that were a timeout, whatever take has reset
}

func (h *errorKinds) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *errorKinds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.note(cmd, err)
		return err
	}
}

func (h *errorKinds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.note(c, c.Err())
		}
		return err
	}
}

// note counts err, the error of cmd, unless it is none, a nil reply, or
// the error of a connection's set-up (CLIENT SETINFO and the like, which
// older servers do not know).
func (h *errorKinds) note(cmd redis.Cmder, err error) {
	if err == nil || errors.Is(err, redis.Nil) || cmd.Name() == "client" || cmd.Name() == "hello" {
		return
	}
	kind := err.Error()
	var re redis.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		kind = "deadline"
	case errors.As(err, &re):
		kind, _, _ = strings.Cut(re.Error(), " ")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[kind]++
	if kind == "deadline" || strings.Contains(kind, "timeout") { // the tier's Timeout, the client's read or write timeout, its pool's
		h.timeouts++
	}
}

// timedOut returns the count of the errors that were a timeout, since the
// hook was made: the signs of a machine too slow for the tiers' Timeout.
func (h *errorKinds) timedOut() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return uint64(h.timeouts)
}

// count returns the count of kind so far.
func (h *errorKinds) count(kind string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[kind]
}

// take returns the counts so far, as "KIND×N" sorted, and resets them.
func (h *errorKinds) take() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for k, n := range h.n {
		out = append(out, fmt.Sprintf("%s×%d", k, n))
	}
	h.n = nil
	slices.Sort(out)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

// TestClusterSlotMove moves a slot to another master, and back, while the
// fleet reads 12 keys, 6 of them in that slot, each reloaded about once a
// second. The slot also holds 3000 other keys (1000 under the race
// detector), so that its migration takes a while (about 150ms on the
// loopback interface), as a slot with data does; midway through each move, every process asks for 3 more keys of
// the slot that nobody has loaded, so that leases and writes meet the
// slot in migration. No Get may fail or return a value older than the
// windows allow; before the moves the fleet makes one downstream call per
// key per generation of its value, and each move may cost it at most one
// extra call per key of the slot it reads (9), plus one for each load a
// tier could not share: each local load (a tier that met an error or its
// Timeout steps aside, and its process loads alone, as it would without
// the tier), each takeover of a lease whose holder stopped beating, and
// each ahead load (a process that loaded a key alone then reloads it from
// the downstream, not from the shared entry, until its own fill is
// stored: ahead.go). A loaded machine makes those;
// TestClusterScriptsOnAMigratingSlot checks the scripts on a migrating
// slot without them. So does the idle twin, for a run in which no command
// of the fleet timed out and no move outlasted the tier's Timeout (the
// span of a command's retries, see clusterOptions): the cluster options ride
// through the migration (ASK, TRYAGAIN), so no load goes unshared, no
// tier meets a Redis error, and the fleet makes no extra call before the
// moves.
func TestClusterSlotMove(t *testing.T) {
	addrs := clusterAddrs(t)
	admin := newClusterAdmin(t, addrs)
	admin.waitHealthy(30 * time.Second)
	c := newClient(t, addrs)
	p := testPrefix(t, c)
	ballast := 3000
	if raceEnabled {
		ballast = 1000 // the fleet still meets the slot in migration: the move waits for its first ASK
	}
	inSlot, slot := sameSlotKeys(p, 12)
	hot, cold := inSlot[:6], [][]string{inSlot[6:9], inSlot[9:12]}
	keys := slices.Clone(hot)
	for i := 0; len(keys) < 12; i++ {
		if k := fmt.Sprint("other-", i); keySlot(keysFor(p, k).base) != slot {
			keys = append(keys, k)
		}
	}
	tag := keysFor(p, hot[0]).base
	if _, err := c.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range ballast {
			pl.Set(ctx, fmt.Sprint(tag, ":ballast:", i), "x", time.Hour)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ns := admin.mustLayout()
	src, ok := owner(ns, slot)
	if !ok {
		t.Fatalf("no master serves slot %d", slot)
	}
	var dst nodeInfo
	for _, m := range masters(ns) {
		if m.id != src.id {
			dst = m
			break
		}
	}
	// Whatever happens, the slot goes back where it was: a move cut short
	// is finished first (the slot cannot stay half migrated).
	var moving *nodeInfo // the target of the move under way, if any
	t.Cleanup(func() {
		if moving != nil {
			if _, _, err := admin.moveSlot(slot, *moving, nil); err != nil {
				t.Errorf("finishing the move of slot %d to %s: %v", slot, moving.addr, err)
			}
		}
		if ns, err := admin.layout(); err == nil {
			if o, ok := owner(ns, slot); ok && o.id != src.id {
				if _, _, err := admin.moveSlot(slot, src, nil); err != nil {
					t.Errorf("moving slot %d back: %v", slot, err)
				}
			}
		}
		admin.waitHealthy(30 * time.Second)
	})

	d := newVersioned()
	lo, to := clusterLoader, clusterTier
	f := startClusterFleet(t, addrs, p, lo, to, clusterProcs, clusterReaders, keys, d)
	// A Redis failure steps a tier aside for RetryAfter, and what it loads
	// locally meanwhile lives TTL: its extra calls are over by then.
	settle := lo.TTL + max(to.RetryAfter, DefaultRetryAfter)

	baseline, atBaseline := time.Now(), f.tierStats()
	time.Sleep(2 * lo.TTL)
	f.errKinds.take()
	type move struct {
		from, to   nodeInfo
		start, end time.Time
		keys       int
		took       time.Duration
		before     Stats
		after      Stats  // at end
		errs       string // the errors of the tiers' commands
		redirects  string // the replies go-redis followed or retried
	}
	var moves []move
	var burst sync.WaitGroup // the Gets of keys nobody has, midway through a move
	t.Cleanup(func() { waitAll(t, &burst, 30*time.Second, "answers to the Gets of keys nobody had") })
	for i, m := range []move{{from: src, to: dst}, {from: dst, to: src}} {
		m.before = f.tierStats()
		m.start = time.Now()
		f.nodeKinds.take()
		moving = &m.to
		n, took, err := admin.moveSlot(slot, m.to, func() {
			for _, pr := range f.procs {
				for _, k := range cold[i] {
					burst.Go(func() {
						start := time.Now()
						v, err := pr.l.Get(ctx, k)
						f.check(k, v, err, start)
					})
				}
			}
			// Go on once the fleet has met the slot in migration: a key
			// nobody has is not on the source, which answers ASK.
			eventually(t, 10*time.Second, "the fleet to be redirected (ASK)", func() bool { return f.nodeKinds.count("ASK") > 0 })
		})
		waitAll(t, &burst, 30*time.Second, "answers to the Gets of keys nobody had")
		if err != nil {
			t.Fatalf("moving slot %d from %s to %s: %v", slot, m.from.addr, m.to.addr, err)
		}
		moving = nil
		m.keys, m.took = n, took
		time.Sleep(settle)
		m.end = time.Now()
		m.after = f.tierStats()
		m.errs = f.errKinds.take()
		m.redirects = f.nodeKinds.take()
		moves = append(moves, m)
	}
	f.stop()
	f.verify()

	extra, largest := d.extras(lo.TTL / 2)
	unshared := func(from, to Stats) uint64 {
		return to.LocalLoads - from.LocalLoads + to.Takeovers - from.Takeovers + to.AheadLoads - from.AheadLoads
	}
	if n, u := countIn(extra, baseline, moves[0].start), unshared(atBaseline, moves[0].before); uint64(n) > u {
		t.Errorf("before the moves, the fleet made %d extra downstream calls with %d loads not shared; want at most those (one call per key per generation)", n, u)
	}
	budget := len(hot) + len(cold[0])
	for i, m := range moves {
		n, u := countIn(extra, m.start, m.end), unshared(m.before, m.after)
		t.Logf("move %d: slot %d (%d Redis keys) from %s to %s in %v; in the %v from its start: %d extra downstream calls; replies to the fleet's commands: %s; tier: %d Redis errors (%s), %d local loads, %d takeovers, %d ahead loads",
			i+1, slot, m.keys, m.from.addr, m.to.addr, m.took.Round(time.Millisecond), settle, n, m.redirects,
			m.after.RedisErrors-m.before.RedisErrors, m.errs, m.after.LocalLoads-m.before.LocalLoads, m.after.Takeovers-m.before.Takeovers,
			m.after.AheadLoads-m.before.AheadLoads)
		if uint64(n) > uint64(budget)+u {
			t.Errorf("move %d cost %d extra downstream calls; want at most one per key of the slot the fleet reads (%d) and one per load not shared (%d)", i+1, n, budget, u)
		}
	}
	t.Logf("largest generation: %d calls (%s); extra calls in all: %d", len(largest), describe(largest, baseline), len(extra))
	// The signs of load: a command that timed out, and a migration slower
	// than a command's retries last (about the tier's Timeout), which a
	// command then meets from start to end.
	last, slow := moves[len(moves)-1].after, uint64(0)
	for _, m := range moves {
		if m.took > to.Timeout {
			slow++
		}
	}
	idleTwin(t, []loadSign{{"commands timed out", f.errKinds.timedOut()}, {"moves longer than the tier's Timeout", slow}}, func(t *testing.T) {
		if u, e := unshared(atBaseline, last), last.RedisErrors-atBaseline.RedisErrors; u != 0 || e != 0 {
			t.Errorf("%d loads not shared (local %d, takeovers %d, ahead %d), %d Redis errors; want 0, 0",
				u, last.LocalLoads-atBaseline.LocalLoads, last.Takeovers-atBaseline.Takeovers, last.AheadLoads-atBaseline.AheadLoads, e)
		}
		if n := countIn(extra, baseline, moves[0].start); n != 0 {
			t.Errorf("before the moves, the fleet made %d extra downstream calls; want 0", n)
		}
		for i, m := range moves {
			if n := countIn(extra, m.start, m.end); n > budget {
				t.Errorf("move %d cost %d extra downstream calls; want at most one per key of the slot the fleet reads (%d)", i+1, n, budget)
			}
		}
	})
}

// TestClusterFailover fails over the master that serves some of the
// fleet's 12 keys while the fleet reads them, each key reloaded about once
// a second, then fails back:
//
//   - "manual": CLUSTER FAILOVER on its replica, which the master hands
//     over to in step (it pauses writes until the replica has caught up);
//   - "kill": the master is killed (SIGKILL); its replica takes over once
//     the other masters mark it failing (cluster-node-timeout, 2s), and
//     the clients find the new master at their next reload of the slot
//     map (ClusterStateReloadInterval, 1s). The test then restarts the
//     killed node, which rejoins as a replica of the new master.
//
// No Get may fail (a tier failure is never an error to the caller: the
// tier steps aside and the Loader loads locally) or return a value older
// than the windows allow. While the fleet has no Redis for some keys, each
// process loads what it needs itself, as it would without the tier: a
// generation of a value costs at most one call per process, plus one for
// each copy the process's tier had it distrust and read again (the tier
// does when its pub/sub subscription drops, as it may then miss other
// processes' writes). Once the cluster is whole again, the fleet is back
// to one call per generation.
func TestClusterFailover(t *testing.T) {
	addrs := clusterAddrs(t)
	t.Run("manual", func(t *testing.T) { testFailover(t, addrs, false) })
	t.Run("kill", func(t *testing.T) { testFailover(t, addrs, true) })
}

func testFailover(t *testing.T, addrs string, kill bool) {
	admin := newClusterAdmin(t, addrs)
	admin.waitHealthy(30 * time.Second)
	p := testPrefix(t, newClient(t, addrs))
	ns := admin.mustLayout()
	var roles []string // the masters to restore
	for _, m := range masters(ns) {
		roles = append(roles, m.addr)
	}
	var keys []string
	for i := range 12 {
		keys = append(keys, fmt.Sprint("k-", i))
	}
	victim, _ := owner(ns, keySlot(keysFor(p, keys[0]).base))
	var replica nodeInfo
	for _, n := range ns {
		if n.masterID == victim.id {
			replica = n
		}
	}
	var affected int
	for _, k := range keys {
		if victim.serves(keySlot(keysFor(p, k).base)) {
			affected++
		}
	}
	conf, err := admin.serverInfo(victim.addr, "config_file")
	if err != nil {
		t.Fatal(err)
	}
	// Whatever happens, the victim runs again and the masters get their
	// roles back.
	t.Cleanup(func() {
		if admin.node(victim.addr).Ping(ctx).Err() != nil {
			if out, err := exec.Command("redis-server", conf).CombinedOutput(); err != nil {
				t.Errorf("restarting %s: %v: %s", victim.addr, err, out)
			}
		}
		admin.failBack(roles)
	})

	d := newVersioned()
	lo, to := clusterLoader, clusterTier
	f := startClusterFleet(t, addrs, p, lo, to, clusterProcs, clusterReaders, keys, d)
	retryAfter := max(to.RetryAfter, DefaultRetryAfter)
	settle := lo.TTL + retryAfter // for a tier that stepped aside to be back, and its keys reloaded

	baseline := time.Now()
	time.Sleep(2 * lo.TTL)
	f.errKinds.take()
	before := f.tierStats()
	start := time.Now()
	if kill {
		pid, err := admin.serverInfo(victim.addr, "process_id")
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(pid)
		if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
			t.Fatalf("killing %s (pid %s): %v", victim.addr, pid, err)
		}
	} else if err := admin.node(replica.addr).ClusterFailover(ctx).Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.addr, err)
	}
	eventually(t, 30*time.Second, replica.addr+" to take over", func() bool { return admin.role(replica.addr) == "master" })
	promoted := time.Since(start)

	// The fleet is back on Redis once its tiers have made no Redis error
	// for 2 RetryAfter (a tier that steps aside tries again after
	// RetryAfter, and every key is loaded about once a second).
	var lastErr time.Time
	errs := before.RedisErrors
	for since := time.Now(); time.Since(since) < 2*retryAfter && time.Since(start) < 30*time.Second; {
		time.Sleep(20 * time.Millisecond)
		if n := f.tierStats().RedisErrors; n != errs {
			lastErr, since, errs = time.Now(), time.Now(), n
		}
	}
	recovered := "none"
	if !lastErr.IsZero() {
		recovered = lastErr.Sub(start).Round(time.Millisecond).String() + " after"
	}
	if kill {
		if out, err := exec.Command("redis-server", conf).CombinedOutput(); err != nil {
			t.Fatalf("restarting %s: %v: %s", victim.addr, err, out)
		}
	}
	admin.waitHealthy(30 * time.Second)
	healthy := time.Since(start)
	time.Sleep(settle)
	during, duringErrs := f.tierStats(), f.errKinds.take()

	back := time.Now()
	admin.failBack(roles)
	time.Sleep(settle)
	quiet := time.Now()
	time.Sleep(2 * lo.TTL)
	after, afterErrs := f.tierStats(), f.errKinds.take()
	f.stop()
	f.verify()

	extra, largest := d.extras(lo.TTL / 2)
	mode := map[bool]string{false: "CLUSTER FAILOVER", true: "SIGKILL"}[kill]
	t.Logf("%s of %s (%d of the %d keys): %s master after %v; the tiers' last Redis error: %s; cluster whole again after %v",
		mode, victim.addr, affected, len(keys), replica.addr, promoted.Round(time.Millisecond), recovered, healthy.Round(time.Millisecond))
	t.Logf("from the failover until %v later: %d extra downstream calls; tier: %d Redis errors (%s), %d local loads",
		back.Sub(start).Round(time.Millisecond), countIn(extra, start, back),
		during.RedisErrors-before.RedisErrors, duringErrs, during.LocalLoads-before.LocalLoads)
	t.Logf("failing back: %d extra downstream calls; tier: %d Redis errors (%s), %d local loads; largest generation: %d calls (%s, from the failover)",
		countIn(extra, back, quiet), after.RedisErrors-during.RedisErrors, afterErrs, after.LocalLoads-during.LocalLoads,
		len(largest), describe(largest, start))
	if n := countIn(extra, baseline, start); n != 0 {
		t.Errorf("before the failover, the fleet made %d extra downstream calls; want 0", n)
	}
	// A process calls the downstream for a key twice within TTL/2 only to
	// read again a copy its tier had it distrust (it may have missed other
	// processes' writes while its subscription was down): each such call
	// comes from a Get the Loader counts in Stats.Rereads.
	repeats := map[int][]repeat{}
	for _, r := range d.repeats(lo.TTL / 2) {
		repeats[r.proc] = append(repeats[r.proc], r)
	}
	var rereads []uint64
	for i, pr := range f.procs {
		ls := pr.l.Stats()
		rereads = append(rereads, ls.Rereads)
		if n := uint64(len(repeats[i])); n > ls.Rereads {
			r := repeats[i][0]
			t.Errorf("process %d called the downstream %d times for a key it had loaded less than %v before, with %d re-reads of distrusted copies; the first: %s at %v and %v after the failover",
				i, n, lo.TTL/2, ls.Rereads, r.key, r.first.Sub(start).Round(time.Millisecond), r.second.Sub(start).Round(time.Millisecond))
		}
	}
	t.Logf("calls repeated by a process within %v: %d; the Loaders' re-reads of distrusted copies: %v", lo.TTL/2, len(d.repeats(lo.TTL/2)), rereads)
	if n := countIn(extra, quiet, time.Now()); n != 0 {
		t.Errorf("after the failback, the fleet made %d extra downstream calls; want 0", n)
	}
}

// TestClusterScriptsOnAMigratingSlot writes a key's entry while its slot
// is in migration, every key the script names still on the source master:
// a fill and a not-found marker, each by a load that holds the lease over
// an existing entry (a Refresh). The source runs such a script, and counts
// a key it lacks as the target's: a script that deleted the entry before
// writing it again failed there midway, the entry lost. The scripts
// replace an entry in place, so both writes land, with no Redis error.
func TestClusterScriptsOnAMigratingSlot(t *testing.T) {
	for _, notFound := range []bool{false, true} {
		t.Run(map[bool]string{false: "fill", true: "not-found"}[notFound], func(t *testing.T) {
			testScriptsOnAMigratingSlot(t, notFound)
		})
	}
}

func testScriptsOnAMigratingSlot(t *testing.T, notFound bool) {
	addrs := clusterAddrs(t)
	admin := newClusterAdmin(t, addrs)
	admin.waitHealthy(30 * time.Second)
	p := testPrefix(t, newClient(t, addrs))
	d := newDownstream()
	lo := flightcache.Options[string, string]{TTL: 100 * time.Millisecond, StaleWhileRevalidate: time.Hour, NotFoundTTL: time.Hour}
	a := newProc(t, addrs, p, lo, Options[string, string]{Timeout: time.Second}, d)
	if v, err := a.l.Get(ctx, "k"); err != nil || v != "k-v1" {
		t.Fatalf("Get = %q, %v; want k-v1", v, err)
	}
	within(t, d.started, 10*time.Second, "downstream call")

	ks := keysFor(p, "k")
	slot := keySlot(ks.base)
	ns := admin.mustLayout()
	src, _ := owner(ns, slot)
	var dst nodeInfo
	for _, m := range masters(ns) {
		if m.id != src.id {
			dst = m
			break
		}
	}
	// The Refresh of the stale entry holds the lease, the entry still
	// there, and waits.
	time.Sleep(2 * lo.TTL)
	d.gate = make(chan struct{})
	if notFound {
		d.fail(flightcache.ErrNotFound)
	}
	a.l.Refresh(ctx, "k")
	select {
	case <-d.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the Refresh did not call the downstream")
	}
	s, dn := admin.node(src.addr), admin.node(dst.addr)
	t.Cleanup(func() {
		for _, n := range []*redis.Client{dn, s} {
			if err := n.Do(context.Background(), "CLUSTER", "SETSLOT", slot, "STABLE").Err(); err != nil {
				t.Errorf("SETSLOT %d STABLE: %v", slot, err)
			}
		}
	})
	if err := dn.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id).Err(); err != nil {
		t.Fatal(err)
	}
	before := a.t.Stats()
	close(d.gate)
	field, want := "v", `"k-v2"`
	if notFound {
		field, want = "nf", "1"
	}
	eventually(t, 10*time.Second, "the write on the source", func() bool {
		return s.HGet(ctx, ks.entry, field).Val() == want
	})
	if n := s.Exists(ctx, ks.lease, ks.alive).Val(); n != 0 {
		t.Errorf("%d of the lease keys left; want none", n)
	}
	if s := a.t.Stats(); s.RedisErrors != before.RedisErrors || s.LocalLoads != before.LocalLoads {
		t.Errorf("Redis errors %d, local loads %d during the write; want 0, 0",
			s.RedisErrors-before.RedisErrors, s.LocalLoads-before.LocalLoads)
	}
}

package flightredis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	"github.com/redis/go-redis/v9"
)

// Tests of Loader.InvalidateTag through the tier (tags.go, docs/design.md
// rule 42). Each simulated process is a Loader with its own tier and
// client; they share one Redis (a node, or the Cluster of REDIS_CLUSTER).

// byCat tags a key's value with its category, the key's first letter.
func byCat(key, _ string) []string { return []string{"cat:" + key[:1]} }

// tagOpts are the Loader options of the tag tests: an hour of TTL, tags
// by category.
func tagOpts() flightcache.Options[string, string] {
	return flightcache.Options[string, string]{TTL: time.Hour, Tags: byCat}
}

// InvalidateTag in one process: at once, the shared entries that carry
// the tag are absent for every process (a process started after the call
// loads them again, and gets the others from Redis); once each process
// has heard, its local copies with the tag are gone too; values of other
// tags stay everywhere; the fleet reloads each key once, through the
// lease. On the Cluster the tags' stamps and the entries live in
// different slots.
func TestInvalidateTagAcrossTheFleet(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	a := newProc(t, addr, prefix, tagOpts(), Options[string, string]{}, d)
	b := newProc(t, addr, prefix, tagOpts(), Options[string, string]{}, d)
	c := newProc(t, addr, prefix, tagOpts(), Options[string, string]{}, d)
	ps := []proc{a, b, c}
	listening(t, ps...)
	keys := []string{"a1", "a2", "a3", "b1", "b2"}
	if onCluster() {
		slots := map[int]bool{}
		for _, k := range keys {
			slots[keySlot(keysFor(prefix, k).base)] = true
		}
		if delete(slots, keySlot(tagKey(prefix, "cat:a"))); len(slots) == 0 {
			t.Fatalf("every key shares the tag's slot; want keys of other slots")
		}
	}
	before := map[string]string{}
	for _, k := range keys {
		before[k], _ = a.l.Get(ctx, k)
		for _, p := range ps[1:] {
			if v, _ := p.l.Get(ctx, k); v != before[k] {
				t.Fatalf("Get(%s) = %q, want the fleet's %q", k, v, before[k])
			}
		}
	}
	mark := d.calls.Load()

	a.l.InvalidateTag("cat:a")

	// The shared tier, at once: a process that holds nothing reads Redis.
	late := newProc(t, addr, prefix, tagOpts(), Options[string, string]{}, d)
	for _, k := range keys {
		v, err := late.l.Get(ctx, k)
		if strings.HasPrefix(k, "a") {
			loadedAfter(t, "late Get("+k+")", v, err, mark)
		} else if v != before[k] {
			t.Fatalf("late Get(%s) = %q, %v; want the shared %q (another tag)", k, v, err, before[k])
		}
	}
	if s := late.t.Stats(); s.TagMisses != 3 {
		t.Fatalf("late tier: TagMisses = %d, want 3", s.TagMisses)
	}
	// The local copies, once heard.
	for _, p := range ps[1:] {
		eventually(t, 10*time.Second, "the other processes to hear the tag", func() bool { return p.t.Stats().TagInvalidationsHeard == 1 })
	}
	for i, p := range ps {
		for _, k := range keys {
			v, err := p.l.Get(ctx, k)
			if strings.HasPrefix(k, "a") {
				loadedAfter(t, fmt.Sprintf("process %d: Get(%s)", i, k), v, err, mark)
			} else if v != before[k] {
				t.Fatalf("process %d: Get(%s) = %q, %v; want %q still (another tag)", i, k, v, err, before[k])
			}
		}
	}
	local := uint64(0)
	for _, p := range append(ps, late) {
		local += p.t.Stats().LocalLoads
	}
	if n := uint64(d.calls.Load() - mark); n < 3 || n > 3+local {
		t.Fatalf("downstream calls after the InvalidateTag = %d, want 3 (one per key of the tag for the fleet; %d loads without Redis)", n, local)
	}
	if s := a.t.Stats(); s.TagInvalidations != 1 {
		t.Fatalf("a's tier: TagInvalidations = %d, want 1", s.TagInvalidations)
	}
	for i, p := range ps {
		if s := p.l.Stats(); s.TagInvalidations != 1 {
			t.Fatalf("process %d: the Loader's TagInvalidations = %d, want 1 (its own call, or the one heard)", i, s.TagInvalidations)
		}
	}
}

// A load under the lease that started before another process's
// InvalidateTag of its value's tag answers its callers but is not shared,
// and its own Loader keeps no copy (rule 37 across the fleet).
func TestInvalidateTagRefusesAnOlderFill(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	d.gate = make(chan struct{})
	a := newProc(t, addr, prefix, tagOpts(), Options[string, string]{Timeout: time.Second}, d)
	b := newProc(t, addr, prefix, tagOpts(), Options[string, string]{Timeout: time.Second}, d)
	listening(t, a, b)
	type res struct {
		v   string
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := a.l.Get(c, "a1")
		got <- res{v, err}
	}()
	select {
	case <-d.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the load did not start")
	}
	b.l.InvalidateTag("cat:a")
	close(d.gate)
	r := <-got
	if r.err != nil || version(r.v) != 1 {
		t.Fatalf("the holder's caller got %q, %v; want a1-v1", r.v, r.err)
	}
	if s := a.t.Stats(); s.TagFillsRefused != 1 || s.Leases != 1 {
		t.Fatalf("holder's tier: TagFillsRefused %d, Leases %d; want 1, 1", s.TagFillsRefused, s.Leases)
	}
	mark := d.calls.Load()
	for _, p := range []proc{a, b} {
		v, err := p.l.Get(ctx, "a1")
		loadedAfter(t, "Get(a1) after the refused fill", v, err, mark-1)
	}
}

// A process whose subscription is lost distrusts every copy: an
// InvalidateTag it could not hear is not served past, since the reread
// checks the shared entry's tags.
func TestInvalidateTagUnheardIsDistrusted(t *testing.T) {
	singleNodeOnly(t, "kills the pub/sub connections of one server")
	addr := redisAddr(t)
	admin := newClient(t, addr)
	prefix := testPrefix(t, admin)
	d := newDownstream()
	a := newProc(t, addr, prefix, tagOpts(), Options[string, string]{}, d)
	b := newProc(t, addr, prefix, tagOpts(), Options[string, string]{}, d)
	listening(t, a, b)
	old, _ := b.l.Get(ctx, "a1")
	other, _ := b.l.Get(ctx, "b1")
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b to see its subscription lost", func() bool { return b.t.Stats().SubscriptionLosses >= 1 })
	a.l.InvalidateTag("cat:a") // b may or may not hear this one
	if v, _ := b.l.Get(ctx, "a1"); v == old {
		t.Fatalf("b served %q after an InvalidateTag it could not hear", v)
	}
	if v, _ := b.l.Get(ctx, "b1"); v != other {
		t.Fatalf("b served %q for b1, want %q (another tag, reread from Redis)", v, other)
	}
	listening(t, a, b)
	if s := b.l.Stats(); s.Distrusts < 1 {
		t.Fatalf("b's Loader: Distrusts %d; want >= 1", s.Distrusts)
	}
}

// cmdLog records the commands a client sends (pipelines included).
type cmdLog struct {
	mu   sync.Mutex
	on   bool
	cmds []string
}

func (h *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}

func (h *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.add(c)
		}
		return next(ctx, cmds)
	}
}

func (h *cmdLog) add(c redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.on {
		h.cmds = append(h.cmds, fmt.Sprint(c.Args()...))
	}
}

func (h *cmdLog) record(on bool) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.on = on
	out := h.cmds
	h.cmds = nil
	return out
}

// InvalidateTag costs Redis two commands whatever the tier holds: the
// clock's INCR and one script on the tag's stamp (which publishes). Counted
// with a client hook, with 10 and with 1,000 values of the tag held.
func TestInvalidateTagCostsTwoCommands(t *testing.T) {
	addr := redisAddr(t)
	client := newClient(t, addr)
	prefix := testPrefix(t, client)
	log := &cmdLog{}
	client.AddHook(log)
	tier, err := NewTier(client, Options[string, string]{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tier.Close() })
	d := newDownstream()
	lo := tagOpts()
	lo.Remote = tier
	l, err := flightcache.New(d.load, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	eventually(t, 5*time.Second, "the subscription", func() bool { return tier.Stats().Listening })
	loaded := 0
	for _, n := range []int{10, 1000} {
		for ; loaded < n; loaded++ {
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := l.Get(c, fmt.Sprintf("a%d", loaded))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		log.record(true)
		l.InvalidateTag("cat:a")
		cmds := log.record(false)
		var ours []string
		for _, c := range cmds {
			if strings.Contains(c, prefix+"tag") {
				ours = append(ours, c)
			}
		}
		if len(ours) != 2 || !strings.HasPrefix(ours[0], "incr") || !strings.HasPrefix(ours[1], "eval") {
			t.Fatalf("with %d values of the tag held: InvalidateTag sent %q (all commands meanwhile: %q); want INCR of the clock and one script", n, ours, cmds)
		}
		t.Logf("%d values held: %d commands: %q", n, len(ours), ours)
	}
	if s := tier.Stats(); s.TagInvalidations != 2 {
		t.Fatalf("TagInvalidations = %d, want 2", s.TagInvalidations)
	}
}

// An InvalidateTag that cannot reach Redis is kept: this tier takes no
// entry of the tag from Redis meanwhile, and the call reaches the fleet
// at a later health check.
func TestInvalidateTagThatMissedRedisIsReplayed(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newDownstream()
	to := Options[string, string]{RetryAfter: 300 * time.Millisecond, Timeout: time.Second}
	a := newProc(t, addr, prefix, tagOpts(), to, d)
	b := newProc(t, addr, prefix, tagOpts(), to, d)
	listening(t, a, b)
	v1, _ := b.l.Get(ctx, "a1")
	a.t.link.failed() // as after a failed round trip: a steps aside for RetryAfter
	a.l.InvalidateTag("cat:a")
	if s := a.t.Stats(); s.TagInvalidations != 0 {
		t.Fatalf("TagInvalidations = %d before the replay, want 0", s.TagInvalidations)
	}
	eventually(t, 10*time.Second, "the replay", func() bool { return a.t.Stats().TagInvalidationsReplayed == 1 })
	eventually(t, 10*time.Second, "b to hear it", func() bool { return b.t.Stats().TagInvalidationsHeard == 1 })
	if v, _ := b.l.Get(ctx, "a1"); v == v1 {
		t.Fatalf("b still serves %q after the replayed InvalidateTag", v)
	}
}

// A storm of InvalidateTag over many tags, from two processes, while both
// Get, Set and load the tags' keys (every Get with a deadline). The
// downstream's rows carry, per tag, an epoch that moves on before each
// InvalidateTag of the tag (as a database changes before the cache is
// told); a Set writes the epoch current when it runs (a Set and an
// InvalidateTag of one tag never overlap). Promised and checked: in the
// process that called it, no Get that starts after an InvalidateTag
// returned is served a value of an older epoch (local copies, shared
// entries and loads in flight alike); in the other, none once it has
// heard every call: after the storm, each process serves the last epoch
// of every tag.
func TestInvalidateTagStorm(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	const tags, perTag, rounds = 16, 4, 60
	var epoch [tags]atomic.Int64 // the downstream's, per tag
	var done [2][tags]atomic.Int64
	var locks [tags]sync.RWMutex // a Set and an InvalidateTag of one tag never overlap
	tagOf := func(key string) int {
		var n int
		fmt.Sscanf(key, "t%d-", &n)
		return n
	}
	load := func(_ context.Context, key string) (string, error) {
		return fmt.Sprintf("%s@%d", key, epoch[tagOf(key)].Load()), nil
	}
	epochOf := func(v string) int64 {
		var e int64
		fmt.Sscanf(v[strings.LastIndex(v, "@")+1:], "%d", &e)
		return e
	}
	lo := flightcache.Options[string, string]{TTL: time.Hour, Tags: func(key, _ string) []string {
		return []string{fmt.Sprintf("tag%d", tagOf(key))}
	}}
	var ps [2]proc
	for i := range ps {
		tier, err := NewTier(newClient(t, addr), Options[string, string]{Prefix: prefix, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tier.Close() })
		o := lo
		o.Remote = tier
		l, err := flightcache.New(load, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ps[i] = proc{l, tier}
	}
	listening(t, ps[:]...)
	key := func(tag, i int) string { return fmt.Sprintf("t%d-k%d", tag, i) }
	var bad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for p := range ps {
		for g := range 3 { // readers
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					tag := (n*7 + g) % tags
					k := key(tag, n%perTag)
					floor := done[p][tag].Load() // invalidations of the tag this process returned from
					c, cancel := context.WithTimeout(ctx, 20*time.Second)
					v, err := ps[p].l.Get(c, k)
					cancel()
					if err != nil {
						bad.Add(1)
						firstBad.CompareAndSwap(nil, fmt.Sprintf("process %d: Get(%s): %v", p, k, err))
						continue
					}
					if e := epochOf(v); e < floor {
						bad.Add(1)
						firstBad.CompareAndSwap(nil, fmt.Sprintf("process %d: Get(%s) = %q after its InvalidateTag of epoch %d returned", p, k, v, floor))
					}
				}
			}()
		}
		wg.Add(1)
		go func() { // a writer
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				tag := (n*5 + p) % tags
				locks[tag].RLock()
				k := key(tag, n%perTag)
				ps[p].l.Set(k, fmt.Sprintf("%s@%d", k, epoch[tag].Load()))
				locks[tag].RUnlock()
			}
		}()
	}
	var inv sync.WaitGroup
	for p := range ps { // the storm: process p invalidates the tags of its parity
		inv.Add(1)
		go func() {
			defer inv.Done()
			for r := range rounds {
				for tag := p; tag < tags; tag += 2 {
					if (r+tag)%3 != 0 {
						continue
					}
					locks[tag].Lock()
					e := epoch[tag].Add(1)
					ps[p].l.InvalidateTag(fmt.Sprintf("tag%d", tag))
					done[p][tag].Store(e)
					locks[tag].Unlock()
				}
			}
		}()
	}
	inv.Wait()
	close(stop)
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d Gets served a value older than an InvalidateTag that had returned (or failed); first: %v", n, firstBad.Load())
	}
	// Once each process has heard the other's calls, none serves an older
	// epoch either.
	for p := range ps {
		o := 1 - p
		eventually(t, 30*time.Second, "every InvalidateTag to be heard", func() bool {
			return ps[p].t.Stats().TagInvalidationsHeard >= ps[o].t.Stats().TagInvalidations
		})
	}
	for p := range ps {
		for tag := range tags {
			for i := range perTag {
				c, cancel := context.WithTimeout(ctx, 20*time.Second)
				v, err := ps[p].l.Get(c, key(tag, i))
				cancel()
				if want := epoch[tag].Load(); err != nil || epochOf(v) != want {
					t.Fatalf("after the storm, process %d: Get(%s) = %q, %v; want epoch %d", p, key(tag, i), v, err, want)
				}
			}
		}
	}
	for p := range ps {
		t.Logf("process %d: tier %+v", p, ps[p].t.Stats())
	}
}

// The same through GetMany's batches (Tier.LoadMany): a batch reads the
// stamps of its tagged entries in one round trip, and a batch's fill
// whose tag was invalidated during its load is refused.
func TestInvalidateTagAcrossTheFleetBatches(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t, newClient(t, addr))
	d := newBatchDownstream()
	a := newBatchProc(t, addr, nil, prefix, tagOpts(), Options[string, string]{}, d)
	b := newBatchProc(t, addr, nil, prefix, tagOpts(), Options[string, string]{}, d)
	listening(t, a, b)
	keys := append(keyRange("a", 0, 4), keyRange("b", 0, 4)...)
	first, err := a.l.GetMany(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.l.GetMany(ctx, keys); err != nil || len(got) != len(keys) {
		t.Fatalf("b's GetMany = %v, %v", got, err)
	}
	a.l.InvalidateTag("cat:a")
	late := newBatchProc(t, addr, nil, prefix, tagOpts(), Options[string, string]{}, d)
	got, err := late.l.GetMany(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.HasPrefix(k, "a") == (got[k] == first[k]) {
			t.Fatalf("late GetMany[%s] = %q (before: %q); want a new value for cat:a only", k, got[k], first[k])
		}
	}
	if s := late.t.Stats(); s.TagMisses != 4 {
		t.Fatalf("late tier: TagMisses = %d, want 4", s.TagMisses)
	}
	eventually(t, 10*time.Second, "b to hear the tag", func() bool { return b.t.Stats().TagInvalidationsHeard == 1 })
	if again, err := b.l.GetMany(ctx, keys); err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
		t.Fatalf("b's GetMany after hearing = %v, %v; want the fleet's %v", again, err, got)
	}

	// A batch's load that spans an InvalidateTag of its tag: served to its
	// callers, not shared, not kept.
	d.mu.Lock()
	d.gate = make(chan struct{})
	d.mu.Unlock()
	for len(d.started) > 0 { // the earlier calls'
		<-d.started
	}
	fresh := keyRange("a", 10, 12)
	done := make(chan map[string]string, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		m, _ := b.l.GetMany(c, fresh)
		done <- m
	}()
	select {
	case <-d.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the batch's load did not start")
	}
	a.l.InvalidateTag("cat:a")
	d.mu.Lock()
	close(d.gate)
	d.gate = nil
	d.mu.Unlock()
	if m := <-done; len(m) != 2 {
		t.Fatalf("the batch's callers got %v; want both keys", m)
	}
	if s := b.t.Stats(); s.TagFillsRefused != 2 {
		t.Fatalf("b's tier: TagFillsRefused = %d, want 2", s.TagFillsRefused)
	}
}

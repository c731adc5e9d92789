package flightpg

import (
	"bufio"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
	flightredis "github.com/flightcache/flightcache/redis"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// redisAddr returns the address of the Redis the fleet tests use
// (REDIS_ADDR, started by redis/testdata/start-redis.sh). Without it the
// test is skipped, except under CI (CI=true), where it fails.
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

func dialRedis(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
}

// redisClient returns a client of the test Redis, closed when the test ends.
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := dialRedis(redisAddr(t))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var fleetSeq atomic.Int64

// fleetNames returns a slot name and a lease key of the test's own; the
// slot is dropped when the test ends if a Source left it.
func fleetNames(t testing.TB) (slot, key string) {
	t.Helper()
	n := fmt.Sprintf("%d_%d", time.Now().UnixNano()%1e9, fleetSeq.Add(1))
	slot, key = "fleet_"+n, "flightpg:test:lease:"+n
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, pgURL(t))
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", slot)
	})
	return slot, key
}

// newLease returns a RedisLease on key, named name.
func newLease(t testing.TB, rdb redis.UniversalClient, key, name string) *RedisLease {
	t.Helper()
	l, err := NewRedisLease(rdb, RedisLeaseOptions{Key: key, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// leaseLog records a Source's LeaseEvents and hands each "acquired" on a
// channel with its time.
type leaseLog struct {
	mu       sync.Mutex
	events   []LeaseEvent
	acquired chan time.Time
}

func newLeaseLog() *leaseLog { return &leaseLog{acquired: make(chan time.Time, 16)} }

func (l *leaseLog) on(e LeaseEvent) {
	now := time.Now()
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
	if e.Held {
		l.acquired <- now
	}
}

func (l *leaseLog) reasons() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rs []string
	for _, e := range l.events {
		rs = append(rs, e.Reason)
	}
	return rs
}

// waitAcquired waits for the Source's next "acquired" event.
func (l *leaseLog) waitAcquired(t testing.TB, who string) time.Time {
	t.Helper()
	select {
	case at := <-l.acquired:
		return at
	case <-deadline(t).Done():
		t.Fatalf("%s never took the lease over (events %v)", who, l.reasons())
		return time.Time{}
	}
}

// slotConfirmed returns the slot's confirmed_flush_lsn.
func slotConfirmed(t testing.TB, conn *pgx.Conn, slot string) LSN {
	t.Helper()
	var s *string
	if err := conn.QueryRow(deadline(t), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s); err != nil {
		t.Fatalf("slot %s: %v", slot, err)
	}
	if s == nil {
		return 0
	}
	l, err := ParseLSN(*s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func slotExists(t testing.TB, conn *pgx.Conn, slot string) bool {
	t.Helper()
	var n int
	if err := conn.QueryRow(deadline(t), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func ids(from, to int64) []int64 {
	var s []int64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// missing returns the ids of want that got lacks.
func missing(want []int64, got map[int64]int) []int64 {
	var m []int64
	for _, id := range want {
		if got[id] == 0 {
			m = append(m, id)
		}
	}
	return m
}

func count(keys []int64) map[int64]int {
	m := map[int64]int{}
	for _, k := range keys {
		m[k]++
	}
	return m
}

func TestFleetOptionErrors(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer rdb.Close()
	lease, err := NewRedisLease(rdb, RedisLeaseOptions{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if lease.TTL() != time.Second {
		t.Errorf("default TTL = %v; want 1s", lease.TTL())
	}
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Publication: "p", Lease: lease}, "Options.Lease needs Options.Slot"},
		{Options{Publication: "p", Slot: "s", Lease: lease, Resume: 1}, "Options.Resume cannot be used with Options.Lease"},
		{Options{Publication: "p", Slot: "s", Lease: (*RedisLease)(nil)}, "Options.Lease TTL() must be > 0"},
	} {
		if err := c.opts.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validate(%+v) = %v; want %q", c.opts, err, c.want)
		}
	}
	for _, c := range []struct {
		opts RedisLeaseOptions
		want string
	}{
		{RedisLeaseOptions{}, "RedisLeaseOptions.Key is required"},
		{RedisLeaseOptions{Key: "k", TTL: -1}, "RedisLeaseOptions.TTL must be >= 0"},
		{RedisLeaseOptions{Key: "k", TTL: time.Millisecond}, "RedisLeaseOptions.TTL must be at least 100ms"},
		{RedisLeaseOptions{Key: "k", Name: "a#b"}, "RedisLeaseOptions.Name must not contain '#'"},
	} {
		if _, err := NewRedisLease(rdb, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRedisLease(%+v) = %v; want %q", c.opts, err, c.want)
		}
	}
	if _, err := NewRedisLease(nil, RedisLeaseOptions{Key: "k"}); err == nil {
		t.Error("NewRedisLease(nil) succeeded")
	}
}

// Two Sources on one slot with one lease: the first holds it and applies
// every change; the other stands by, applies nothing, and names the
// holder. The last one to close drops the slot (DropSlotOnClose).
func TestFleetOneSourceConsumes(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot, key := fleetNames(t)
	rdb := redisClient(t)
	var ra, rb recorder
	opts := func(name string) Options {
		return Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, name)}
	}
	a, err := New(deadline(t), pgURL(t), &ra, byID, opts("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(deadline(t), pgURL(t), &rb, byID, opts("b"))
	if err != nil {
		_ = a.Close()
		t.Fatal(err)
	}
	if st := a.Lease(); !st.Enabled || !st.Held || st.Holder != "a" || st.Acquired != 1 {
		t.Errorf("a.Lease() = %+v; want held by a", st)
	}
	if st := b.Lease(); !st.Enabled || st.Held || st.Holder != "a" || st.Acquired != 0 {
		t.Errorf("b.Lease() = %+v; want standing by, holder a", st)
	}
	for i := int64(1); i <= 50; i++ {
		exec(t, conn, "INSERT INTO "+tbl+" VALUES ($1, 'p', 1)", i)
	}
	caughtUp(t, a, conn)
	gotA, _ := ra.take()
	if m := missing(ids(1, 50), count(gotA)); len(m) > 0 {
		t.Errorf("the holder did not apply %v", m)
	}
	// b renewed its attempt several times meanwhile (every TTL/8).
	if gotB, alls := rb.take(); len(gotB) > 0 || alls > 0 {
		t.Errorf("the Source standing by applied %d keys and %d InvalidateAlls; want none", len(gotB), alls)
	}
	if st := b.Lease(); st.Held || st.Acquired != 0 {
		t.Errorf("b.Lease() = %+v after 50 changes; want standing by", st)
	}
	if err := a.Close(); err != nil {
		t.Errorf("a.Close: %v", err)
	}
	// a's Close with DropSlotOnClose left the slot: b took the lease over.
	eventually(t, "b takes the lease over", func() bool { return b.Lease().Held })
	if _, alls := rb.take(); alls != 0 || !slotExists(t, conn, slot) {
		t.Errorf("a's Close dropped the slot while b was there to read it: b made it anew and distrusted every value (%d InvalidateAlls)", alls)
	}
	if err := b.Close(); err != nil {
		t.Errorf("b.Close: %v", err)
	}
	if slotExists(t, conn, slot) {
		t.Error("the last Source of the fleet closed with DropSlotOnClose, and the slot is still there")
	}
	if n, _ := rdb.Exists(deadline(t), key).Result(); n != 0 {
		t.Error("the lease outlived the fleet's Close")
	}
}

// The holder's Close hands over: the Source standing by takes the lease
// and resumes from the slot's confirmed position, so every change
// committed around the handover is applied by one or the other (0
// skipped).
func TestFleetCloseHandsOver(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot, key := fleetNames(t)
	rdb := redisClient(t)
	var ra, rb recorder
	logB := newLeaseLog()
	a, err := New(deadline(t), pgURL(t), &ra, byID, Options{Publication: pub, Slot: slot, Lease: newLease(t, rdb, key, "a")})
	if err != nil {
		t.Fatal(err)
	}
	b := start(t, &rb, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, "b"), OnLease: logB.on})
	for i := int64(1); i <= 20; i++ {
		exec(t, conn, "INSERT INTO "+tbl+" VALUES ($1, 'p', 1)", i)
	}
	caughtUp(t, a, conn)
	closed := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.ConfirmedLSN != st.AppliedLSN {
		t.Errorf("a closed with %v applied and %v confirmed; want what it applied confirmed on the way out", st.AppliedLSN, st.ConfirmedLSN)
	}
	for i := int64(21); i <= 40; i++ { // committed while no one reads
		exec(t, conn, "INSERT INTO "+tbl+" VALUES ($1, 'p', 1)", i)
	}
	at := logB.waitAcquired(t, "b")
	t.Logf("handover: b consumed %v after a's Close (lease TTL 1s, tried every 125ms)", at.Sub(closed).Round(time.Millisecond))
	caughtUp(t, b, conn)
	gotA, _ := ra.take()
	gotB, _ := rb.take()
	all := count(append(gotA, gotB...))
	if m := missing(ids(1, 40), all); len(m) > 0 {
		t.Errorf("skipped in the handover: %v", m)
	}
	if m := missing(ids(21, 40), count(gotB)); len(m) > 0 {
		t.Errorf("b did not apply what was committed after a's Close: %v", m)
	}
	if st := b.Lease(); !st.Held || st.Holder != "b" || st.Acquired != 1 {
		t.Errorf("b.Lease() = %+v; want held by b", st)
	}
	if st := a.Lease(); st.Held {
		t.Errorf("a.Lease() = %+v after Close; want not held", st)
	}
}

// The holder's invalidations go through its Loader, whose Redis tier
// tells every process that read the key (tracking): a Loader of another
// process, whose Source stands by, stops serving the old row.
func TestFleetTierReachesHolders(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot, key := fleetNames(t)
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'p', 10)")
	prefix := "flightpg:test:" + slot + ":"
	pool, err := pgxpool.New(deadline(t), pgURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	loader := func() *flightcache.Loader[int64, int32] {
		rdb := dialRedis(redisAddr(t))
		tier, err := flightredis.NewTier(rdb, flightredis.Options[int64, int32]{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		l, err := flightcache.New(func(ctx context.Context, id int64) (int32, error) {
			var price int32
			err := pool.QueryRow(ctx, "SELECT price FROM "+tbl+" WHERE id = $1", id).Scan(&price)
			return price, err
		}, flightcache.Options[int64, int32]{TTL: time.Hour, Remote: tier})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(); _ = tier.Close(); _ = rdb.Close() })
		return l
	}
	la, lb := loader(), loader()
	rdb := redisClient(t)
	// Closed before the Loaders (Cleanup runs last in, first out).
	a := start(t, la, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, "a")})
	b := start(t, lb, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, "b")})
	if !a.Lease().Held || b.Lease().Held {
		t.Fatalf("a holds %v, b holds %v; want a alone", a.Lease().Held, b.Lease().Held)
	}
	for _, l := range []*flightcache.Loader[int64, int32]{la, lb} {
		if v, err := l.Get(deadline(t), 1); err != nil || v != 10 {
			t.Fatalf("Get = %v, %v; want 10", v, err)
		}
	}
	if v, info, err := lb.GetInfo(deadline(t), 1); err != nil || v != 10 || info.Source != flightcache.SourceHit {
		t.Fatalf("b's Get = %v (%v), %v; want a hit of 10", v, info.Source, err)
	}
	writer, err := pgx.Connect(deadline(t), pgURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	if _, err := writer.Exec(deadline(t), "UPDATE "+tbl+" SET price = 11 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, a, writer)
	// a's Source applied it: b's copy is dropped when Redis's tracking
	// message reaches b's tier, a moment after.
	ctx := deadline(t)
	for {
		v, err := lb.Get(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if v == 11 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("b's Loader serves %d; want 11 (b's Source stands by: only the tier can tell it)", v)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if st := b.Stats(); st.Invalidations != 0 {
		t.Errorf("b's Source invalidated %d keys; want 0 (it stands by)", st.Invalidations)
	}
}

// A holder that finds its lease taken while it is held up applying a
// transaction stops: it confirms nothing more (the slot's confirmed
// position stays before that transaction), and when it takes the lease
// again it replays that transaction.
func TestFleetLostLeaseStopsConfirms(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot, key := fleetNames(t)
	rdb := redisClient(t)
	rec := recorder{block: make(chan struct{})}
	log := newLeaseLog()
	a := start(t, &rec, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, "a"), OnLease: log.on})
	log.waitAcquired(t, "a")
	before := walNow(t, conn)
	eventually(t, "a confirms what it applied", func() bool {
		return slotConfirmed(t, conn, slot) >= before
	})
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'p', 1)")
	commit := walNow(t, conn)
	// a is held up in the Invalidate of row 1. The lease is taken from it.
	if err := rdb.Del(deadline(t), key).Err(); err != nil {
		t.Fatal(err)
	}
	thief := newLease(t, rdb, key, "thief")
	if held, _, err := thief.Acquire(deadline(t)); err != nil || !held {
		t.Fatalf("thief.Acquire = %v, %v", held, err)
	}
	eventually(t, "a finds its lease taken", a.fenced)
	close(rec.block)
	eventually(t, "a stops consuming", func() bool { return !a.Lease().Held })
	if got := a.Stats().ConfirmedLSN; got >= commit {
		t.Errorf("a confirmed %v after losing its lease; want before %v", got, commit)
	}
	if got := slotConfirmed(t, conn, slot); got >= commit {
		t.Errorf("the slot is confirmed at %v; want before %v (a lost its lease before applying it)", got, commit)
	}
	if st := a.Lease(); st.Lost != 1 || st.Holder != "thief" {
		t.Errorf("a.Lease() = %+v; want lost once, holder thief", st)
	}
	if rs := log.reasons(); !slices.Equal(rs, []string{"acquired", "lost"}) {
		t.Errorf("OnLease reasons %v; want acquired, lost", rs)
	}
	rec.take()
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (2, 'p', 1)")
	if err := thief.Release(deadline(t)); err != nil {
		t.Fatal(err)
	}
	log.waitAcquired(t, "a")
	caughtUp(t, a, conn)
	got, _ := rec.take()
	if m := missing([]int64{1, 2}, count(got)); len(m) > 0 {
		t.Errorf("after taking the lease again a did not apply %v (got %v)", m, got)
	}
}

// The consumer process of TestFleetSIGKILLTakeover: it runs only in the
// child (FLIGHTPG_FLEET_CHILD set), holds the lease, prints "held" once
// it consumes, "lost" when it loses the lease, and "key N" for each
// Invalidate (each line one write, so
// the parent has every key invalidated before a SIGKILL), and waits to
// be killed.
func TestFleetConsumerProcess(t *testing.T) {
	if os.Getenv("FLIGHTPG_FLEET_CHILD") == "" {
		t.Skip("the consumer process of TestFleetSIGKILLTakeover")
	}
	rdb := dialRedis(os.Getenv("REDIS_ADDR"))
	lease, err := NewRedisLease(rdb, RedisLeaseOptions{Key: os.Getenv("FLIGHTPG_FLEET_KEY"), Name: "child"})
	if err != nil {
		t.Fatal(err)
	}
	out := &stdoutTarget{}
	_, err = New(context.Background(), os.Getenv("PG_URL"), out, byID, Options{
		Publication: os.Getenv("FLIGHTPG_FLEET_PUB"), Slot: os.Getenv("FLIGHTPG_FLEET_SLOT"), Lease: lease,
		OnLease: func(e LeaseEvent) {
			switch {
			case e.Held:
				out.line("held")
			case e.Reason == "lost":
				out.line("lost")
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	select {} // until SIGKILL
}

type stdoutTarget struct{ mu sync.Mutex }

func (s *stdoutTarget) line(l string) {
	s.mu.Lock()
	_, _ = os.Stdout.WriteString(l + "\n")
	s.mu.Unlock()
}
func (s *stdoutTarget) Invalidate(k int64) { s.line("key " + strconv.FormatInt(k, 10)) }
func (s *stdoutTarget) InvalidateAll()     { s.line("all") }

// The consuming process killed with SIGKILL: a Source of this process,
// standing by, takes the lease over within 2 s and resumes from the
// slot's confirmed position, while a writer commits continuously; over
// several kills every committed row is applied by one consumer or the
// other (0 skipped; duplicates, the applied but unconfirmed changes
// replayed, are counted).
func TestFleetSIGKILLTakeover(t *testing.T) {
	if testing.Short() {
		t.Skip("several consumer processes killed")
	}
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot, key := fleetNames(t)
	rdb := redisClient(t)

	var (
		mu      sync.Mutex
		applied []int64 // every key invalidated, by any consumer
	)
	addKeys := func(keys []int64) {
		mu.Lock()
		applied = append(applied, keys...)
		mu.Unlock()
	}

	// The fleet's slot exists before the first commit: nothing committed
	// is before it.
	exec(t, conn, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)

	// The writer: one INSERT a commit, every 2ms, until stopped.
	writer, err := pgx.Connect(deadline(t), pgURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	var stopOnce sync.Once
	stopWriter := func() error {
		var err error
		stopOnce.Do(func() { close(stop); err = <-writerDone })
		return err
	}
	var written atomic.Int64
	go func() {
		for i := int64(1); ; i++ {
			select {
			case <-stop:
				writerDone <- nil
				return
			case <-time.After(2 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := writer.Exec(ctx, "INSERT INTO "+tbl+" VALUES ($1, 'p', 1)", i)
			cancel()
			if err != nil {
				writerDone <- err
				return
			}
			written.Store(i)
		}
	}()
	defer func() { _ = stopWriter() }()

	const kills = 5
	var takeovers, afterExpiry []time.Duration // from the kill, from the lease's expiry
	var busy uint64                            // starts refused: the slot still active
	for round := range kills {
		child, lines := startConsumer(t, pub, slot, key)
		waitLine(t, lines, "held")
		// keyOf counts a line that names a key.
		keyOf := func(l string) bool {
			k, err := strconv.ParseInt(strings.TrimPrefix(l, "key "), 10, 64)
			if err == nil && strings.HasPrefix(l, "key ") {
				addKeys([]int64{k})
				return true
			}
			return false
		}
		var rec recorder
		log := newLeaseLog()
		src, err := New(deadline(t), pgURL(t), &rec, byID, Options{Publication: pub, Slot: slot, Lease: newLease(t, rdb, key, "parent"), OnLease: log.on})
		if err != nil {
			t.Fatal(err)
		}
		if src.Lease().Held {
			t.Errorf("round %d: the parent holds the lease beside the consumer process", round)
		}
		// Let the child apply and confirm for a while (its position is
		// confirmed about every second): it is killed mid-stream, with
		// changes applied and not yet confirmed.
		from := slotConfirmed(t, conn, slot)
		for n := 0; n < 400; {
			select {
			case l := <-lines:
				if keyOf(l) {
					n++
				}
			case <-deadline(t).Done():
				t.Fatalf("round %d: the consumer process applies nothing", round)
			}
		}
		eventually(t, "the consumer process confirms", func() bool { return slotConfirmed(t, conn, slot) > from })
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		left, _ := rdb.PTTL(deadline(t), key).Result()
		at := log.waitAcquired(t, "the parent")
		takeovers = append(takeovers, at.Sub(killed))
		afterExpiry = append(afterExpiry, at.Sub(killed)-left)
		busy += src.Lease().SlotBusy
		for l := range lines { // until the killed process's output ends
			keyOf(l)
		}
		eventually(t, "the parent applies changes committed after the kill", func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.keys) >= 100
		})
		caughtUp(t, src, conn)
		if err := src.Close(); err != nil {
			t.Error(err)
		}
		got, alls := rec.take()
		addKeys(got)
		if alls != 0 {
			t.Errorf("round %d: the parent distrusted every value %d times; want 0 (no gap)", round, alls)
		}
		if st := src.Stats(); st.Gaps != 0 {
			t.Errorf("round %d: %d gaps", round, st.Gaps)
		}
	}
	if err := stopWriter(); err != nil {
		t.Fatal(err)
	}
	// The last changes, committed after the last parent Source closed.
	var rec recorder
	last := start(t, &rec, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, "last")})
	caughtUp(t, last, conn)
	got, _ := rec.take()
	addKeys(got)

	n := written.Load()
	mu.Lock()
	all := count(applied)
	total := len(applied)
	mu.Unlock()
	if m := missing(ids(1, n), all); len(m) > 0 {
		t.Errorf("%d of %d committed rows skipped: %v", len(m), n, m[:min(len(m), 20)])
	}
	sorted := slices.Clone(takeovers)
	slices.Sort(sorted)
	t.Logf("%d rows committed, %d applications (%d duplicates: applied, not yet confirmed, replayed); takeover after SIGKILL over %d kills: p50 %v, max %v (all %v)",
		n, total, total-len(all), kills, sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), takeovers)
	slices.Sort(afterExpiry)
	t.Logf("after the lease ran out: p50 %v, max %v; starts refused while the killed walsender was still there: %d",
		afterExpiry[len(afterExpiry)/2].Round(time.Millisecond), afterExpiry[len(afterExpiry)-1].Round(time.Millisecond), busy)
	if sorted[len(sorted)-1] > 2*time.Second {
		t.Errorf("takeover took %v; want within 2s", sorted[len(sorted)-1])
	}
}

// startConsumer starts the consumer process (TestFleetConsumerProcess) on
// the fleet's slot and lease; its lines come on the channel returned,
// closed when it exits.
func startConsumer(t *testing.T, pub, slot, key string) (*osexec.Cmd, <-chan string) {
	t.Helper()
	child := osexec.Command(os.Args[0], "-test.run=^TestFleetConsumerProcess$", "-test.v=false")
	child.Env = append(os.Environ(), "FLIGHTPG_FLEET_CHILD=1", "FLIGHTPG_FLEET_KEY="+key,
		"FLIGHTPG_FLEET_PUB="+pub, "FLIGHTPG_FLEET_SLOT="+slot, "PG_URL="+pgURL(t), "REDIS_ADDR="+redisAddr(t))
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1<<16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
		for range lines {
		}
	})
	return child, lines
}

// waitLine waits for the line want from a consumer process.
func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	ctx := deadline(t)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the consumer process exited before printing %q", want)
			}
			if l == want {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the consumer process never printed %q", want)
		}
	}
}

// A paused holder (SIGSTOP) keeps its walsender, and PostgreSQL keeps the
// slot active for it: the Source that took the lease over retries while
// the slot is busy, then, a TTL later, ends that walsender and consumes.
// The holder, resumed, finds its lease gone and stops.
func TestFleetPausedHolderIsCutOff(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	slot, key := fleetNames(t)
	rdb := redisClient(t)
	exec(t, conn, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	child, lines := startConsumer(t, pub, slot, key)
	waitLine(t, lines, "held")
	var rec recorder
	log := newLeaseLog()
	src := start(t, &rec, byID, Options{Publication: pub, Slot: slot, DropSlotOnClose: true, Lease: newLease(t, rdb, key, "parent"), OnLease: log.on})
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	at := log.waitAcquired(t, "the parent")
	st := src.Lease()
	t.Logf("took over a paused holder in %v: %+v", at.Sub(paused).Round(time.Millisecond), st)
	if st.SlotBusy == 0 || st.Terminated != 1 {
		t.Errorf("Lease() = %+v; want the slot found busy, and the paused holder's walsender ended once", st)
	}
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'p', 1)")
	caughtUp(t, src, conn)
	if got, _ := rec.take(); !slices.Contains(got, 1) {
		t.Errorf("the new holder did not apply row 1: %v", got)
	}
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitLine(t, lines, "lost")
	if !src.Lease().Held {
		t.Error("the parent lost the lease when the paused holder resumed")
	}
}

package flightpg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrClosed is returned by [Source.Wait] once the Source is closed.
var ErrClosed = errors.New("flightpg: source closed")

// Source reads the changes of a publication from PostgreSQL's logical
// replication and invalidates, in commit order, the keys and tags its
// [Mapping] names for each, in a [Target] (a *flightcache.Loader).
//
// It runs on one goroutine of its own from [New] to [Source.Close]. It
// reports a commit's position to the server as applied only after that
// commit's invalidations are made, so a lost connection or a restart on a
// permanent slot replays what was not applied and skips nothing; changes
// it cannot replay (a [Gap]) make it distrust every value instead. Its
// methods are safe for concurrent use.
type Source[K comparable] struct {
	opts   Options
	config *pgconn.Config // the replication connection's
	plain  *pgconn.Config // the connection that asks what is visible (visible.go)
	apply  *applier[K]
	stats  counters
	base   context.Context    // New's context without its cancellation: values for the work the Source starts
	cancel context.CancelFunc // ends the Source's goroutine
	done   chan struct{}      // closed when the goroutine has ended

	applied   atomic.Uint64          // Stats.AppliedLSN
	confirmed atomic.Uint64          // Stats.ConfirmedLSN
	slot      atomic.Pointer[string] // the slot read now
	resumed   atomic.Bool            // Stats.Resumed
	urging    atomic.Int32           // CatchUps waiting: the stream asks the server for its position often
	fleet     *fleet                 // Options.Lease's state (fleet.go); nil without a Lease
	connected bool                   // a replication connection was made (the Source's goroutine, New's before it)

	mu       sync.Mutex    // guards progress
	progress chan struct{} // closed when applied grows; nil while no one waits

	closeOnce sync.Once
	closeErr  error
}

// New connects to the PostgreSQL that connString names (a URL or a DSN, as
// pgx takes them; the user needs the REPLICATION attribute; the Source
// holds two connections: the replication stream, and a plain one on which
// it waits for each transaction to be visible before applying it), creates or
// finds the replication slot ([Options.Slot]), starts reading
// [Options.Publication], and returns once the stream has started: every
// change committed after New returns reaches target. ctx bounds this
// start only. When New creates the slot, it distrusts every value target
// holds (InvalidateAll): none of them can be checked against changes from
// before the slot.
//
// mapping names, for each change, the keys and tags to invalidate; see
// [Mapping]. Close the Source when done.
func New[K comparable](ctx context.Context, connString string, target Target[K], mapping Mapping[K], opts Options) (*Source[K], error) {
	if target == nil {
		return nil, errors.New("flightpg: New needs a target, got nil")
	}
	if mapping == nil {
		return nil, errors.New("flightpg: New needs a mapping, got nil")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	config, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("flightpg: connString: %w", err)
	}
	if config.RuntimeParams["application_name"] == "" {
		config.RuntimeParams["application_name"] = "flightpg"
	}
	plain := config.Copy()
	delete(plain.RuntimeParams, "replication")
	config.RuntimeParams["replication"] = "database"
	s := &Source[K]{opts: opts, config: config, plain: plain, base: context.WithoutCancel(ctx), done: make(chan struct{})}
	s.apply = newApplier(target, mapping, opts.MaxPendingKeys, s.report, &s.stats)
	if err := s.configure(target); err != nil {
		return nil, err
	}
	s.applied.Store(uint64(opts.Resume)) // applied by the process that saved the snapshot
	if opts.Lease != nil {
		// One Source of the fleet reads the slot (fleet.go).
		s.fleet = newFleet(opts.Lease)
		s.slot.Store(&opts.Slot)
		var life context.Context
		life, s.cancel = context.WithCancel(s.base)
		t, err := s.startFleet(ctx, life)
		if err != nil {
			s.cancel()
			return nil, err
		}
		go s.runFleet(life, t)
		return s, nil
	}
	link, err := s.connect(ctx, true)
	if err != nil {
		return nil, err
	}
	s.connected = true
	var life context.Context
	life, s.cancel = context.WithCancel(s.base)
	go s.run(life, link)
	return s, nil
}

// Close stops the Source: it ends the replication connection (a temporary
// slot goes with it), drops a permanent slot when
// [Options.DropSlotOnClose] says so, and returns once its goroutine has
// ended. It is idempotent; it returns the error of dropping the slot, if
// any.
func (s *Source[K]) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		<-s.done
		s.signal()
		switch {
		case s.opts.DropSlotOnClose && s.fleet != nil:
			s.closeErr = s.dropFleetSlot()
		case s.opts.DropSlotOnClose:
			s.closeErr = s.dropSlot()
		}
	})
	return s.closeErr
}

// Stats returns what the Source did so far. It may be called at any time,
// after Close too.
func (s *Source[K]) Stats() Stats {
	st := s.stats.snapshot()
	st.AppliedLSN = LSN(s.applied.Load())
	st.ConfirmedLSN = LSN(s.confirmed.Load())
	st.Resumed = s.resumed.Load()
	return st
}

// Applied returns the log position up to which every change has been
// applied ([Stats.AppliedLSN]). For a warm restart, close the Source,
// then read Applied, then take the Loader's entries, and save both: the
// next process passes it as [Options.Resume].
func (s *Source[K]) Applied() LSN {
	return LSN(s.applied.Load())
}

// CatchUp asks the server for its current WAL position (on a connection
// of its own, pg_current_wal_insert_lsn()) and returns it once every
// change committed up to it has been applied: after a warm restart
// ([Options.Resume]), every change committed while no process read the
// slot has then been invalidated, and the Loader may serve. It returns
// ctx's error, the connection's, or [ErrClosed]; while it waits the
// Source asks the server for its position every few milliseconds instead
// of every 10 seconds, so that it returns promptly while nothing is
// committed.
func (s *Source[K]) CatchUp(ctx context.Context) (LSN, error) {
	conn, err := pgconn.ConnectConfig(ctx, s.plain)
	if err != nil {
		return 0, fmt.Errorf("flightpg: CatchUp: connect: %w", err)
	}
	rs, err := conn.Exec(ctx, "SELECT pg_current_wal_insert_lsn()::text").ReadAll()
	s.hangUp(link{plain: conn})
	if err != nil {
		return 0, fmt.Errorf("flightpg: CatchUp: read the server's position: %w", err)
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 {
		return 0, fmt.Errorf("flightpg: CatchUp: read the server's position: unexpected result %v", rs)
	}
	at, err := ParseLSN(string(rs[0].Rows[0][0]))
	if err != nil {
		return 0, fmt.Errorf("flightpg: CatchUp: %w", err)
	}
	s.urging.Add(1)
	defer s.urging.Add(-1)
	return at, s.Wait(ctx, at)
}

// Slot returns the name of the replication slot the Source reads from:
// Options.Slot, or the temporary slot of its current connection.
func (s *Source[K]) Slot() string {
	if p := s.slot.Load(); p != nil {
		return *p
	}
	return ""
}

// Wait returns once every change committed at or before lsn has been
// applied (its keys invalidated), or with ctx's error, or with
// [ErrClosed]. A writer that read pg_current_wal_insert_lsn() after its
// commit returned waits with it for its own change to reach the cache:
// read-your-writes across processes. (pg_current_wal_lsn(), the position
// written, may still be before a commit made with synchronous_commit off.)
func (s *Source[K]) Wait(ctx context.Context, lsn LSN) error {
	for {
		s.mu.Lock()
		if LSN(s.applied.Load()) >= lsn {
			s.mu.Unlock()
			return nil
		}
		select {
		case <-s.done:
			s.mu.Unlock()
			return ErrClosed
		default:
		}
		if s.progress == nil {
			s.progress = make(chan struct{})
		}
		ch := s.progress
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// advance records that everything up to lsn is applied, and wakes Wait.
func (s *Source[K]) advance(lsn LSN) {
	if lsn <= LSN(s.applied.Load()) {
		return
	}
	s.applied.Store(uint64(lsn))
	s.signal()
}

// signal wakes every Wait to look again.
func (s *Source[K]) signal() {
	s.mu.Lock()
	if s.progress != nil {
		close(s.progress)
		s.progress = nil
	}
	s.mu.Unlock()
}

// report hands an error the Source rides out to Options.OnError.
func (s *Source[K]) report(err error) {
	if s.opts.OnError == nil || err == nil {
		return
	}
	_ = guard(func() { s.opts.OnError(err) })
}

// gap distrusts every value after changes were lost, and says so.
func (s *Source[K]) gap(slot, reason string) {
	s.stats.gaps.Add(1)
	s.apply.invalidateAll()
	if s.opts.OnGap != nil {
		_ = guard(func() { s.opts.OnGap(Gap{Slot: slot, Reason: reason}) })
	}
}

// closeTimeout bounds the work Close does on the server: ending the
// connection, dropping a slot.
const closeTimeout = 10 * time.Second

package flightpg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// LeaseEvent says that a [Source] with [Options.Lease] started or stopped
// consuming, or, standing by, saw the lease held by someone new; see
// [Options.OnLease].
type LeaseEvent struct {
	// Held is true when this Source consumes the slot from now on.
	Held bool
	// Holder names who holds the lease as far as this Source knows ("":
	// no one, or unknown).
	Holder string
	// Reason is one of "acquired" (this Source took the lease and its
	// stream started), "lost" (it found the lease gone or taken: it
	// stopped applying and confirming at once), "released" (Close gave it
	// up) or "observed" (standing by, it saw a new holder).
	Reason string
	// Err is why the lease was lost, for "lost".
	Err error
}

// LeaseStatus says where a Source stands in its fleet; see
// [Source.Lease].
type LeaseStatus struct {
	// Enabled is true when [Options.Lease] is set.
	Enabled bool
	// Held is true while this Source holds the lease and consumes.
	Held bool
	// Holder names the holder last seen ("": no one, or unknown); this
	// Source's own name while it holds it.
	Holder string
	// Acquired counts the times this Source took the lease and started
	// consuming.
	Acquired uint64
	// Lost counts the times it lost the lease while consuming (not by
	// Close): a renewal that found it taken, or no renewal for TTL.
	Lost uint64
	// SlotBusy counts the starts PostgreSQL refused because the slot was
	// still active for the walsender of a former holder; each was tried
	// again after a short backoff.
	SlotBusy uint64
	// Terminated counts the walsenders of a former holder this Source
	// ended (pg_terminate_backend) after the slot stayed busy for a TTL
	// past its own takeover: a paused holder's connection.
	Terminated uint64
}

// errLeaseLost ends a stream whose lease is no longer this Source's.
var errLeaseLost = errors.New("flightpg: the lease is no longer held")

// fleet is a Source's side of Options.Lease.
type fleet struct {
	lease Lease
	ttl   time.Duration
	epoch time.Time // validUntil counts from it, on the monotonic clock

	// validUntil is when this Source stops counting the lease as its own,
	// in nanoseconds since epoch; 0 while it does not hold it.
	validUntil                           atomic.Int64
	held                                 atomic.Bool
	acquired, lost, slotBusy, terminated atomic.Uint64

	mu     sync.Mutex // guards holder
	holder string

	// warm is a link a Source standing by keeps open, so that a takeover
	// starts the stream without first opening connections (the Source's
	// goroutine only).
	warm   link
	warmed bool
}

func newFleet(l Lease) *fleet {
	return &fleet{lease: l, ttl: l.TTL(), epoch: time.Now()}
}

func (f *fleet) since() int64 { return int64(time.Since(f.epoch)) }

// valid reports whether the lease is still this Source's by its own
// clock: less than 9/10 of TTL since the start of its last successful
// Acquire (the server started the TTL later than that).
func (f *fleet) valid() bool { return f.since() < f.validUntil.Load() }

// extend records a successful Acquire that started at start; it does
// nothing once the lease was dropped (lose).
func (f *fleet) extend(start int64) {
	next := start + int64(f.ttl)*9/10
	for {
		cur := f.validUntil.Load()
		if cur == 0 || next <= cur || f.validUntil.CompareAndSwap(cur, next) {
			return
		}
	}
}

func (f *fleet) lose() { f.validUntil.Store(0) }

// see records the holder seen, and reports whether it is a new one.
func (f *fleet) see(holder string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holder == holder {
		return false
	}
	f.holder = holder
	return true
}

func (f *fleet) status() LeaseStatus {
	f.mu.Lock()
	holder := f.holder
	f.mu.Unlock()
	return LeaseStatus{
		Enabled: true, Held: f.held.Load(), Holder: holder,
		Acquired: f.acquired.Load(), Lost: f.lost.Load(),
		SlotBusy: f.slotBusy.Load(), Terminated: f.terminated.Load(),
	}
}

// Lease says where the Source stands in its fleet ([Options.Lease]):
// whether it holds the lease, who does, and how often it took it, lost
// it, and found the slot busy. Without a Lease, Enabled is false. It may
// be called at any time, after Close too.
func (s *Source[K]) Lease() LeaseStatus {
	if s.fleet == nil {
		return LeaseStatus{}
	}
	return s.fleet.status()
}

// fenced reports whether this Source must not apply or confirm: it has
// a Lease, and does not hold it by its own clock.
func (s *Source[K]) fenced() bool {
	return s.fleet != nil && !s.fleet.valid()
}

// term is one holding of the lease, from the Acquire that won it to its
// loss or Close: ctx ends with it, and a goroutine renews the lease.
type term struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the renewing goroutine has ended
	why    error         // why the lease was lost (set before cancel)
	whyMu  sync.Mutex
	link   link // the connection New made, if any
	linked bool
}

func (t *term) lost(err error) {
	t.whyMu.Lock()
	if t.why == nil {
		t.why = err
	}
	t.whyMu.Unlock()
	t.cancel()
}

func (t *term) reason() error {
	t.whyMu.Lock()
	defer t.whyMu.Unlock()
	return t.why
}

// tryLease makes one Acquire; on a win it starts a term.
func (s *Source[K]) tryLease(ctx, life context.Context) (*term, error) {
	f := s.fleet
	start := f.since()
	actx, cancel := context.WithTimeout(ctx, f.ttl/3)
	held, holder, err := f.lease.Acquire(actx)
	cancel()
	if err != nil {
		return nil, err
	}
	if !held {
		if f.see(holder) {
			s.leaseEvent(LeaseEvent{Holder: holder, Reason: "observed"})
		}
		return nil, nil
	}
	f.see(holder)
	f.validUntil.Store(start + int64(f.ttl)*9/10)
	t := &term{done: make(chan struct{})}
	t.ctx, t.cancel = context.WithCancel(life)
	go s.keep(t)
	return t, nil
}

// keep renews the lease every TTL/3 until the term ends; it ends the
// term when a renewal finds the lease taken, or when none succeeded for
// TTL.
func (s *Source[K]) keep(t *term) {
	defer close(t.done)
	f := s.fleet
	every := f.ttl / 3
	for {
		timer := time.NewTimer(every)
		select {
		case <-t.ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		start := f.since()
		actx, cancel := context.WithTimeout(t.ctx, every)
		held, holder, err := f.lease.Acquire(actx)
		cancel()
		if t.ctx.Err() != nil {
			return
		}
		switch {
		case err == nil && held:
			f.extend(start)
		case err == nil:
			f.lose()
			f.see(holder)
			t.lost(fmt.Errorf("%w: taken by %q", errLeaseLost, holder))
			return
		case !f.valid():
			f.lose()
			t.lost(fmt.Errorf("%w: not renewed for its TTL (%v): %w", errLeaseLost, f.ttl, err))
			return
		default:
			s.report(fmt.Errorf("flightpg: renew the lease: %w", err))
		}
	}
}

// end stops a term's renewals and, when the Source closes, releases the
// lease.
func (s *Source[K]) end(t *term, closing bool) {
	t.cancel()
	<-t.done
	f := s.fleet
	f.lose()
	if !closing {
		return
	}
	ctx, cancel := context.WithTimeout(s.base, closeTimeout)
	defer cancel()
	if err := f.lease.Release(ctx); err != nil {
		s.report(err)
	}
	f.see("")
}

// handOver confirms what was applied when a holder's stream ends while
// it still holds the lease (Close), so that the next holder replays
// less. A fenced Source confirms nothing.
func (s *Source[K]) handOver(conn *pgconn.PgConn) {
	if s.fleet == nil || s.fenced() || s.applied.Load() <= s.confirmed.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(s.base, time.Second)
	defer cancel()
	at := LSN(s.applied.Load())
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(at)})
	if err == nil {
		s.confirmed.Store(uint64(at))
	}
}

// leaseEvent hands e to Options.OnLease.
func (s *Source[K]) leaseEvent(e LeaseEvent) {
	if s.opts.OnLease == nil {
		return
	}
	if perr := guard(func() { s.opts.OnLease(e) }); perr != nil {
		s.report(fmt.Errorf("flightpg: Options.OnLease panicked: %w", perr))
	}
}

// startFleet is New's part with a Lease: it checks the publication,
// tries the lease once and, when it wins, connects, so that New fails on
// a wrong setting and returns holding the stream when it can. A Redis
// that cannot be reached is ridden out: the Source stands by.
func (s *Source[K]) startFleet(ctx, life context.Context) (*term, error) {
	if err := s.checkPublication(ctx); err != nil {
		return nil, err
	}
	t, err := s.tryLease(ctx, life)
	if err != nil {
		s.report(fmt.Errorf("flightpg: take the lease: %w", err))
		return nil, nil
	}
	if t == nil {
		return nil, nil
	}
	l, err := s.connectHolding(ctx, t, true)
	if err != nil {
		s.end(t, true)
		return nil, err
	}
	t.link, t.linked = l, true
	return t, nil
}

// runFleet is the Source's goroutine with a Lease: it stands by until it
// takes the lease, consumes until it loses it, and again, until ctx ends.
func (s *Source[K]) runFleet(ctx context.Context, t *term) {
	defer close(s.done)
	defer func() {
		if s.fleet.warmed {
			s.hangUp(s.fleet.warm)
			s.fleet.warmed = false
		}
	}()
	for {
		if t == nil {
			if t = s.standBy(ctx); t == nil {
				return
			}
		}
		s.consume(ctx, t)
		closing := ctx.Err() != nil
		why := t.reason()
		s.end(t, closing)
		if s.fleet.held.Swap(false) {
			if closing {
				s.leaseEvent(LeaseEvent{Reason: "released"})
			} else {
				s.fleet.lost.Add(1)
				s.report(why)
				s.leaseEvent(LeaseEvent{Holder: s.fleet.status().Holder, Reason: "lost", Err: why})
			}
		}
		if closing {
			return
		}
		t = nil
	}
}

// standBy tries for the lease every TTL/8 (jittered) until it wins it or
// ctx ends (then it returns nil).
func (s *Source[K]) standBy(ctx context.Context) *term {
	f := s.fleet
	every := f.ttl / 8
	for {
		if !f.warmed {
			// A failure here is met again, and reported, at the takeover.
			if l, err := s.dial(ctx); err == nil {
				f.warm, f.warmed = l, true
			}
		}
		d := every*4/5 + rand.N(every*2/5+1)
		timer := time.NewTimer(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		t, err := s.tryLease(ctx, ctx)
		if ctx.Err() != nil {
			if t != nil {
				s.end(t, true)
			}
			return nil
		}
		if err != nil {
			s.report(fmt.Errorf("flightpg: take the lease: %w", err))
			continue
		}
		if t != nil {
			return t
		}
	}
}

// consume reads the slot while the term lasts, reconnecting after a
// lost connection as run does.
func (s *Source[K]) consume(ctx context.Context, t *term) {
	l := t.link
	if !t.linked {
		var err error
		if l, err = s.connectHolding(t.ctx, t, false); err != nil {
			return // the term or the Source ended
		}
	}
	s.fleet.held.Store(true)
	s.fleet.acquired.Add(1)
	s.leaseEvent(LeaseEvent{Held: true, Holder: s.fleet.status().Holder, Reason: "acquired"})
	for {
		err := s.stream(t.ctx, l)
		s.hangUp(l)
		if errors.Is(err, errLeaseLost) {
			t.lost(err)
		}
		if t.ctx.Err() != nil {
			return
		}
		lost := time.Now()
		s.report(fmt.Errorf("flightpg: replication connection lost: %w", err))
		var cerr error
		if l, cerr = s.connectHolding(t.ctx, t, false); cerr != nil {
			return
		}
		s.stats.reconnects.Add(1)
		if s.opts.OnReconnect != nil {
			r := Reconnected{Slot: s.Slot(), Err: err, Down: time.Since(lost)}
			if perr := guard(func() { s.opts.OnReconnect(r) }); perr != nil {
				s.report(fmt.Errorf("flightpg: Options.OnReconnect panicked: %w", perr))
			}
		}
	}
}

// Backoff while the slot is busy: the walsender of a former holder is
// still exiting (a closed connection) or its holder is paused.
const (
	busyInitial = 20 * time.Millisecond
	busyMax     = 320 * time.Millisecond
)

// connectHolding connects while the term lasts. A slot still active for
// another walsender (a former holder's: PostgreSQL lets one walsender
// use a slot at a time) is tried again after a short backoff; once it
// has stayed busy for a TTL (its holder, fenced by its own clock since,
// is paused or cut off), that walsender is ended. In New (inNew) any
// other error is returned; later it is reported and retried with
// Options.Reconnect's backoff.
func (s *Source[K]) connectHolding(ctx context.Context, t *term, inNew bool) (link, error) {
	busy := backoff.NewExponentialBackOff()
	busy.InitialInterval, busy.MaxInterval, busy.MaxElapsedTime = busyInitial, busyMax, 0
	busy.Reset()
	other := backoff.NewExponentialBackOff()
	other.InitialInterval, other.MaxInterval, other.MaxElapsedTime = s.opts.Reconnect.InitialInterval, s.opts.Reconnect.MaxInterval, 0
	other.Reset()
	if f := s.fleet; f.warmed {
		l := f.warm
		f.warmed = false
		if err := s.begin(ctx, l, !s.connected); err == nil {
			s.connected = true
			return l, nil
		}
		s.hangUp(l) // gone stale, or the slot is busy: connect anew
	}
	var busySince time.Time
	for {
		if s.fenced() {
			t.lost(errLeaseLost)
			return link{}, errLeaseLost
		}
		l, err := s.connect(ctx, !s.connected)
		if err == nil {
			s.connected = true
			return l, nil
		}
		if ctx.Err() != nil {
			return link{}, ctx.Err()
		}
		var wait time.Duration
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: "replication slot ... is active for PID ..."
			s.fleet.slotBusy.Add(1)
			if busySince.IsZero() {
				busySince = time.Now()
			}
			if time.Since(busySince) >= s.fleet.ttl {
				if err := s.endFormerHolder(ctx); err != nil {
					s.report(err)
				}
				busySince = time.Now()
			}
			wait = busy.NextBackOff()
		} else {
			if inNew {
				return link{}, err
			}
			s.report(fmt.Errorf("flightpg: connect: %w", err))
			wait = other.NextBackOff()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return link{}, ctx.Err()
		case <-timer.C:
		}
	}
}

// endFormerHolder ends the walsender still active on the slot: this
// Source holds the lease, so it is a former holder's, which stopped
// counting the lease as its own a TTL ago at the latest.
func (s *Source[K]) endFormerHolder(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, s.plain)
	if err != nil {
		return fmt.Errorf("flightpg: end the former holder's walsender: %w", err)
	}
	defer s.hangUp(link{plain: conn})
	rs, err := conn.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '"+
		s.opts.Slot+"' AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()").ReadAll()
	if err != nil {
		return fmt.Errorf("flightpg: end the former holder's walsender on slot %s: %w", s.opts.Slot, err)
	}
	if len(rs) == 1 && len(rs[0].Rows) == 1 && string(rs[0].Rows[0][0]) == "t" {
		s.fleet.terminated.Add(1)
	}
	return nil
}

// checkPublication fails when Options.Publication does not exist; a
// Source that stands by checks it this way, on a plain connection.
func (s *Source[K]) checkPublication(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, s.plain)
	if err != nil {
		return fmt.Errorf("flightpg: connect: %w", err)
	}
	defer s.hangUp(link{plain: conn})
	rs, err := conn.Exec(ctx, "SELECT 1 FROM pg_publication WHERE pubname = "+quoteLiteral(s.opts.Publication)).ReadAll()
	if err != nil {
		return fmt.Errorf("flightpg: look up publication %q: %w", s.opts.Publication, err)
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 {
		return fmt.Errorf("flightpg: Options.Publication: no publication %q in database %q", s.opts.Publication, s.config.Database)
	}
	return nil
}

// dropFleetSlot is Close's DropSlotOnClose with a Lease: the slot is
// dropped only when no other Source of the fleet takes the lease. This
// Source let it go as it stopped; it waits TTL/2, in which any Source
// standing by tries for it several times (every TTL/8) and takes it,
// then takes it itself: if it can, no Source stands by, and it drops the
// slot. (A Source standing by that missed it all that time, Redis
// failing it, makes the slot anew when it takes over, and distrusts
// every value: a cost, never a stale row.)
func (s *Source[K]) dropFleetSlot() error {
	ctx, cancel := context.WithTimeout(s.base, closeTimeout)
	defer cancel()
	timer := time.NewTimer(s.fleet.ttl / 2)
	select {
	case <-ctx.Done():
		timer.Stop()
		return ctx.Err()
	case <-timer.C:
	}
	held, _, err := s.fleet.lease.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("flightpg: drop slot %s: take the lease: %w", s.opts.Slot, err)
	}
	if !held {
		return nil // the fleet reads on: the slot stays
	}
	defer func() {
		if err := s.fleet.lease.Release(ctx); err != nil {
			s.report(err)
		}
	}()
	return s.dropSlot()
}

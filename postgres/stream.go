package flightpg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

const (
	// statusInterval is the most time the applied position waits before
	// it is reported to the server.
	statusInterval = time.Second
	// idleStatusInterval is how often the Source reports while nothing
	// changes, so the server knows it is alive.
	idleStatusInterval = 10 * time.Second
	// silenceLimit is how long the Source waits for any message before it
	// takes the connection for dead; the server sends a keepalive at least
	// every wal_sender_timeout/2 (30s by default).
	silenceLimit = 2 * time.Minute
	// urgeInterval is how often the Source asks the server for its
	// position while a CatchUp waits.
	urgeInterval = 20 * time.Millisecond
)

// link is a Source's pair of connections to the server: the replication
// stream, and a plain one that asks whether a transaction is visible yet
// (visible.go). Only the Source's goroutine uses them (New's before it).
type link struct {
	repl, plain *pgconn.PgConn
}

// run is the Source's goroutine: it reads the stream on l until a
// connection fails, then reconnects with backoff, until ctx ends.
func (s *Source[K]) run(ctx context.Context, l link) {
	defer close(s.done)
	for {
		err := s.stream(ctx, l)
		s.hangUp(l)
		if ctx.Err() != nil {
			return
		}
		lost := time.Now()
		s.report(fmt.Errorf("flightpg: replication connection lost: %w", err))
		var ok bool
		if l, ok = s.reconnect(ctx); !ok {
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

// reconnect connects again, waiting between attempts as Options.Reconnect
// says; it returns false when ctx ends first.
func (s *Source[K]) reconnect(ctx context.Context) (link, bool) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = s.opts.Reconnect.InitialInterval
	b.MaxInterval = s.opts.Reconnect.MaxInterval
	b.MaxElapsedTime = 0
	b.Reset()
	for {
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return link{}, false
		case <-t.C:
		}
		l, err := s.connect(ctx, false)
		if err == nil {
			return l, true
		}
		if ctx.Err() != nil {
			return link{}, false
		}
		s.report(fmt.Errorf("flightpg: reconnect: %w", err))
	}
}

// hangUp closes a link's connections; a temporary slot goes with the
// replication one.
func (s *Source[K]) hangUp(l link) {
	ctx, cancel := context.WithTimeout(s.base, closeTimeout)
	defer cancel()
	for _, c := range []*pgconn.PgConn{l.repl, l.plain} {
		if c != nil {
			_ = c.Close(ctx)
		}
	}
}

// connect opens the connections, finds or creates the slot, and starts
// the stream after the last position applied. A slot created where one
// was read before (first is false) is a gap; any slot created distrusts
// every value.
func (s *Source[K]) connect(ctx context.Context, first bool) (link, error) {
	l, err := s.dial(ctx)
	if err != nil {
		return link{}, err
	}
	if err := s.begin(ctx, l, first); err != nil {
		s.hangUp(l)
		return link{}, err
	}
	return l, nil
}

// dial opens a link's connections.
func (s *Source[K]) dial(ctx context.Context) (link, error) {
	var l link
	var err error
	if l.plain, err = pgconn.ConnectConfig(ctx, s.plain); err != nil {
		return link{}, fmt.Errorf("flightpg: connect: %w", err)
	}
	if l.repl, err = pgconn.ConnectConfig(ctx, s.config); err != nil {
		s.hangUp(l)
		return link{}, fmt.Errorf("flightpg: connect for replication: %w", err)
	}
	return l, nil
}

// begin finds or creates the slot and starts the stream on l, as connect
// says.
func (s *Source[K]) begin(ctx context.Context, l link, first bool) error {
	slot, lost, err := s.startStream(ctx, l.repl)
	if err != nil {
		return err
	}
	s.slot.Store(&slot)
	switch {
	case lost != "" && (!first || s.opts.Resume != 0):
		// A resume that cannot replay from Resume is a gap: the entries
		// restored before New cannot be checked.
		s.gap(slot, lost)
	case lost != "":
		s.apply.invalidateAll()
	case first && s.opts.Resume != 0:
		s.resumed.Store(true)
	}
	return nil
}

// stream reads the replication stream on conn and applies it, reporting
// progress to the server, until an error or ctx ends (then it returns nil).
func (s *Source[K]) stream(ctx context.Context, l link) error {
	conn := l.repl
	rels := newRelations()
	s.apply.reset() // a transaction cut by a lost connection comes again
	lastStatus, lastHeard := time.Now(), time.Now()
	sendStatus := func(reply bool) error {
		if s.fenced() {
			return errLeaseLost // a lease lost confirms nothing more
		}
		at := LSN(s.applied.Load())
		err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
			WALWritePosition: pglogrepl.LSN(at), ReplyRequested: reply,
		})
		if err != nil {
			return fmt.Errorf("flightpg: report position %v: %w", at, err)
		}
		s.confirmed.Store(uint64(at))
		lastStatus = time.Now()
		return nil
	}
	for {
		next := lastStatus.Add(idleStatusInterval)
		if s.applied.Load() > s.confirmed.Load() {
			next = lastStatus.Add(statusInterval)
		}
		urged := s.urging.Load() > 0
		if urged {
			next = lastStatus.Add(urgeInterval)
		}
		if !time.Now().Before(next) {
			// While idle, ask for a reply: the server's keepalive shows
			// the connection alive (silenceLimit). While a CatchUp waits,
			// ask too: the keepalive carries the server's position, which
			// advances AppliedLSN between transactions.
			idle := s.applied.Load() == s.confirmed.Load()
			if err := sendStatus(idle || urged); err != nil {
				return err
			}
			continue
		}
		// Transactions received whole wait for the next message only as
		// long as it takes to see whether one is already there: if none,
		// they are applied now.
		deadline := next
		peek := s.apply.waiting()
		if peek {
			deadline = earliest(next, time.Now().Add(backlogPeek))
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			s.handOver(conn)
			return nil
		case err != nil && pgconn.Timeout(err):
			if peek {
				if err := s.applyGroup(ctx, l.plain); err != nil {
					return err
				}
				continue
			}
			if time.Since(lastHeard) > silenceLimit {
				return fmt.Errorf("flightpg: no message from the server in %v", silenceLimit)
			}
			continue
		case err != nil:
			return err
		}
		lastHeard = time.Now()
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			reply, err := s.handle(ctx, l.plain, rels, msg.Data)
			if err != nil {
				return err
			}
			lastHeard = time.Now() // a slow target is not a silent server
			if reply {
				if err := sendStatus(false); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyDone:
			return errors.New("flightpg: the server ended the replication stream")
		}
	}
}

// handle applies one message of the stream; it returns whether the
// server asked for a reply.
func (s *Source[K]) handle(ctx context.Context, plain *pgconn.PgConn, rels *relations, data []byte) (reply bool, err error) {
	if len(data) == 0 {
		return false, nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("flightpg: %w", err)
		}
		// Between transactions, with nothing waiting to be applied,
		// everything the server decoded up to its position has been
		// received and applied.
		if !s.apply.busy() {
			s.advance(LSN(k.ServerWALEnd))
		}
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		if s.fenced() {
			return false, errLeaseLost // a lease lost applies nothing more
		}
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, fmt.Errorf("flightpg: %w", err)
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			s.apply.unknown(fmt.Errorf("flightpg: decode: %w", err))
			return false, nil
		}
		s.message(rels, m)
		if s.apply.due(time.Now()) {
			if err := s.applyGroup(ctx, plain); err != nil {
				return false, err
			}
		}
	}
	return false, nil
}

// backlogPeek is how long transactions received whole wait for a next
// message to join their group (see applier): one already received by the
// kernel or the connection's buffer comes at once.
const backlogPeek = 100 * time.Microsecond

// applyGroup applies what the applier holds: it waits until the
// transactions it named are visible (their commits are durable; a load
// after the invalidations must read them, visible.go), invalidates, and
// reports the transactions received whole applied.
func (s *Source[K]) applyGroup(ctx context.Context, plain *pgconn.PgConn) error {
	if s.fenced() {
		return errLeaseLost // a lease lost applies nothing more
	}
	if xids := s.apply.xids; len(xids) > 0 {
		notYet, err := awaitVisible(ctx, plain, xids)
		if err != nil {
			return err
		}
		s.stats.notYetVisible.Add(uint64(notYet))
		s.apply.xids = xids[:0]
	}
	if end, ok := s.apply.flush(time.Now()); ok {
		s.advance(end)
	}
	return nil
}

// earliest returns the earlier of two times.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// message applies one pgoutput message.
func (s *Source[K]) message(rels *relations, m pglogrepl.Message) {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		rels.byID[m.RelationID] = m
	case *pglogrepl.BeginMessage:
		s.apply.begin(m)
	case *pglogrepl.CommitMessage:
		s.apply.commit(m, time.Now())
	case *pglogrepl.InsertMessage, *pglogrepl.UpdateMessage, *pglogrepl.DeleteMessage:
		c, err := rels.change(m)
		if err != nil {
			s.apply.unknown(err)
			return
		}
		s.apply.add(c)
	case *pglogrepl.TruncateMessage:
		cs, err := rels.truncated(m)
		if err != nil {
			s.apply.unknown(err)
			return
		}
		for _, c := range cs {
			s.apply.add(c)
		}
	}
	// Type, Origin and logical decoding messages name no row.
}

// quoteIdent quotes a name as an SQL identifier.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// quoteLiteral quotes a string as an SQL literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

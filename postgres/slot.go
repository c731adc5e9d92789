package flightpg

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// startStream finds or creates the slot and starts the stream on conn. It
// returns the slot's name and, when changes before the stream's start
// cannot be replayed (the slot was created, or someone else read past what
// this Source applied), why.
func (s *Source[K]) startStream(ctx context.Context, conn *pgconn.PgConn) (slot, lost string, err error) {
	// pgoutput reads the publication only when the first change comes:
	// look now, so that a wrong name fails New and says why.
	rs, err := conn.Exec(ctx, "SELECT 1 FROM pg_publication WHERE pubname = "+quoteLiteral(s.opts.Publication)).ReadAll()
	if err != nil {
		return "", "", fmt.Errorf("flightpg: look up publication %q: %w", s.opts.Publication, err)
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 {
		return "", "", fmt.Errorf("flightpg: Options.Publication: no publication %q in database %q", s.opts.Publication, s.config.Database)
	}
	slot = s.opts.Slot
	start := LSN(s.applied.Load())
	if s.fleet != nil {
		start = 0 // a fleet's holder reads from the slot's confirmed position
	}
	if slot == "" {
		slot = "flightpg_" + randomHex(8)
		if err := createSlot(ctx, conn, slot, true); err != nil {
			return "", "", err
		}
		lost = "a new temporary slot: what was committed before it cannot be read"
	} else {
		created, confirmed, err := ensureSlot(ctx, conn, slot)
		if err != nil {
			return "", "", err
		}
		if s.fleet != nil {
			// The fleet applied every change up to the slot's confirmed
			// position: its former holder's invalidations reached this
			// target through the tier.
			s.advance(confirmed)
		}
		switch {
		case created:
			lost = "slot " + slot + " was missing and is created anew"
		case start != 0 && confirmed > start:
			lost = fmt.Sprintf("slot %s was read up to %v elsewhere, past %v applied here", slot, confirmed, start)
		}
	}
	if lost != "" {
		start = 0 // from the slot's own position
	}
	err = s.startReplication(ctx, conn, slot, start)
	var pgErr *pgconn.PgError
	if s.opts.Slot != "" && errors.As(err, &pgErr) && pgErr.Code == "55000" {
		// The slot was invalidated (max_slot_wal_keep_size): the WAL it
		// needed is gone. Make it anew.
		if err := dropSlot(ctx, conn, slot); err != nil {
			return "", "", err
		}
		if err := createSlot(ctx, conn, slot, false); err != nil {
			return "", "", err
		}
		lost = "slot " + slot + " was invalidated (" + pgErr.Message + ") and is created anew"
		err = s.startReplication(ctx, conn, slot, 0)
	}
	if err != nil {
		return "", "", fmt.Errorf("flightpg: start replication on slot %s: %w", slot, err)
	}
	return slot, lost, nil
}

func (s *Source[K]) startReplication(ctx context.Context, conn *pgconn.PgConn, slot string, start LSN) error {
	return pglogrepl.StartReplication(ctx, conn, slot, pglogrepl.LSN(start), pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(quoteIdent(s.opts.Publication))},
	})
}

// createSlot creates a logical slot on pgoutput.
func createSlot(ctx context.Context, conn *pgconn.PgConn, slot string, temporary bool) error {
	_, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: temporary, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		return fmt.Errorf("flightpg: create slot %s: %w", slot, err)
	}
	return nil
}

// ensureSlot creates the permanent slot when it is missing; it returns
// whether it did, and the position the slot was confirmed at before.
func ensureSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (created bool, confirmed LSN, err error) {
	// A replication connection (replication=database) takes plain SQL
	// through the simple protocol. slot is checked: [a-z0-9_]+.
	rs, err := conn.Exec(ctx, "SELECT confirmed_flush_lsn, plugin FROM pg_replication_slots WHERE slot_name = '"+slot+"'").ReadAll()
	if err != nil {
		return false, 0, fmt.Errorf("flightpg: look up slot %s: %w", slot, err)
	}
	if len(rs) == 1 && len(rs[0].Rows) == 1 {
		row := rs[0].Rows[0]
		if string(row[1]) != "pgoutput" {
			return false, 0, fmt.Errorf("flightpg: slot %s uses plugin %q, not pgoutput", slot, row[1])
		}
		if row[0] != nil {
			if confirmed, err = ParseLSN(string(row[0])); err != nil {
				return false, 0, err
			}
		}
		return false, confirmed, nil
	}
	return true, 0, createSlot(ctx, conn, slot, false)
}

// dropSlot drops a slot, waiting for a connection still using it to let
// go.
func dropSlot(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	if err := pglogrepl.DropReplicationSlot(ctx, conn, slot, pglogrepl.DropReplicationSlotOptions{Wait: true}); err != nil {
		return fmt.Errorf("flightpg: drop slot %s: %w", slot, err)
	}
	return nil
}

// dropSlot drops the permanent slot, for Close.
func (s *Source[K]) dropSlot() error {
	ctx, cancel := context.WithTimeout(s.base, closeTimeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, s.config)
	if err != nil {
		return fmt.Errorf("flightpg: drop slot %s: %w", s.opts.Slot, err)
	}
	defer s.hangUp(link{repl: conn})
	return dropSlot(ctx, conn, s.opts.Slot)
}

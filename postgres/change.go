package flightpg

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"
)

// Change is one committed row change, as the [Mapping] sees it. Its fields
// are not PostgreSQL's own: another database's change stream (a MySQL
// binlog) could fill them.
type Change struct {
	// Schema and Table name the table the row belongs to.
	Schema, Table string
	// Op is what happened to the row.
	Op Op
	// Old holds the row's values before an UPDATE or a DELETE, as far as
	// the table's REPLICA IDENTITY gives them: with the default identity,
	// the primary key's columns, and only when the UPDATE changed the key
	// (a DELETE always has them); with REPLICA IDENTITY FULL, every
	// column. Nil for an INSERT, a TRUNCATE, and an UPDATE that left the
	// key alone (New then holds the key).
	Old map[string]any
	// New holds the row's values after an INSERT or an UPDATE: every
	// column, except a TOASTed value the UPDATE did not change, which
	// PostgreSQL does not send (its column is absent). Nil for a DELETE
	// and a TRUNCATE.
	//
	// Values are decoded from PostgreSQL's text form into pgx's Go types
	// (int4 -> int32, int8 -> int64, text -> string, timestamptz ->
	// time.Time, ...); NULL is nil; a type pgx does not know (an enum, a
	// domain of one) stays a string.
	New map[string]any
	// LSN is where the commit record of the change's transaction is in
	// the write-ahead log: changes of one transaction share it, and it
	// grows with the commit order.
	LSN LSN
	// CommitTime is when the transaction committed, by the server's clock.
	CommitTime time.Time
}

// Op is the operation a [Change] records.
type Op uint8

// The operations a Change records.
const (
	// OpInsert is an INSERT: New holds the row.
	OpInsert Op = iota + 1
	// OpUpdate is an UPDATE: New holds the row after it, Old the replica
	// identity's columns before it when PostgreSQL sends them.
	OpUpdate
	// OpDelete is a DELETE: Old holds the replica identity's columns.
	OpDelete
	// OpTruncate is a TRUNCATE of the whole table: neither Old nor New;
	// one Change per table truncated. The rows are not named, so unless
	// the Mapping names keys or tags for it, the Source distrusts every
	// value (InvalidateAll).
	OpTruncate
)

// String returns "insert", "update", "delete" or "truncate".
func (o Op) String() string {
	switch o {
	case OpInsert:
		return "insert"
	case OpUpdate:
		return "update"
	case OpDelete:
		return "delete"
	case OpTruncate:
		return "truncate"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// LSN is a position in PostgreSQL's write-ahead log.
type LSN uint64

// String formats the LSN as PostgreSQL does (16/B374D848).
func (l LSN) String() string { return pglogrepl.LSN(l).String() }

// ParseLSN parses the text form of an LSN, as pg_current_wal_insert_lsn()
// gives it.
func ParseLSN(s string) (LSN, error) {
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("flightpg: %w", err)
	}
	return LSN(l), nil
}

// Mapping names what a committed change makes stale: the keys to
// Invalidate and the tags to InvalidateTag. It is called on the Source's
// goroutine, once per change, in commit order; a panic in it is recovered
// and distrusts every value (see [Stats.MappingPanics]). Returning nothing
// means the change touches no cached value (except for [OpTruncate]).
type Mapping[K comparable] func(Change) (keys []K, tags []string)

// relations remembers the tables pgoutput has described (a Relation
// message comes before a table's first change on each connection, and
// again after its definition changed), and decodes rows by them.
type relations struct {
	byID  map[uint32]*pglogrepl.RelationMessage
	types *pgtype.Map
}

func newRelations() *relations {
	return &relations{byID: make(map[uint32]*pglogrepl.RelationMessage), types: pgtype.NewMap()}
}

// change returns the Change a row message records, without its commit
// LSN and time.
func (r *relations) change(m pglogrepl.Message) (Change, error) {
	var (
		id       uint32
		op       Op
		old, new *pglogrepl.TupleData
		keyOnly  bool
	)
	switch m := m.(type) {
	case *pglogrepl.InsertMessage:
		id, op, new = m.RelationID, OpInsert, m.Tuple
	case *pglogrepl.UpdateMessage:
		id, op, old, new = m.RelationID, OpUpdate, m.OldTuple, m.NewTuple
		keyOnly = m.OldTupleType == pglogrepl.UpdateMessageTupleTypeKey
	case *pglogrepl.DeleteMessage:
		id, op, old = m.RelationID, OpDelete, m.OldTuple
		keyOnly = m.OldTupleType == pglogrepl.DeleteMessageTupleTypeKey
	default:
		return Change{}, fmt.Errorf("flightpg: not a row change: %T", m)
	}
	rel, ok := r.byID[id]
	if !ok {
		return Change{}, fmt.Errorf("flightpg: a %v of relation %d, which no Relation message described", op, id)
	}
	c := Change{Schema: rel.Namespace, Table: rel.RelationName, Op: op}
	var err error
	if old != nil {
		if c.Old, err = r.row(rel, old, keyOnly); err != nil {
			return Change{}, err
		}
	}
	if new != nil {
		if c.New, err = r.row(rel, new, false); err != nil {
			return Change{}, err
		}
	}
	return c, nil
}

// truncated returns the Change of each table a TRUNCATE emptied.
func (r *relations) truncated(m *pglogrepl.TruncateMessage) ([]Change, error) {
	cs := make([]Change, 0, len(m.RelationIDs))
	for _, id := range m.RelationIDs {
		rel, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("flightpg: a truncate of relation %d, which no Relation message described", id)
		}
		cs = append(cs, Change{Schema: rel.Namespace, Table: rel.RelationName, Op: OpTruncate})
	}
	return cs, nil
}

// row decodes a tuple by its relation's columns. keyOnly (an old tuple of
// the key's columns) leaves out the columns that are not the key's: they
// are sent as NULL.
func (r *relations) row(rel *pglogrepl.RelationMessage, t *pglogrepl.TupleData, keyOnly bool) (map[string]any, error) {
	if len(t.Columns) > len(rel.Columns) {
		return nil, fmt.Errorf("flightpg: a row of %s.%s has %d columns, its relation %d",
			rel.Namespace, rel.RelationName, len(t.Columns), len(rel.Columns))
	}
	row := make(map[string]any, len(t.Columns))
	for i, col := range t.Columns {
		def := rel.Columns[i]
		if keyOnly && def.Flags&1 == 0 {
			continue
		}
		switch col.DataType {
		case pglogrepl.TupleDataTypeNull:
			row[def.Name] = nil
		case pglogrepl.TupleDataTypeToast:
			// Unchanged and not sent: absent.
		case pglogrepl.TupleDataTypeText:
			v, err := r.decode(def.DataType, col.Data)
			if err != nil {
				return nil, fmt.Errorf("flightpg: column %s of %s.%s: %w", def.Name, rel.Namespace, rel.RelationName, err)
			}
			row[def.Name] = v
		default:
			return nil, fmt.Errorf("flightpg: column %s of %s.%s: unknown tuple data type %q",
				def.Name, rel.Namespace, rel.RelationName, col.DataType)
		}
	}
	return row, nil
}

// decode turns a column's text form into pgx's Go value for its type, or
// into a string for a type pgx does not know.
func (r *relations) decode(oid uint32, text []byte) (any, error) {
	if t, ok := r.types.TypeForOID(oid); ok {
		return t.Codec.DecodeValue(r.types, oid, pgtype.TextFormatCode, text)
	}
	return string(text), nil
}

// CommitVersion is an [Options.Version] for a Loader whose values carry,
// as their version (flightcache's Options.Version), the WAL position
// their row was read at: the commit's position plus one. A value read at
// a position at or before a commit's own predates it, and is not stored
// after the change is applied. Read the position in a statement before
// the row's, at READ COMMITTED (each statement a newer snapshot), so that
// it is never past what the row's statement sees: on the primary
// pg_current_wal_insert_lsn(), on a replica pg_last_wal_replay_lsn().
func CommitVersion(c Change) uint64 { return uint64(c.LSN) + 1 }

// ColumnVersion returns an [Options.Version] that reads the version from
// column of the row after the change (Change.New): a version column the
// application raises with every write, an integer (int2, int4, int8) or a
// timestamp (its Unix nanoseconds). It gives 0 (no version: a plain
// Invalidate) for a DELETE, a TRUNCATE, a NULL or negative value, a
// column the change does not carry, or one of another type.
func ColumnVersion(column string) func(Change) uint64 {
	return func(c Change) uint64 {
		var n int64
		switch v := c.New[column].(type) {
		case int16:
			n = int64(v)
		case int32:
			n = int64(v)
		case int64:
			n = v
		case time.Time:
			n = v.UnixNano()
		}
		return uint64(max(n, 0))
	}
}

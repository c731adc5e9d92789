package flightpg

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/flightcache/flightcache"
)

// A *flightcache.Loader is a Target, and one with InvalidateTag a
// TagTarget: the Source needs nothing else of it.
var _ Target[int64] = (*flightcache.Loader[int64, string])(nil)

// Each row change reaches the Mapping with its table, operation and the
// values the replica identity gives, and its keys are invalidated; a
// TRUNCATE the Mapping names nothing for distrusts everything.
func TestChangesInvalidateTheirKeys(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	var mu sync.Mutex
	var seen []Change
	mapping := func(c Change) ([]int64, []string) {
		mu.Lock()
		seen = append(seen, c)
		mu.Unlock()
		return byID(c)
	}
	target := &recorder{}
	src := start(t, target, mapping, Options{Publication: pub})
	_, allsAtStart := target.take()
	if allsAtStart != 1 {
		t.Errorf("InvalidateAll calls after New created its slot = %d; want 1", allsAtStart)
	}
	takeChanges := func() []Change {
		mu.Lock()
		defer mu.Unlock()
		cs := seen
		seen = nil
		return cs
	}

	steps := []struct {
		sql     string
		keys    []int64
		op      Op
		old     map[string]any
		new     map[string]any
		changes int
	}{
		{"INSERT INTO " + tbl + " VALUES (1, 'tea', 3), (2, 'jam', 5)", []int64{1, 2}, OpInsert,
			nil, map[string]any{"id": int64(2), "name": "jam", "price": int32(5)}, 2},
		{"UPDATE " + tbl + " SET price = 4 WHERE id = 1", []int64{1}, OpUpdate,
			nil, map[string]any{"id": int64(1), "name": "tea", "price": int32(4)}, 1},
		{"UPDATE " + tbl + " SET id = 3 WHERE id = 2", []int64{2, 3}, OpUpdate,
			map[string]any{"id": int64(2)}, map[string]any{"id": int64(3), "name": "jam", "price": int32(5)}, 1},
		{"DELETE FROM " + tbl + " WHERE id = 3", []int64{3}, OpDelete,
			map[string]any{"id": int64(3)}, nil, 1},
		{"UPDATE " + tbl + " SET name = NULL WHERE id = 1", []int64{1}, OpUpdate,
			nil, map[string]any{"id": int64(1), "name": nil, "price": int32(4)}, 1},
	}
	for _, st := range steps {
		exec(t, conn, st.sql)
		caughtUp(t, src, conn)
		keys, alls := target.take()
		if !slices.Equal(keys, st.keys) || alls != allsAtStart {
			t.Errorf("%s: invalidated %v, %d InvalidateAll; want %v, %d", st.sql, keys, alls, st.keys, allsAtStart)
		}
		cs := takeChanges()
		if len(cs) != st.changes {
			t.Fatalf("%s: %d changes; want %d: %+v", st.sql, len(cs), st.changes, cs)
		}
		c := cs[len(cs)-1]
		if c.Table != tbl || c.Schema != "public" || c.Op != st.op || !sameRow(c.Old, st.old) || !sameRow(c.New, st.new) {
			t.Errorf("%s: change %+v; want %v of public.%s, old %v, new %v", st.sql, c, st.op, tbl, st.old, st.new)
		}
		if c.LSN == 0 || c.CommitTime.IsZero() || c.LSN > src.Stats().AppliedLSN {
			t.Errorf("%s: change at LSN %v, committed %v; want a commit LSN at most the applied %v",
				st.sql, c.LSN, c.CommitTime, src.Stats().AppliedLSN)
		}
	}

	exec(t, conn, "TRUNCATE "+tbl)
	caughtUp(t, src, conn)
	if keys, alls := target.take(); len(keys) != 0 || alls != allsAtStart+1 {
		t.Errorf("TRUNCATE: invalidated %v, %d InvalidateAll; want none, %d", keys, alls, allsAtStart+1)
	}
	if cs := takeChanges(); len(cs) != 1 || cs[0].Op != OpTruncate || cs[0].Old != nil || cs[0].New != nil {
		t.Errorf("TRUNCATE: changes %+v; want one truncate without rows", cs)
	}
	st := src.Stats()
	if st.TruncatesUnmapped != 1 || st.Transactions != 6 || st.Changes != 7 || st.Invalidations != 7 {
		t.Errorf("Stats = %+v; want 1 truncate unmapped, 6 transactions, 7 changes, 7 invalidations", st)
	}
}

func sameRow(got, want map[string]any) bool {
	if (got == nil) != (want == nil) || len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return false
		}
	}
	return true
}

// A key named by several changes of one transaction is invalidated once;
// a transaction naming more than MaxPendingKeys is invalidated in parts,
// every key included.
func TestTransactionKeysAreCoalescedAndBounded(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	target := &recorder{}
	src := start(t, target, byID, Options{Publication: pub, MaxPendingKeys: 7})
	exec(t, conn, "INSERT INTO "+tbl+" SELECT g, 'p', 1 FROM generate_series(1, 20) g")
	caughtUp(t, src, conn)
	target.take()

	tx, err := conn.Begin(deadline(t))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := tx.Exec(deadline(t), "UPDATE "+tbl+" SET price = price + 1 WHERE id = 4"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(deadline(t)); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, src, conn)
	if keys, _ := target.take(); !slices.Equal(keys, []int64{4}) {
		t.Errorf("5 updates of row 4 in a transaction invalidated %v; want [4]", keys)
	}

	exec(t, conn, "UPDATE "+tbl+" SET price = price + 1")
	caughtUp(t, src, conn)
	keys, alls := target.take()
	want := make([]int64, 20)
	for i := range want {
		want[i] = int64(i + 1)
	}
	if !slices.Equal(keys, want) || alls != 1 {
		t.Errorf("an update of 20 rows with MaxPendingKeys 7 invalidated %v, %d InvalidateAll; want %v, 1 (New's)", keys, alls, want)
	}
}

// A target with InvalidateTag gets the tags the Mapping names; one
// without it cannot drop a tag's values alone, so the Source distrusts
// every value, once per transaction, and Stats says so.
func TestTagsReachATagTargetOrDistrustEverything(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	tagged := func(c Change) ([]int64, []string) {
		keys, _ := byID(c)
		return keys, []string{"products"}
	}

	withTags := &tagRecorder{}
	src := start(t, withTags, tagged, Options{Publication: pub})
	without := &recorder{}
	plain := start(t, without, tagged, Options{Publication: pub})
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'a', 1), (2, 'b', 2)")
	caughtUp(t, src, conn)
	caughtUp(t, plain, conn)

	keys, alls := withTags.take()
	withTags.mu.Lock()
	tags := slices.Clone(withTags.tags)
	withTags.mu.Unlock()
	if !slices.Equal(keys, []int64{1, 2}) || !slices.Equal(tags, []string{"products"}) || alls != 1 {
		t.Errorf("tag target: keys %v, tags %v, %d InvalidateAll; want [1 2], [products], 1 (New's)", keys, tags, alls)
	}
	if st := src.Stats(); st.TagInvalidations != 1 || st.TagsWithoutTarget != 0 {
		t.Errorf("tag target: Stats %+v; want 1 tag invalidation, 0 without target", st)
	}

	_, alls = without.take()
	if alls != 2 {
		t.Errorf("plain target: %d InvalidateAll; want 2 (New's, then the tagged transaction's)", alls)
	}
	if st := plain.Stats(); st.TagsWithoutTarget != 1 || st.InvalidateAlls != 2 {
		t.Errorf("plain target: Stats %+v; want 1 transaction of tags without target, 2 InvalidateAlls", st)
	}
}

// A Mapping that panics does not stop the Source: the panic is reported
// as a *flightcache.PanicError, counted, and distrusts every value; the
// next changes are applied as usual.
func TestMappingPanicIsContained(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	mapping := func(c Change) ([]int64, []string) {
		if c.New != nil && c.New["name"] == "poison" {
			panic("bad mapping")
		}
		return byID(c)
	}
	var log errorLog
	target := &recorder{}
	src := start(t, target, mapping, Options{Publication: pub, OnError: log.onError})
	target.take()
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'poison', 1)")
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (2, 'fine', 1)")
	caughtUp(t, src, conn)

	keys, alls := target.take()
	if !slices.Equal(keys, []int64{2}) || alls != 2 {
		t.Errorf("after a panic: invalidated %v, %d InvalidateAll; want [2], 2 (New's and the panic's)", keys, alls)
	}
	errs, _ := log.snapshot()
	var pe *flightcache.PanicError
	if len(errs) != 1 || !errors.As(errs[0], &pe) || pe.Value != "bad mapping" || len(pe.Stack) == 0 {
		t.Fatalf("OnError got %v; want one *flightcache.PanicError of \"bad mapping\" with its stack", errs)
	}
	if st := src.Stats(); st.Panics != 1 || st.Transactions != 2 {
		t.Errorf("Stats = %+v; want 1 panic, 2 transactions", st)
	}
}

// A column added to a published table (DDL) does not stop decoding: the
// next change carries it.
func TestColumnAddedKeepsDecoding(t *testing.T) {
	conn := connect(t)
	tbl, pub := table(t, conn)
	var last Change
	var mu sync.Mutex
	mapping := func(c Change) ([]int64, []string) {
		mu.Lock()
		last = c
		mu.Unlock()
		return byID(c)
	}
	target := &recorder{}
	src := start(t, target, mapping, Options{Publication: pub})
	exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'a', 1)")
	exec(t, conn, "ALTER TABLE "+tbl+" ADD COLUMN stock int8 DEFAULT 5")
	exec(t, conn, "UPDATE "+tbl+" SET stock = 6 WHERE id = 1")
	caughtUp(t, src, conn)
	mu.Lock()
	defer mu.Unlock()
	if keys, _ := target.take(); !slices.Equal(keys, []int64{1, 1}) || last.New["stock"] != int64(6) {
		t.Errorf("after ADD COLUMN: invalidated %v, last change %+v; want [1 1], stock 6", keys, last)
	}
}

// New fails, naming the option, when the publication does not exist.
func TestMissingPublicationFailsNew(t *testing.T) {
	_, err := New(deadline(t), pgURL(t), &recorder{}, byID, Options{Publication: "no_such_publication"})
	if err == nil || !strings.Contains(err.Error(), "Options.Publication") || !strings.Contains(err.Error(), "no_such_publication") {
		t.Errorf("New with a missing publication = %v; want an error naming Options.Publication and the name", err)
	}
}

// New rejects bad options with an error naming the field.
func TestOptionsNameTheBadField(t *testing.T) {
	for _, tc := range []struct {
		opts  Options
		field string
	}{
		{Options{}, "Options.Publication"},
		{Options{Publication: "p", Slot: "Bad-Name"}, "Options.Slot"},
		{Options{Publication: "p", DropSlotOnClose: true}, "Options.DropSlotOnClose"},
		{Options{Publication: "p", Resume: 1}, "Options.Resume"},
		{Options{Publication: "p", MaxPendingKeys: -1}, "Options.MaxPendingKeys"},
		{Options{Publication: "p", Reconnect: Reconnect{InitialInterval: -1}}, "Options.Reconnect.InitialInterval"},
		{Options{Publication: "p", Reconnect: Reconnect{InitialInterval: 2e9, MaxInterval: 1e9}}, "Options.Reconnect.MaxInterval"},
	} {
		_, err := New(deadline(t), "postgres://127.0.0.1:1/x", &recorder{}, byID, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v; want an error naming %s", tc.opts, err, tc.field)
		}
	}
}

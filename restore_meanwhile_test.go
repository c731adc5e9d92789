package flightcache

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// Restore's doc: without a Remote too, a row changed while no process
// held it (between the save and the Restore) is served as it was saved,
// a hit, until the freshness it had left runs out; the next load reads
// the new row.
func TestRestoreServesARowChangedMeanwhile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		row := "v1"
		load := func(ctx context.Context, key string) (string, error) { return row, nil }
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()

		before, err := New(load, Options[string, string]{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := before.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		var saved []Entry[string, string]
		for en := range before.Entries() {
			saved = append(saved, en)
		}
		before.Close()

		row = "v2" // written while no process held the key
		after, err := New(load, Options[string, string]{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer after.Close()
		if n, err := after.Restore(func(yield func(Entry[string, string]) bool) {
			for _, en := range saved {
				if !yield(en) {
					return
				}
			}
		}); n != 1 || err != nil {
			t.Fatalf("Restore = %d, %v; want 1, nil", n, err)
		}
		if v, info, err := after.GetInfo(ctx, "k"); v != "v1" || info.Source != SourceHit || err != nil {
			t.Errorf("GetInfo(%q) after Restore = %q, %v, %v; want the saved row %q as a hit", "k", v, info.Source, err, "v1")
		}
		time.Sleep(time.Minute + time.Second) // the freshness it had left runs out
		if v, err := after.Get(ctx, "k"); v != "v2" || err != nil {
			t.Errorf("Get(%q) past its TTL = %q, %v; want the new row %q", "k", v, err, "v2")
		}
	})
}

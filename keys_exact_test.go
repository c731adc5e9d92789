package flightcache

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// docs/design.md rule 9, as Options.Hash's doc tells it: keys are compared
// exactly, so "P1", "p1 " and "p1", one row to a database whose collation
// ignores case and trailing spaces, are three keys: three loads, three
// cached copies, and an Invalidate of one leaves the others serving the
// row as it was. Normalised before Get, they are one key.
func TestKeysAreNotNormalised(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		row := "v1"
		var calls int
		l, err := New(func(ctx context.Context, id string) (string, error) {
			calls++
			return row, nil
		}, Options[string, string]{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		for _, id := range []string{"P1", "p1 ", "p1"} {
			if _, err := l.Get(ctx, id); err != nil {
				t.Fatalf("Get(%q) = %v", id, err)
			}
		}
		if calls != 3 {
			t.Errorf("%d loads for \"P1\", \"p1 \" and \"p1\"; want 3: keys are compared exactly", calls)
		}
		row = "v2" // the row is written, and its writer invalidates its own spelling
		l.Invalidate("p1")
		if v, _ := l.Get(ctx, "P1"); v != "v1" {
			t.Errorf("Get(%q) = %q; want the old row, %q: the Invalidate was of another key", "P1", v, "v1")
		}
		if v, _ := l.Get(ctx, "p1"); v != "v2" {
			t.Errorf("Get(%q) = %q; want %q", "p1", v, "v2")
		}
	})
}

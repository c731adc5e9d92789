package flightpg

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// A load that read a row before an outside UPDATE committed never fills
// the cache once the Source has applied that commit: its own caller gets
// the row it read, and the next Get loads the committed row. Without a
// Source the old row is served as a hit until its TTL (the twin below):
// the Loader knows only the writes that go through it. (docs/design.md,
// rules 6 and 34.)
func TestLoadThatReadBeforeTheCommitNeverFills(t *testing.T) {
	for _, withSource := range []bool{true, false} {
		name := "without a Source: the old row is a hit"
		if withSource {
			name = "with a Source: the old row never fills"
		}
		t.Run(name, func(t *testing.T) {
			conn := connect(t)
			tbl, pub := table(t, conn)
			exec(t, conn, "INSERT INTO "+tbl+" VALUES (1, 'old', 1)")

			reader := connect(t) // the LoadFunc's: one load at a time here
			read, release := make(chan struct{}), make(chan struct{})
			var calls atomic.Int32
			load := func(ctx context.Context, id int64) (string, error) {
				n := calls.Add(1)
				var name string
				err := reader.QueryRow(ctx, "SELECT name FROM "+tbl+" WHERE id = $1", id).Scan(&name)
				if n == 1 {
					close(read) // the row is read: now the UPDATE commits
					<-release
				}
				return name, err
			}
			l, err := flightcache.New(load, flightcache.Options[int64, string]{TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var src *Source[int64]
			if withSource {
				src = start(t, l, byID, Options{Publication: pub})
			}

			first := make(chan string, 1)
			go func() {
				v, err := l.Get(deadline(t), 1)
				if err != nil {
					v = "error: " + err.Error()
				}
				first <- v
			}()
			<-read
			exec(t, conn, "UPDATE "+tbl+" SET name = 'new' WHERE id = 1")
			if withSource {
				caughtUp(t, src, conn) // the UPDATE's Invalidate is made
			}
			close(release)
			if v := <-first; v != "old" {
				t.Fatalf("the first Get = %q; want the row it read, \"old\"", v)
			}

			v, err := l.Get(deadline(t), 1)
			want, wantCalls := "new", int32(2)
			if !withSource {
				want, wantCalls = "old", 1
			}
			if err != nil || v != want || calls.Load() != wantCalls {
				t.Errorf("Get(1) after the UPDATE = %q, %v, %d loads; want %q, %d loads", v, err, calls.Load(), want, wantCalls)
			}
		})
	}
}

package flightredis

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flightcache/flightcache"
)

// The tier judges a load's not-found by the Loader's rule: with
// Options.IsNotFound, a LoadFunc's own not-found error (sql.ErrNoRows) is
// stored as a not-found marker and served to the other processes, as
// ErrNotFound is; without it, or with an IsNotFound that panics (no), it
// is a failure: no marker, and another process loads again.
func TestOwnNotFoundIsSharedByTheTier(t *testing.T) {
	addr := redisAddr(t)
	for _, tc := range []struct {
		name       string
		isNotFound func(error) bool
		shared     bool
	}{
		{"IsNotFound", func(err error) bool { return errors.Is(err, sql.ErrNoRows) }, true},
		{"no IsNotFound", nil, false},
		{"IsNotFound panics", func(error) bool { panic("IsNotFound panics") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPrefix(t, newClient(t, addr))
			d := newDownstream()
			d.fail(sql.ErrNoRows)
			lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute,
				IsNotFound: tc.isNotFound, Breaker: flightcache.Breaker{Disabled: true}}
			a := newProc(t, addr, p, lo, Options[string, string]{}, d)
			b := newProc(t, addr, p, lo, Options[string, string]{}, d)

			if _, err := a.l.Get(ctx, "k"); !errors.Is(err, sql.ErrNoRows) {
				t.Fatalf("a.Get(k) = %v; want the LoadFunc's sql.ErrNoRows", err)
			}
			exists, nf := entryState(t, a, "k")
			if tc.shared != (exists && nf == "1") {
				t.Fatalf("entry of k: exists %v, nf %q; want a not-found marker: %v", exists, nf, tc.shared)
			}
			_, err := b.l.Get(ctx, "k")
			if tc.shared {
				if !errors.Is(err, ErrSharedNotFound) || !lo.NotFound(err) {
					t.Errorf("b.Get(k) = %v; want ErrSharedNotFound, a not-found by the Loader's rule", err)
				}
				if n := d.calls.Load(); n != 1 {
					t.Errorf("downstream calls = %d; want 1: b read the marker", n)
				}
				return
			}
			if !errors.Is(err, sql.ErrNoRows) || lo.NotFound(err) {
				t.Errorf("b.Get(k) = %v; want its own load's sql.ErrNoRows, a failure", err)
			}
			if n := d.calls.Load(); n != 2 {
				t.Errorf("downstream calls = %d; want 2: a failure is not stored", n)
			}
		})
	}
}

// A LoadMany that fails as a whole with the Loader's own not-found error
// leaves a marker for each of its keys; without NotFoundTTL, the process
// that waited on a lease shares the holder's not-found (ErrPeerFailed
// matching ErrNotFound), and GetMany leaves such keys out rather than
// failing them.
func TestOwnNotFoundThroughTheBatchPath(t *testing.T) {
	addr := redisAddr(t)
	isNotFound := func(err error) bool { return errors.Is(err, sql.ErrNoRows) }

	t.Run("markers", func(t *testing.T) {
		p := testPrefix(t, newClient(t, addr))
		d := newBatchDownstream()
		d.err = sql.ErrNoRows
		lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: time.Minute,
			IsNotFound: isNotFound, Breaker: flightcache.Breaker{Disabled: true}}
		a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
		b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
		if m, err := a.l.GetMany(ctx, []string{"x1", "x2"}); err != nil || len(m) != 0 {
			t.Fatalf("a.GetMany = %v, %v; want nothing and no error (both not found)", m, err)
		}
		for _, k := range []string{"x1", "x2"} {
			if exists, nf := entryState(t, a, k); !exists || nf != "1" {
				t.Fatalf("entry of %s: exists %v, nf %q; want a not-found marker", k, exists, nf)
			}
		}
		if m, err := b.l.GetMany(ctx, []string{"x1", "x2"}); err != nil || len(m) != 0 {
			t.Errorf("b.GetMany = %v, %v; want nothing and no error", m, err)
		}
		if calls := d.allCalls(); len(calls) != 1 {
			t.Errorf("downstream calls %v; want only a's", calls)
		}
	})

	t.Run("shared with the waiters", func(t *testing.T) {
		p := testPrefix(t, newClient(t, addr))
		d := newBatchDownstream()
		d.gate = make(chan struct{})
		d.err = sql.ErrNoRows
		lo := flightcache.Options[string, string]{TTL: time.Minute,
			IsNotFound: isNotFound, Breaker: flightcache.Breaker{Disabled: true}}
		a := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
		b := newBatchProc(t, addr, nil, p, lo, Options[string, string]{}, d)
		ra := getMany(a, []string{"y"})
		waitStarted(t, d, 1)
		rb := getMany(b, []string{"y"})
		eventually(t, 30*time.Second, "b to wait on a's lease", func() bool { return b.t.Stats().Waits == 1 })
		close(d.gate)
		for i, r := range []manyResult{within(t, ra, 30*time.Second, "a's GetMany"), within(t, rb, 30*time.Second, "b's GetMany")} {
			if r.err != nil || len(r.m) != 0 {
				t.Errorf("GetMany %d = %v, %v; want y left out as not found", i, r.m, r.err)
			}
		}
		if s := b.t.Stats(); s.PeerErrors != 1 {
			t.Errorf("b stats %+v; want the holder's not-found shared (a peer error)", s)
		}
		if calls := d.allCalls(); len(calls) != 1 {
			t.Errorf("downstream calls %v; want only a's", calls)
		}
	})
}

// Every not-found a caller receives matches flightcache.ErrNotFound
// (docs/design.md rule 25), through the tier too: the process whose
// LoadFunc returned its own not-found error gets one that matches both it
// and ErrNotFound; another process, which read the shared marker
// (NotFoundTTL > 0) or waited on the lease of the load that found it
// (NotFoundTTL 0: the holder's failure, ErrPeerFailed), gets one that
// matches ErrNotFound and says the holder's error in its text, but cannot
// match that error's Go value. Before, the loading process's not-found
// matched sql.ErrNoRows only.
func TestEveryNotFoundMatchesErrNotFoundThroughTheTier(t *testing.T) {
	addr := redisAddr(t)
	isNotFound := func(err error) bool { return errors.Is(err, sql.ErrNoRows) }
	for _, tc := range []struct {
		name        string
		notFoundTTL time.Duration
		other       error // what b's error matches besides ErrNotFound
	}{
		{"shared marker", time.Minute, ErrSharedNotFound},
		{"peer failed", 0, ErrPeerFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			p := testPrefix(t, newClient(t, addr))
			d := newDownstream()
			d.gate = make(chan struct{})
			d.fail(sql.ErrNoRows)
			lo := flightcache.Options[string, string]{TTL: time.Minute, NotFoundTTL: tc.notFoundTTL,
				IsNotFound: isNotFound, Breaker: flightcache.Breaker{Disabled: true}}
			a := newProc(t, addr, p, lo, Options[string, string]{}, d)
			b := newProc(t, addr, p, lo, Options[string, string]{}, d)
			ra := make(chan error, 1)
			go func() { _, err := a.l.Get(ctx, "k"); ra <- err }()
			within(t, d.started, 10*time.Second, "downstream call by a")
			var rb chan error
			if tc.notFoundTTL == 0 { // b waits on a's lease, and shares its failure
				rb = make(chan error, 1)
				go func() { _, err := b.l.Get(ctx, "k"); rb <- err }()
				eventually(t, 10*time.Second, "b to wait on a's lease", func() bool { return b.t.Stats().Waits == 1 })
			}
			close(d.gate)
			errA := within(t, ra, 30*time.Second, "a's Get")
			if !errors.Is(errA, flightcache.ErrNotFound) || !errors.Is(errA, sql.ErrNoRows) {
				t.Errorf("a.Get(k) = %v; want it to match ErrNotFound and the LoadFunc's sql.ErrNoRows", errA)
			}
			if want := "flightcache: not found: " + sql.ErrNoRows.Error(); errA.Error() != want {
				t.Errorf("a.Get(k) text %q; want %q", errA.Error(), want)
			}
			var errB error
			if rb != nil {
				errB = within(t, rb, 30*time.Second, "b's Get")
			} else {
				_, errB = b.l.Get(ctx, "k")
			}
			if !errors.Is(errB, flightcache.ErrNotFound) || !errors.Is(errB, tc.other) || errors.Is(errB, sql.ErrNoRows) {
				t.Errorf("b.Get(k) = %v; want it to match ErrNotFound and %v, not the other process's sql.ErrNoRows", errB, tc.other)
			}
			if tc.notFoundTTL == 0 && !strings.Contains(errB.Error(), sql.ErrNoRows.Error()) {
				t.Errorf("b.Get(k) text %q; want it to say a's error", errB.Error())
			}
			if n := d.calls.Load(); n != 1 {
				t.Errorf("downstream calls = %d; want 1: b's answer came from a", n)
			}
		})
	}
}

package flightcache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightcache/flightcache/remote"
)

// The root's names for the tier's contract are remote's: the same error
// values (errors.Is holds across both names, either way), the same context
// keys (a value set through one name is read through the other) and the
// same types (a value of one is a value of the other).
func TestRemoteNamesAreTheRootsOwn(t *testing.T) {
	for _, tc := range []struct {
		name       string
		root, tier error
	}{
		{"ErrClosed", ErrClosed, remote.ErrClosed},
		{"ErrNotFound", ErrNotFound, remote.ErrNotFound},
		{"ErrNotModified", ErrNotModified, remote.ErrNotModified},
		{"ErrBreakerOpen", ErrBreakerOpen, remote.ErrBreakerOpen},
		{"ErrLimited", ErrLimited, remote.ErrLimited},
		{"ErrLoadTimeout", ErrLoadTimeout, remote.ErrLoadTimeout},
		{"ErrInvalidKey", ErrInvalidKey, remote.ErrInvalidKey},
	} {
		wrapped := errors.Join(errors.New("cause"), tc.root)
		if tc.root != tc.tier || !errors.Is(wrapped, tc.tier) || !errors.Is(errors.Join(tc.tier), tc.root) {
			t.Errorf("%s: flightcache's %p and remote's %p are not one error", tc.name, tc.root, tc.tier)
		}
	}

	ctx := context.Background()
	if d, ok := remote.MaxStale(WithMaxStale(ctx, time.Minute)); !ok || d != time.Minute {
		t.Errorf("remote.MaxStale(WithMaxStale(ctx, 1m)) = %v, %v; want 1m, true", d, ok)
	}
	if d, ok := MaxStale(remote.WithMaxStale(ctx, time.Second)); !ok || d != time.Second {
		t.Errorf("MaxStale(remote.WithMaxStale(ctx, 1s)) = %v, %v; want 1s, true", d, ok)
	}
	if v, ok := remote.ReloadValue[string](WithReloadValue(ctx, "v")); !ok || v != "v" {
		t.Errorf("remote.ReloadValue(WithReloadValue(ctx, %q)) = %q, %v; want %q, true", "v", v, ok, "v")
	}
	if _, ok := remote.ReloadValue[int](WithReloadValue(ctx, "v")); ok {
		t.Error("remote.ReloadValue[int] found a string: want only a value of its type")
	}

	var rv remote.Value[int] = RemoteValue[int]{Value: 1}
	var rr RemoteResult[int] = remote.Result[int]{RemoteValue: rv}
	var w remote.Windows = Windows{Fresh: time.Second}
	var p Phase = remote.PhaseStale
	if rr.Value != 1 || rr.RemoteValue != rv || w.Fresh != time.Second || p != PhaseStale {
		t.Errorf("aliases: %+v, %+v, %v", rr, w, p)
	}
}

// The Loader judges a caller's max-stale bound, read once from its
// context, by remote.AcceptsStale's rule.
func TestWithinMaxStaleIsAcceptsStale(t *testing.T) {
	bounds := []time.Duration{-1, 0, 1, time.Second, time.Hour}
	ds := []time.Duration{-time.Second, 0, 1, time.Second, time.Second + 1, time.Hour, 2 * time.Hour}
	for _, d := range ds {
		if got, want := withinMaxStale(0, false, d), remote.AcceptsStale(context.Background(), d); got != want {
			t.Errorf("no bound, stale %v: withinMaxStale = %v; remote.AcceptsStale = %v", d, got, want)
		}
		for _, b := range bounds {
			ctx := WithMaxStale(context.Background(), b)
			max, bounded := remote.MaxStale(ctx)
			if got, want := withinMaxStale(max, bounded, d), remote.AcceptsStale(ctx, d); got != want {
				t.Errorf("bound %v, stale %v: withinMaxStale = %v; remote.AcceptsStale = %v", b, d, got, want)
			}
		}
	}
}

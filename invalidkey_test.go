package flightcache

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// errCollation is what a database answers a query whose id is not valid
// UTF-8: the caller's input, not the database's health. Sent in a batch's
// IN (...), it fails the whole call (bisect_test.go).
var errCollation = errors.New("Error 1271: Illegal mix of collations for operation 'in'")

// badKey is an id no database row can have: invalid UTF-8.
func badKey(i int) string { return fmt.Sprintf("bad-%d-\xff", i) }

// validUTF8 is a ValidateKey that rejects badKey's keys.
func validUTF8(key string) error {
	if !utf8.ValidString(key) {
		return errors.New("id is not valid UTF-8")
	}
	return nil
}

// catalog is a downstream that fails a bad key with errCollation, wrapped
// in ErrInvalidKey when wrap is set, and counts the calls per key.
type catalog struct {
	wrap  bool
	mu    sync.Mutex
	calls map[string]int
}

func (c *catalog) count(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[key]++
}

func (c *catalog) calledFor(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[key]
}

func (c *catalog) fail(key string) error {
	if utf8.ValidString(key) {
		return nil
	}
	if c.wrap {
		return fmt.Errorf("%w: %w", ErrInvalidKey, errCollation)
	}
	return errCollation
}

func (c *catalog) load(ctx context.Context, key string) (string, error) {
	c.count(key)
	if err := c.fail(key); err != nil {
		return "", err
	}
	return "v-" + key, nil
}

func (c *catalog) reload(ctx context.Context, key, old string) (string, error) {
	return c.load(ctx, key)
}

func (c *catalog) loadMany(ctx context.Context, keys []string) (map[string]string, error) {
	m := make(map[string]string, len(keys))
	for _, key := range keys {
		c.count(key)
		if err := c.fail(key); err != nil {
			return nil, err // the whole call fails, as a database's IN (...) does
		}
		m[key] = "v-" + key
	}
	return m, nil
}

// goodGets runs workers that Get cold good keys until stop is closed, then
// one more each (after every bad key), and returns how many Gets there
// were and the errors.
func goodGets(l *Loader[string, string], workers int, stop <-chan struct{}) (wait func() (int, []error)) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		n    atomic.Int64
		next atomic.Int64
	)
	get := func() bool {
		key := fmt.Sprint("good-", next.Add(1))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Add(1)
		v, err := l.Get(ctx, key)
		if err == nil && v != "v-"+key {
			err = fmt.Errorf("Get(%s) = %q", key, v)
		}
		if err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("Get(%s): %w", key, err))
			mu.Unlock()
		}
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for get() {
			}
			get() // after the last bad key
		}()
	}
	return func() (int, []error) {
		wg.Wait()
		return int(n.Load()), errs
	}
}

// Twenty Gets in a row of keys the downstream rejects as the caller's
// fault (its error wraps ErrInvalidKey), among concurrent Gets of good
// keys, through each path that loads a key: the LoadFunc, a Reload, a
// LoadMany call (a GetMany of the bad key). The breaker,
// which five failures in a row would open, stays closed; every good key
// is answered; no bad key is tried twice in one load (Retry allows 3
// attempts); nothing of a bad key is cached, neither as a value nor as a
// not-found (NotFoundTTL is set): the next Get calls the downstream
// again; and each bad key's caller gets an error matching ErrInvalidKey
// and the downstream's own (docs/design.md rule 33).
func TestInvalidKeyErrorIsTheCallersAlone(t *testing.T) {
	for _, path := range []string{"LoadFunc", "Reload", "LoadMany"} {
		t.Run(path, func(t *testing.T) {
			cat := &catalog{wrap: true}
			opts := Options[string, string]{
				TTL:         time.Minute,
				NotFoundTTL: time.Minute,
				Retry:       Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
				Breaker:     Breaker{ConsecutiveFailures: 5, OpenTimeout: time.Hour},
			}
			switch path {
			case "Reload":
				opts.Reload = cat.reload
			case "LoadMany":
				opts.LoadMany = cat.loadMany
			}
			l, err := New(cat.load, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			stop := make(chan struct{})
			wait := goodGets(l, 4, stop)
			const bad = 20
			for i := range bad {
				key := badKey(i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var err error
				switch path {
				case "Reload":
					l.Set(key, "old") // a value held: the revalidating Get reloads it
					_, err = l.Get(WithRevalidate(ctx), key)
				case "LoadMany":
					// A LoadMany call's own error fails each of its keys:
					// here one caller's one key.
					_, err = l.GetMany(ctx, []string{key})
					var me *ManyError[string]
					if errors.As(err, &me) {
						err = me.Errs[key]
					}
				default:
					_, err = l.Get(ctx, key)
				}
				cancel()
				if !errors.Is(err, ErrInvalidKey) || !errors.Is(err, errCollation) {
					t.Errorf("bad key %d: error %v; want one matching ErrInvalidKey and the downstream's own", i+1, err)
				}
				if n := cat.calledFor(key); n != 1 {
					t.Errorf("bad key %d: %d downstream calls; want 1: never retried", i+1, n)
				}
			}
			close(stop)
			n, errs := wait()
			if len(errs) > 0 {
				t.Errorf("%d of %d good Gets failed; want 0: first %v", len(errs), n, errs[0])
			}
			s := l.Stats()
			if s.Breaker != BreakerClosed {
				t.Errorf("breaker %v after %d invalid keys; want closed", s.Breaker, bad)
			}
			if s.Retries != 0 {
				t.Errorf("Retries = %d; want 0", s.Retries)
			}
			// Nothing cached: the next Get of a bad key calls the
			// downstream again, and gets the same error.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			key := badKey(0)
			if path == "Reload" {
				ctx = WithRevalidate(ctx)
			}
			if _, err := l.Get(ctx, key); !errors.Is(err, ErrInvalidKey) || cat.calledFor(key) != 2 {
				t.Errorf("Get of bad key 1 again: %v after %d calls; want ErrInvalidKey after 2: nothing cached", err, cat.calledFor(key))
			}
			if s := l.Stats(); s.NotFounds != 0 {
				t.Errorf("NotFounds = %d; want 0: an invalid key is never a not-found", s.NotFounds)
			}
		})
	}
}

// Twenty Gets in a row of keys ValidateKey rejects, among concurrent Gets
// of good keys: no bad key reaches the downstream (which would fail it with
// a plain error, a failure for the breaker); each fails at once with an
// error matching ErrInvalidKey and ValidateKey's own, naming the option;
// the breaker stays closed; every good key is answered; Stats.InvalidKeys
// counts the rejections, Stats.Gets does not (docs/design.md rule 33).
func TestValidateKeyRejectsWithoutLoad(t *testing.T) {
	cat := &catalog{} // plain errCollation: what the breaker would count
	l, err := New(cat.load, Options[string, string]{
		TTL:         time.Minute,
		Retry:       Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
		Breaker:     Breaker{ConsecutiveFailures: 5, OpenTimeout: time.Hour},
		ValidateKey: validUTF8,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	stop := make(chan struct{})
	wait := goodGets(l, 4, stop)
	const bad = 20
	for i := range bad {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, info, err := l.GetInfo(ctx, badKey(i))
		cancel()
		if !errors.Is(err, ErrInvalidKey) || err == nil || !strings.Contains(err.Error(), "Options.ValidateKey") || !strings.Contains(err.Error(), "not valid UTF-8") {
			t.Errorf("bad key %d: error %v; want one matching ErrInvalidKey, naming Options.ValidateKey, with its text", i+1, err)
		}
		if info.Source != SourceNone {
			t.Errorf("bad key %d: Source %v; want none", i+1, info.Source)
		}
	}
	close(stop)
	n, errs := wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d good Gets failed; want 0: first %v", len(errs), n, errs[0])
	}
	for i := range bad {
		if c := cat.calledFor(badKey(i)); c != 0 {
			t.Errorf("bad key %d: %d downstream calls; want 0", i+1, c)
		}
	}
	s := l.Stats()
	if s.Breaker != BreakerClosed || s.Retries != 0 {
		t.Errorf("breaker %v, Retries %d; want closed, 0", s.Breaker, s.Retries)
	}
	if s.InvalidKeys != bad || s.Gets != uint64(n) || s.Loads != uint64(n) {
		t.Errorf("InvalidKeys, Gets, Loads = %d, %d, %d; want %d, %d, %d: a rejected key is neither a Get nor a load", s.InvalidKeys, s.Gets, s.Loads, bad, n, n)
	}
}

// Every entry point that would load a key asks ValidateKey first: GetMany
// and GetManyInfo fail a rejected key alone (in the ManyError, Info
// SourceNone) and answer the others; Refresh does nothing; Set stores
// nothing; Restore skips the entry; Invalidate and Peek do not ask. A
// ValidateKey that panics rejects the key with the *PanicError, counted
// in Stats.Panics (docs/design.md rule 33).
func TestValidateKeyEveryEntryPoint(t *testing.T) {
	cat := &catalog{}
	var asked atomic.Int64
	l, err := New(cat.load, Options[string, string]{
		TTL:      time.Minute,
		LoadMany: cat.loadMany,
		ValidateKey: func(key string) error {
			asked.Add(1)
			if key == "panics" {
				panic("ValidateKey panicked")
			}
			return validUTF8(key)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad := badKey(0)

	vals, infos, err := l.GetManyInfo(ctx, []string{"a", bad, "b", bad})
	var me *ManyError[string]
	if !errors.As(err, &me) || len(me.Errs) != 1 || !errors.Is(me.Errs[bad], ErrInvalidKey) {
		t.Errorf("GetManyInfo error %v; want a ManyError of the bad key alone, matching ErrInvalidKey", err)
	}
	if want := map[string]string{"a": "v-a", "b": "v-b"}; !maps.Equal(vals, want) {
		t.Errorf("GetManyInfo values %v; want %v", vals, want)
	}
	if info, ok := infos[bad]; !ok || info.Source != SourceNone {
		t.Errorf("GetManyInfo Info of the bad key = %v, %v; want SourceNone", info, ok)
	}
	if c := cat.calledFor(bad); c != 0 {
		t.Errorf("the bad key reached LoadMany %d times; want 0", c)
	}
	if s := l.Stats(); s.Gets != 2 || s.InvalidKeys != 1 {
		t.Errorf("Gets, InvalidKeys = %d, %d; want 2, 1 (the bad key asked once)", s.Gets, s.InvalidKeys)
	}

	l.Refresh(ctx, bad)
	l.Set(bad, "set")
	n, err := l.Restore(slices.Values([]Entry[string, string]{{Key: bad, Value: "restored", LoadedAt: time.Now()}}))
	if n != 0 || err != nil {
		t.Errorf("Restore of the bad key = %d, %v; want 0, nil (skipped)", n, err)
	}
	l.Invalidate(bad)
	if _, _, ok := l.Peek(bad); ok {
		t.Error("Peek found the bad key; want nothing stored by Set or Restore")
	}
	if s := l.Stats(); s.InvalidKeys != 4 || s.Refreshes != 0 || cat.calledFor(bad) != 0 {
		t.Errorf("InvalidKeys, Refreshes, calls = %d, %d, %d; want 4 (GetMany, Refresh, Set, Restore), 0, 0", s.InvalidKeys, s.Refreshes, cat.calledFor(bad))
	}

	before := l.Stats().Panics
	_, err = l.Get(ctx, "panics")
	var pe *PanicError
	if !errors.Is(err, ErrInvalidKey) || !errors.As(err, &pe) || l.Stats().Panics != before+1 {
		t.Errorf("Get of a key ValidateKey panics on: %v; want ErrInvalidKey with the *PanicError, counted in Panics", err)
	}
	if c := cat.calledFor("panics"); c != 0 {
		t.Errorf("the key ValidateKey panicked on was loaded %d times; want 0", c)
	}
}

// A stale value does not cover an invalid key's error (StaleMayCover):
// the downstream answered about the key, it did not fail. A plain failure
// is covered, as ever.
func TestInvalidKeyNotCoveredByStale(t *testing.T) {
	for _, wrap := range []bool{true, false} {
		cat := &catalog{wrap: wrap}
		l, err := New(cat.load, Options[string, string]{TTL: time.Minute, StaleIfError: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		key := badKey(0)
		l.Set(key, "held")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, info, err := l.GetInfo(WithRevalidate(ctx), key)
		cancel()
		switch {
		case wrap && (!errors.Is(err, ErrInvalidKey) || v != ""):
			t.Errorf("invalid key: GetInfo = %q, %v, %v; want ErrInvalidKey, not the held value", v, info.Source, err)
		case !wrap && (err != nil || info.Source != SourceStaleOnError):
			t.Errorf("plain failure: GetInfo = %q, %v, %v; want the held value, stale-on-error", v, info.Source, err)
		}
		l.Close()
	}
}

// A key whose dynamic type is not comparable fails (a *PanicError: the
// hash, checked as a map would, goes through the user-code guard) even with
// a custom Hash, before Get takes a lock. It used to panic on the map lookup
// in join with the shard mutex held, hanging every key of the shard.
//
// Real clock: the Get below blocks on a sync.Mutex, which a synctest bubble
// does not count as durably blocked, so a bubble's clock would never fire
// the timeout. It only runs once the lock is known to be leaked, when the
// Get can never return: its length cannot make the test flaky.
func TestPanickingKeyReleasesShardLock(t *testing.T) {
	l, err := New(func(ctx context.Context, k any) (string, error) { return "v", nil },
		Options[any, string]{TTL: time.Minute, Hash: func(any) uint64 { return 7 }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Logf("recovered: %v", r)
			}
		}()
		_, err := l.Get(context.Background(), []int{1}) // a *PanicError, or a panic: no lock held either way
		t.Logf("Get([]int{1}): %v", err)
	}()
	sh := l.flights.shard(7)
	if sh.mu.TryLock() {
		sh.mu.Unlock()
		return
	}
	// Public consequence: an unrelated, comparable key in the same shard hangs.
	done := make(chan struct{})
	go func() { l.Get(context.Background(), "other"); close(done) }()
	select {
	case <-done:
	case <-time.After(300 * time.Millisecond):
		t.Errorf("shard mutex left locked by the panic: Get(\"other\") hangs (ctx cannot help)")
	}
	sh.mu.Unlock() // clean up so the test binary can finish
	recv(t, `Get("other") once the shard is unlocked`, done)
}

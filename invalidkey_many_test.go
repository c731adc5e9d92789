package flightcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// loadManyKeyErrors is a LoadManyFunc that answers every good key of the
// call and fails each bad one (invalid UTF-8) alone, in the *ManyError it
// returns with its map, with an error wrapping ErrInvalidKey (docs/design.md
// rules 15 and 33). It counts the calls per key.
func (c *catalog) loadManyKeyErrors(_ context.Context, keys []string) (map[string]string, error) {
	m := make(map[string]string, len(keys))
	var errs map[string]error
	for _, key := range keys {
		c.count(key)
		if !utf8.ValidString(key) {
			if errs == nil {
				errs = map[string]error{}
			}
			errs[key] = fmt.Errorf("%w: %w", ErrInvalidKey, errCollation)
			continue
		}
		m[key] = "v-" + key
	}
	if errs == nil {
		return m, nil
	}
	return m, &ManyError[string]{Errs: errs}
}

// goodGetsAndGetManys runs workers that ask for cold good keys until stop
// is closed, then once more each (after every bad key): the even workers
// by Get, the odd ones by GetMany of three keys. Every call has a
// deadline. It returns how many keys were asked for and the errors.
func goodGetsAndGetManys(l *Loader[string, string], workers int, stop <-chan struct{}) (wait func() (int, []error)) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		n    atomic.Int64
		next atomic.Int64
	)
	failed := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	ask := func(many bool) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if !many {
			key := fmt.Sprint("good-", next.Add(1))
			n.Add(1)
			if v, err := l.Get(ctx, key); err != nil || v != "v-"+key {
				failed(fmt.Errorf("Get(%s) = %q, %v", key, v, err))
			}
		} else {
			keys := []string{fmt.Sprint("good-", next.Add(1)), fmt.Sprint("good-", next.Add(1)), fmt.Sprint("good-", next.Add(1))}
			n.Add(int64(len(keys)))
			vals, err := l.GetMany(ctx, keys)
			if err != nil {
				failed(fmt.Errorf("GetMany(%v): %w", keys, err))
			}
			for _, k := range keys {
				if vals[k] != "v-"+k {
					failed(fmt.Errorf("GetMany(%v)[%s] = %q", keys, k, vals[k]))
				}
			}
		}
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	for w := range workers {
		wg.Go(func() {
			for ask(w%2 == 1) {
			}
			ask(w%2 == 1) // after the last bad key
		})
	}
	return func() (int, []error) {
		wg.Wait()
		return int(n.Load()), errs
	}
}

// Rules 15 and 33 together: a LoadManyFunc fails twenty bad keys in a row
// alone, each in the *ManyError it returns with its map, with an error
// wrapping ErrInvalidKey, among concurrent Gets and GetManys of good keys
// (many goroutines, every call with a deadline), with and without a
// BatchWindow. Each bad key has three callers at once (two Gets, and a
// GetMany with a good key beside it). The breaker, which three failures
// in a row would open, stays closed; every good key is answered; each bad
// key's callers get an error matching ErrInvalidKey and the downstream's
// own; nothing is retried; nothing of a bad key is cached, neither as a
// value nor as a not-found (NotFoundTTL is set): the next Get of it
// reaches LoadMany again. Then, alone, ten LoadMany calls in a row whose
// every key is invalid (GetManys of three bad keys, Gets of one): each is
// a call the downstream answered, none a failure, and the breaker stays
// closed.
func TestInvalidKeyInManyError(t *testing.T) {
	for _, window := range []time.Duration{0, 2 * time.Millisecond} {
		t.Run(fmt.Sprint("BatchWindow=", window), func(t *testing.T) {
			cat := &catalog{}
			l := manyLoader(t, Options[string, string]{
				LoadMany:    cat.loadManyKeyErrors,
				BatchWindow: window,
				NotFoundTTL: time.Minute,
				Retry:       Retry{MaxAttempts: 3, InitialInterval: time.Millisecond},
				Breaker:     Breaker{ConsecutiveFailures: 3, OpenTimeout: time.Hour},
			})
			stop := make(chan struct{})
			wait := goodGetsAndGetManys(l, 8, stop)
			const bad = 20
			for i := range bad {
				key := badKey(i)
				good := fmt.Sprint("beside-", i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var wg sync.WaitGroup
				errs := make([]error, 3)
				for c := range 2 {
					wg.Go(func() {
						if v, err := l.Get(ctx, key); err == nil {
							errs[c] = fmt.Errorf("Get = %q, no error", v)
						} else {
							errs[c] = err
						}
					})
				}
				wg.Go(func() {
					vals, err := l.GetMany(ctx, []string{good, key})
					var me *ManyError[string]
					switch {
					case !errors.As(err, &me) || len(me.Errs) != 1:
						errs[2] = fmt.Errorf("GetMany's error %v; want a *ManyError of the bad key alone", err)
					case vals[good] != "v-"+good:
						errs[2] = fmt.Errorf("GetMany's %s = %q; want v-%s", good, vals[good], good)
					default:
						errs[2] = me.Errs[key]
					}
				})
				waitGroup(t, fmt.Sprint("bad key ", i+1, "'s callers"), &wg)
				cancel()
				for c, err := range errs {
					if !errors.Is(err, ErrInvalidKey) || !errors.Is(err, errCollation) {
						t.Errorf("bad key %d, caller %d: error %v; want one matching ErrInvalidKey and the downstream's own", i+1, c+1, err)
					}
				}
				if n := cat.calledFor(key); n < 1 || n > 3 {
					t.Errorf("bad key %d: %d downstream calls for its 3 callers; want 1 to 3, never retried", i+1, n)
				}
			}
			close(stop)
			n, errs := wait()
			if len(errs) > 0 {
				t.Errorf("%d of %d good keys failed; want 0: first %v", len(errs), n, errs[0])
			}
			s := l.Stats()
			t.Logf("%d good keys, %d downstream calls, %d batch loads of %d keys", n, s.DownstreamCalls, s.BatchLoads, s.BatchKeys)
			if s.Breaker != BreakerClosed {
				t.Errorf("breaker %v after %d invalid keys; want closed", s.Breaker, bad)
			}
			if s.Retries != 0 || s.NotFounds != 0 {
				t.Errorf("Retries %d, NotFounds %d; want 0, 0: an invalid key is never retried, never a not-found", s.Retries, s.NotFounds)
			}
			// Nothing cached: the next Get of each bad key reaches LoadMany
			// again, and gets the same error.
			for i := range bad {
				key := badKey(i)
				before := cat.calledFor(key)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := l.Get(ctx, key)
				cancel()
				if !errors.Is(err, ErrInvalidKey) || cat.calledFor(key) != before+1 {
					t.Errorf("Get of bad key %d again: %v after %d calls; want ErrInvalidKey after %d: nothing cached", i+1, err, cat.calledFor(key), before+1)
				}
			}

			// LoadMany calls whose every key is invalid, ten in a row with
			// nothing between them: not a failure for the breaker.
			calls := l.Stats().DownstreamCalls
			for i := range 5 {
				keys := []string{badKey(100 + 3*i), badKey(101 + 3*i), badKey(102 + 3*i)}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				vals, err := l.GetMany(ctx, keys)
				cancel()
				var me *ManyError[string]
				if !errors.As(err, &me) || len(me.Errs) != 3 || len(vals) != 0 {
					t.Fatalf("GetMany of 3 bad keys = %v, %v; want each key failed alone", vals, err)
				}
				for _, k := range keys {
					if !errors.Is(me.Errs[k], ErrInvalidKey) || !errors.Is(me.Errs[k], errCollation) {
						t.Errorf("GetMany of 3 bad keys: %q's error %v; want one matching ErrInvalidKey and the downstream's own", k, me.Errs[k])
					}
				}
				ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
				_, err = l.Get(ctx, badKey(200+i))
				cancel()
				if !errors.Is(err, ErrInvalidKey) {
					t.Errorf("Get of a bad key alone: %v; want ErrInvalidKey", err)
				}
			}
			s = l.Stats()
			if s.Breaker != BreakerClosed || s.BreakerRejected != 0 {
				t.Errorf("after 10 LoadMany calls in a row whose every key was invalid: breaker %v, %d calls refused; want closed, none", s.Breaker, s.BreakerRejected)
			}
			if c := s.DownstreamCalls - calls; c != 10 || s.Retries != 0 {
				t.Errorf("%d downstream calls, %d retries for the 10 calls of bad keys alone; want 10, 0", c, s.Retries)
			}
		})
	}
}

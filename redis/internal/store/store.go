// Package store is the gobreaker SharedDataStore of the Redis tier's
// Breaker: the breaker's state and its mutex in Redis, each round trip
// bounded by a timeout. It knows nothing of the cache's keys or values.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flightcache/flightcache/redis/internal/listen"
	"github.com/redis/go-redis/v9"
)

// Store is the gobreaker.SharedDataStore of a Breaker. It is used by one
// DistributedCircuitBreaker call at a time (the Breaker's sem), so its
// fields need no lock of their own.
//
// gobreaker calls, per Execute: GetData, Lock, SetData, Unlock. The store
// takes the shared mutex in GetData (Lock then finds it held), so the state
// is read under the mutex; Unlock releases it. In Seed (the
// constructor), Lock and Unlock do nothing and SetData writes only if no
// state exists, so seeding never waits in gobreaker's own lock loop.
type Store struct {
	RDB      redis.UniversalClient
	MutexKey string
	Timeout  time.Duration
	LockWait time.Duration   // how long to wait for a mutex held by an update
	LockTTL  time.Duration   // PX of the mutex for an update
	ProbeTTL time.Duration   // PX of the mutex for a probe (the whole call)
	Base     context.Context // cancelled by Breaker.Close

	mode  Mode
	gen   uint64 // the generation the outcome belongs to; 0 = any
	held  string // value of the mutex held by this call, "" if none
	fault error  // the first Redis failure or busy mutex of this call
}

// Errors of a call through the Store (Fault), matched by the Breaker.
var (
	ErrBusy    = errors.New("flightredis: shared breaker mutex busy")
	ErrProbing = errors.New("flightredis: another process is probing")
	ErrStale   = errors.New("flightredis: outcome of an earlier breaker generation")
)

// token is a random value of the mutex: whose call holds it.
func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

// Mode is what one gobreaker call through the Store is for.
type Mode uint8

const (
	Seed   Mode = iota // constructor: no mutex, create-only writes
	Update             // record an outcome: mutex for a few round trips
	Probe              // half-open probe: mutex for the whole call
)

// stateTTL lets Redis free the state of a breaker nobody uses any more; a
// state that expires in use is seeded again (closed).
const stateTTL = 24 * time.Hour

// lockScript takes the mutex; if it is held, it reports whether by a probe
// (-1: do not wait) or by an update (0: worth waiting a moment).
var lockScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 6) == 'probe:' then return -1 end
return 0
`)

var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Begin starts one gobreaker call in mode m, for an outcome of generation
// gen (0: whatever the generation).
func (s *Store) Begin(m Mode, gen uint64) { s.mode, s.gen, s.fault = m, gen, nil }

// End releases a mutex that gobreaker left held (it skips Unlock when the
// state is missing or does not decode).
func (s *Store) End() {
	if s.held != "" {
		s.unlock()
	}
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.Base, s.Timeout)
}

func (s *Store) fail(err error) error {
	if s.fault == nil {
		s.fault = err
	}
	return err
}

// Lock implements gobreaker.SharedDataStore.
func (s *Store) Lock(name string) error {
	if name != s.MutexKey {
		return s.fail(fmt.Errorf("flightredis: gobreaker asked for mutex %q, want %q", name, s.MutexKey))
	}
	if s.mode == Seed || s.held != "" {
		return nil
	}
	return s.lock()
}

// Unlock implements gobreaker.SharedDataStore.
func (s *Store) Unlock(string) error {
	if s.mode == Seed || s.held == "" {
		return nil
	}
	return s.unlock()
}

// GetData implements gobreaker.SharedDataStore: outside Seed it takes
// the mutex first. A missing state is (nil, nil), which gobreaker reports
// as ErrNoSharedState. An outcome for a generation that has ended (the
// breaker changed state since the call was allowed) stops here, as
// gobreaker's own generation check would stop it in one process.
func (s *Store) GetData(name string) ([]byte, error) {
	if s.mode != Seed && s.held == "" {
		if err := s.lock(); err != nil {
			return nil, err
		}
	}
	c, cancel := s.ctx()
	data, err := s.RDB.Get(c, name).Bytes()
	cancel()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		s.End()
		return nil, s.fail(err)
	}
	if s.gen != 0 {
		var g struct{ Generation uint64 }
		if json.Unmarshal(data, &g) == nil && g.Generation != s.gen {
			s.End()
			return nil, s.fail(ErrStale)
		}
	}
	return data, nil
}

// SetData implements gobreaker.SharedDataStore. It writes under the mutex
// (a plain SET: the state and the mutex may live in different Cluster
// items); in Seed only if no state exists yet.
func (s *Store) SetData(name string, data []byte) error {
	c, cancel := s.ctx()
	defer cancel()
	var err error
	if s.mode == Seed {
		err = s.RDB.SetNX(c, name, data, stateTTL).Err()
	} else {
		err = s.RDB.Set(c, name, data, stateTTL).Err()
	}
	if err != nil {
		return s.fail(err)
	}
	return nil
}

// lock takes the shared mutex, waiting up to lockWait while another
// process's update holds it, and failing at once when a probe holds it.
func (s *Store) lock() error {
	val, ttl := token(), s.LockTTL
	if s.mode == Probe {
		val, ttl = "probe:"+val, s.ProbeTTL
	}
	deadline := time.Now().Add(s.LockWait)
	pause := time.Millisecond
	for {
		c, cancel := s.ctx()
		n, err := lockScript.Run(c, s.RDB, []string{s.MutexKey}, val, px(ttl)).Int()
		cancel()
		switch {
		case err != nil:
			return s.fail(err)
		case n == 1:
			s.held = val
			return nil
		case n < 0:
			return s.fail(ErrProbing)
		case time.Now().After(deadline):
			return s.fail(ErrBusy)
		}
		timer := time.NewTimer(listen.Jitter(pause))
		select {
		case <-timer.C:
		case <-s.Base.Done():
			timer.Stop()
			return s.fail(ErrBusy)
		}
		pause = min(2*pause, 16*time.Millisecond)
	}
}

func (s *Store) unlock() error {
	val := s.held
	s.held = ""
	c, cancel := s.ctx()
	err := unlockScript.Run(c, s.RDB, []string{s.MutexKey}, val).Err()
	cancel()
	if err != nil {
		return s.fail(err)
	}
	return nil
}

// Fault is the first Redis failure or busy mutex of the call Begin began.
func (s *Store) Fault() error { return s.fault }

// px is d as the argument of a Redis PX: whole milliseconds, at least 1.
func px(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

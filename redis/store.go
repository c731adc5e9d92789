package flightredis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// store is the gobreaker.SharedDataStore of a [Breaker]. It is used by one
// DistributedCircuitBreaker call at a time (the Breaker's sem), so its
// fields need no lock of their own.
//
// gobreaker calls, per Execute: GetData, Lock, SetData, Unlock. The store
// takes the shared mutex in GetData (Lock then finds it held), so the state
// is read under the mutex; Unlock releases it. In modeSeed (the
// constructor), Lock and Unlock do nothing and SetData writes only if no
// state exists, so seeding never waits in gobreaker's own lock loop.
type store struct {
	rdb      redis.UniversalClient
	mutexKey string
	timeout  time.Duration
	lockWait time.Duration   // how long to wait for a mutex held by an update
	lockTTL  time.Duration   // PX of the mutex for an update
	probeTTL time.Duration   // PX of the mutex for a probe (the whole call)
	base     context.Context // cancelled by Breaker.Close

	mode  storeMode
	gen   uint64 // the generation the outcome belongs to; 0 = any
	held  string // value of the mutex held by this call, "" if none
	fault error  // the first Redis failure or busy mutex of this call
}

type storeMode uint8

const (
	modeSeed   storeMode = iota // constructor: no mutex, create-only writes
	modeUpdate                  // record an outcome: mutex for a few round trips
	modeProbe                   // half-open probe: mutex for the whole call
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

// begin starts one gobreaker call in mode m, for an outcome of generation
// gen (0: whatever the generation).
func (s *store) begin(m storeMode, gen uint64) { s.mode, s.gen, s.fault = m, gen, nil }

// end releases a mutex that gobreaker left held (it skips Unlock when the
// state is missing or does not decode).
func (s *store) end() {
	if s.held != "" {
		s.unlock()
	}
}

func (s *store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.base, s.timeout)
}

func (s *store) fail(err error) error {
	if s.fault == nil {
		s.fault = err
	}
	return err
}

// Lock implements gobreaker.SharedDataStore.
func (s *store) Lock(name string) error {
	if name != s.mutexKey {
		return s.fail(fmt.Errorf("flightredis: gobreaker asked for mutex %q, want %q", name, s.mutexKey))
	}
	if s.mode == modeSeed || s.held != "" {
		return nil
	}
	return s.lock()
}

// Unlock implements gobreaker.SharedDataStore.
func (s *store) Unlock(string) error {
	if s.mode == modeSeed || s.held == "" {
		return nil
	}
	return s.unlock()
}

// GetData implements gobreaker.SharedDataStore: outside modeSeed it takes
// the mutex first. A missing state is (nil, nil), which gobreaker reports
// as ErrNoSharedState. An outcome for a generation that has ended (the
// breaker changed state since the call was allowed) stops here, as
// gobreaker's own generation check would stop it in one process.
func (s *store) GetData(name string) ([]byte, error) {
	if s.mode != modeSeed && s.held == "" {
		if err := s.lock(); err != nil {
			return nil, err
		}
	}
	c, cancel := s.ctx()
	data, err := s.rdb.Get(c, name).Bytes()
	cancel()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		s.end()
		return nil, s.fail(err)
	}
	if s.gen != 0 {
		var g struct{ Generation uint64 }
		if json.Unmarshal(data, &g) == nil && g.Generation != s.gen {
			s.end()
			return nil, s.fail(errStale)
		}
	}
	return data, nil
}

// SetData implements gobreaker.SharedDataStore. It writes under the mutex
// (a plain SET: the state and the mutex may live in different Cluster
// items); in modeSeed only if no state exists yet.
func (s *store) SetData(name string, data []byte) error {
	c, cancel := s.ctx()
	defer cancel()
	var err error
	if s.mode == modeSeed {
		err = s.rdb.SetNX(c, name, data, stateTTL).Err()
	} else {
		err = s.rdb.Set(c, name, data, stateTTL).Err()
	}
	if err != nil {
		return s.fail(err)
	}
	return nil
}

// lock takes the shared mutex, waiting up to lockWait while another
// process's update holds it, and failing at once when a probe holds it.
func (s *store) lock() error {
	val, ttl := token(16), s.lockTTL
	if s.mode == modeProbe {
		val, ttl = "probe:"+val, s.probeTTL
	}
	deadline := time.Now().Add(s.lockWait)
	pause := time.Millisecond
	for {
		c, cancel := s.ctx()
		n, err := lockScript.Run(c, s.rdb, []string{s.mutexKey}, val, px(ttl)).Int()
		cancel()
		switch {
		case err != nil:
			return s.fail(err)
		case n == 1:
			s.held = val
			return nil
		case n < 0:
			return s.fail(errProbing)
		case time.Now().After(deadline):
			return s.fail(errBusy)
		}
		timer := time.NewTimer(jitter(pause))
		select {
		case <-timer.C:
		case <-s.base.Done():
			timer.Stop()
			return s.fail(errBusy)
		}
		pause = min(2*pause, 16*time.Millisecond)
	}
}

func (s *store) unlock() error {
	val := s.held
	s.held = ""
	c, cancel := s.ctx()
	err := unlockScript.Run(c, s.rdb, []string{s.mutexKey}, val).Err()
	cancel()
	if err != nil {
		return s.fail(err)
	}
	return nil
}

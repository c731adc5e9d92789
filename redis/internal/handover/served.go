package handover

import (
	"sync"
	"time"
)

// Served remembers, per key, the version of the shared entry last handed
// to this process's Loader. The Loader asks again for a key it holds only
// to refresh it (stale-while-revalidate, early refresh) or after a local
// eviction; so a stale entry this process already has is not handed back,
// and the tier reloads it under the lease instead. Bounded: when full, an
// arbitrary key is forgotten, which costs at most one Redis round trip.
type Served struct {
	mu sync.Mutex
	m  map[string]servedID // keys.base → entry id; guarded by mu
}

// servedID is the entry id handed over for a key, and when.
type servedID struct {
	id string
	at time.Time
}

// Init readies s.
func (s *Served) Init() { s.m = make(map[string]servedID) }

// Get returns the id handed over for base, "" if none.
func (s *Served) Get(base string) string {
	id, _ := s.Since(base)
	return id
}

// since returns the id handed over for base and when it was.
func (s *Served) Since(base string) (string, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[base]
	return e.id, e.at
}

// Note records that the entry id of base was handed over now.
func (s *Served) Note(base, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[base]; !ok && len(s.m) >= bound {
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[base] = servedID{id, time.Now()}
}

// reset forgets everything: after a Distrust, the Loader asks again for
// what it holds to read it, not to refresh it; after a generation move,
// nothing handed over is of the current generation.
func (s *Served) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.m)
}

// Drop forgets base.
func (s *Served) Drop(base string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, base)
}

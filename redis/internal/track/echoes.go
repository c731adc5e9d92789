package track

import "sync"

// Echo is what Echoes knows of an entry.
type Echo int8

const (
	EchoNone  Echo = iota // tracked; no write of this process since
	EchoWrite             // this process's Set or Invalidate since
	EchoFill              // this process's fill since
)

// maxEchoes bounds Echoes: when full, an arbitrary entry is forgotten.
const maxEchoes = 1 << 16

// Echoes remembers which entries Redis tracks for this process, and which
// of those this process wrote since: the invalidation that comes back is
// its own write's echo. Bounded: a name forgotten costs a count, never a
// drop. It is forgotten at each distrust: the echo of a connection lost
// never comes.
type Echoes struct {
	mu sync.Mutex
	m  map[string]Echo // entry → EchoNone, EchoWrite or EchoFill
}

// Tracked notes a tracked read of entry.
func (e *Echoes) Tracked(entry string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = make(map[string]Echo)
	}
	if _, ok := e.m[entry]; !ok {
		if len(e.m) >= maxEchoes {
			for k := range e.m {
				delete(e.m, k)
				break
			}
		}
		e.m[entry] = EchoNone
	}
}

// Wrote notes this process's write of entry, of kind EchoWrite or
// EchoFill, if Redis tracks entry for it: it reports whether an
// invalidation will come back.
func (e *Echoes) Wrote(entry string, kind Echo) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.m[entry]; ok {
		e.m[entry] = kind
		return true
	}
	return false
}

// Unmark undoes Wrote, for a write that changed nothing.
func (e *Echoes) Unmark(entry string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if k, ok := e.m[entry]; ok && k != EchoNone {
		e.m[entry] = EchoNone
	}
}

// Reset forgets everything.
func (e *Echoes) Reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.m)
}

// Heard notes an invalidation of entry (Redis tracks it no more); it
// returns what the tier knew: EchoNone for another process's write.
func (e *Echoes) Heard(entry string) Echo {
	e.mu.Lock()
	defer e.mu.Unlock()
	own := e.m[entry]
	delete(e.m, entry)
	return own
}

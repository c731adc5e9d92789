package handover

import "sync"

// Running are the keys (keys.base) a Load or LoadMany of this tier reads
// now, whether an invalidation of theirs came meanwhile, and whether the
// Loader's copy of them was cut (see Cut) since each Load began.
type Running struct {
	mu   sync.Mutex
	m    map[string]*keyLoads // guarded by mu
	cuts uint64               // cuts of every key (CutAll); guarded by mu
}

// keyLoads are the Loads of one key running now.
type keyLoads struct {
	n      int    // Loads of the key running
	pushed bool   // an invalidation came while they ran
	cuts   uint64 // cuts of the key while they ran
}

// Ticket is what the cuts of a Load's key stood at when it began.
type Ticket struct{ key, all uint64 }

// Begin notes that a Load of base starts, and returns its Ticket.
func (f *Running) Begin(base string) Ticket {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]*keyLoads)
	}
	fl := f.m[base]
	if fl != nil {
		fl.n++
	} else {
		fl = &keyLoads{n: 1}
		f.m[base] = fl
	}
	return Ticket{fl.cuts, f.cuts}
}

// Cut notes that the Loader's copy of base is dropped or replaced by
// other means than a Load of this tier (a drop, this process's Set or
// Invalidate): the Loader detaches a Load of the key running then, and
// keeps nothing of it. Call it before the drop and before recording what
// the Loader holds instead.
func (f *Running) Cut(base string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil {
		fl.cuts++
	}
}

// CutAll is cut for every key (a distrust: a Get detaches the Loads of
// its key running then; a move to a new generation).
func (f *Running) CutAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cuts++
}

// Record runs note, the record of a copy a Load with Ticket tk hands the
// Loader, unless the Loader's copy of base was cut since that Load began:
// the Loader keeps nothing of it then, and what it holds instead (the copy
// of a Load that began after the cut, or of a Set) is what served must
// name, else an invalidation of that copy is checked against the wrong
// version and lost. Under mu: a cut comes before the record, or finds it
// made and overrides it.
func (f *Running) Record(base string, tk Ticket, note func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil && fl.cuts == tk.key && f.cuts == tk.all {
		note()
	}
}

// End notes that a Load of base ends; it reports whether an invalidation
// came while it ran (the last of them to end checks it).
func (f *Running) End(base string) (pushed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl := f.m[base]
	if fl == nil {
		return false
	}
	if fl.n--; fl.n > 0 {
		return false
	}
	delete(f.m, base)
	return fl.pushed
}

// Pushed notes an invalidation of base; it reports whether a Load of it
// runs, which will have it checked when it ends.
func (f *Running) Pushed(base string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.m[base]; fl != nil {
		fl.pushed = true
		return true
	}
	return false
}

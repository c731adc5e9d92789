package flightcache

// Flush sends every open batch window's keys at once ([Options.BatchWindow],
// docs/design.md rule 39): the misses and refreshes waiting in a window go
// out in its LoadMany call now, as a full window does, instead of at the
// end of the window. A caller that knows it has asked for everything it
// will ask for (a GraphQL resolver once a level of the query is resolved)
// calls it so that no miss waits out the window after it. A load that
// starts after Flush opens a new window. Without a BatchWindow, with no
// window open, and after Close (the windows go out at Close), it does
// nothing. Flush never waits for a load, and is safe for concurrent use.
func (l *Loader[K, V]) Flush() {
	l.gathers.flush()
}

// flush seals the open gathers, of misses and of refreshes, and wakes
// their goroutines (hold): each goes out at once. Sealed, a gather takes
// no more calls (the next load opens a new one), and its calls no longer
// leave it (drop), as when it goes out at its time.
func (g *gathers[K, V]) flush() {
	if g.d == 0 {
		return
	}
	g.mu.Lock()
	fg, bg := g.fg, g.bg
	g.fg, g.bg = nil, nil
	for _, b := range [2]*batch[K, V]{fg, bg} {
		if b != nil {
			b.gather.open = false
		}
	}
	g.mu.Unlock()
	// An open gather (in fg or bg) was never closed as full (add takes a
	// full one out of fg or bg as it fills it, and afterStart closes it),
	// and out of them now, it never will be: each is closed once.
	for _, b := range [2]*batch[K, V]{fg, bg} {
		if b != nil {
			close(b.gather.full)
		}
	}
}

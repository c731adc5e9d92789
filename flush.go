package flightcache

// Flush sends every open batch window ([Options.BatchWindow]) at once, in
// its LoadMany call, instead of at the window's end: a caller that has
// asked for everything it will (a GraphQL resolver at the end of a level)
// spares its misses the wait (docs/design.md rule 39). It never waits for
// a load; with no window open, and after Close, it does nothing. It is safe
// for concurrent use.
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

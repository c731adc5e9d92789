package main

import (
	"time"

	"github.com/flightcache/flightcache"
)

// experiment is one configuration under measurement: a Loader, its fake
// downstream and its readers. Several run side by side, each with its own
// of all three, so that they share the machine's conditions but nothing
// else.
type experiment interface {
	start()                   // start the readers
	stats() flightcache.Stats // the Loader's Stats now
	stop()                    // stop the readers (once the run has what it needs), wait for them, close the Loader
}

// sideBySide runs exps together for d (or longer, if an experiment's stop
// waits for more), showing progress under label.
func sideBySide(p *progress, label string, d time.Duration, exps ...experiment) {
	for _, e := range exps {
		e.start()
	}
	stop := p.start(label, d, func() flightcache.Stats {
		var sum flightcache.Stats
		for _, e := range exps {
			s := e.stats()
			sum.Gets += s.Gets
			sum.Loads += s.Loads
			sum.LoadErrors += s.LoadErrors
		}
		return sum
	})
	time.Sleep(d) // the length of the run, not a wait for an event
	for _, e := range exps {
		e.stop()
	}
	stop()
}

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
	stop()                    // stop the readers, wait for them, close the Loader
}

// sideBySide runs exps together for d, and on until each has finished at
// least minLoads loads, showing progress under label.
func sideBySide(p *progress, label string, d time.Duration, minLoads uint64, exps ...experiment) {
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
	time.Sleep(d)
	for _, e := range exps {
		for e.stats().Loads < minLoads {
			time.Sleep(time.Millisecond)
		}
	}
	for _, e := range exps {
		e.stop()
	}
	stop()
}

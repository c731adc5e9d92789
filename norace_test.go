//go:build !race

package flightcache

// raceEnabled reports whether the race detector is on: tests that push
// millions of operations through the Loader run fewer of them then.
const raceEnabled = false

//go:build !race

package flightredis

// raceEnabled reports whether the race detector is on: tests whose bulk
// is load, not their point, make less of it then.
const raceEnabled = false

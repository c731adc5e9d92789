//go:build !unix

package main

// raiseFileLimit does nothing where there is no RLIMIT_NOFILE.
func raiseFileLimit() {}

// cpuSeconds returns 0: not measured here.
func cpuSeconds() float64 { return 0 }

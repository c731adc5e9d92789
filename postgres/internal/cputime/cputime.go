// Package cputime reads the CPU time a process has used, for the
// measuring commands (cmd/changelag, cmd/fleetlag).
package cputime

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Self returns the CPU time (user and system) this process has used, or 0
// when it cannot be read.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Of returns the CPU time of process pid from /proc, or -1 when it cannot
// be read (pid 0, or a process on another machine).
func Of(pid int) time.Duration {
	if pid == 0 {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// Fields after the command (which may hold spaces) in parentheses:
	// utime and stime are the 14th and 15th fields of the line.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(u+k) * time.Second / ticks
}

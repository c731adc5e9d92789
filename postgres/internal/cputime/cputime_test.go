package cputime

import (
	"os"
	"testing"
	"time"
)

// Burning CPU shows in both readings of this process, and a pid that
// cannot be read gives -1.
func TestSelfAndOfCountThisProcess(t *testing.T) {
	s0, o0 := Self(), Of(os.Getpid())
	end := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(end) {
		x++
	}
	_ = x
	if d := Self() - s0; d <= 0 {
		t.Errorf("Self grew by %v after 300 ms of work; want more than 0", d)
	}
	if o0 < 0 {
		t.Skip("no /proc here")
	}
	if d := Of(os.Getpid()) - o0; d < 0 {
		t.Errorf("Of(self) went back by %v", d)
	}
	if got := Of(0); got != -1 {
		t.Errorf("Of(0) = %v; want -1", got)
	}
}

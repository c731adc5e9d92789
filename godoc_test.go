package flightcache

import (
	"bytes"
	"os/exec"
	"testing"
)

// maxGodocLines bounds what `go doc -all` prints for the package: the
// godoc says what each name is, promises and fails with, and links the
// docs/ page for the long story, so that the page stays one a reader reads.
const maxGodocLines = 1300

// The package's godoc, as a reader meets it, stays short.
func TestGodocStaysShort(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command:", err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(gocmd, "doc", "-all", ".")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go doc -all .: %v\n%s", err, stderr.Bytes())
	}
	if n := bytes.Count(out, []byte("\n")); n > maxGodocLines {
		t.Errorf("go doc -all . prints %d lines; want at most %d: say what a name is, promises and fails with, and link docs/ for the rest", n, maxGodocLines)
	}
}

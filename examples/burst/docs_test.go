package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README and docs/examples.md say how many experiments this program
// runs, and docs/examples.md describes each: they must count the parts
// that measure runs (the letters of -only's default).
func TestDocsCountTheParts(t *testing.T) {
	parts := defaultConfig().only
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	want := words[len(parts)]
	said := regexp.MustCompile("examples/burst`? runs (\\w+) experiments")
	for _, path := range []string{"../../README.md", "../../docs/examples.md"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := said.FindSubmatch(b)
		if m == nil {
			t.Errorf("%s: no sentence \"examples/burst runs N experiments\"", path)
		} else if string(m[1]) != want {
			t.Errorf("%s says %s experiments; examples/burst runs %s (parts %s)", path, m[1], want, parts)
		}
		if !strings.HasSuffix(path, "examples.md") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(string(b), "- **"+string(p)+".**") {
				t.Errorf("%s: part %c is not described (no \"- **%c.**\")", path, p, p)
			}
		}
		if flags := "`-only " + strings.Join(strings.Split(parts, ""), "|") + "`"; !strings.Contains(string(b), flags) {
			t.Errorf("%s does not list every part in %s", path, flags)
		}
	}
}

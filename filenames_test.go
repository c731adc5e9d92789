package flightcache

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A comment that sends its reader to a file names one the repository has:
// every file name ending in .go in the comments of this package's files
// and its internal packages' is a file of the comment's own directory, or
// a path from the repository's root.
func TestCommentsNameFilesThatExist(t *testing.T) {
	files := map[string]bool{} // every file's path
	var sources []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		files[filepath.ToSlash(path)] = true
		// The package's own files and its internal packages': the
		// programs and nested modules name their neighbours' files.
		dir := filepath.ToSlash(filepath.Dir(path))
		if strings.HasSuffix(path, ".go") && (dir == "." || strings.HasPrefix(dir, "internal/")) {
			sources = append(sources, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`(^|[^\w/.-])([\w/-]*[a-z0-9_]\.go)\b`)
	for _, path := range sources {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			_, comment, ok := strings.Cut(line, "//")
			if !ok {
				continue
			}
			for _, m := range named.FindAllStringSubmatch(comment, -1) {
				name := m[2]
				if !files[filepath.ToSlash(filepath.Join(filepath.Dir(path), name))] && !files[name] {
					t.Errorf("%s:%d: the comment names %s, which is not in its directory nor at that path", path, i+1, name)
				}
			}
		}
	}
}

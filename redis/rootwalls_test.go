package flightredis

import (
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestWallsNoRootInternal fails if a file of any package of this module
// (its internal/ packages and commands included, tests too) imports a
// package under the root module's internal/: the tier reaches the Loader
// through flightcache and its contract through flightcache/remote only.
func TestWallsNoRootInternal(t *testing.T) {
	const rootInternal = "github.com/flightcache/flightcache/internal/"
	fset := gotoken.NewFileSet()
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, rootInternal) {
				t.Errorf("%s imports %s: use flightcache or flightcache/remote", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no Go file found")
	}
}

package flightredis

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The walls of the package, read from its source: the connection
// machinery under internal/ knows neither the root module nor this
// package, functions stay short, Tier keeps the methods of its own state,
// and a name means one thing (docs/design.md, the glossary).

// ownInternal is the import path of the packages under internal/.
const ownInternal = "github.com/flightcache/flightcache/redis/internal/"

// TestWallsInternalImports fails if a package under internal/ imports
// anything but the standard library (a path whose first element has no
// dot), go-redis and the other packages under internal/: not the root
// module (its internal/ packages included), nor this package. Test files
// may import test helpers.
func TestWallsInternalImports(t *testing.T) {
	fset := gotoken.NewFileSet()
	dirs := map[string]bool{}
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dirs[filepath.Dir(path)] = true
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			std := !strings.Contains(strings.SplitN(p, "/", 2)[0], ".")
			if !std && p != "github.com/redis/go-redis/v9" && !strings.HasPrefix(p, ownInternal) {
				t.Errorf("%s imports %s: a package under internal/ imports only the standard library, go-redis and internal/", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no package found under internal/: the connection machinery belongs there")
	}
}

// maxFuncLines and maxParams bound every function of the package and of
// its internal packages (non-test files), as in the root: a step of the
// protocol, not the protocol.
const (
	maxFuncLines = 50
	maxParams    = 5
)

// TestWallsFunctionSize fails if a function (test files aside) is longer
// than maxFuncLines lines or takes more than maxParams parameters (the
// receiver not counted).
func TestWallsFunctionSize(t *testing.T) {
	for _, fn := range funcs(t) {
		lines := fn.fset.Position(fn.decl.End()).Line - fn.fset.Position(fn.decl.Pos()).Line + 1
		if lines > maxFuncLines {
			t.Errorf("%s: %s is %d lines long, more than %d: split it at its steps", fn.file, fn.decl.Name.Name, lines, maxFuncLines)
		}
		params := 0
		for _, f := range fn.decl.Type.Params.List {
			params += max(1, len(f.Names))
		}
		if params > maxParams {
			t.Errorf("%s: %s takes %d parameters, more than %d: give them a struct", fn.file, fn.decl.Name.Name, params, maxParams)
		}
	}
}

// funcDecl is a function of the package's source.
type funcDecl struct {
	file string
	fset *gotoken.FileSet
	decl *ast.FuncDecl
}

// funcs returns the functions with a body of the non-test files of the
// package and of its internal packages.
func funcs(t *testing.T) []funcDecl {
	t.Helper()
	fset := gotoken.NewFileSet()
	var out []funcDecl
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "testdata" || path == "cmd") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				out = append(out, funcDecl{path, fset, fd})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no function found")
	}
	return out
}

// maxTierMethods bounds Tier's methods: the state of a concern (the
// round trips to Redis, the record of the Loader's copies, the Loader's
// rules, the fleet's names) has a type of its own, with its methods.
const maxTierMethods = 60

// TestWallsTierMethods fails if Tier has more than maxTierMethods methods.
func TestWallsTierMethods(t *testing.T) {
	n := 0
	for _, fn := range funcs(t) {
		if fn.decl.Recv == nil || len(fn.decl.Recv.List) != 1 {
			continue
		}
		typ := fn.decl.Recv.List[0].Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if idx, ok := typ.(*ast.IndexListExpr); ok {
			typ = idx.X
		}
		if id, ok := typ.(*ast.Ident); ok && id.Name == "Tier" {
			n++
		}
	}
	if n == 0 || n > maxTierMethods {
		t.Errorf("Tier has %d methods, want 1 to %d: move a method onto the type whose state it works on", n, maxTierMethods)
	}
}

// TestWallsNames fails if the package declares a type under a name that
// means something else in the root package or in docs/design.md's
// glossary: the root's in-flight map (flights, flight), a Limit slot
// (slot), a stale window (window).
func TestWallsNames(t *testing.T) {
	taken := map[string]string{
		"flights": "the root's in-flight map", "flight": "the root's in-flight map",
		"slot": "a Limit slot", "window": "a stale window",
	}
	fset := gotoken.NewFileSet()
	pkgs, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range pkgs {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if what, ok := taken[strings.ToLower(ts.Name.Name)]; ok {
					t.Errorf("%s: type %s: the name means %s", path, ts.Name.Name, what)
				}
			}
			return true
		})
	}
}

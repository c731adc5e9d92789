package flightcache

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The walls of the package, read from its source: the mechanisms under
// internal/ import only the standard library and each other, the second
// tier's contract (remote/) only the standard library and internal/timing,
// and only flight.go locks a shard.

// internalPrefix is the import path of the packages under internal/.
const internalPrefix = "github.com/flightcache/flightcache/internal/"

// TestWallsInternalImports fails if a package under internal/ imports
// anything but the standard library (a path whose first element has no
// dot) and other internal packages. Test files may import test helpers.
func TestWallsInternalImports(t *testing.T) {
	fset := token.NewFileSet()
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
			if strings.Contains(strings.SplitN(p, "/", 2)[0], ".") && !strings.HasPrefix(p, internalPrefix) {
				t.Errorf("%s imports %s: an internal package imports only the standard library and internal/", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no package found under internal/")
	}
}

// TestWallsRemoteImports fails if a non-test file of remote/ imports
// anything but the standard library and internal/timing: the contract a
// second tier implements stands below the root (the root imports it, never
// the other way) and holds no mechanism of its own.
func TestWallsRemoteImports(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("remote", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		files++
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			if strings.Contains(strings.SplitN(p, "/", 2)[0], ".") && p != internalPrefix+"timing" {
				t.Errorf("%s imports %s: remote/ imports only the standard library and internal/timing", path, p)
			}
		}
	}
	if files == 0 {
		t.Fatal("no package found in remote/")
	}
}

// TestWallsShardLocks fails if a file of the package other than flight.go
// locks or unlocks a shard: a call of Lock, Unlock, RLock, RUnlock,
// TryLock or TryRLock on X.mu where X is a shard (by its type), or is
// named sh, shard or s (the names a shard goes by).
func TestWallsShardLocks(t *testing.T) {
	byType, byName := shardLockFiles(t)
	if !slices.Contains(byType, "flight.go") {
		t.Fatalf("no shard lock found by type in flight.go (found in %v): the check has lost the shard type", byType)
	}
	for _, files := range [][]string{byType, byName} {
		for _, f := range files {
			if f != "flight.go" {
				t.Errorf("%s locks a shard: only flight.go does (move the locked section into a flights method)", f)
			}
		}
	}
}

// shardLockFiles returns the non-test files of the package that lock a
// shard, found by the type of the locked value and by its name.
func shardLockFiles(t *testing.T) (byType, byName []string) {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// Imports outside the standard library may not resolve: the errors
	// that leaves are ignored, the shard type is the package's own.
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{Importer: importer.Default(), Error: func(error) {}}
	pkg, _ := conf.Check("github.com/flightcache/flightcache", fset, files, info)
	for _, f := range files {
		name := filepath.Base(fset.Position(f.Pos()).Filename)
		typed, named := false, false
		ast.Inspect(f, func(n ast.Node) bool {
			x := lockedMutexOwner(n)
			if x == nil {
				return true
			}
			typed = typed || isShard(pkg, info.TypeOf(x))
			if id, ok := x.(*ast.Ident); ok && (id.Name == "sh" || id.Name == "shard" || id.Name == "s") {
				named = true
			}
			return true
		})
		if typed {
			byType = append(byType, name)
		}
		if named {
			byName = append(byName, name)
		}
	}
	return byType, byName
}

// lockedMutexOwner returns X if n is X.mu.Lock (or another locking
// method of a mutex), else nil.
func lockedMutexOwner(n ast.Node) ast.Expr {
	sel, ok := n.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	switch sel.Sel.Name {
	case "Lock", "Unlock", "RLock", "RUnlock", "TryLock", "TryRLock":
	default:
		return nil
	}
	if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "mu" {
		return inner.X
	}
	return nil
}

// isShard reports whether t is pkg's shard type, or a pointer to it.
func isShard(pkg *types.Package, t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && pkg != nil && n.Origin().Obj().Pkg() == pkg && n.Origin().Obj().Name() == "shard"
}

// TestWallsFlightPort fails if flight.go, the in-flight map, reaches more
// than a few members of the Loader: it is handed its port (docs/design.md,
// "The in-flight map's port"), and a new rule about keys goes there, not
// into start, put or finish.
func TestWallsFlightPort(t *testing.T) {
	const most = 8
	members := loaderMembersUsedIn(t, "flight.go")
	if len(members) > most {
		t.Errorf("flight.go reaches %d members of the Loader, want at most %d: %v", len(members), most, members)
	}
}

// loaderMembersUsedIn returns the distinct fields and methods of the
// Loader that file selects (a member of a type the Loader embeds counts
// as that embedded field).
func loaderMembersUsedIn(t *testing.T, file string) []string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	var target *ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
		if p == file {
			target = f
		}
	}
	if target == nil {
		t.Fatalf("%s not found", file)
	}
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: importer.Default(), Error: func(error) {}}
	pkg, _ := conf.Check("github.com/flightcache/flightcache", fset, files, info)
	seen := map[string]bool{}
	ast.Inspect(target, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		s := info.Selections[sel]
		if s == nil {
			return true
		}
		r := s.Recv()
		if p, ok := r.(*types.Pointer); ok {
			r = p.Elem()
		}
		nt, ok := r.(*types.Named)
		if !ok || pkg == nil || nt.Origin().Obj().Pkg() != pkg || nt.Origin().Obj().Name() != "Loader" {
			return true
		}
		name := sel.Sel.Name
		if st, ok := nt.Underlying().(*types.Struct); ok && len(s.Index()) > 1 {
			name = st.Field(s.Index()[0]).Name() // through an embedded field: that field is what it reaches
		}
		seen[name] = true
		return true
	})
	return slices.Sorted(maps.Keys(seen))
}

// retiredNames are names the package no longer declares, each for a word
// that means something else here (docs/design.md, "Glossary"): a window
// is a stale window (a batch window is a gather inside the code), a slot
// a Limit slot, outdated a version's, an entry that leaves the cache a
// departure.
var retiredNames = []string{
	"batchWindows", "windowWait", "windowAct", "bwin", // gathers, gatherWait, afterStart
	"refreshSlots", "slotted", // refreshPermits, permitted
	"olderThanFloor",                                                  // belowFloor
	"left", "leftMu", "noteLeft", "reportLeft", "leftCache", "leftBy", // departures; flights.abandoned
	"departed",
}

// TestNamesOneConcept fails if a non-test file of the package declares a
// retired name (a type, a function or method, or a field).
func TestNamesOneConcept(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var names []*ast.Ident
			switch d := n.(type) {
			case *ast.TypeSpec:
				names = []*ast.Ident{d.Name}
			case *ast.FuncDecl:
				names = []*ast.Ident{d.Name}
				if d.Name.Name == "outdated" { // a version's word: a write's field may hold it, no function
					t.Errorf("%s declares func outdated: the generation check is detachDistrusted", fset.Position(d.Pos()))
				}
			case *ast.Field:
				names = d.Names
			}
			for _, id := range names {
				if slices.Contains(retiredNames, id.Name) {
					t.Errorf("%s declares %s: a retired name (docs/design.md, Glossary)", fset.Position(id.Pos()), id.Name)
				}
			}
			return true
		})
	}
}

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
	"olderThanFloor", "isFloor", "errFloor", // belowFloor; isTombstone, errTombstone (a version's)
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

// The root's size, held where it stands so that it cannot grow back
// unnoticed (a new mechanism goes under internal/, behind a wall, or
// into the file it serves): its non-test files and their lines, the
// Loader's methods, the pairs of files that refer to each other's
// top-level names both ways, and the length and parameters of its
// functions.
const (
	rootFilesMost     = 19
	rootLinesMost     = 7993
	loaderMethodsMost = 80
	bothWaysMost      = 26
	funcLinesMost     = 50
	funcParamsMost    = 5
)

// rootFiles parses the package's non-test files, by name.
func rootFiles(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
	}
	return fset, files
}

// TestWallsRootSize fails if the root has more files, lines or Loader
// methods than it has now, or a function longer than funcLinesMost lines
// or with more than funcParamsMost parameters (the receiver not counted).
func TestWallsRootSize(t *testing.T) {
	fset, files := rootFiles(t)
	lines, methods := 0, 0
	for name, f := range files {
		lines += fset.Position(f.End()).Line
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if fd.Recv != nil && receiverName(fd.Recv.List[0].Type) == "Loader" {
				methods++
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > funcLinesMost {
				t.Errorf("%s: %s is %d lines, want at most %d: split it at its steps", name, fd.Name.Name, n, funcLinesMost)
			}
			params := 0
			for _, p := range fd.Type.Params.List {
				params += max(1, len(p.Names))
			}
			if params > funcParamsMost {
				t.Errorf("%s: %s takes %d parameters, want at most %d", name, fd.Name.Name, params, funcParamsMost)
			}
		}
	}
	if len(files) > rootFilesMost {
		t.Errorf("the root has %d non-test files, want at most %d", len(files), rootFilesMost)
	}
	if lines > rootLinesMost {
		t.Errorf("the root's non-test files have %d lines, want at most %d", lines, rootLinesMost)
	}
	if methods > loaderMethodsMost {
		t.Errorf("the Loader has %d methods, want at most %d", methods, loaderMethodsMost)
	}
}

// TestWallsBothWays fails if more pairs of the root's files refer to each
// other both ways than now. A file refers to another when it names one of
// that file's top-level declarations, or selects a method of the Loader
// declared there (by name: a selector of another type's method of the same
// name counts too, which errs on the side of more pairs).
func TestWallsBothWays(t *testing.T) {
	_, files := rootFiles(t)
	owner := map[string]string{}
	for name, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					owner[d.Name.Name] = name
				} else if receiverName(d.Recv.List[0].Type) == "Loader" {
					owner["Loader."+d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						owner[s.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range s.Names {
							owner[n.Name] = name
						}
					}
				}
			}
		}
	}
	uses := map[string]map[string]bool{}
	for name, f := range files {
		u := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Ident:
				u[owner[n.Name]] = true
			case *ast.SelectorExpr:
				u[owner["Loader."+n.Sel.Name]] = true
			}
			return true
		})
		uses[name] = u
	}
	var pairs []string
	for a := range files {
		for b := range uses[a] {
			if b != "" && a < b && uses[b][a] {
				pairs = append(pairs, a+" <-> "+b)
			}
		}
	}
	slices.Sort(pairs)
	if len(pairs) > bothWaysMost {
		t.Errorf("%d pairs of files refer to each other both ways, want at most %d: %v", len(pairs), bothWaysMost, pairs)
	}
}

// receiverName is the name of a method's receiver type.
func receiverName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverName(t.X)
	case *ast.IndexExpr:
		return receiverName(t.X)
	case *ast.IndexListExpr:
		return receiverName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}

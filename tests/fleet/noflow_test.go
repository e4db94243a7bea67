package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// flowNames are what only core does around a handler: recover is checked
// apart (the builtin), these by name, on anything (a decision, the
// engine, a store, an interface or an embedding of them, a method value or
// expression, a string handed to reflect). gin's own (*gin.Context).Abort,
// which ends gin's chain, is translation and the one exception.
var flowNames = map[string]bool{
	"Abort": true, "Commit": true, "Decide": true, "Run": true,
	"Claim": true, "Complete": true, "Fail": true, "Heartbeat": true, "Release": true,
}

// engineAllowed are the *core.Engine methods an adapter may call: Serve
// (the whole flow of a request), Call (the whole flow of a plain call:
// grpcidem) and what it needs to build itself.
var engineAllowed = map[string]bool{"Serve": true, "Call": true, "CheckScope": true}

const corePath = "github.com/idemkit/idem/core"

// flowUses reports, as "file:line: what", every place in files (type
// checked into info) that holds flow: a use of the builtin recover, a
// selector, identifier or string literal naming a flow operation, a method
// of *core.Engine other than engineAllowed.
func flowUses(fset *token.FileSet, files []*ast.File, info *types.Info) []string {
	var found []string
	report := func(n ast.Node, what string) {
		found = append(found, fmt.Sprintf("%s: %s", fset.Position(n.Pos()), what))
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				name := n.Sel.Name
				if fn, ok := info.Uses[n.Sel].(*types.Func); ok && isEngineMethod(fn) && !engineAllowed[name] {
					report(n, "core.Engine."+name)
				} else if flowNames[name] && !isGinAbort(info.Uses[n.Sel]) {
					report(n, "selector "+name)
				}
				// n.X is walked below; n.Sel must not be seen again as an ident.
				ast.Inspect(n.X, func(m ast.Node) bool { return inspectLeaf(m, info, report) })
				return false
			default:
				return inspectLeaf(n, info, report)
			}
		})
	}
	return found
}

// inspectLeaf checks identifiers and string literals outside selectors.
func inspectLeaf(n ast.Node, info *types.Info, report func(ast.Node, string)) bool {
	switch n := n.(type) {
	case *ast.Ident:
		if b, ok := info.Uses[n].(*types.Builtin); ok && b.Name() == "recover" {
			report(n, "recover")
		} else if n.Name == "recover" && info.Uses[n] == nil && info.Defs[n] == nil {
			report(n, "recover (unresolved)")
		} else if fn, ok := info.Uses[n].(*types.Func); ok && flowNames[fn.Name()] {
			report(n, "call of "+fn.Name())
		}
	case *ast.BasicLit:
		if n.Kind == token.STRING {
			if s, err := strconv.Unquote(n.Value); err == nil && flowNames[s] {
				report(n, "string "+n.Value)
			}
		}
	case *ast.SelectorExpr:
		return false // handled by the caller's walk
	}
	return true
}

func isEngineMethod(fn *types.Func) bool {
	recv := fn.Signature().Recv()
	return recv != nil && isNamed(recv.Type(), corePath, "Engine")
}

func isGinAbort(obj types.Object) bool {
	fn, ok := obj.(*types.Func)
	if !ok || fn.Name() != "Abort" {
		return false
	}
	recv := fn.Signature().Recv()
	return recv != nil && isNamed(recv.Type(), "github.com/gin-gonic/gin", "Context")
}

func isNamed(t types.Type, pkg, name string) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == pkg && n.Obj().Name() == name
}

// listed is what go list -export says about one package.
type listed struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
}

// exportData lists pkgs and their dependencies with compiled export data,
// for type checking against the real dependencies.
func exportData(t *testing.T, pkgs ...string) map[string]listed {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,Export,GoFiles"}, pkgs...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	all := map[string]listed{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		all[p.ImportPath] = p
	}
	return all
}

// check type-checks files as package path and returns its flow uses.
func check(t *testing.T, all map[string]listed, fset *token.FileSet, path string, files []*ast.File) []string {
	t.Helper()
	imp := importer.ForCompiler(fset, "gc", func(p string) (io.ReadCloser, error) {
		l, ok := all[p]
		if !ok || l.Export == "" {
			return nil, fmt.Errorf("no export data for %s", p)
		}
		return os.Open(l.Export)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
	var typeErrs []error
	conf := types.Config{Importer: imp, Error: func(err error) { typeErrs = append(typeErrs, err) }}
	_, _ = conf.Check(path, fset, files, info)
	if len(typeErrs) > 0 {
		t.Fatalf("%s does not type-check: %v", path, typeErrs)
	}
	return flowUses(fset, files, info)
}

// TestAdaptersHoldNoFlow: the adapters' non-test code never recovers a
// panic, commits, aborts or otherwise runs the flow around the handler:
// that sequence is core.Engine.Serve's, in one place. The check is on the
// type-checked syntax tree, not on lines, so spacing, method values,
// embedding, interfaces and receiver names do not hide a use
// (TestFlowCheckCatchesEvasions shows it).
func TestAdaptersHoldNoFlow(t *testing.T) {
	adapters := []string{"nethttpidem", "ginidem", "echoidem", "echov5idem", "fiberidem", "fiberv3idem", "grpcidem"}
	var pkgs []string
	for _, a := range adapters {
		pkgs = append(pkgs, "github.com/idemkit/idem/"+a)
	}
	all := exportData(t, pkgs...)
	for _, p := range pkgs {
		l := all[p]
		if len(l.GoFiles) == 0 {
			t.Fatalf("%s: no sources", p)
		}
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range l.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(l.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		for _, use := range check(t, all, fset, p, files) {
			t.Errorf("%s holds flow: %s", p, use)
		}
	}
}

// TestFlowCheckCatchesEvasions: each snippet hides a piece of flow from a
// line regex (the check this test replaced); the syntax-tree check finds
// every one, and passes the legitimate code adapters contain.
func TestFlowCheckCatchesEvasions(t *testing.T) {
	all := exportData(t, corePath, "github.com/gin-gonic/gin", "reflect")
	const header = `package x
import (
	"context"
	"reflect"
	"github.com/gin-gonic/gin"
	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)
var _ = context.Background
var _ = reflect.ValueOf
var _ gin.HandlerFunc
var _ core.Request
var _ adapterkit.Response
var _ storekit.Fence
`
	cases := []struct {
		name, src string
		want      int // flow uses found
	}{
		{"recover with a space", `func f() { defer func() { _ = recover () }() }`, 1},
		{"recover parenthesised", `func f() { defer func() { _ = (recover)() }() }`, 1},
		{"commit as a method value", `func f(e *core.Engine, d *core.Decision) { c := e.Commit; _ = c(context.TODO(), d, adapterkit.Response{}) }`, 1},
		{"abort as a method expression", `func f(e *core.Engine, d *core.Decision) { _ = (*core.Engine).Abort(e, context.TODO(), d, nil) }`, 1},
		{"abort on a receiver ending in c", `func f(svc *core.Engine, d *core.Decision) { _ = svc.Abort(context.TODO(), d, nil) }`, 1},
		{"abort on a receiver named c", `func f(c *core.Engine, d *core.Decision) { _ = c.Abort(context.TODO(), d, nil) }`, 1},
		{"decide through an embedding", `type w struct{ *core.Engine }
func f(x w) { _, _ = x.Decide(context.TODO(), core.Request{}) }`, 1},
		{"commit through an interface", `type committer interface{ Commit(context.Context, *core.Decision, adapterkit.Response) error }
func f(c committer) { _ = c.Commit(context.TODO(), nil, adapterkit.Response{}) }`, 1},
		{"run by reflection", `func f(e *core.Engine) { _ = reflect.ValueOf(e).MethodByName("Run") }`, 1},
		{"store claim", `func f(s core.Store) { _, _ = s.Claim(context.TODO(), storekit.ClaimRequest{}) }`, 1},
		{"another engine method", `func f(e *core.Engine) { _ = e.Store() }`, 1},
		{"gin's Abort is translation", `func f(c *gin.Context) { c.Abort(); c.AbortWithStatus(404) }`, 0},
		{"serve is the one entry", `func f(e *core.Engine) { _ = e.Serve(context.TODO(), core.Request{}, nil); _ = e.CheckScope("x.WithScope", true) }`, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "snippet.go", header+tc.src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			got := check(t, all, fset, "example.com/x", []*ast.File{f})
			sort.Strings(got)
			if len(got) != tc.want {
				t.Errorf("found %d flow uses, want %d: %s", len(got), tc.want, strings.Join(got, "; "))
			}
		})
	}
}

package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoKeyFormatted is the first wall, checked on the source: no library
// code (core, the stores, the adapters, otelidem, idemctl) hands a key to
// a formatting or logging call (fmt.Errorf, fmt.Sprintf, errors.New,
// log.*, slog attributes, ...) other than through RedactKey, ScrubText or
// scrubError. A key is an identifier named key, k or secret, or a field
// named Key. The engine's own log method takes the key and redacts it. A
// line that prints a key because the operator asked for it (idemctl
// -show-keys) says so with an "idem:showkey" comment.
func TestNoKeyFormatted(t *testing.T) {
	dirs := []string{".", "memstore", "../pgstore", "../mysqlstore", "../nethttpidem", "../ginidem",
		"../echoidem", "../echov5idem", "../fiberidem", "../otelidem", "../cmd/idemctl", "../sqlitestore", "../grpcidem", "storekit/sqlkit"}
	formatting := map[string]map[string]bool{
		"fmt":    {"Errorf": true, "Sprintf": true, "Sprint": true, "Sprintln": true, "Fprintf": true, "Fprint": true, "Fprintln": true, "Printf": true, "Print": true, "Println": true, "Appendf": true},
		"errors": {"New": true},
		"log":    {"Printf": true, "Print": true, "Println": true, "Fatalf": true, "Panicf": true},
		"slog":   {"String": true, "Any": true, "Info": true, "Warn": true, "Error": true, "Debug": true, "Group": true},
	}
	safe := map[string]bool{"RedactKey": true, "ScrubText": true, "scrubError": true, "redact": true, "scrub": true, "describe": true}
	checked := 0
	for _, dir := range dirs {
		fset := token.NewFileSet()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, ent := range entries {
			name := ent.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			path := filepath.Join(dir, name)
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			shown := map[int]bool{}
			for _, cg := range f.Comments {
				if strings.Contains(cg.Text(), "idem:showkey") {
					shown[fset.Position(cg.Pos()).Line] = true
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok || !formatting[pkg.Name][sel.Sel.Name] || shown[fset.Position(call.Pos()).Line] {
					return true
				}
				for _, arg := range call.Args {
					if bad := keyIn(arg, safe); bad != "" {
						t.Errorf("%s: %s.%s is given %s: a key must only appear as RedactKey(key)",
							fset.Position(arg.Pos()), pkg.Name, sel.Sel.Name, bad)
					}
				}
				return true
			})
		}
	}
	if checked < 50 {
		t.Fatalf("only %d files checked: the walk is broken", checked)
	}
}

// keyIn returns the key expression inside e that no safe call wraps.
func keyIn(e ast.Expr, safe map[string]bool) string {
	found := ""
	ast.Inspect(e, func(n ast.Node) bool {
		if found != "" {
			return false
		}
		switch x := n.(type) {
		case *ast.CallExpr:
			name := ""
			switch f := x.Fun.(type) {
			case *ast.Ident:
				name = f.Name
			case *ast.SelectorExpr:
				name = f.Sel.Name
			}
			if safe[name] {
				return false
			}
		case *ast.SelectorExpr:
			if x.Sel.Name == "Key" {
				found = "a .Key field"
				return false
			}
		case *ast.Ident:
			switch x.Name {
			case "key", "k", "secret":
				found = "the identifier " + x.Name
			}
		}
		return true
	})
	return found
}

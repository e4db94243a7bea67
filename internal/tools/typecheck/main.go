// Command typecheck type-checks the packages named on its command line and
// everything they import, from source, without compiling: the go command
// resolves the module graph and the files exactly as `go build` would, and
// go/types checks them. Function bodies are checked only in packages whose
// path has the -full prefix; elsewhere (the standard library, third-party
// modules) only declarations are, which is all their users' code depends on.
//
//	typecheck [-full PREFIX] PATTERN...
//
// scripts/release-check.sh uses it in `make test`, where compiling every
// integration's dependencies without the race detector would cost minutes
// on a cold build cache; `make release-check` compiles them.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	full := flag.String("full", "", "import-path prefix of the packages whose function bodies are checked too")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: typecheck [-full PREFIX] PATTERN...")
		os.Exit(2)
	}
	// The files of the packages being checked in full: ParseFile is told only
	// a file name, so the set is built from a first, syntax-free load.
	fullFiles := map[string]bool{}
	mode := packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles | packages.NeedImports | packages.NeedDeps
	pkgs, err := packages.Load(&packages.Config{Mode: mode}, flag.Args()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "typecheck:", err)
		os.Exit(1)
	}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		if *full != "" && (p.PkgPath == *full || strings.HasPrefix(p.PkgPath, *full+"/")) || slices.Contains(pkgs, p) {
			for _, f := range p.CompiledGoFiles {
				fullFiles[f] = true
			}
		}
	})
	cfg := &packages.Config{
		Mode: mode | packages.NeedTypes | packages.NeedSyntax,
		ParseFile: func(fset *token.FileSet, name string, src []byte) (*ast.File, error) {
			f, err := parser.ParseFile(fset, name, src, parser.AllErrors|parser.SkipObjectResolution)
			if f != nil && !fullFiles[name] {
				for _, d := range f.Decls {
					if fn, ok := d.(*ast.FuncDecl); ok {
						fn.Body = nil // a declaration without a body is legal Go (assembly-backed), so go/types accepts it
					}
				}
			}
			return f, err
		},
	}
	pkgs, err = packages.Load(cfg, flag.Args()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "typecheck:", err)
		os.Exit(1)
	}
	// Errors count only in the packages checked in full: without their
	// bodies, the others have imports "not used" and the like.
	failed := false
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, f := range p.CompiledGoFiles {
			if !fullFiles[f] {
				return
			}
		}
		for _, e := range p.Errors {
			fmt.Fprintln(os.Stderr, e)
			failed = true
		}
	})
	if failed {
		os.Exit(1)
	}
}

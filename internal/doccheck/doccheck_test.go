package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository root, from this package's directory.
const root = "../.."

// pending are README link targets another branch adds; the merge that
// brings them deletes the entry.
var pending = map[string]bool{}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mdLink matches [text](target) with a relative target.
var mdLink = regexp.MustCompile(`\[([^\]]+)\]\(([^)#:\s]+)(#[^)]*)?\)`)

// exampleName matches link text naming a function: `pkg.ExampleX` or `ExampleX`.
var exampleName = regexp.MustCompile("^`(?:[a-z0-9]+\\.)?(Example[A-Za-z0-9_]*)`$")

// TestReadmeLinks: every relative link in the user-facing documents points
// at a file that exists, and a link named after an example function points
// at the file that defines it.
func TestReadmeLinks(t *testing.T) {
	for _, doc := range []string{"README.md", "SECURITY.md", "CHANGELOG.md", "pgstore/README.md", "mysqlstore/README.md"} {
		text := readFile(t, doc)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			label, target := m[1], filepath.ToSlash(filepath.Join(filepath.Dir(doc), m[2]))
			if pending[target] {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, target)); err != nil {
				t.Errorf("%s links %s, which does not exist", doc, m[2])
				continue
			}
			if e := exampleName.FindStringSubmatch(label); e != nil && !definesFunc(t, target, e[1]) {
				t.Errorf("%s links %s as %s, which it does not define", doc, m[2], e[1])
			}
		}
	}
}

func definesFunc(t *testing.T, rel, name string) bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == name {
			return true
		}
	}
	return false
}

// docFiles are the files users read as documentation: markdown, doc.go and
// the option docs.
func docFiles(t *testing.T, match func(rel string) bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if match(rel) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNoDesignDocCited: DESIGN.md is not in the repository; what users
// need from it is in the README, SECURITY.md and the packages' docs.
func TestNoDesignDocCited(t *testing.T) {
	files := docFiles(t, func(rel string) bool {
		return (strings.HasSuffix(rel, ".md") || strings.HasSuffix(rel, ".go")) && !strings.HasPrefix(rel, "internal/doccheck/")
	})
	for _, rel := range files {
		if strings.Contains(readFile(t, rel), "DESIGN"+".md") {
			t.Errorf("%s cites DESIGN.md, which users do not have", rel)
		}
	}
}

// speedFigure matches a measured speed: a duration per operation, a rate,
// a ratio.
var speedFigure = regexp.MustCompile(`[0-9]\s?(µs|us/op|ns/op|req/s|×)`)

// TestNoSpeedFiguresOutsideBenchmarks: figures go stale; BENCHMARKS.md has
// them with the command that made them, the docs point there.
func TestNoSpeedFiguresOutsideBenchmarks(t *testing.T) {
	files := docFiles(t, func(rel string) bool {
		base := filepath.Base(rel)
		return rel == "README.md" || rel == "SECURITY.md" || base == "doc.go" || base == "options.go"
	})
	for _, rel := range files {
		for i, line := range strings.Split(readFile(t, rel), "\n") {
			if m := speedFigure.FindString(line); m != "" {
				t.Errorf("%s:%d quotes a speed figure (%q); put it in BENCHMARKS.md and point there", rel, i+1, m)
			}
		}
	}
}

// TestReadmeInstallsEveryModule: each module a user imports has its
// `go get` line (a command its `go install` line) in the README.
func TestReadmeInstallsEveryModule(t *testing.T) {
	readme := readFile(t, "README.md")
	mods := docFiles(t, func(rel string) bool { return filepath.Base(rel) == "go.mod" })
	if len(mods) == 0 {
		t.Fatal("no go.mod found")
	}
	for _, mod := range mods {
		dir := filepath.ToSlash(filepath.Dir(mod))
		path := "github.com/idemkit/idem"
		if dir != "." {
			path += "/" + dir
		}
		switch {
		case dir == "examples" || dir == "tests" || strings.HasPrefix(dir, "examples/") || strings.HasPrefix(dir, "tests/"):
			continue // not imported by users
		case strings.HasPrefix(dir, "internal/"):
			continue // the repository's own tools (internal/tools), not published
		case strings.HasPrefix(dir, "cmd/"):
			if !strings.Contains(readme, "go install "+path+"@") {
				t.Errorf("README has no `go install %s@...` line", path)
			}
		case !regexp.MustCompile(`go get ` + regexp.QuoteMeta(path) + `\s`).MatchString(readme):
			t.Errorf("README has no `go get %s` line", path)
		}
	}
}

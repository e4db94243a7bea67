package sqlkit

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

// MigrationFile is one versioned migration file, its SQL rendered for a
// configuration (LoadMigrations).
type MigrationFile struct {
	Version int    // from the file name
	Name    string // the file name, without its directory
	SQL     string // the rendered text
}

// LoadMigrations reads a store's embedded migrations (pgstore, mysqlstore
// and sqlitestore share the naming rule, the rendering and the order): it
// renders every .sql file in dirs of fsys as a text/template with data (a
// key the file names but data lacks is an error) and returns them in
// version order. A file is named "<version>_<words>.sql" with a positive
// version; two files with one version are an error. Other files are
// skipped.
func LoadMigrations(fsys fs.FS, data map[string]string, dirs ...string) ([]MigrationFile, error) {
	var out []MigrationFile
	for _, dir := range dirs {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".sql") {
				continue
			}
			prefix, _, ok := strings.Cut(name, "_")
			v, err := strconv.Atoi(prefix)
			if !ok || err != nil || v <= 0 {
				return nil, fmt.Errorf("migration file %s: name must start with a positive version and '_'", name)
			}
			src, err := fs.ReadFile(fsys, path.Join(dir, name))
			if err != nil {
				return nil, err
			}
			tmpl, err := template.New(name).Option("missingkey=error").Parse(string(src))
			if err != nil {
				return nil, fmt.Errorf("migration %s: %w", name, err)
			}
			var b bytes.Buffer
			if err := tmpl.Execute(&b, data); err != nil {
				return nil, fmt.Errorf("migration %s: %w", name, err)
			}
			out = append(out, MigrationFile{Version: v, Name: name, SQL: b.String()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

// statementSeparator separates the statements of a migration file (a
// line ";;" of its own).
const statementSeparator = "\n;;\n"

// Statements splits a migration's sql into statements, for a driver that
// sends one statement at a time: they are separated by a line ";;" of its
// own. Statements with nothing but blanks and whole-line "--" comments are
// dropped; the others are returned as written.
func Statements(sql string) []string {
	var out []string
	for _, st := range strings.Split(sql, statementSeparator) {
		if strings.TrimSpace(stripComments(st)) != "" {
			out = append(out, st)
		}
	}
	return out
}

// stripComments drops whole-line "--" comments.
func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

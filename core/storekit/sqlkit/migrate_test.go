package sqlkit

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadMigrations(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("CREATE INDEX {{.T}}_i")},
		"m/0001_a.sql": {Data: []byte("CREATE TABLE {{.T}}")},
		"m/readme.txt": {Data: []byte("not a migration")},
		"n/0003_c.sql": {Data: []byte("DROP {{.T}}")},
	}
	got, err := LoadMigrations(fsys, map[string]string{"T": "t"}, "n", "m")
	require.NoError(t, err)
	assert.Equal(t, []MigrationFile{{1, "0001_a.sql", "CREATE TABLE t"}, {2, "0002_b.sql", "CREATE INDEX t_i"}, {3, "0003_c.sql", "DROP t"}}, got)
	for name, fsys := range map[string]fstest.MapFS{
		"bad name":     {"m/a_x.sql": {Data: []byte("x")}},
		"zero version": {"m/0_x.sql": {Data: []byte("x")}},
		"same version": {"m/1_x.sql": {Data: []byte("x")}, "m/0001_y.sql": {Data: []byte("y")}},
		"missing key":  {"m/1_x.sql": {Data: []byte("{{.Nope}}")}},
	} {
		_, err := LoadMigrations(fsys, map[string]string{}, "m")
		assert.Error(t, err, "%s: LoadMigrations accepted it", name)
	}
}

func TestStatements(t *testing.T) {
	sql := strings.Join([]string{"CREATE TABLE a (x int)", "-- only a comment\n  ", "\n-- why\nCREATE INDEX i ON a (x)", "  "}, "\n;;\n")
	want := []string{"CREATE TABLE a (x int)", "\n-- why\nCREATE INDEX i ON a (x)"}
	assert.Equal(t, want, Statements(sql))
}

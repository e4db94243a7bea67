package sqlmigrate

import (
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoad(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_b.sql": {Data: []byte("CREATE INDEX {{.T}}_i")},
		"m/0001_a.sql": {Data: []byte("CREATE TABLE {{.T}}")},
		"m/readme.txt": {Data: []byte("not a migration")},
		"n/0003_c.sql": {Data: []byte("DROP {{.T}}")},
	}
	got, err := Load(fsys, map[string]string{"T": "t"}, "n", "m")
	if err != nil {
		t.Fatal(err)
	}
	want := []File{{1, "0001_a.sql", "CREATE TABLE t"}, {2, "0002_b.sql", "CREATE INDEX t_i"}, {3, "0003_c.sql", "DROP t"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load = %+v, want %+v", got, want)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"bad name":     {"m/a_x.sql": {Data: []byte("x")}},
		"zero version": {"m/0_x.sql": {Data: []byte("x")}},
		"same version": {"m/1_x.sql": {Data: []byte("x")}, "m/0001_y.sql": {Data: []byte("y")}},
		"missing key":  {"m/1_x.sql": {Data: []byte("{{.Nope}}")}},
	} {
		if _, err := Load(fsys, map[string]string{}, "m"); err == nil {
			t.Errorf("%s: Load accepted it", name)
		}
	}
}

func TestStatements(t *testing.T) {
	sql := strings.Join([]string{"CREATE TABLE a (x int)", "-- only a comment\n  ", "\n-- why\nCREATE INDEX i ON a (x)", "  "}, Separator)
	want := []string{"CREATE TABLE a (x int)", "\n-- why\nCREATE INDEX i ON a (x)"}
	if got := Statements(sql); !reflect.DeepEqual(got, want) {
		t.Errorf("Statements = %q, want %q", got, want)
	}
}

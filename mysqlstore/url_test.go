package mysqlstore

import (
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"mysql://root@127.0.0.1/test", "root@tcp(127.0.0.1:3306)/test"},
		{"mysql://u:p%40ss@db:3307/app?parseTime=true", "u:p@ss@tcp(db:3307)/app?parseTime=true"},
		{"mysql://u@[::1]:3306/x", "u@tcp([::1]:3306)/x"},
	} {
		cfg, err := ParseURL(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if got := cfg.FormatDSN(); got != c.want {
			t.Errorf("%s: %s, want %s", c.in, got, c.want)
		}
	}
	for _, bad := range []string{"postgres://u@h/db", "mysql://u:secretpw@h/", "mysql:///db", "mysql://u:secretpw@h/a/b", "mysql://u:secretpw@h/db?timeout=xyz", "::"} {
		_, err := ParseURL(bad)
		if err == nil {
			t.Errorf("%s accepted", bad)
		} else if strings.Contains(err.Error(), "secretpw") {
			t.Errorf("%s: error repeats the password: %v", bad, err)
		}
	}
}

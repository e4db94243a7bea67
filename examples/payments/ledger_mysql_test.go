package main

import (
	"strings"
	"testing"
)

func TestMySQLConfig(t *testing.T) {
	for _, tc := range []struct {
		dsn, want string
	}{
		{"mysql://root@127.0.0.1/test", "root@tcp(127.0.0.1:3306)/test"},
		{"mysql://app:s3cr%40t@db.example:3307/pay", "app:s3cr@t@tcp(db.example:3307)/pay"},
		{"mysql://app@[::1]:3306/pay?timeout=5s", "app@tcp([::1]:3306)/pay?timeout=5s"},
	} {
		cfg, err := mysqlConfig(tc.dsn)
		if err != nil {
			t.Errorf("mysqlConfig(%q): %v", tc.dsn, err)
			continue
		}
		if got := cfg.FormatDSN(); got != tc.want {
			t.Errorf("mysqlConfig(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
	for _, dsn := range []string{
		"mysql://app:hunter2@db.example:3306",     // no database
		"mysql://app:hunter2@/pay",                // no host
		"mysql://app:hunter2@db.example/pay/more", // not a database name
		"mysql://app:hunter2@db.example/pay?timeout=never",
	} {
		_, err := mysqlConfig(dsn)
		if err == nil {
			t.Errorf("mysqlConfig(%q) accepted", dsn)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("mysqlConfig(%q): error %q repeats the password", dsn, err)
		}
	}
	if !isMySQLDSN("mysql://x@h/db") || isMySQLDSN("postgres://x@h/db") || isMySQLDSN("host=h dbname=db") {
		t.Error("isMySQLDSN misclassifies")
	}
}

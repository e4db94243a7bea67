package main

import (
	"strings"
	"testing"
)

func TestMySQLConfig(t *testing.T) {
	for _, tc := range []struct {
		dsn, want string
		pool      int
	}{
		{"mysql://root@127.0.0.1/test", "root@tcp(127.0.0.1:3306)/test", defaultMySQLPool},
		{"mysql://app:s3cr%40t@db.example:3307/pay", "app:s3cr@t@tcp(db.example:3307)/pay", defaultMySQLPool},
		{"mysql://app@[::1]:3306/pay?timeout=5s", "app@tcp([::1]:3306)/pay?timeout=5s", defaultMySQLPool},
		{"mysql://app@h/pay?pool_max_conns=8&timeout=5s", "app@tcp(h:3306)/pay?timeout=5s", 8},
	} {
		cfg, pool, err := mysqlConfig(tc.dsn)
		if err != nil {
			t.Errorf("mysqlConfig(%q): %v", tc.dsn, err)
			continue
		}
		if got := cfg.FormatDSN(); got != tc.want || pool != tc.pool {
			t.Errorf("mysqlConfig(%q) = %q, pool %d; want %q, pool %d", tc.dsn, got, pool, tc.want, tc.pool)
		}
	}
	for _, dsn := range []string{
		"mysql://app:hunter2@db.example:3306",     // no database
		"mysql://app:hunter2@/pay",                // no host
		"mysql://app:hunter2@db.example/pay/more", // not a database name
		"mysql://app:hunter2@db.example/pay?timeout=never",
		"mysql://app:hunter2@db.example/pay?pool_max_conns=0",
	} {
		_, _, err := mysqlConfig(dsn)
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

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/pgstore/pgstoretest"
	"github.com/idemkit/idem/sqlitestore"
)

// TestArticleServer runs the article's design (serveChild "article") on
// a fresh schema of each database and checks that it behaves as the
// article says, so that the comparison is with the design as published: a
// first request is booked (201), a retry replays it (201,
// Idempotent-Replayed), a retry with another body is refused (422), and
// concurrent duplicates of one key book it once (the others replay or get
// 409).
func TestArticleServer(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		pool := pgstoretest.Pool(t)
		schema := pgstoretest.Schema(t, pool)
		dsn, err := withParams(pgstoretest.DSN(), schema, 4)
		require.NoError(t, err)
		testArticleServer(t, dsn, func(ctx context.Context) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".payments`).Scan(&n)
			return n, err
		})
	})
	t.Run("mysql", func(t *testing.T) {
		c := mysqlstoretest.Config(t, "")
		base := "mysql://" + url.UserPassword(c.User, c.Passwd).String() + "@" + c.Addr + "/" + c.DBName
		name, drop, err := newMySQLDatabase(t.Context(), base)
		require.NoError(t, err)
		t.Cleanup(drop)
		dsn, err := withParams(base, name, 4)
		require.NoError(t, err)
		testArticleServer(t, dsn, func(ctx context.Context) (n int, err error) {
			db, _, err := openMySQL(dsn)
			if err != nil {
				return 0, err
			}
			defer db.Close()
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n)
			return n, err
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		path, drop, err := newSchema(t.Context(), sqliteScheme+t.TempDir())
		require.NoError(t, err)
		t.Cleanup(drop)
		dsn, err := withParams(sqliteScheme, path, 4)
		require.NoError(t, err)
		testArticleServer(t, dsn, func(ctx context.Context) (n int, err error) {
			db, err := sqlitestore.OpenDB(ctx, path)
			if err != nil {
				return 0, err
			}
			defer db.Close()
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n)
			return n, err
		})
	})
}

func testArticleServer(t *testing.T, dsn string, ledgerRows func(ctx context.Context) (int, error)) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- serveChild(ctx, "article", "127.0.0.1:0", dsn, 0, "", "none", pw) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("article server: %v", err)
		}
		_ = pw.Close()
	})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
				addrc <- line.Addr
			}
		}
	}()
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("article server did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("article server did not start within 30s")
	}
	post := func(key, body string) (int, bool) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payments", strings.NewReader(body))
		req.Header.Set("X-User-ID", "u1")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("post: %v", err)
			return 0, false
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true"
	}
	if code, replayed := post("k1", payBody); code != http.StatusCreated || replayed {
		t.Fatalf("first request: %d replayed=%v, want a fresh 201", code, replayed)
	}
	if code, replayed := post("k1", payBody); code != http.StatusCreated || !replayed {
		t.Fatalf("retry: %d replayed=%v, want a replayed 201", code, replayed)
	}
	if code, _ := post("k1", `{"amount":50000,"currency":"JPY","to":"alice"}`); code != http.StatusUnprocessableEntity {
		t.Fatalf("retry with another body: %d, want 422", code)
	}

	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		fresh, dup, busy int
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, replayed := post("k2", payBody)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case code == http.StatusCreated && !replayed:
				fresh++
			case code == http.StatusCreated:
				dup++
			case code == http.StatusConflict:
				busy++
			default:
				t.Errorf("concurrent duplicate: %d", code)
			}
		}()
	}
	wg.Wait()
	if fresh != 1 {
		t.Errorf("concurrent duplicates: %d fresh 201s (%d replayed, %d 409), want exactly 1", fresh, dup, busy)
	}
	rows, err := ledgerRows(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, rows, "ledger rows")
}

package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storekit/sqlkit"
	"github.com/idemkit/idem/core/storetest"
)

var benchRun atomic.Int64

// BenchmarkClaimComplete measures claim+complete pairs (a fresh key each
// time: the cost of a first request) at 1 and 4 concurrent workers on one
// file opened with OpenDB (synchronous=FULL), next to:
//
//   - raw: the store's own statements (the read, the write transaction's
//     token draw, clock read, re-read and upsert, the fenced complete) sent
//     by a plain database/sql loop on prepared statements: what the store
//     adds on top (validation, scanning, header encoding);
//   - simple: the simplest statements that could do the job, a plain
//     autocommit INSERT (token from the same counter, in the statement)
//     and a fenced UPDATE: what the read-first claim transaction costs
//     over them.
//
// Each variant commits twice per pair (claim and complete), each commit an
// fsync: the numbers are bounded by the disk. raw and simple queue their
// writes on the store's writer slot as the store does (writer.go): without
// it, variants meeting in SQLite's busy handler would measure its sleeps.
func BenchmarkClaimComplete(b *testing.B) {
	for _, workers := range []int{1, 4} {
		db, _ := newDB(b)
		s := openStore(b, db)
		resp := storekit.StoredResponse{
			Status: 201,
			Header: map[string][]string{"Content-Type": {"application/json"}},
			Body:   []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`),
		}
		lease, retention := micros(30*time.Second), micros(24*time.Hour)
		prep := func(q string) *sql.Stmt {
			st, err := db.Prepare(q)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = st.Close() })
			return st
		}
		getSt, drawSt, nowSt, upsertSt, completeSt := prep(s.sql.get), prep(s.sql.drawToken), prep(s.sql.now), prep(s.sql.upsert), prep(s.sql.complete)
		if _, err := db.Exec(`CREATE TABLE simple_records (scope BLOB NOT NULL, key BLOB NOT NULL, token INTEGER NOT NULL,
  status TEXT NOT NULL, locked_until INTEGER NOT NULL, expires_at INTEGER NOT NULL,
  resp_status INTEGER, resp_header BLOB, resp_body BLOB, PRIMARY KEY (scope, key)) WITHOUT ROWID`); err != nil {
			b.Fatal(err)
		}
		now := s.cfg.clock()
		insSt := prep("INSERT INTO simple_records (scope, key, token, status, locked_until, expires_at)" +
			" VALUES (?, ?, (SELECT last + 1 FROM " + s.names.tokens + "), 'processing', " + now + " + ?, " + now + " + ?) RETURNING token")
		updSt := prep("UPDATE simple_records SET status = 'completed', resp_status = ?, resp_header = ?, resp_body = ?" +
			" WHERE scope = ? AND key = ? AND token = ? AND status = 'processing'")
		header := sqlkit.AppendHeader(nil, resp.Header)

		store := func(ctx context.Context, key string) error {
			req := claimReq(key, 30*time.Second)
			req.Retention = 24 * time.Hour
			res, err := s.Claim(ctx, req)
			if err != nil {
				return err
			}
			if !res.Claimed {
				return errors.New("not claimed")
			}
			return s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}, resp)
		}
		raw := func(ctx context.Context, key string) error {
			scope, k := []byte("tenant"), []byte(key)
			var n int64
			if err := getSt.QueryRowContext(ctx, scope, k).Scan(new(any)); !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("read: %v", err)
			}
			if err := s.wr.lock(ctx); err != nil { // queued in Go like the store's writes
				return err
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				s.wr.unlock()
				return err
			}
			defer func() { _ = tx.Rollback() }()
			var tok, at int64
			if err := tx.StmtContext(ctx, drawSt).QueryRowContext(ctx).Scan(&tok); err != nil {
				return err
			}
			if err := tx.StmtContext(ctx, nowSt).QueryRowContext(ctx).Scan(&at); err != nil {
				return err
			}
			if err := tx.StmtContext(ctx, getSt).QueryRowContext(ctx, scope, k).Scan(new(any)); !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("re-read: %v", err)
			}
			if _, err := tx.StmtContext(ctx, upsertSt).ExecContext(ctx, scope, k, []byte("POST"), []byte("/v1/payments"), []byte("f1"),
				tok, at+lease, at, at+retention); err != nil {
				return err
			}
			err = tx.Commit()
			s.wr.unlock()
			if err != nil {
				return err
			}
			if err := s.wr.lock(ctx); err != nil {
				return err
			}
			res, err := completeSt.ExecContext(ctx, int32(201), header, resp.Body, false, scope, k, tok)
			s.wr.unlock()
			if err != nil {
				return err
			}
			if n, _ = res.RowsAffected(); n != 1 {
				return fmt.Errorf("complete matched %d rows", n)
			}
			return nil
		}
		simple := func(ctx context.Context, key string) error {
			scope, k := []byte("tenant"), []byte(key)
			var tok int64
			if err := s.wr.lock(ctx); err != nil {
				return err
			}
			err := insSt.QueryRowContext(ctx, scope, k, lease, retention).Scan(&tok)
			s.wr.unlock()
			if err != nil {
				return err
			}
			if err := s.wr.lock(ctx); err != nil {
				return err
			}
			res, err := updSt.ExecContext(ctx, int32(201), header, resp.Body, scope, k, tok)
			s.wr.unlock()
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return fmt.Errorf("update matched %d rows", n)
			}
			return nil
		}
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			runAlternating(b, workers, []string{"store", "raw", "simple"}, store, raw, simple)
		})
	}
}

// runAlternating runs b.N pairs spread over workers goroutines, each with a
// unique key; pair i is run by variant i mod len(variants), so every variant
// sees the same machine (noise, file size) within one run. It reports each
// variant's mean latency per pair (µs) and the ratios of the first
// variant's to each other's. (mysqlstore's benchmark does the same.)
func runAlternating(b *testing.B, workers int, names []string, variants ...func(ctx context.Context, key string) error) {
	prefix := "b" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
	ctx := context.Background()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		total = make([]atomic.Int64, len(variants))
		count = make([]atomic.Int64, len(variants))
	)
	for i := range workers * len(variants) * 2 { // warm-up: connections opened, statements prepared
		if err := variants[i%len(variants)](ctx, prefix+"warm-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				v := int(i) % len(variants)
				t0 := time.Now()
				if err := variants[v](ctx, prefix+strconv.FormatInt(i, 10)); err != nil {
					b.Error(err) // not Fatal: not the benchmark goroutine
					return
				}
				total[v].Add(int64(time.Since(t0)))
				count[v].Add(1)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	mean := make([]float64, len(variants))
	for v := range variants {
		if n := count[v].Load(); n > 0 {
			mean[v] = float64(total[v].Load()) / float64(n) / 1e3
		}
		b.ReportMetric(mean[v], names[v]+"-µs/pair")
	}
	for v := 1; v < len(variants); v++ {
		if mean[v] > 0 {
			b.ReportMetric(mean[0]/mean[v], names[0]+"/"+names[v])
		}
	}
}

// BenchmarkConformance runs the store-neutral benchmark of core/storetest
// (claim+complete and replay, serial and parallel).
func BenchmarkConformance(b *testing.B) {
	storetest.Benchmark(b, func(tb testing.TB) core.Store { return newStore(tb) })
}

package mysqlstore

import (
	"context"
	"database/sql"
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
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

var benchRun atomic.Int64

// BenchmarkClaimComplete measures claim+complete pairs per second (a fresh
// key each time: the cost of a first request) at 1 and 16 concurrent
// workers, each on its own pool connection, next to:
//
//   - raw: the store's own two statements (the CALL and the fenced UPDATE)
//     sent by a plain database/sql loop on prepared statements: what the
//     store adds on top (validation, scanning, header encoding, retries);
//   - simple: the simplest statements that could do the job, a plain
//     INSERT (token from the same AUTO_INCREMENT table) and a fenced
//     UPDATE: what the claim procedure costs over them;
//   - read-first: the store WithReadFirst (a SELECT before the CALL).
//
// Each pair commits twice (three times for store and raw: the token draw
// is its own autocommit); with innodb_flush_log_at_trx_commit=1 the numbers
// are bounded by log flush latency at low concurrency.
func BenchmarkClaimComplete(b *testing.B) {
	for _, workers := range []int{1, 16} {
		db := mysqlstoretest.NewDB(b, "")
		db.SetMaxOpenConns(workers)
		db.SetMaxIdleConns(workers)
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
		claimSt, completeSt := prep(s.sql.claim), prep(s.sql.complete)
		if _, err := db.Exec(`CREATE TABLE simple_records (
  scope VARBINARY(1024) NOT NULL, ` + "`key`" + ` VARBINARY(1024) NOT NULL, token BIGINT NOT NULL,
  status VARCHAR(10) NOT NULL, locked_until DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL,
  resp_status SMALLINT, resp_header MEDIUMBLOB, resp_body LONGBLOB,
  PRIMARY KEY (scope, ` + "`key`" + `)) ENGINE = InnoDB`); err != nil {
			b.Fatal(err)
		}
		drawSt := prep("INSERT INTO " + s.names.tokens + " () VALUES ()")
		insSt := prep("INSERT INTO simple_records (scope, `key`, token, status, locked_until, expires_at)" +
			" VALUES (?, ?, ?, 'processing', UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)")
		updSt := prep("UPDATE simple_records SET status = 'completed', resp_status = ?, resp_header = ?, resp_body = ?" +
			" WHERE scope = ? AND `key` = ? AND token = ? AND status = 'processing'")
		header := sqlkit.AppendHeader(nil, resp.Header)

		store := func(ctx context.Context, key string) error {
			req := claimReq(key, 30*time.Second)
			req.Retention = 24 * time.Hour
			res, err := s.Claim(ctx, req)
			if err != nil {
				return err
			}
			if !res.Claimed {
				return fmt.Errorf("not claimed")
			}
			return s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}, resp)
		}
		raw := func(ctx context.Context, key string) error {
			rows, err := claimSt.QueryContext(ctx, "tenant", key, "POST", "/v1/payments", "f1", lease, retention, 0)
			if err != nil {
				return err
			}
			var (
				m, r, f, st          []byte
				tok, lu, ca, ea, now int64
				rs                   sql.NullInt32
				rh, rb               []byte
				nr, claimed          bool
			)
			for rows.Next() {
				if err := rows.Scan(&m, &r, &f, &st, &tok, &lu, &ca, &ea, &rs, &rh, &rb, &nr, &claimed, &now); err != nil {
					_ = rows.Close()
					return err
				}
			}
			if err := rows.Close(); err != nil {
				return err
			}
			if !claimed {
				return fmt.Errorf("not claimed")
			}
			res, err := completeSt.ExecContext(ctx, int32(201), header, resp.Body, false, "tenant", key, tok)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return fmt.Errorf("complete matched %d rows", n)
			}
			return nil
		}
		simple := func(ctx context.Context, key string) error {
			d, err := drawSt.ExecContext(ctx)
			if err != nil {
				return err
			}
			tok, err := d.LastInsertId()
			if err != nil {
				return err
			}
			if _, err := insSt.ExecContext(ctx, "tenant", key, tok, lease, retention); err != nil {
				return err
			}
			res, err := updSt.ExecContext(ctx, int32(201), header, resp.Body, "tenant", key, tok)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return fmt.Errorf("update matched %d rows", n)
			}
			return nil
		}
		sf := openStore(b, db, WithReadFirst())
		readFirst := func(ctx context.Context, key string) error {
			req := claimReq(key, 30*time.Second)
			req.Retention = 24 * time.Hour
			res, err := sf.Claim(ctx, req)
			if err != nil {
				return err
			}
			if !res.Claimed {
				return fmt.Errorf("not claimed")
			}
			return sf.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}, resp)
		}
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			runAlternating(b, workers, []string{"store", "raw", "simple", "read-first"}, store, raw, simple, readFirst)
		})
	}
}

// runAlternating runs b.N pairs spread over workers goroutines, each with a
// unique key; pair i is run by variant i mod len(variants), so every variant
// sees the same machine (noise, server state, table size) within one run.
// It reports each variant's mean latency per pair (µs) and the ratios of
// the first variant's to each other's.
func runAlternating(b *testing.B, workers int, names []string, variants ...func(ctx context.Context, key string) error) {
	prefix := "b" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
	ctx := context.Background()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		total = make([]atomic.Int64, len(variants))
		count = make([]atomic.Int64, len(variants))
	)
	// Warm-up, untimed: every connection opened and every statement prepared.
	for i := range workers * len(variants) * 2 {
		v := i % len(variants)
		if err := variants[v](ctx, prefix+"warm-"+strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
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
	storetest.Benchmark(b, func(tb testing.TB) core.Store {
		db := mysqlstoretest.NewDB(tb, "")
		db.SetMaxIdleConns(mysqlstoretest.DefaultMaxConns)
		return openStore(tb, db)
	})
}

// BenchmarkWaitWake measures how soon a waiting duplicate replays after the
// owner commits. The store has no storekit.Watcher (no LISTEN/NOTIFY in MySQL):
// the waiter polls, at the default interval (20ms, doubling to 200ms) and
// at 5ms; see storetest.BenchmarkWaitWake for what is measured and
// reported. Run with a fixed count, e.g. -benchtime 50x.
func BenchmarkWaitWake(b *testing.B) {
	db := mysqlstoretest.NewDB(b, "")
	db.SetMaxIdleConns(mysqlstoretest.DefaultMaxConns)
	s := openStore(b, db)
	b.Run("poll-20ms", func(b *testing.B) { storetest.BenchmarkWaitWake(b, s, false) })
	b.Run("poll-5ms", func(b *testing.B) {
		storetest.BenchmarkWaitWake(b, s, false, core.WithWaitPoll(5*time.Millisecond))
	})
}

// BenchmarkReplay measures a replay (a completed key claimed again) by the
// default claim (one CALL) against WithReadFirst (one plain SELECT), the
// two stores alternating on one table, at 1 and 8 workers.
func BenchmarkReplay(b *testing.B) {
	for _, workers := range []int{1, 8} {
		db := mysqlstoretest.NewDB(b, "")
		db.SetMaxOpenConns(workers)
		db.SetMaxIdleConns(workers)
		call, first := openStore(b, db), openStore(b, db, WithReadFirst())
		ctx := context.Background()
		req := claimReq("r", time.Minute)
		res, err := call.Claim(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := call.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token},
			storekit.StoredResponse{Status: 201, Body: []byte(`{"id":"pay_1"}`)}); err != nil {
			b.Fatal(err)
		}
		replay := func(s *Store) func(ctx context.Context, _ string) error {
			return func(ctx context.Context, _ string) error {
				r, err := s.Claim(ctx, req)
				if err == nil && r.Record.Status != storekit.StatusCompleted {
					err = fmt.Errorf("not a replay: %s", r.Record.Status)
				}
				return err
			}
		}
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			runAlternating(b, workers, []string{"call", "read-first"}, replay(call), replay(first))
		})
	}
}

// BenchmarkTxClaimComplete measures a transactional first execution
// (claim, Tx, one ledger INSERT in the transaction, Complete committing
// both) against the same pair without Tx (the ledger row written in its
// own autocommit statement), alternating on one database, at 1 and 16
// workers. The ratio tx/plain is what the lease transaction costs.
func BenchmarkTxClaimComplete(b *testing.B) {
	for _, workers := range []int{1, 16} {
		db := mysqlstoretest.NewDB(b, "")
		db.SetMaxOpenConns(workers)
		db.SetMaxIdleConns(workers)
		s := openStore(b, db)
		if _, err := db.Exec("CREATE TABLE ledger (k VARBINARY(255) PRIMARY KEY, owner BIGINT NOT NULL)"); err != nil {
			b.Fatal(err)
		}
		resp := storekit.StoredResponse{Status: 201, Body: []byte(`{"id":"pay_123","amount":1000}`)}
		run := func(inTx bool) func(ctx context.Context, key string) error {
			return func(ctx context.Context, key string) error {
				req := claimReq(key, 30*time.Second)
				res, err := s.Claim(ctx, req)
				if err != nil {
					return err
				}
				if !res.Claimed {
					return fmt.Errorf("not claimed")
				}
				f := storekit.Fence{Scope: req.Scope, Key: key, Token: res.Record.Token}
				if !inTx {
					if _, err := db.ExecContext(ctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", key, f.Token); err != nil {
						return err
					}
					return s.Complete(ctx, f, resp)
				}
				hctx := storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
				tx, err := Tx(hctx)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(hctx, "INSERT INTO ledger (k, owner) VALUES (?, ?)", key, f.Token); err != nil {
					return err
				}
				return s.Complete(hctx, f, resp)
			}
		}
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			runAlternating(b, workers, []string{"tx", "plain"}, run(true), run(false))
		})
	}
}

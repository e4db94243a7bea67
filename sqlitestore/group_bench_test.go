package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// BenchmarkFirstExecution measures examples/payments' first execution on
// SQLite (a fresh key: the claim, the provider charge as a core.Step, the
// ledger row by Defer committed with the stored response, through
// Engine.Call) with group commit (the default, writer.go) against the same
// without it (withoutGroupCommit), and against two servers without idem on
// the same statements' path:
//
//   - article: the background article's design, its three autocommit
//     statements (INSERT OR IGNORE of a PROCESSING row, the ledger
//     INSERT, the final UPDATE);
//   - bare: the ledger INSERT alone.
//
// Each variant has a file of its own (opened with OpenDB: WAL,
// synchronous=FULL, an fsync per commit). article and bare queue their
// writes in Go as the store does, so that no variant measures SQLite's
// busy-handler sleeps. The variants alternate in rounds (order rotated);
// each ratio reported is the median over rounds of the throughput of
// "grouped" over the other's in the same round. Use a fixed count, e.g.
// -benchtime 4000x.
func BenchmarkFirstExecution(b *testing.B) {
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			ctx := context.Background()
			variants := []struct {
				name string
				run  func(ctx context.Context, key string) error
			}{
				{"grouped", benchCall(b)},
				{"ungrouped", benchCall(b, withoutGroupCommit())},
				{"article", benchArticle(b, true)},
				{"bare", benchArticle(b, false)},
			}
			prefix := "k" + strconv.FormatInt(benchRun.Add(1), 10) + "-"
			var seq atomic.Int64
			for _, v := range variants { // warm-up: connections, statements
				for range 2 * workers {
					if err := v.run(ctx, prefix+strconv.FormatInt(seq.Add(1), 10)); err != nil {
						b.Fatal(err)
					}
				}
			}
			round := max(8*workers, 50)
			took := make([]time.Duration, len(variants))
			total := make([]time.Duration, len(variants))
			done := make([]int, len(variants))
			ratios := make([][]float64, len(variants))
			b.ResetTimer()
			for r := 0; done[0] < b.N; r++ {
				n := min(round, b.N-done[0])
				for j := range variants {
					i := (j + r) % len(variants)
					var (
						next atomic.Int64
						wg   sync.WaitGroup
					)
					t0 := time.Now()
					for range workers {
						wg.Go(func() {
							for next.Add(1) <= int64(n) {
								if err := variants[i].run(ctx, prefix+strconv.FormatInt(seq.Add(1), 10)); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
					took[i] = time.Since(t0)
					total[i] += took[i]
					done[i] += n
				}
				for i := 1; i < len(variants); i++ {
					ratios[i] = append(ratios[i], took[i].Seconds()/took[0].Seconds())
				}
			}
			b.StopTimer()
			for i, v := range variants {
				b.ReportMetric(float64(done[i])/total[i].Seconds(), v.name+"-exec/s")
				if i > 0 {
					slices.Sort(ratios[i])
					b.ReportMetric(ratios[i][len(ratios[i])/2], "grouped/"+v.name)
				}
			}
		})
	}
}

const benchLedgerDDL = `CREATE TABLE payments (id TEXT PRIMARY KEY, user_id TEXT NOT NULL, amount INTEGER NOT NULL,
  currency TEXT NOT NULL, recipient TEXT NOT NULL, provider_charge_id TEXT NOT NULL)`

const benchLedgerInsert = `INSERT INTO payments (id, user_id, amount, currency, recipient, provider_charge_id) VALUES (?, ?, ?, ?, ?, ?)`

// benchCall is examples/payments' first execution through Engine.Call on a
// store of its own file.
func benchCall(b *testing.B, opts ...Option) func(ctx context.Context, key string) error {
	db, _ := newDB(b)
	s := openStore(b, db, opts...)
	if _, err := db.Exec(benchLedgerDDL); err != nil {
		b.Fatal(err)
	}
	eng, err := core.New(s, core.WithStepsRequired(true))
	if err != nil {
		b.Fatal(err)
	}
	input := []byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)
	out := []byte(`{"id":"pay_123","amount":1000,"currency":"JPY","to":"alice","provider_charge_id":"ch_1"}`)
	return func(ctx context.Context, key string) error {
		res, err := eng.Call(ctx, core.CallRequest{Scope: "alice", Key: key, Name: "payments", Input: input},
			func(ctx context.Context) ([]byte, error) {
				charge, err := core.Step(ctx, "provider-charge", func(context.Context) ([]byte, error) {
					return []byte(`{"id":"ch_0123456789abcdef"}`), nil
				})
				if err != nil {
					return nil, err
				}
				if err := Defer(ctx, benchLedgerInsert, "pay_"+key, "alice", 1000, "JPY", "bob", string(charge)); err != nil {
					return nil, err
				}
				return out, nil
			})
		if err == nil && res.Replayed {
			err = errors.New("a fresh key was replayed")
		}
		return err
	}
}

// benchArticle is the article's design (article) or the ledger INSERT
// alone (bare) on a file of its own, each write queued in Go.
func benchArticle(b *testing.B, article bool) func(ctx context.Context, key string) error {
	db, _ := newDB(b)
	for _, q := range []string{benchLedgerDDL, `CREATE TABLE idempotency_keys (idempotency_key TEXT NOT NULL, user_id TEXT NOT NULL,
  request_path TEXT NOT NULL, request_hash TEXT NOT NULL, status TEXT NOT NULL, response_code INTEGER, response_body TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, locked_until INTEGER NOT NULL, PRIMARY KEY (user_id, idempotency_key))`} {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	var mu sync.Mutex
	exec := func(ctx context.Context, q string, args ...any) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		res, err := db.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	return func(ctx context.Context, key string) error {
		now := time.Now().UnixMicro()
		if article {
			n, err := exec(ctx, `INSERT OR IGNORE INTO idempotency_keys (idempotency_key, user_id, request_path, request_hash, status,
  created_at, updated_at, locked_until) VALUES (?, 'alice', '/v1/payments', 'h', 'PROCESSING', ?, ?, ?)`, key, now, now, now+30e6)
			if err != nil {
				return err
			}
			if n != 1 {
				return errors.New("a fresh key exists")
			}
		}
		if _, err := exec(ctx, benchLedgerInsert, "pay_"+key, "alice", 1000, "JPY", "bob", "ch_0123456789abcdef"); err != nil {
			return err
		}
		if article {
			_, err := exec(ctx, `UPDATE idempotency_keys SET status = 'SUCCEEDED', response_code = 201, response_body = ?, updated_at = ?
WHERE user_id = 'alice' AND idempotency_key = ?`, `{"id":"pay_123"}`, time.Now().UnixMicro(), key)
			return err
		}
		return nil
	}
}

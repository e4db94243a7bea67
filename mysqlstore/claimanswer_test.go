package mysqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// hookClaimProc re-creates the claim procedure the store calls with a hook
// right after its COMMIT: the first call to pass the hook (one row in
// idem_test_hook, deleted by that call) takes the user lock reached and
// then waits for the user lock hold, which the test holds. Between the
// two, the claim's write is committed and its answer not yet sent, and
// the test can change the record. Returns the two lock names.
func hookClaimProc(t *testing.T, s *Store) (reached, hold string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var dbName string
	if err := s.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	reached, hold = "idem_reached_"+dbName, "idem_hold_"+dbName
	migs, err := loadMigrations(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	var create string
	for _, m := range migs {
		for _, st := range m.stmts {
			if strings.Contains(st, "CREATE PROCEDURE "+s.names.claimProc+"(") {
				create = st
			}
		}
	}
	if strings.Count(create, "COMMIT;") != 1 {
		t.Fatalf("claim procedure %s: want exactly one COMMIT to hook, source:\n%s", s.names.claimProc, create)
	}
	create = strings.Replace(create, "COMMIT;", `COMMIT;
    DELETE FROM idem_test_hook;
    IF ROW_COUNT() > 0 THEN
      DO GET_LOCK('`+reached+`', 60);
      DO GET_LOCK('`+hold+`', 60);
      DO RELEASE_LOCK('`+hold+`');
    END IF;`, 1)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Discard the connection: it has the migration's sql_mode.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
	}()
	for _, q := range []string{
		"CREATE TABLE idem_test_hook (id INT PRIMARY KEY)",
		"INSERT INTO idem_test_hook VALUES (1)",
		"SET SESSION sql_mode = '" + migrationMode + "'",
		"DROP PROCEDURE " + s.names.claimProc,
		create,
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return reached, hold
}

// TestClaimAnswerReadInTx: the claim's answer is the record as its own
// transaction wrote it, whatever happens to the record after its COMMIT.
// The claim is held right after its COMMIT (hookClaimProc) while an
// operator releases the lease it took (Release, live) and, in the second
// case, another request takes the released key over. Read after the
// COMMIT (the procedure of migration 0003), the answer was "claimed" with
// a record already failed, or "not claimed" after the claim had taken the
// key under a token it never reported.
func TestClaimAnswerReadInTx(t *testing.T) {
	for _, takeover := range []bool{false, true} {
		name := "release"
		if takeover {
			name = "release-then-takeover"
		}
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			// The claim under test takes over a failed record: the
			// claim procedure's work (a new key gets the cheap claim).
			req := claimReq("k", time.Hour)
			first, err := s.Claim(ctx, req)
			if err != nil || !first.Claimed {
				t.Fatalf("first claim: %+v, %v", first, err)
			}
			if err := s.Fail(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: first.Record.Token}); err != nil {
				t.Fatal(err)
			}
			reached, hold := hookClaimProc(t, s)
			lock, err := s.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Close()
			var got sql.NullInt64
			if err := lock.QueryRowContext(ctx, "SELECT GET_LOCK(?, 10)", hold).Scan(&got); err != nil || got.Int64 != 1 {
				t.Fatalf("take lock %s: %v %v", hold, got, err)
			}
			held := true
			defer func() {
				if held {
					_, _ = lock.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", hold)
				}
			}()

			type answer struct {
				res storekit.ClaimResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := s.Claim(ctx, req)
				done <- answer{res, err}
			}()
			// Wait until the claim is past its COMMIT, at the hook.
			for {
				var owner sql.NullInt64
				if err := s.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", reached).Scan(&owner); err != nil {
					t.Fatal(err)
				}
				if owner.Valid {
					break
				}
				select {
				case a := <-done:
					t.Fatalf("the claim returned before reaching the hook: %+v, %v", a.res, a.err)
				case <-time.After(5 * time.Millisecond):
				}
			}
			rec, err := s.Inspect(ctx, req.Scope, req.Key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != storekit.StatusProcessing {
				t.Fatalf("record at the hook: %s, want processing", rec.Status)
			}
			mine := rec.Token
			if err := s.Release(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: mine}, true); err != nil {
				t.Fatalf("release: %v", err)
			}
			if takeover {
				res, err := s.Claim(ctx, req)
				if err != nil || !res.Claimed || res.Record.Token <= mine {
					t.Fatalf("takeover of the released key: %+v, %v", res, err)
				}
			}
			if _, err := lock.ExecContext(ctx, "DO RELEASE_LOCK(?)", hold); err != nil {
				t.Fatal(err)
			}
			held = false
			a := <-done
			if a.err != nil {
				t.Fatalf("claim: %v", a.err)
			}
			if !a.res.Claimed || a.res.Record.Token != mine || a.res.Record.Status != storekit.StatusProcessing {
				t.Errorf("claim answered claimed=%v token=%d status=%s; it took the key under token %d: want claimed, token %d, processing",
					a.res.Claimed, a.res.Record.Token, a.res.Record.Status, mine, mine)
			}
		})
	}
}

// TestOlderClaimProceduresStay: during a rolling deploy, binaries of the
// previous versions still call claim_v1 (migration 0002) and claim_v2
// (0003): Migrate keeps them, and each still claims a new key.
func TestOlderClaimProceduresStay(t *testing.T) {
	s := newStore(t)
	for i, proc := range []string{s.names.claimProc1, s.names.claimProc2, s.names.claimProc} {
		var (
			tok     int64
			claimed bool
		)
		rows, err := s.db.QueryContext(t.Context(), "CALL "+proc+"('tenant', ?, 'POST', '/r', 'f', 3600000000, 3600000000, 0)", "k"+string(rune('0'+i)))
		if err != nil {
			t.Fatalf("%s: %v", proc, err)
		}
		if !rows.Next() {
			t.Fatalf("%s: no answer: %v", proc, rows.Err())
		}
		var skip [12]any
		dst := []any{}
		for j := range skip {
			dst = append(dst, &skip[j])
		}
		dst[4] = &tok
		if err := rows.Scan(append(dst, &claimed, new(int64))...); err != nil {
			t.Fatalf("%s: %v", proc, err)
		}
		if err := rows.Close(); err != nil {
			t.Fatalf("%s: %v", proc, err)
		}
		if !claimed || tok == 0 {
			t.Errorf("%s: claimed=%v token=%d, want a claim", proc, claimed, tok)
		}
	}
}

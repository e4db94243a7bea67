package model

import (
	"database/sql"
	"os"
	"testing"

	"github.com/idemkit/idem/core/storekit"
)

// ledgerTokens reads the tokens an Audit query on a database/sql ledger
// returned (mysqlstore, sqlitestore).
func ledgerTokens(rows *sql.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var toks []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			return nil, err
		}
		toks = append(toks, tok)
	}
	return toks, rows.Err()
}

// handlerEndsTx tells which handlers end their lease transaction
// themselves before idem completes (Env.HandlerEndsTx): by default every
// other lease's (odd tokens); IDEM_MODEL_DEFER_ROLLBACK=0 none, =1 all.
func handlerEndsTx() func(storekit.Fence) bool {
	switch os.Getenv("IDEM_MODEL_DEFER_ROLLBACK") {
	case "0":
		return func(storekit.Fence) bool { return false }
	case "1":
		return func(storekit.Fence) bool { return true }
	}
	return func(f storekit.Fence) bool { return f.Token%2 == 1 }
}

// txCovered is covered for a transactional run with handlers that end
// their transaction themselves (handlerEndsTx) and commit it themselves
// (CommitSelf): it also requires ledger audits, takeovers that found a
// crashed handler's committed writes, and Completes refused after a
// handler's own rollback.
func txCovered(t *testing.T, sum Summary) {
	t.Helper()
	if os.Getenv("IDEM_MODEL_DEFER_ROLLBACK") == "1" {
		// Every handler rolls back: no Complete can succeed, so there is
		// no replay to require. Linearizability is still checked.
		t.Log(sum.String())
	} else {
		covered(t, sum, true)
	}
	if sum.Count(Audit, OK) == 0 {
		t.Errorf("no ledger audit was answered")
	}
	if sum.Histories >= 20 && sum.Sealed == 0 {
		t.Errorf("no claim found a crashed handler's committed writes (CommitCrash): it proves nothing about them")
	}
	if os.Getenv("IDEM_MODEL_DEFER_ROLLBACK") != "0" && sum.Count(Complete, NotCommitted) == 0 {
		t.Errorf("no Complete after a handler's own rollback was refused (storekit.ErrNotCommitted)")
	}
}

package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// MySQL client protocol command bytes (the first payload byte of a packet
// with sequence number 0).
const (
	comQuery       = 0x03
	comStmtPrepare = 0x16
	comStmtExecute = 0x17
	comStmtClose   = 0x19 // no response: not a round trip
)

var comNames = map[byte]string{comQuery: "query", comStmtPrepare: "prepare", comStmtExecute: "execute", comStmtClose: "close"}

// commandCounter counts the commands the driver sends, read off the wire:
// every command is a packet with sequence number 0 (the driver writes each
// packet with one Write).
type commandCounter struct {
	mu   sync.Mutex
	cmds []byte
}

func (c *commandCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, c: c}, nil
}

func (c *commandCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmds = nil
}

// roundTrips returns the number of commands that wait for an answer, and
// all commands by name.
func (c *commandCounter) roundTrips() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	by := map[string]int{}
	for _, b := range c.cmds {
		if b != comStmtClose {
			n++
		}
		name, ok := comNames[b]
		if !ok {
			name = fmt.Sprintf("0x%02x", b)
		}
		by[name]++
	}
	var parts []string
	for k, v := range by {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return n, fmt.Sprint(parts)
}

type countingConn struct {
	net.Conn
	c *commandCounter
}

func (cc *countingConn) Write(p []byte) (int, error) {
	if len(p) >= 5 && p[3] == 0 {
		cc.c.mu.Lock()
		cc.c.cmds = append(cc.c.cmds, p[4])
		cc.c.mu.Unlock()
	}
	return cc.Conn.Write(p)
}

// TestQueryCounts asserts the number of round trips per phase, counted on
// the wire: one for each of claim (new, in flight, takeover, replay: the
// CALL), heartbeat, complete, fail and get; in transactional mode one
// (START TRANSACTION) when the handler first asks for the transaction, and
// at commit the fenced UPDATE plus COMMIT on the business transaction;
// with Defer, one more per deferred statement at commit, and without Tx
// START TRANSACTION too.
func TestQueryCounts(t *testing.T) {
	tr := &commandCounter{}
	cfg := mysqlstoretest.Database(t, "")
	cfg.DialFunc = tr.dial
	db := mysqlstoretest.Open(t, cfg)
	db.SetMaxOpenConns(1) // one connection: each statement prepared once
	s := openStore(t, db)
	if _, err := db.Exec("CREATE TABLE ledger (k VARBINARY(255) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	phase := func(name string, want int, fn func() error) {
		t.Helper()
		tr.reset()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n, by := tr.roundTrips(); n != want {
			t.Errorf("%s: %d round trips (%s), want %d", name, n, by, want)
		}
	}
	// Warm-up: a Store's first claim checks the schema version and asks
	// whether the server is a Galera node, once; each statement is prepared
	// on its first use on the connection.
	warm := claimReq("warm", time.Minute)
	var wf storekit.Fence
	phase("first claim (schema check + galera check + prepare + claim)", 5, func() error {
		res, err := s.Claim(ctx, warm)
		wf = storekit.Fence{Scope: warm.Scope, Key: warm.Key, Token: res.Record.Token}
		return err
	})
	phase("first heartbeat (prepare + execute)", 2, func() error { return s.Heartbeat(ctx, wf, time.Minute) })
	phase("first complete (prepare + execute)", 2, func() error { return s.Complete(ctx, wf, storekit.StoredResponse{Status: 200}) })
	phase("first get (prepare + execute)", 2, func() error { _, err := s.Get(ctx, warm.Scope, warm.Key); return err })
	phase("warm claim + first fail", 3, func() error {
		res, err := s.Claim(ctx, claimReq("warm2", time.Minute))
		if err != nil {
			return err
		}
		return s.Fail(ctx, storekit.Fence{Scope: "tenant", Key: "warm2", Token: res.Record.Token})
	})

	req := claimReq("k", 100*time.Millisecond)
	var f storekit.Fence
	phase("claim (new key)", 1, func() error {
		res, err := s.Claim(ctx, req)
		f = storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
		return err
	})
	phase("claim (in flight)", 1, func() error { _, err := s.Claim(ctx, req); return err })
	phase("heartbeat", 1, func() error { return s.Heartbeat(ctx, f, 100*time.Millisecond) })
	phase("fail", 1, func() error { return s.Fail(ctx, f) })
	phase("claim (takeover of failed)", 1, func() error {
		res, err := s.Claim(ctx, req)
		if !res.Claimed {
			return fmt.Errorf("takeover did not claim: %+v", res.Record)
		}
		f.Token = res.Record.Token
		return err
	})
	phase("first save step (prepare + execute)", 2, func() error { return s.SaveStep(ctx, f, "charge", []byte("ch_1")) })
	phase("save step", 1, func() error { return s.SaveStep(ctx, f, "notify", []byte("n_1")) })
	phase("first load steps (prepare + execute)", 2, func() error { _, err := s.LoadSteps(ctx, f); return err })
	phase("load steps", 1, func() error { _, err := s.LoadSteps(ctx, f); return err })
	phase("complete", 1, func() error {
		return s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("x")})
	})
	phase("claim (replay)", 1, func() error { _, err := s.Claim(ctx, req); return err })
	phase("get", 1, func() error { _, err := s.Get(ctx, req.Scope, req.Key); return err })

	// Transactional mode.
	txReq := claimReq("tx", time.Minute)
	var hctx context.Context
	phase("claim (tx)", 1, func() error {
		res, err := s.Claim(ctx, txReq)
		f = storekit.Fence{Scope: txReq.Scope, Key: txReq.Key, Token: res.Record.Token}
		hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
		return err
	})
	var tx *sql.Tx
	phase("first Tx (prepare the complete + START TRANSACTION + commit mark)", 3, func() error { var err error; tx, err = Tx(hctx); return err })
	phase("handler insert (no arguments)", 1, func() error {
		_, err := tx.ExecContext(hctx, "INSERT INTO ledger (k) VALUES ('tx')")
		return err
	})
	phase("Tx again (no statement)", 0, func() error { _, err := Tx(hctx); return err })
	phase("complete in tx (UPDATE + DELETE mark + COMMIT)", 3, func() error {
		return s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	})
	// In transactional mode, Fail: the mark's check + ROLLBACK + fenced UPDATE.
	txReq.Key = "tx2"
	phase("claim (tx2)", 1, func() error {
		res, err := s.Claim(ctx, txReq)
		f = storekit.Fence{Scope: txReq.Scope, Key: txReq.Key, Token: res.Record.Token}
		hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
		return err
	})
	phase("Tx (START TRANSACTION + commit mark) 2", 2, func() error { _, err := Tx(hctx); return err })
	phase("fail in tx (SELECT mark + ROLLBACK + UPDATE)", 3, func() error { return s.Fail(hctx, f) })

	// Deferred writes: nothing at Defer; at Complete, one round trip per
	// statement (database/sql cannot pipeline), in a transaction of their
	// own without Tx.
	claimHandler := func(key string) {
		txReq.Key = key
		phase("claim ("+key+")", 1, func() error {
			res, err := s.Claim(ctx, txReq)
			f = storekit.Fence{Scope: txReq.Scope, Key: txReq.Key, Token: res.Record.Token}
			hctx = storetest.ContextWithLease(ctx, storetest.NewLease(s, f))
			return err
		})
	}
	claimHandler("defer")
	phase("Defer (no statement)", 0, func() error { return Defer(hctx, "INSERT INTO ledger (k) VALUES ('defer')") })
	phase("complete with a deferred statement (START TRANSACTION + UPDATE + INSERT + COMMIT)", 4, func() error {
		return s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	})
	claimHandler("tx-defer")
	phase("Tx (START TRANSACTION + commit mark) 3", 2, func() error { _, err := Tx(hctx); return err })
	phase("Defer in tx (no statement)", 0, func() error { return Defer(hctx, "INSERT INTO ledger (k) VALUES ('tx-defer')") })
	phase("complete in tx with a deferred statement (UPDATE + DELETE mark + INSERT + COMMIT)", 4, func() error {
		return s.Complete(hctx, f, storekit.StoredResponse{Status: 201})
	})
	claimHandler("defer-fail")
	phase("Defer (no statement) 2", 0, func() error { return Defer(hctx, "INSERT INTO ledger (k) VALUES ('defer-fail')") })
	phase("fail with a deferred statement (UPDATE)", 1, func() error { return s.Fail(hctx, f) })

	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM ledger").Scan(&n); err != nil || n != 3 {
		t.Errorf("ledger rows = %d (%v), want 3: the completed transactions' rows only", n, err)
	}
}

// TestQueryCountsReadFirst: with WithReadFirst a replay or an in-flight
// duplicate costs one round trip (the SELECT), a new key two (the SELECT
// that finds nothing, then the CALL).
func TestQueryCountsReadFirst(t *testing.T) {
	tr := &commandCounter{}
	cfg := mysqlstoretest.Database(t, "")
	cfg.DialFunc = tr.dial
	db := mysqlstoretest.Open(t, cfg)
	db.SetMaxOpenConns(1)
	s := openStore(t, db, WithReadFirst())
	ctx := t.Context()
	warm := claimReq("warm", time.Minute)
	if _, err := s.Claim(ctx, warm); err != nil { // schema check, preparations
		t.Fatal(err)
	}
	count := func(name string, want int, fn func() (storekit.ClaimResult, error)) storekit.ClaimResult {
		t.Helper()
		tr.reset()
		res, err := fn()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n, by := tr.roundTrips(); n != want {
			t.Errorf("%s: %d round trips (%s), want %d", name, n, by, want)
		}
		return res
	}
	req := claimReq("k", time.Minute)
	res := count("claim (new key)", 2, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	if !res.Claimed || !res.Fresh {
		t.Fatalf("new key: %+v", res)
	}
	count("claim (in flight)", 1, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	if err := s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	res = count("claim (replay)", 1, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil {
		t.Fatalf("replay: %+v", res)
	}
}

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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
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

// TestQueryCountsReadFirst: with WithReadFirst a replay or an in-flight
// duplicate costs one round trip (the SELECT), a new key two (the SELECT
// that finds nothing, then the new key's CALL).
func TestQueryCountsReadFirst(t *testing.T) {
	s, _, tr := countedStore(t, WithReadFirst())
	ctx := t.Context()
	warm := claimReq("warm", time.Minute)
	if _, err := s.Claim(ctx, warm); err != nil { // schema check, preparations
		t.Fatal(err)
	}
	count := tr.claims(t)
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

// TestNewKeyReadFirstIsTheCheapClaim: a key that the read first finds
// missing (WithReadFirst, or during a retry storm) is created by the new
// key's cheap CALL (migration 0007), not by the claim procedure (0006),
// which costs MariaDB about half as much again: with the procedure
// dropped, the new key is still claimed, and answered as stored.
func TestNewKeyReadFirstIsTheCheapClaim(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  []Option
		storm bool
	}{{"WithReadFirst", []Option{WithReadFirst()}, false}, {"retry storm", nil, true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.opts...)
			if tc.storm {
				inRetryStorm(s)
			}
			ctx := t.Context()
			if _, err := s.db.ExecContext(ctx, "DROP PROCEDURE "+s.names.claimProc); err != nil {
				t.Fatal(err)
			}
			req := claimReq("new", time.Minute)
			res, err := s.Claim(ctx, req)
			require.NoError(t, err, "a new key must not need the claim procedure")
			assert.True(t, res.Claimed && res.Fresh, "new key: %+v", res)
			stored, err := s.Inspect(ctx, req.Scope, req.Key)
			require.NoError(t, err)
			assert.Equal(t, res.Record.Token, stored.Token)
			assert.Equal(t, storekit.StatusProcessing, stored.Status)
			if tc.storm {
				assert.False(t, s.mix.InsertFirst(), "one new key ends no retry storm")
			}
		})
	}
}

// TestQueryCountsDeferred: a complete with a deferred statement, once its
// statements are prepared on the connection, is BEGIN, the fenced
// complete, the deferred statement and COMMIT: four round trips, the
// deferred statement executed as kept prepared rather than prepared,
// executed and closed again on every run.
func TestQueryCountsDeferred(t *testing.T) {
	s, db, tr := countedStore(t)
	ledgerTable(t, db)
	for _, k := range []string{"warm", "k1", "k2"} {
		hctx, f := handlerCtx(t, s, claimReq(k, time.Minute))
		if err := deferRow(hctx, k); err != nil {
			t.Fatal(err)
		}
		tr.reset()
		if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
			t.Fatalf("complete %s: %v", k, err)
		}
		if n, by := tr.roundTrips(); k != "warm" && n != 4 {
			t.Errorf("complete with a deferred row (%s): %d round trips (%s), want 4", k, n, by)
		}
	}
	// Past maxDeferredStmts kept, a new query is sent as database/sql
	// sends it: prepared, executed and closed.
	s.deferredKept.Store(maxDeferredStmts)
	hctx, f := handlerCtx(t, s, claimReq("k3", time.Minute))
	l, _ := storekit.LeaseFromContext(hctx)
	if err := Defer(hctx, "INSERT INTO ledger (owner, k) VALUES (?, ?)", l.Fence().Token, "k3"); err != nil {
		t.Fatal(err)
	}
	tr.reset()
	if err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatalf("complete k3: %v", err)
	}
	if n, by := tr.roundTrips(); n != 5 {
		t.Errorf("complete with a deferred query past the bound: %d round trips (%s), want 5", n, by)
	}
	if got := ledgerOwners(t, db); len(got) != 4 {
		t.Errorf("%d ledger rows, want a row per key", len(got))
	}
}

// TestQueryCountsInsertFirst: a new key is one CALL of its cheap claim
// (migration 0007), an existing key then a plain SELECT; in a retry storm
// (half of recent claims finding their key) the store reads first, one
// round trip per replay and two per new key (the SELECT, then the new
// key's CALL), until new keys dominate again.
func TestQueryCountsInsertFirst(t *testing.T) {
	s, _, tr := countedStore(t)
	ctx := t.Context()
	warm := claimReq("warm", time.Minute)
	for range 2 { // schema check, the cheap claim and Get's SELECT prepared
		if _, err := s.Claim(ctx, warm); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.claim(ctx, &warm); err != nil { // the claim procedure prepared
		t.Fatal(err)
	}
	count := tr.claims(t)
	req := claimReq("k", time.Minute)
	res := count("claim (new key)", 1, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
	if !res.Claimed || !res.Fresh || res.Record.Status != storekit.StatusProcessing || res.Record.Fingerprint != req.Fingerprint {
		t.Fatalf("new key: %+v", res)
	}
	// The answer is the record as stored.
	if got, err := s.Inspect(ctx, req.Scope, req.Key); err != nil || got.Token != res.Record.Token ||
		!got.LockedUntil.Equal(res.Record.LockedUntil) || !got.CreatedAt.Equal(res.Record.CreatedAt) || !got.ExpiresAt.Equal(res.Record.ExpiresAt) {
		t.Fatalf("new key's answer %+v, stored %+v (%v)", res.Record, got, err)
	}
	if err := s.Complete(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}, storekit.StoredResponse{Status: 201}); err != nil {
		t.Fatal(err)
	}
	n := 1
	for ; n < 100 && s.mix.InsertFirst(); n++ {
		res = count("claim (replay, insert first)", 2, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
		if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil {
			t.Fatalf("replay: %+v", res)
		}
	}
	if s.mix.InsertFirst() {
		t.Fatalf("still inserting first after %d replays in a row", n)
	}
	if n < 5 {
		t.Errorf("switched after %d replays: one retry should not flip the strategy", n)
	}
	for range 3 {
		res = count("claim (replay, read first)", 1, func() (storekit.ClaimResult, error) { return s.Claim(ctx, req) })
		if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Response == nil {
			t.Fatalf("replay, read first: %+v", res)
		}
	}
	for i := 0; !s.mix.InsertFirst(); i++ {
		if i == 100 {
			t.Fatal("still reading first after 100 new keys")
		}
		res := count("claim (new key, read first)", 2, func() (storekit.ClaimResult, error) {
			return s.Claim(ctx, claimReq(fmt.Sprintf("new-%d", i), time.Minute))
		})
		if !res.Claimed || !res.Fresh {
			t.Fatalf("new key, read first: %+v", res)
		}
	}
	res = count("claim (new key, inserting first again)", 1, func() (storekit.ClaimResult, error) {
		return s.Claim(ctx, claimReq("after-the-storm", time.Minute))
	})
	if !res.Claimed || !res.Fresh {
		t.Fatalf("new key after the storm: %+v", res)
	}
}

// claims returns a function that runs a claim and fails t unless it cost
// want round trips.
func (c *commandCounter) claims(t *testing.T) func(name string, want int, fn func() (storekit.ClaimResult, error)) storekit.ClaimResult {
	return func(name string, want int, fn func() (storekit.ClaimResult, error)) storekit.ClaimResult {
		t.Helper()
		c.reset()
		res, err := fn()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n, by := c.roundTrips(); n != want {
			t.Errorf("%s: %d round trips (%s), want %d", name, n, by, want)
		}
		return res
	}
}

// countedStore opens a store on a fresh database through one connection
// whose commands tr counts (each statement prepared once).
func countedStore(t *testing.T, opts ...Option) (*Store, *sql.DB, *commandCounter) {
	tr := &commandCounter{}
	cfg := mysqlstoretest.Database(t, "")
	cfg.DialFunc = tr.dial
	db := mysqlstoretest.Open(t, cfg)
	db.SetMaxOpenConns(1)
	return openStore(t, db, opts...), db, tr
}

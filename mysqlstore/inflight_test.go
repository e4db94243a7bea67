package mysqlstore

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// commitHolder holds the next COMMIT the driver sends, while armed, until
// release is closed; held is closed when it is being held.
type commitHolder struct {
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (h *commitHolder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: conn, h: h}, nil
}

type holdConn struct {
	net.Conn
	h *commitHolder
}

func (hc *holdConn) Write(p []byte) (int, error) {
	if len(p) >= 5 && p[3] == 0 && p[4] == comQuery && string(p[5:]) == "COMMIT" && hc.h.armed.CompareAndSwap(true, false) {
		close(hc.h.held)
		<-hc.h.release
	}
	return hc.Conn.Write(p)
}

// TestTakeoverDuringCommit: the lease lapses while Complete is in flight
// in the handler's transaction (its fenced update done, its COMMIT not yet
// sent), and a retry claims the key meanwhile. The claim must not take the
// key over: it waits for the transaction, finds the record completed, and
// replays. One ledger row, the owner's.
func TestTakeoverDuringCommit(t *testing.T) {
	h := &commitHolder{held: make(chan struct{}), release: make(chan struct{})}
	cfg := mysqlstoretest.Database(t, "")
	cfg.DialFunc = h.dial
	db := mysqlstoretest.Open(t, cfg)
	s := openStore(t, db)
	ledgerTable(t, db)
	// The retry comes from an instance whose clock is past the lease
	// (opened first: its Migrate would wait for the transaction's
	// metadata locks).
	retry := openStore(t, mysqlstoretest.Open(t, cfg), withClockOffset(2*time.Minute))
	// The takeover under test is the claim procedure's: a new key's insert
	// tried first would wait on the record's row lock instead (and then
	// call the procedure, which replays), and show no mark read.
	inRetryStorm(retry)
	req := claimReq("k", time.Minute)
	hctx, f := handlerCtx(t, s, req)
	if err := book(hctx, req.Key, f.Token); err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	completed := make(chan error, 1)
	go func() { completed <- s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("booked")}) }()
	select {
	case <-h.held:
	case err := <-completed:
		t.Fatalf("complete returned before its COMMIT: %v", err)
	}
	claimed := make(chan storekit.ClaimResult, 1)
	claimErr := make(chan error, 1)
	go func() {
		res, err := retry.Claim(context.Background(), req)
		claimErr <- err
		claimed <- res
	}()
	// The claim waits for the transaction in flight (its commit mark,
	// read by the takeover with a locking read): wait until the read shows
	// (bounded), then let the COMMIT go.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if markReads(t, db) > 0 {
			break
		}
		if time.Now().After(deadline) {
			close(h.release)
			t.Fatal("the retry's claim never waited for the transaction in flight")
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(h.release)
	if err := <-completed; err != nil {
		t.Fatalf("complete: %v", err)
	}
	if err := <-claimErr; err != nil {
		t.Fatalf("retry's claim: %v", err)
	}
	res := <-claimed
	if res.Claimed || res.Record.Status != storekit.StatusCompleted || res.Record.Token != f.Token {
		t.Fatalf("retry's claim: claimed=%v %s token %d; want the record completed under token %d", res.Claimed, res.Record.Status, res.Record.Token, f.Token)
	}
	if got := ledgerOwners(t, db); len(got) != 1 || got[req.Key] != f.Token {
		t.Fatalf("ledger %v, want one row by token %d", got, f.Token)
	}
}

package mysqlstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// cutter cuts the connection that sends the k-th command after it is
// armed: before the command leaves (the server, seeing the connection
// gone, rolls back what it had not committed), or right after it left (the
// server runs it, and the client never reads the answer: after a COMMIT,
// an ambiguous commit).
type cutter struct {
	left  atomic.Int64 // commands to let through before the cut; <= 0: disarmed
	after bool         // cut after the command left
}

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: conn, c: c}, nil
}

type cutConn struct {
	net.Conn
	c *cutter
}

func (cc *cutConn) Write(p []byte) (int, error) {
	// A command is a packet with sequence number 0 (the driver writes
	// each packet with one Write).
	if len(p) < 5 || p[3] != 0 || cc.c.left.Load() <= 0 || cc.c.left.Add(-1) != 0 {
		return cc.Conn.Write(p)
	}
	if !cc.c.after {
		_ = cc.Conn.Close()
		return 0, net.ErrClosed
	}
	n, err := cc.Conn.Write(p)
	_ = cc.Conn.Close()
	return n, err
}

// TestCompleteCut: the connection dies at each command Complete sends for
// a transactional execution (the fenced update, the commit mark's delete,
// a deferred statement's prepare, execute and close, the COMMIT; with Tx,
// with Tx and Defer, with Defer alone), before the command leaves or right
// after. Whatever the point, the money invariant holds: the response is
// recorded if and only if the ledger row committed (once), a key whose row
// committed is never released, and one whose row did not is released (a
// retry may run at once). Only a cut after the COMMIT left may commit: then
// Complete fails, but not as "not committed" (a cut before the first
// command left is retried by database/sql on another connection).
func TestCompleteCut(t *testing.T) {
	for _, mode := range []string{"tx", "tx+defer", "defer"} {
		for _, after := range []bool{false, true} {
			ambiguous := false
			for k := int64(1); ; k++ {
				cut, amb := completeCut(t, mode, after, k)
				if !cut {
					break
				}
				ambiguous = ambiguous || amb
				if k > 20 {
					t.Fatalf("%s: Complete sent more than 20 commands", mode)
				}
			}
			if after && !ambiguous {
				t.Errorf("%s: no cut after a command left made Complete fail with its writes committed: the ambiguous COMMIT was not driven", mode)
			}
		}
	}
}

// completeCut runs one case of TestCompleteCut and reports whether the cut
// happened (false: Complete sent fewer than k commands), and whether
// Complete failed with the writes committed (an ambiguous COMMIT).
func completeCut(t *testing.T, mode string, after bool, k int64) (cut, ambiguous bool) {
	name := fmt.Sprintf("%s/command-%d/before-it-left", mode, k)
	if after {
		name = fmt.Sprintf("%s/command-%d/after-it-left", mode, k)
	}
	t.Run(name, func(t *testing.T) {
		c := &cutter{after: after}
		cfg := mysqlstoretest.Database(t, "")
		cfg.DialFunc = c.dial
		db := mysqlstoretest.Open(t, cfg)
		s := openStore(t, db)
		ledgerTable(t, db)
		req := claimReq("k", time.Hour)
		hctx, f := handlerCtx(t, s, req)
		key := req.Key
		if mode != "defer" {
			if err := book(hctx, key, f.Token); err != nil {
				t.Fatal(err)
			}
			key = "deferred"
		}
		if mode != "tx" {
			if err := deferRow(hctx, key); err != nil {
				t.Fatal(err)
			}
		}
		c.left.Store(k)
		err := s.Complete(hctx, f, storekit.StoredResponse{Status: 201, Body: []byte("booked")})
		if cut = c.left.Load() <= 0; !cut {
			if err != nil {
				t.Fatalf("complete without a cut: %v", err)
			}
			return
		}
		rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
		if gerr != nil {
			t.Fatal(gerr)
		}
		rows := ledgerOwners(t, db)
		switch {
		case errors.Is(err, core.ErrLeaseLost):
			t.Errorf("complete = %v, want the connection's loss", err)
		case err == nil && len(rows) == 0:
			// database/sql retries on another connection a command that
			// never left (driver.ErrBadConn): then Complete succeeds.
			t.Errorf("complete succeeded with nothing booked")
		case len(rows) == 0:
			if rec.Status != storekit.StatusFailed {
				t.Errorf("nothing booked, record %s; want failed (released)", rec.Status)
			}
		case errors.Is(err, storekit.ErrNotCommitted):
			t.Errorf("complete = %v, yet the ledger holds %v", err, rows)
		}
		if len(rows) > 0 {
			ambiguous = err != nil
			want := 1
			if mode == "tx+defer" {
				want = 2
			}
			if len(rows) != want || rec.Status != storekit.StatusCompleted || rec.Response == nil ||
				rec.Response.Status != 201 || string(rec.Response.Body) != "booked" {
				t.Fatalf("ledger %v, record %s %+v; want %d rows and the record completed 201", rows, rec.Status, rec.Response, want)
			}
			res, err := s.Claim(t.Context(), req)
			if err != nil || res.Claimed || res.Record.Status != storekit.StatusCompleted {
				t.Fatalf("retry: claimed=%v status=%s err=%v; want the replay", res.Claimed, res.Record.Status, err)
			}
		}
		if rec.Status == storekit.StatusCompleted && len(rows) == 0 {
			t.Errorf("record completed with nothing booked")
		}
		if n := markRows(t, db); n != 0 {
			t.Errorf("%d commit marks left, want 0", n)
		}
	})
	return cut, ambiguous
}

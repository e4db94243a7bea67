package pgstore

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// Faults at a statement boundary, on the wire: the store's pool dials
// through faultDialer, which, once armed, breaks the next write that
// executes something (an Execute or simple Query message; a write that only
// prepares passes) in one of three ways. The connection is then closed, as
// a network cut or a killed backend leaves it.
type faultKind int

const (
	// faultDrop: nothing of the write reaches the server.
	faultDrop faultKind = iota + 1
	// faultCutMidWrite: half of it does (the server never gets the Sync).
	faultCutMidWrite
	// faultLoseAnswer: all of it does and the server runs it to the end
	// (its answer, up to ReadyForQuery, is read and thrown away): a commit
	// in it has landed, but the client only sees the connection die.
	faultLoseAnswer
)

var errFault = errors.New("fault injected: connection lost")

type faultDialer struct {
	mu    sync.Mutex
	armed faultKind
	fired int
	// noCancel drops pgx's cancel requests (sent when a context is
	// cancelled mid-statement), as a network that lost them would: the
	// statement then runs to its end on the server.
	noCancel bool
}

// cancelRequestCode opens a CancelRequest message (protocol docs).
const cancelRequestCode = 80877102

// dropsCancel reports whether b is a cancel request to drop.
func (d *faultDialer) dropsCancel(b []byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.noCancel && len(b) == 16 && binary.BigEndian.Uint32(b[4:8]) == cancelRequestCode
}

func (d *faultDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, d: d}, nil
}

// arm breaks the next executing write, once.
func (d *faultDialer) arm(k faultKind) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = k
}

// firedCount is how many faults were injected.
func (d *faultDialer) firedCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fired
}

// take returns the armed fault if b executes something, disarming it.
func (d *faultDialer) take(b []byte) faultKind {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed == 0 || !executes(b) {
		return 0
	}
	k := d.armed
	d.armed = 0
	d.fired++
	return k
}

// executes reports whether b, a sequence of frontend messages, holds an
// Execute ('E') or a simple Query ('Q'). The startup message (no type
// byte: it begins with its length's zero high byte) does not count.
func executes(b []byte) bool {
	for len(b) >= 5 {
		typ, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if typ == 'E' || typ == 'Q' {
			return true
		}
		if typ == 0 || n < 4 || 1+n > len(b) {
			return false
		}
		b = b[1+n:]
	}
	return false
}

type faultConn struct {
	net.Conn
	d *faultDialer

	mu       sync.Mutex
	draining bool // faultLoseAnswer: reads discard the answer, then fail
	dead     bool
}

func (c *faultConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	dead := c.dead
	c.mu.Unlock()
	if dead {
		return 0, errFault
	}
	if c.d.dropsCancel(b) {
		c.kill()
		return 0, errFault
	}
	switch c.d.take(b) {
	case faultDrop:
		c.kill()
		return 0, errFault
	case faultCutMidWrite:
		n, _ := c.Conn.Write(b[:len(b)/2])
		c.kill()
		return n, errFault
	case faultLoseAnswer:
		n, err := c.Conn.Write(b)
		c.mu.Lock()
		c.draining = true
		c.mu.Unlock()
		return n, err
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	draining, dead := c.draining, c.dead
	c.mu.Unlock()
	if dead {
		return 0, errFault
	}
	if !draining {
		return c.Conn.Read(b)
	}
	// Read the server's answer to the end (ReadyForQuery), throw it away.
	var pending []byte
	buf := make([]byte, 8192)
	for {
		n, err := c.Conn.Read(buf)
		pending = append(pending, buf[:n]...)
		for len(pending) >= 5 {
			typ, l := pending[0], int(binary.BigEndian.Uint32(pending[1:5]))
			if len(pending) < 1+l {
				break
			}
			pending = pending[1+l:]
			if typ == 'Z' {
				c.kill()
				return 0, errFault
			}
		}
		if err != nil {
			c.kill()
			return 0, errFault
		}
	}
}

func (c *faultConn) kill() {
	c.mu.Lock()
	c.dead = true
	c.mu.Unlock()
	_ = c.Conn.Close()
}

// waitReleased waits until no connection of pool is acquired: pgxpool
// destroys a broken connection asynchronously after its release.
func waitReleased(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0; {
		if time.Now().After(deadline) {
			t.Errorf("%d connections still acquired", pool.Stat().AcquiredConns())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// faultPool is a pool whose connections go through a faultDialer.
func faultPool(t *testing.T) (*pgxpool.Pool, *faultDialer) {
	t.Helper()
	d := &faultDialer{}
	cfg := pgstoretest.Config(t)
	cfg.MaxConns = 4
	cfg.ConnConfig.DialFunc = d.dial
	return pgstoretest.NewPool(t, cfg), d
}

// faultLease is a fresh store on a faultPool, with a ledger table and a
// claimed key "k": where every fault test of a lease starts.
func faultLease(t *testing.T, opts []Option) (*pgxpool.Pool, *faultDialer, *Store, string, storekit.ClaimRequest, context.Context, storekit.Fence) {
	t.Helper()
	pool, d := faultPool(t)
	s := newStore(t, pool, opts...)
	table := ledger(t, s)
	req := claimReq("k", time.Minute)
	ctx, f := mustClaim(t, s, req)
	return pool, d, s, table, req, ctx, f
}

// TestFaultAtComplete breaks the connection at the statement that commits
// the response (and the business writes), in every way a cut can fall:
// before the server got it, in the middle of it, and after it ran (its
// answer lost: an ambiguous commit). The handler writes its ledger row with
// Defer, with Tx, or with both. Whatever the client was told:
//
//   - the ledger row committed exactly when the response was recorded;
//   - a response recorded is never reported as not committed
//     (storekit.ErrNotCommitted would tell the client its payment did not
//     happen), and its key is never released;
//   - writes that did not commit leave the key claimable, and the retry
//     commits them exactly once.
func TestFaultAtComplete(t *testing.T) {
	faults := []struct {
		name string
		kind faultKind
	}{{"drop", faultDrop}, {"cut-mid-write", faultCutMidWrite}, {"lose-answer", faultLoseAnswer}}
	writers := []string{"defer", "tx", "tx+defer"}
	for _, m := range deferModes() {
		for _, w := range writers {
			for _, fl := range faults {
				t.Run(m.name+"/"+w+"/"+fl.name, func(t *testing.T) {
					t.Parallel()
					_, d, s, table, req, ctx, f := faultLease(t, m.opts)
					write := func(ctx context.Context) error {
						switch w {
						case "defer":
							return deferRow(ctx, table, req.Key)
						case "tx":
							return handle(ctx, table, req.Key)
						default:
							if err := handle(ctx, table, req.Key); err != nil {
								return err
							}
							return Defer(ctx, "UPDATE "+table+" SET token = token + 0 WHERE key = $1", req.Key)
						}
					}
					if err := write(ctx); err != nil {
						t.Fatalf("handler: %v", err)
					}
					d.arm(fl.kind)
					err := s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("paid")})
					if d.firedCount() != 1 {
						t.Fatalf("fault not injected (Complete = %v)", err)
					}
					if err == nil {
						t.Fatal("Complete succeeded on a connection that died")
					}
					rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
					if gerr != nil {
						t.Fatalf("get: %v", gerr)
					}
					rows := ledgerRows(t, s, table, req.Key)
					committed := fl.kind == faultLoseAnswer
					t.Logf("Complete = %v; record %s, ledger %v", err, rec.Status, rows)
					if committed {
						if len(rows) != 1 || rec.Status != storekit.StatusCompleted || rec.Response == nil || string(rec.Response.Body) != "paid" {
							t.Fatalf("commit landed, answer lost: ledger %v, record %s; want one row and the response recorded", rows, rec.Status)
						}
						if errors.Is(err, storekit.ErrNotCommitted) {
							t.Errorf("Complete = %v: reports as not committed writes that committed", err)
						}
						if res, err := s.Claim(t.Context(), req); err != nil || res.Claimed || res.Record.Response == nil || string(res.Record.Response.Body) != "paid" {
							t.Errorf("retry: claimed %v (%v); want the recorded response replayed", res.Claimed, err)
						}
						return
					}
					if len(rows) != 0 || rec.Status != storekit.StatusFailed {
						t.Fatalf("nothing committed: ledger %v, record %s; want no row, the key released", rows, rec.Status)
					}
					// The retry runs the handler again and commits once.
					ctx2, f2 := mustClaim(t, s, req)
					if err := write(ctx2); err != nil {
						t.Fatalf("retry's handler: %v", err)
					}
					if err := s.Complete(ctx2, f2, storekit.StoredResponse{Status: 201, Body: []byte("paid")}); err != nil {
						t.Fatalf("retry's Complete: %v", err)
					}
					if rows := ledgerRows(t, s, table, req.Key); len(rows) != 1 || rows[0] != f2.Token {
						t.Errorf("after the retry: ledger %v, want [%d]", rows, f2.Token)
					}
				})
			}
		}
	}
}

// TestFaultInHandlerTx breaks the connection at the handler's statements
// in Tx: the first (sent with BEGIN in one pipeline), or a later one. The
// handler either gives up (Fail) or ignores the error and answers (Complete).
// Nothing committed (no COMMIT was sent), so the response must not be
// recorded and the key must be released.
func TestFaultInHandlerTx(t *testing.T) {
	for _, m := range deferModes() {
		for _, at := range []string{"first", "second"} {
			for _, fl := range []faultKind{faultDrop, faultLoseAnswer} {
				for _, then := range []string{"fail", "complete"} {
					name := m.name + "/" + at + "/" + map[faultKind]string{faultDrop: "drop", faultLoseAnswer: "lose-answer"}[fl] + "/" + then
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						pool, d, s, table, req, ctx, f := faultLease(t, m.opts)
						if at == "second" {
							if err := handle(ctx, table, req.Key); err != nil {
								t.Fatal(err)
							}
						}
						d.arm(fl)
						if err := handle(ctx, table, req.Key); err == nil {
							t.Fatal("the handler's statement succeeded on a connection that died")
						}
						if d.firedCount() != 1 {
							t.Fatal("fault not injected")
						}
						var err error
						if then == "fail" {
							err = s.Fail(ctx, f)
						} else {
							err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("paid")})
							if err == nil {
								t.Errorf("Complete recorded a response for a transaction whose connection died")
							}
						}
						rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
						if gerr != nil {
							t.Fatalf("get: %v", gerr)
						}
						rows := ledgerRows(t, s, table, req.Key)
						t.Logf("%s = %v; record %s, ledger %v", then, err, rec.Status, rows)
						if len(rows) != 0 || rec.Status != storekit.StatusFailed {
							t.Fatalf("ledger %v, record %s; want no row, the key released", rows, rec.Status)
						}
						if errors.Is(err, core.ErrLeaseLost) {
							t.Errorf("%s = %v: the lease was not lost", then, err)
						}
						waitReleased(t, pool)
					})
				}
			}
		}
	}
}

// TestFaultAtSaveStep breaks the connection at a step's fenced insert
// (core.Step): the handler sees the save fail and gives up; the retry
// takes the key over. A step whose insert committed although its answer
// was lost is honoured: its effect does not run again. One that did not
// reach the server runs again, under the same relay key (one incarnation).
func TestFaultAtSaveStep(t *testing.T) {
	for _, fl := range []struct {
		name string
		kind faultKind
		runs int
	}{{"drop", faultDrop, 2}, {"lose-answer", faultLoseAnswer, 1}} {
		for _, m := range deferModes() {
			t.Run(m.name+"/"+fl.name, func(t *testing.T) {
				t.Parallel()
				pool, d := faultPool(t)
				s := newStore(t, pool, m.opts...)
				eng := stepEngine(t, s, core.WithLease(time.Minute))
				var (
					runs   int
					relays []string
				)
				charge := func(ctx context.Context) ([]byte, error) {
					runs++
					relays = append(relays, core.RelayKey(ctx, "charge"))
					return []byte("ch_1"), nil
				}
				dec, ctx := stepProceed(t, eng, "k")
				core.RelayKey(ctx, "charge") // transactional mode: SyncClaim runs now, not under the fault
				d.arm(fl.kind)
				if _, err := core.Step(ctx, "charge", charge); err == nil {
					t.Fatal("Step succeeded although its save's connection died")
				}
				if d.firedCount() != 1 {
					t.Fatal("fault not injected")
				}
				if err := eng.Abort(t.Context(), dec, errors.New("step not saved")); err != nil {
					t.Fatalf("abort: %v", err)
				}
				dec, ctx = stepProceed(t, eng, "k") // the retry takes the failed key over
				out, err := core.Step(ctx, "charge", charge)
				if err != nil || string(out) != "ch_1" {
					t.Fatalf("retry's Step = %q, %v", out, err)
				}
				if err := eng.Commit(t.Context(), dec, adapterkit.Response{Status: 201}); err != nil {
					t.Fatal(err)
				}
				if runs != fl.runs {
					t.Errorf("the step's effect ran %d times, want %d", runs, fl.runs)
				}
				for _, r := range relays[1:] {
					if r != relays[0] {
						t.Errorf("relay keys %q: one incarnation relayed two keys", relays)
					}
				}
			})
		}
	}
}

// TestFaultAtHandlerCommit: a handler that commits the lease transaction
// itself (tx.Exec(ctx, "COMMIT")) and loses the answer: the commit landed,
// but pgx only saw the connection die, so no tag said COMMIT. Whatever
// the engine does next (Complete or Fail), the key must not be released:
// PostgreSQL is asked how the transaction ended, by its id.
func TestFaultAtHandlerCommit(t *testing.T) {
	for _, m := range deferModes() {
		for _, then := range []string{"fail", "complete"} {
			t.Run(m.name+"/"+then, func(t *testing.T) {
				t.Parallel()
				pool, d, s, table, req, ctx, f := faultLease(t, m.opts)
				if err := handle(ctx, table, req.Key); err != nil {
					t.Fatal(err)
				}
				tx, err := Tx(ctx)
				if err != nil {
					t.Fatal(err)
				}
				d.arm(faultLoseAnswer)
				if _, err := tx.Exec(ctx, "COMMIT"); err == nil {
					t.Fatal("the COMMIT's answer arrived on a connection that died")
				}
				if d.firedCount() != 1 {
					t.Fatal("fault not injected")
				}
				if then == "fail" {
					err = s.Fail(ctx, f)
				} else {
					err = s.Complete(ctx, f, storekit.StoredResponse{Status: 201, Body: []byte("paid")})
				}
				rec, gerr := s.Get(t.Context(), req.Scope, req.Key)
				if gerr != nil {
					t.Fatalf("get: %v", gerr)
				}
				rows := ledgerRows(t, s, table, req.Key)
				t.Logf("%s = %v; record %s %+v, ledger %v", then, err, rec.Status, rec.Response, rows)
				if len(rows) != 1 {
					t.Fatalf("ledger %v: want the row the handler's COMMIT landed", rows)
				}
				if rec.Status != storekit.StatusCompleted {
					t.Errorf("record %s: the committed writes' key was left claimable (a retry runs them again); want completed", rec.Status)
				}
				if res, err := s.Claim(t.Context(), req); err != nil || res.Claimed {
					t.Errorf("retry: claimed %v (%v); want the completed record", res.Claimed, err)
				}
				waitReleased(t, pool)
			})
		}
	}
}

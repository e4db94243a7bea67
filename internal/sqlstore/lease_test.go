package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"reflect"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/core/storetest"
)

// fakeStore and otherStore stand for two store types; no method is called.
type fakeStore struct{ core.Store }
type otherStore struct{ core.Store }

// decorator wraps a store as metrics or tracing decorators do.
type decorator struct{ core.Store }

func (d decorator) Unwrap() core.Store { return d.Store }

var errNoLease = errors.New("no lease")

func leaseCtx(s core.Store, f storekit.Fence) (context.Context, *core.Lease) {
	l := storetest.NewLease(s, f)
	return storetest.ContextWithLease(context.Background(), l), l
}

func TestGranted(t *testing.T) {
	f := storekit.Fence{Scope: "s", Key: "k", Token: 7}
	s := &fakeStore{}

	if _, _, err := Granted[*fakeStore](context.Background(), errNoLease, "x: tx"); err != errNoLease {
		t.Errorf("no lease: got %v, want the caller's error", err)
	}
	ctx, l := leaseCtx(decorator{s}, f)
	lease, got, err := Granted[*fakeStore](ctx, errNoLease, "x: tx")
	if err != nil || got != s || lease != l {
		t.Errorf("through a decorator: got %p, %v; want the store and the lease", got, err)
	}
	ctx, _ = leaseCtx(&otherStore{}, f)
	_, _, err = Granted[*fakeStore](ctx, errNoLease, "x: tx")
	const want = "x: tx: the lease was granted by *sqlstore.otherStore, not by a *sqlstore.fakeStore (or a store whose Unwrap returns one)"
	if err == nil || err.Error() != want {
		t.Errorf("another store's lease: got %v, want %q", err, want)
	}
}

func TestOwned(t *testing.T) {
	f := storekit.Fence{Scope: "s", Key: "k", Token: 7}
	s := &fakeStore{}
	ctx, l := leaseCtx(s, f)
	if st := Owned(ctx, f, s); st == nil || st != StateOf(l) {
		t.Errorf("own lease: got %p, want the lease's state", st)
	}
	if st := Owned(ctx, storekit.Fence{Scope: "s", Key: "k", Token: 8}, s); st != nil {
		t.Error("another fence: got a state")
	}
	if st := Owned(ctx, f, &fakeStore{}); st != nil {
		t.Error("another store of the same type: got a state")
	}
	if st := Owned(context.Background(), f, s); st != nil {
		t.Error("no lease: got a state")
	}
}

// TestStateTombstone: Take hands over what Defer queued, once; from then
// on Tx and Defer refuse with the caller's error and begin nothing.
func TestStateTombstone(t *testing.T) {
	errFinished := errors.New("finished")
	st := &State{}
	if err := st.Defer(errFinished, "A", []any{1}); err != nil {
		t.Fatal(err)
	}
	if err := st.Defer(errFinished, "B", nil); err != nil {
		t.Fatal(err)
	}
	tx, marked, deferred := st.Take()
	if tx != nil || marked {
		t.Errorf("Take: tx %v marked %v, want none", tx, marked)
	}
	want := []Stmt{{Query: "A", Args: []any{1}}, {Query: "B"}}
	if !reflect.DeepEqual(deferred, want) {
		t.Errorf("Take: deferred %v, want %v in order", deferred, want)
	}
	if err := st.Defer(errFinished, "C", nil); err != errFinished {
		t.Errorf("Defer after Take: %v, want the caller's error", err)
	}
	begun := 0
	if _, err := st.Tx(errFinished, func() (*sql.Tx, bool, error) { begun++; return nil, true, nil }); err != errFinished {
		t.Errorf("Tx after Take: %v, want the caller's error", err)
	}
	if begun != 0 {
		t.Errorf("Tx after Take began a transaction (%d)", begun)
	}
	if _, _, deferred := st.Take(); deferred != nil {
		t.Errorf("second Take: deferred %v, want none", deferred)
	}
}

// TestStateTx: Tx begins once and hands the same transaction out; a failed
// begin leaves none; Take hands it over with its mark; Abandon tells a
// transaction the handler ended itself from one it rolls back.
func TestStateTx(t *testing.T) {
	db := sql.OpenDB(fakeConnector{})
	defer db.Close()
	errFinished := errors.New("finished")
	for _, handlerEnds := range []bool{false, true} {
		st := &State{}
		errBegin := errors.New("begin")
		if _, err := st.Tx(errFinished, func() (*sql.Tx, bool, error) { return nil, false, errBegin }); err != errBegin {
			t.Errorf("failed begin: %v, want its error", err)
		}
		begun := 0
		begin := func() (*sql.Tx, bool, error) {
			begun++
			tx, err := db.Begin()
			return tx, true, err
		}
		tx1, err1 := st.Tx(errFinished, begin)
		tx2, err2 := st.Tx(errFinished, begin)
		if err1 != nil || err2 != nil || tx1 == nil || tx1 != tx2 || begun != 1 {
			t.Fatalf("Tx twice: %p %v, %p %v, begun %d; want one transaction", tx1, err1, tx2, err2, begun)
		}
		if !st.MarkedTxOpen() {
			t.Error("MarkedTxOpen: false with a marked transaction open")
		}
		ran := st.InMarkedTx(func(tx *sql.Tx) {
			if tx != tx1 {
				t.Errorf("InMarkedTx: %p, want %p", tx, tx1)
			}
		})
		if !ran {
			t.Error("InMarkedTx: did not run")
		}
		if handlerEnds {
			_ = tx1.Commit()
		}
		tx, marked, _ := st.Take()
		if tx != tx1 || !marked {
			t.Errorf("Take: %p marked %v, want %p marked", tx, marked, tx1)
		}
		if st.MarkedTxOpen() || st.InMarkedTx(func(*sql.Tx) { t.Error("InMarkedTx ran after Take") }) {
			t.Error("after Take: the transaction is still open")
		}
		if got := Abandon(tx, marked); got != handlerEnds {
			t.Errorf("Abandon (handler ended it: %v): %v", handlerEnds, got)
		}
	}
	if Abandon(nil, true) {
		t.Error("Abandon(nil): handler ended")
	}
}

// fakeConnector is a database/sql driver whose transactions do nothing.
type fakeConnector struct{}

func (fakeConnector) Connect(context.Context) (driver.Conn, error) { return fakeConn{}, nil }
func (fakeConnector) Driver() driver.Driver                        { return nil }

type fakeConn struct{}

func (fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (fakeConn) Close() error                        { return nil }
func (fakeConn) Begin() (driver.Tx, error)           { return fakeConn{}, nil }
func (fakeConn) Commit() error                       { return nil }
func (fakeConn) Rollback() error                     { return nil }

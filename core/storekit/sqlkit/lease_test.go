package sqlkit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

func leaseCtx(s core.Store, f storekit.Fence) (context.Context, storekit.Lease) {
	l := storetest.NewLease(s, f)
	return storetest.ContextWithLease(context.Background(), l), l
}

func TestGranted(t *testing.T) {
	f := storekit.Fence{Scope: "s", Key: "k", Token: 7}
	s := &fakeStore{}

	_, _, err := Granted[*fakeStore](context.Background(), errNoLease, "x: tx")
	assert.Same(t, errNoLease, err, "no lease: the caller's error")
	ctx, l := leaseCtx(decorator{s}, f)
	lease, got, err := Granted[*fakeStore](ctx, errNoLease, "x: tx")
	require.NoError(t, err, "through a decorator")
	assert.Same(t, s, got, "through a decorator: the store")
	assert.Same(t, l, lease, "through a decorator: the lease")
	ctx, _ = leaseCtx(&otherStore{}, f)
	_, _, err = Granted[*fakeStore](ctx, errNoLease, "x: tx")
	assert.EqualError(t, err, "x: tx: the lease was granted by *sqlkit.otherStore, not by a *sqlkit.fakeStore (or a store whose Unwrap returns one)")
}

func TestOwned(t *testing.T) {
	f := storekit.Fence{Scope: "s", Key: "k", Token: 7}
	s := &fakeStore{}
	ctx, l := leaseCtx(s, f)
	st := Owned(ctx, f, s)
	require.NotNil(t, st, "own lease")
	assert.Same(t, StateOf(l), st, "own lease: the lease's state")
	assert.Nil(t, Owned(ctx, storekit.Fence{Scope: "s", Key: "k", Token: 8}, s), "another fence")
	assert.Nil(t, Owned(ctx, f, &fakeStore{}), "another store of the same type")
	assert.Nil(t, Owned(context.Background(), f, s), "no lease")
}

// TestStateTombstone: Take hands over what Defer queued, once; from then
// on Tx and Defer refuse with the caller's error and begin nothing.
func TestStateTombstone(t *testing.T) {
	errFinished := errors.New("finished")
	st := &LeaseState{}
	require.NoError(t, st.Defer(errFinished, "A", []any{1}))
	require.NoError(t, st.Defer(errFinished, "B", nil))
	tx, marked, deferred := st.Take()
	assert.Nil(t, tx, "Take: no transaction")
	assert.False(t, marked, "Take: not marked")
	assert.Equal(t, []DeferredStmt{{Query: "A", Args: []any{1}}, {Query: "B"}}, deferred, "Take: the deferred statements in order")
	assert.Same(t, errFinished, st.Defer(errFinished, "C", nil), "Defer after Take: the caller's error")
	begun := 0
	_, err := st.Tx(errFinished, func() (*sql.Tx, bool, error) { begun++; return nil, true, nil })
	assert.Same(t, errFinished, err, "Tx after Take: the caller's error")
	assert.Zero(t, begun, "Tx after Take began a transaction")
	_, _, deferred = st.Take()
	assert.Nil(t, deferred, "second Take: nothing deferred")
}

// TestStateTx: Tx begins once and hands the same transaction out; a failed
// begin leaves none; Take hands it over with its mark; Abandon tells a
// transaction the handler ended itself from one it rolls back.
func TestStateTx(t *testing.T) {
	db := sql.OpenDB(fakeConnector{})
	defer db.Close()
	errFinished := errors.New("finished")
	for _, handlerEnds := range []bool{false, true} {
		st := &LeaseState{}
		errBegin := errors.New("begin")
		_, err := st.Tx(errFinished, func() (*sql.Tx, bool, error) { return nil, false, errBegin })
		assert.Same(t, errBegin, err, "failed begin: its error")
		begun := 0
		begin := func() (*sql.Tx, bool, error) {
			begun++
			tx, err := db.Begin()
			return tx, true, err
		}
		tx1, err := st.Tx(errFinished, begin)
		require.NoError(t, err)
		require.NotNil(t, tx1)
		tx2, err := st.Tx(errFinished, begin)
		require.NoError(t, err)
		require.Same(t, tx1, tx2, "Tx twice: one transaction")
		require.Equal(t, 1, begun, "Tx twice: begun once")
		assert.True(t, st.MarkedTxOpen(), "MarkedTxOpen with a marked transaction open")
		ran := st.InMarkedTx(func(tx *sql.Tx) { assert.Same(t, tx1, tx, "InMarkedTx: the transaction") })
		assert.True(t, ran, "InMarkedTx ran")
		if handlerEnds {
			require.NoError(t, tx1.Commit())
		}
		tx, marked, _ := st.Take()
		assert.Same(t, tx1, tx, "Take: the transaction")
		assert.True(t, marked, "Take: marked")
		assert.False(t, st.MarkedTxOpen(), "after Take: the transaction is still open")
		assert.False(t, st.InMarkedTx(func(*sql.Tx) { t.Error("InMarkedTx ran after Take") }), "after Take: InMarkedTx ran")
		assert.Equal(t, handlerEnds, Abandon(tx, marked), "Abandon (handler ended it: %v)", handlerEnds)
	}
	assert.False(t, Abandon(nil, true), "Abandon(nil): handler ended")
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

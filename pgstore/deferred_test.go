package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// deferRow queues the handler-equivalent's ledger row with Defer.
func deferRow(ctx context.Context, table, key string) error {
	l, _ := storekit.LeaseFromContext(ctx)
	return Defer(ctx, "INSERT INTO "+table+" (key, token) VALUES ($1, $2)", key, l.Fence().Token)
}

func deferModes() []struct {
	name string
	opts []Option
} {
	return append(modes[:len(modes):len(modes)], struct {
		name string
		opts []Option
	}{"transactional", []Option{WithTransactional()}})
}

// waitLapsed waits until the database's clock is past f's lease.
func waitLapsed(t *testing.T, s *Store, req storekit.ClaimRequest, f storekit.Fence) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var lapsed bool
		err := s.pool.QueryRow(t.Context(), "SELECT locked_until <= now() FROM "+s.names.table+" WHERE scope = $1 AND key = $2 AND token = $3",
			req.Scope, req.Key, f.Token).Scan(&lapsed)
		if err != nil {
			t.Fatalf("read lease: %v", err)
		}
		if lapsed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("lease did not lapse within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeferRefusesQueryOptions: the statements travel in a batch, which
// takes no query options (the refusals every store shares: txtest).
func TestDeferRefusesQueryOptions(t *testing.T) {
	s := newStore(t, pgstoretest.Pool(t))
	ctx, _ := mustClaim(t, s, claimReq("k1", time.Minute))
	require.Error(t, Defer(ctx, "SELECT $1", pgx.QueryExecModeSimpleProtocol, 1))
}

// TestDeferExecModes: in every query mode a pool may be configured with
// (the simple protocol sends the batch as one multi-statement query), the
// deferred statements commit with the record, and a stale owner's roll back.
func TestDeferExecModes(t *testing.T) {
	for _, em := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"cache_statement", 0}, {"exec", pgx.QueryExecModeExec}, {"simple_protocol", pgx.QueryExecModeSimpleProtocol}} {
		t.Run(em.name, func(t *testing.T) {
			t.Parallel()
			cfg := pgstoretest.Config(t)
			if em.mode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = em.mode
			}
			s := newStore(t, pgstoretest.NewPool(t, cfg))
			table := ledger(t, s)
			req := claimReq("k1", 100*time.Millisecond)
			staleCtx, staleFence := mustClaim(t, s, req)
			if err := deferRow(staleCtx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			waitLapsed(t, s, req, staleFence)
			newCtx, newFence := mustClaim(t, s, req)
			if err := deferRow(newCtx, table, req.Key); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(staleCtx, staleFence, storekit.StoredResponse{Status: 201}); !errors.Is(err, core.ErrLeaseLost) {
				t.Fatalf("stale Complete = %v, want ErrLeaseLost", err)
			}
			if err := s.Complete(newCtx, newFence, storekit.StoredResponse{Status: 201, Body: []byte("new")}); err != nil {
				t.Fatalf("new Complete: %v", err)
			}
			if got := ledgerRows(t, s, table, req.Key); len(got) != 1 || got[0] != newFence.Token {
				t.Fatalf("ledger = %v, want exactly the new owner's row [%d]", got, newFence.Token)
			}
		})
	}
}

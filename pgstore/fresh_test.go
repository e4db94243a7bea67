package pgstore

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore/pgstoretest"
)

// TestTakeoverNeverFresh: a takeover keeps the record's created_at, and
// when the old claim's transaction began in the same microsecond as the
// takeover's, created_at equals the claim's clock. Claim must still not
// report Fresh: the engine would skip reading the steps the old owner
// saved and run them again (a second provider call). The model checker
// met it under load (two claims of one key whose statements began in the
// same microsecond, a lapse between them); here a trigger makes every takeover's
// created_at the statement's clock, which is that coincidence.
func TestTakeoverNeverFresh(t *testing.T) {
	for _, m := range modes {
		for _, first := range []struct {
			name     string
			opts     []Option
			execMode pgx.QueryExecMode
		}{
			{"function", []Option{withFunctionFirst()}, 0},
			{"insert_first", nil, 0},
			{"simple_protocol", nil, pgx.QueryExecModeSimpleProtocol}, // claimText
		} {
			t.Run(m.name+"/"+first.name, func(t *testing.T) {
				t.Parallel()
				cfg := pgstoretest.Config(t)
				if first.execMode != 0 {
					cfg.ConnConfig.DefaultQueryExecMode = first.execMode
				}
				pool := pgstoretest.NewPool(t, cfg)
				s := newStore(t, pool, append(append([]Option{}, m.opts...), first.opts...)...)
				ctx := t.Context()
				req := claimReq("k", time.Minute)
				res, err := s.Claim(ctx, req)
				if err != nil || !res.Claimed || !res.Fresh {
					t.Fatalf("first claim: %+v, %v; want claimed and fresh", res, err)
				}
				if err := s.Fail(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}); err != nil {
					t.Fatal(err)
				}
				fn := s.names.schema + ".same_microsecond"
				if _, err := pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.created_at := now(); RETURN NEW; END $$`); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `CREATE TRIGGER same_microsecond BEFORE UPDATE ON `+s.names.table+`
FOR EACH ROW WHEN (OLD.token IS DISTINCT FROM NEW.token AND NEW.created_at = OLD.created_at) EXECUTE FUNCTION `+fn+`()`); err != nil {
					t.Fatal(err)
				}
				res, err = s.Claim(ctx, req)
				if err != nil || !res.Claimed {
					t.Fatalf("takeover: %+v, %v; want claimed", res, err)
				}
				if !res.Record.CreatedAt.Equal(res.Now) {
					t.Fatalf("takeover: created_at %v, clock %v: the trigger did not make the coincidence", res.Record.CreatedAt, res.Now)
				}
				if res.Fresh {
					t.Errorf("a takeover reported Fresh: its old owner's steps would not be read")
				}
			})
		}
	}
}

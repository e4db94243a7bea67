package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgstore"
)

// pgLedger is the ledger table in the store's database and schema. Record
// queues the row with pgstore.Defer: it is inserted in the transaction idem
// commits together with the stored response, in the same round trip, so
// the row and the idempotency record are one atomic fact and a first
// execution costs two database round trips (claim, complete). A stale
// owner's fenced commit fails and its row rolls back with it; a row the
// database refuses fails the commit (500, key released), as with Tx.
type pgLedger struct {
	pool  *pgxpool.Pool
	table string // quoted schema.payments
}

func newPGLedger(pool *pgxpool.Pool, schema string) *pgLedger {
	return &pgLedger{pool: pool, table: pgx.Identifier{schema, "payments"}.Sanitize()}
}

// migrate creates the ledger table. It runs after pgstore.Migrate, which
// creates the schema; the advisory lock keeps concurrent start-ups from
// racing on CREATE TABLE IF NOT EXISTS.
func (l *pgLedger) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('idem-examples-payments-ledger'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+l.table+` (
	id                 text        PRIMARY KEY,
	user_id            text        NOT NULL,
	amount             bigint      NOT NULL CHECK (amount > 0),
	currency           text        NOT NULL,
	recipient          text        NOT NULL,
	provider_charge_id text        NOT NULL,
	created_at         timestamptz NOT NULL DEFAULT now()
)`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `CREATE INDEX IF NOT EXISTS payments_user_idx ON `+l.table+` (user_id, created_at, id)`)
		return err
	})
}

// Record queues the row's insert with pgstore.Defer: it runs in the
// transaction that stores the response, in the same round trip.
func (l *pgLedger) Record(ctx context.Context, user string, p Payment) error {
	err := pgstore.Defer(ctx, `INSERT INTO `+l.table+` (id, user_id, amount, currency, recipient, provider_charge_id)
VALUES ($1, $2, $3, $4, $5, $6)`, p.ID, user, p.Amount, p.Currency, p.To, p.ProviderChargeID)
	if err != nil {
		return fmt.Errorf("ledger: insert: %w", err)
	}
	return nil
}

// List reads committed rows only: a payment in flight is not listed.
func (l *pgLedger) List(ctx context.Context, user string) ([]Payment, error) {
	rows, err := l.pool.Query(ctx, `SELECT id, amount, currency, recipient, provider_charge_id, created_at
FROM `+l.table+` WHERE user_id = $1 ORDER BY created_at, id`, user)
	if err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Payment, error) {
		var p Payment
		err := r.Scan(&p.ID, &p.Amount, &p.Currency, &p.To, &p.ProviderChargeID, &p.CreatedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: list: %w", err)
	}
	return ps, nil
}

// maintainer is a store with retention work (pgstore, mysqlstore).
type maintainer interface {
	Maintain(ctx context.Context) error
}

// maintain runs the store's retention work every interval until ctx ends.
func maintain(ctx context.Context, s maintainer, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.Maintain(ctx); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "store maintenance failed", "err", err)
		}
	}
}

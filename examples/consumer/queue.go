package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Queue is a minimal PostgreSQL table queue with at-least-once delivery,
// like most brokers: Take hides a message for a visibility timeout
// instead of removing it, and only Ack removes it. A worker that dies
// (or is slow) before Ack lets the message reappear and be delivered
// again; a producer that retries a publish delivers it twice. Both are
// why the consumer needs idem.
type Queue struct {
	pool   *pgxpool.Pool
	schema string
}

// Message is a payment request.
type Message struct {
	PaymentID string // the idempotency key: one payment, however often delivered
	Account   string
	Amount    int64
}

// Delivery is one delivery of a message.
type Delivery struct {
	ID         int64
	Message    Message
	Deliveries int // how many times this row was taken, this one included
}

func (q *Queue) table(name string) string { return pgx.Identifier{q.schema, name}.Sanitize() }

// Migrate creates the queue, ledger and provider tables.
func (q *Queue) Migrate(ctx context.Context) error {
	for _, stmt := range []string{
		"CREATE TABLE IF NOT EXISTS " + q.table("queue") + ` (
			id bigserial PRIMARY KEY, payment_id text NOT NULL, account text NOT NULL,
			amount bigint NOT NULL, visible_at timestamptz NOT NULL DEFAULT now(), deliveries int NOT NULL DEFAULT 0)`,
		// No unique constraint on payment_id: a double booking must show.
		"CREATE TABLE IF NOT EXISTS " + q.table("ledger") + ` (
			id bigserial PRIMARY KEY, payment_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL, charge_id text NOT NULL)`,
		// The simulated provider deduplicates by the relayed key, as real
		// providers' Idempotency-Key does; attempts counts the calls.
		"CREATE TABLE IF NOT EXISTS " + q.table("provider_charges") + ` (
			relay_key text PRIMARY KEY, payment_id text NOT NULL, amount bigint NOT NULL, attempts int NOT NULL)`,
	} {
		if _, err := q.pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("queue: migrate: %w", err)
		}
	}
	return nil
}

// Publish enqueues m.
func (q *Queue) Publish(ctx context.Context, m Message) error {
	_, err := q.pool.Exec(ctx, "INSERT INTO "+q.table("queue")+" (payment_id, account, amount) VALUES ($1, $2, $3)",
		m.PaymentID, m.Account, m.Amount)
	if err != nil {
		return fmt.Errorf("queue: publish: %w", err)
	}
	return nil
}

// Take delivers the next visible message, hidden for visibility; ok is
// false when none is visible.
func (q *Queue) Take(ctx context.Context, visibility time.Duration) (d Delivery, ok bool, err error) {
	t := q.table("queue")
	err = q.pool.QueryRow(ctx, "UPDATE "+t+" SET visible_at = now() + $1, deliveries = deliveries + 1 WHERE id = "+
		"(SELECT id FROM "+t+" WHERE visible_at <= now() ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) "+
		"RETURNING id, payment_id, account, amount, deliveries", visibility).
		Scan(&d.ID, &d.Message.PaymentID, &d.Message.Account, &d.Message.Amount, &d.Deliveries)
	if errors.Is(err, pgx.ErrNoRows) {
		return Delivery{}, false, nil
	}
	if err != nil {
		return Delivery{}, false, fmt.Errorf("queue: take: %w", err)
	}
	return d, true, nil
}

// Ack removes a delivered message for good.
func (q *Queue) Ack(ctx context.Context, d Delivery) error {
	if _, err := q.pool.Exec(ctx, "DELETE FROM "+q.table("queue")+" WHERE id = $1", d.ID); err != nil {
		return fmt.Errorf("queue: ack: %w", err)
	}
	return nil
}

// Len is the number of messages not yet acknowledged, visible or not.
func (q *Queue) Len(ctx context.Context) (int, error) {
	var n int
	if err := q.pool.QueryRow(ctx, "SELECT count(*) FROM "+q.table("queue")).Scan(&n); err != nil {
		return 0, fmt.Errorf("queue: len: %w", err)
	}
	return n, nil
}

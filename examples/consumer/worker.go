package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgstore"
)

// Worker consumes payment messages: each payment is charged and booked
// once, however often its message is delivered, through core.Engine.Call
// keyed by the payment ID. The ledger row is written in the call's
// transaction (pgstore.Tx), so it commits with the call's record; the
// provider, outside the database, gets a relayed key (core.RelayKey), so
// a worker killed after the charge and before the commit does not make
// the retry charge twice.
type Worker struct {
	Engine     *core.Engine
	Queue      *Queue
	Visibility time.Duration // how long a taken message stays hidden
	Log        *slog.Logger
	// AfterCharge, when set, runs between the provider's charge and the
	// ledger write (the fault test kills the worker there).
	AfterCharge func(Delivery)
}

// Receipt is a call's result, replayed to later deliveries.
type Receipt struct {
	ChargeID string `json:"charge_id"`
}

// Handle processes one delivery and acknowledges it once its payment is
// recorded (now or before). A delivery whose payment is in flight on
// another worker, or that failed, is left to be delivered again.
func (w *Worker) Handle(ctx context.Context, d Delivery) error {
	input, err := json.Marshal(d.Message)
	if err != nil {
		return fmt.Errorf("worker: encode message: %w", err)
	}
	_, err = core.CallJSON(ctx, w.Engine, core.CallRequest{
		Scope: "payments", Key: d.Message.PaymentID, Name: "charge-payment", Input: input,
	}, func(ctx context.Context) (Receipt, error) {
		id, err := w.charge(ctx, d.Message)
		if err != nil {
			return Receipt{}, err
		}
		if w.AfterCharge != nil {
			w.AfterCharge(d)
		}
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return Receipt{}, err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+w.Queue.table("ledger")+" (payment_id, account, amount, charge_id) VALUES ($1, $2, $3, $4)",
			d.Message.PaymentID, d.Message.Account, d.Message.Amount, id); err != nil {
			return Receipt{}, fmt.Errorf("worker: book: %w", err)
		}
		return Receipt{ChargeID: id}, nil
	})
	switch {
	case err == nil:
		return w.Queue.Ack(ctx, d)
	case errors.Is(err, core.ErrMismatch):
		// Another message reused this payment ID: a producer bug. Drop it
		// (a real consumer would dead-letter it), never charge it.
		w.Log.Error("payment ID reused with another message; dropped", "delivery", d.ID)
		return w.Queue.Ack(ctx, d)
	}
	// In flight elsewhere, store unavailable, charge failed: not acked, so
	// the queue delivers it again after the visibility timeout.
	return err
}

// charge is the simulated provider: it deduplicates by the relayed key
// and returns the same charge ID for it.
func (w *Worker) charge(ctx context.Context, m Message) (string, error) {
	key := core.RelayKey(ctx, "provider")
	_, err := w.Queue.pool.Exec(ctx, "INSERT INTO "+w.Queue.table("provider_charges")+
		" VALUES ($1, $2, $3, 1) ON CONFLICT (relay_key) DO UPDATE SET attempts = "+w.Queue.table("provider_charges")+".attempts + 1",
		key, m.PaymentID, m.Amount)
	if err != nil {
		return "", fmt.Errorf("worker: charge: %w", err)
	}
	return "ch_" + key, nil
}

// Run takes and handles messages until ctx ends, or, with untilEmpty,
// until the queue holds no message at all.
func (w *Worker) Run(ctx context.Context, untilEmpty bool, poll time.Duration) error {
	for ctx.Err() == nil {
		d, ok, err := w.Queue.Take(ctx, w.Visibility)
		if err != nil {
			w.Log.Warn("take", "err", err)
		}
		if ok {
			if err := w.Handle(ctx, d); err != nil {
				w.Log.Info("not acknowledged; it will be delivered again", "delivery", d.ID, "err", err)
			}
			continue
		}
		if untilEmpty {
			if n, err := w.Queue.Len(ctx); err == nil && n == 0 {
				return nil
			}
		}
		t := time.NewTimer(poll) // a table queue is polled
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return ctx.Err()
}

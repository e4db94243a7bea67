// Command consumer is a queue consumer protected by idem: it takes payment
// messages from a PostgreSQL table queue with at-least-once delivery
// (redeliveries after a visibility timeout, duplicate publishes) and
// charges and books each payment once, with core.Engine.Call keyed by the
// payment ID.
//
//	go run ./examples/consumer -dsn postgres://postgres@127.0.0.1:5432/test -publish 10
//
// Flags:
//
//	-dsn URL            PostgreSQL (default: $DATABASE_URL)
//	-schema public      schema of the queue, ledger and idem tables
//	-publish 0          publish this many payments first, each twice
//	-workers 4          concurrent workers in this process
//	-until-empty        exit once the queue is empty
//	-lease 5s           idem lease (core.WithLease): a killed worker's
//	                    payment is taken over this long after its death
//	-visibility 10s     how long a taken message stays hidden
//
// Its fault test (consumer_test.go) publishes every payment twice, runs
// worker processes that SIGKILL themselves after the provider's charge and
// before the ledger commit, and checks one ledger row and one provider
// charge per payment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/pgstore"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run() error {
	dsn := flag.String("dsn", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
	schema := flag.String("schema", "public", "schema")
	publish := flag.Int("publish", 0, "payments to publish first, each twice")
	workers := flag.Int("workers", 4, "concurrent workers")
	untilEmpty := flag.Bool("until-empty", false, "exit once the queue is empty")
	lease := flag.Duration("lease", 5*time.Second, "idem lease")
	visibility := flag.Duration("visibility", 10*time.Second, "visibility timeout")
	flag.Parse()
	if *dsn == "" {
		return errors.New("-dsn (or DATABASE_URL) is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	w, closeStore, err := setup(ctx, pool, *schema, *lease, *visibility, log)
	if err != nil {
		return err
	}
	defer closeStore()
	for i := range *publish {
		m := Message{PaymentID: fmt.Sprintf("pay-%d", i), Account: "acct-1", Amount: int64(100 + i)}
		for range 2 { // a producer that retried its publish
			if err := w.Queue.Publish(ctx, m); err != nil {
				return err
			}
		}
	}
	return work(ctx, w, *workers, *untilEmpty)
}

// setup migrates the store and the queue and returns a worker on them.
func setup(ctx context.Context, pool *pgxpool.Pool, schema string, lease, visibility time.Duration, log *slog.Logger) (*Worker, func(), error) {
	opts := []pgstore.Option{pgstore.WithSchema(schema), pgstore.WithTransactional()}
	if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
		return nil, nil, err
	}
	store, err := pgstore.New(pool, opts...)
	if err != nil {
		return nil, nil, err
	}
	// A consumer has no HTTP tenant: its payments share one scope, named
	// in each call ("payments").
	e, err := core.New(store, core.WithLease(lease), core.WithWait(lease+2*time.Second), core.WithLogger(log))
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	q := &Queue{pool: pool, schema: schema}
	if err := q.Migrate(ctx); err != nil {
		store.Close()
		return nil, nil, err
	}
	return &Worker{Engine: e, Queue: q, Visibility: visibility, Log: log}, store.Close, nil
}

// work runs n workers until ctx ends (or the queue is empty).
func work(ctx context.Context, w *Worker, n int, untilEmpty bool) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = w.Run(ctx, untilEmpty, 100*time.Millisecond) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

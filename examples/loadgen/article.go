package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The article's design (the background article's "production-grade minimal
// implementation", section 5), implemented as it is written there, for
// comparison: every statement in autocommit, no transaction around the
// business write, no fencing, no heartbeat, the application's clock. Its
// flaws are kept on purpose (a stale owner's final UPDATE overwrites the
// new owner's; the business row and the record are not one fact; the
// stored JSONB body is replayed as PostgreSQL prints it, not byte for
// byte). Only the driver differs: pgxpool, sized like idem's, where the
// article uses database/sql, so that the comparison measures the design,
// not the driver.

const (
	articleProcessing = "PROCESSING"
	articleSucceeded  = "SUCCEEDED"
	articleFailed     = "FAILED"
	articleLock       = 30 * time.Second
)

// articleDDL is the article's table, as published (PostgreSQL version).
func articleDDL(table string) []string {
	return []string{`CREATE TABLE IF NOT EXISTS ` + table + ` (
    idempotency_key VARCHAR(255) NOT NULL,
    user_id VARCHAR(64) NOT NULL,
    request_path VARCHAR(255) NOT NULL,
    request_hash CHAR(64) NOT NULL,
    status VARCHAR(32) NOT NULL,
    response_code INT,
    response_body JSONB,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    locked_until TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (user_id, idempotency_key)
)`, `CREATE INDEX IF NOT EXISTS idx_idempotency_created_at ON ` + table + ` (created_at)`}
}

type articleStore struct {
	pool                          *pgxpool.Pool
	claim, read, takeover, finish string
}

func newArticleStore(pool *pgxpool.Pool, schema string) *articleStore {
	t := pgx.Identifier{schema, "idempotency_keys"}.Sanitize()
	return &articleStore{
		pool: pool,
		claim: `INSERT INTO ` + t + `
(idempotency_key, user_id, request_path, request_hash, status, locked_until, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
ON CONFLICT (user_id, idempotency_key) DO NOTHING`,
		read: `SELECT idempotency_key, user_id, request_path, request_hash, status, response_code, response_body, locked_until
FROM ` + t + `
WHERE user_id = $1 AND idempotency_key = $2`,
		takeover: `UPDATE ` + t + `
SET locked_until = $1, updated_at = $2
WHERE user_id = $3 AND idempotency_key = $4 AND status = $5`,
		finish: `UPDATE ` + t + `
SET status = $1, response_code = $2, response_body = $3, updated_at = $4
WHERE user_id = $5 AND idempotency_key = $6`,
	}
}

// execute is the article's ExecuteWithIdempotency, step for step.
func (a *articleStore) execute(ctx context.Context, log *slog.Logger, userID, key, path string, reqBody []byte,
	handler func(ctx context.Context) (int, []byte, error)) (code int, body []byte, replayed bool, err error) {
	if key == "" {
		code, body, err = handler(ctx)
		return code, body, false, err
	}
	sum := sha256.Sum256(reqBody)
	reqHash := hex.EncodeToString(sum[:])
	now := time.Now().UTC()
	lockTimeout := now.Add(articleLock)

	// Step 1: INSERT PROCESSING, autocommit.
	tag, err := a.pool.Exec(ctx, a.claim, key, userID, path, reqHash, articleProcessing, lockTimeout, now)
	if err != nil {
		return http.StatusInternalServerError, nil, false, err
	}
	if tag.RowsAffected() == 0 {
		// Step 2: the key exists: read it.
		var (
			k, u, p, h, status string
			respCode           *int32
			respBody           []byte
			lockedUntil        time.Time
		)
		if err := a.pool.QueryRow(ctx, a.read, userID, key).Scan(&k, &u, &p, &h, &status, &respCode, &respBody, &lockedUntil); err != nil {
			return http.StatusInternalServerError, nil, false, err
		}
		if h != reqHash || p != path {
			log.InfoContext(ctx, "article: mismatch", "user", userID)
			out, _ := json.Marshal(map[string]string{"error": "Idempotency key payload mismatch"})
			return http.StatusUnprocessableEntity, out, false, nil
		}
		if status == articleSucceeded {
			log.InfoContext(ctx, "article: replay", "user", userID)
			c := 0
			if respCode != nil {
				c = int(*respCode)
			}
			return c, respBody, true, nil
		}
		if status == articleProcessing {
			if now.Before(lockedUntil) {
				log.InfoContext(ctx, "article: conflict", "user", userID)
				out, _ := json.Marshal(map[string]string{"error": "A request with this idempotency key is currently in-flight"})
				return http.StatusConflict, out, false, nil
			}
			if _, err := a.pool.Exec(ctx, a.takeover, lockTimeout, now, userID, key, articleProcessing); err != nil {
				return http.StatusConflict, nil, false, err
			}
		}
	}
	log.InfoContext(ctx, "article: claim", "user", userID)

	// Step 3: the business logic.
	code, out, execErr := handler(ctx)

	// Step 4: the final UPDATE, autocommit; its failure is only logged.
	final := articleSucceeded
	if execErr != nil || code >= 500 {
		final = articleFailed
	}
	var stored any
	if json.Valid(out) {
		stored = string(out)
	}
	if _, err := a.pool.Exec(ctx, a.finish, final, code, stored, time.Now().UTC(), userID, key); err != nil {
		log.ErrorContext(ctx, "article: final update failed", "user", userID, "err", err)
	}
	return code, out, false, execErr
}

// articleHandler serves POST /v1/payments through the article's design: the
// same validation, provider wait and ledger insert as the baseline.
func articleHandler(a *articleStore, book func(ctx context.Context, user, key string, in payIn) (int, []byte, error), log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-User-ID")
		if user == "" {
			http.Error(w, `{"status":401}`, http.StatusUnauthorized)
			return
		}
		body, in, ok := readPayment(w, r)
		if !ok {
			return
		}
		key := r.Header.Get("Idempotency-Key")
		code, out, replayed, err := a.execute(r.Context(), log, user, key, "/v1/payments", body,
			func(ctx context.Context) (int, []byte, error) { return book(ctx, user, key, in) })
		if err != nil && !errors.Is(err, context.Canceled) {
			log.ErrorContext(r.Context(), "article: request failed", "user", user, "err", err)
		}
		if code == 0 {
			code = http.StatusInternalServerError
		}
		w.Header().Set("Content-Type", "application/json")
		if replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(code)
		_, _ = w.Write(out)
	}
}

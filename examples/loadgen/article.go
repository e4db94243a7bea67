package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The article's design (the background article's "production-grade minimal
// implementation", section 5), implemented as it is written there, for
// comparison: every statement in autocommit, no transaction around the
// business write, no fencing, no heartbeat, the application's clock. Its
// flaws are kept on purpose (a stale owner's final UPDATE overwrites the
// new owner's; the business row and the record are not one fact; the
// stored JSONB body is replayed as PostgreSQL prints it, not byte for
// byte). On PostgreSQL only the driver differs: pgxpool, sized like
// idem's, where the article uses database/sql, so that the comparison
// measures the design, not the driver. On MySQL/MariaDB and SQLite it runs
// on database/sql with the same statements in their dialect (INSERT IGNORE
// on MySQL).

const (
	articleProcessing = "PROCESSING"
	articleSucceeded  = "SUCCEEDED"
	articleFailed     = "FAILED"
	articleLock       = 30 * time.Second
)

// articleDDL is the article's table, as published (PostgreSQL version),
// or its translation: MySQL's JSON and DATETIME(6), SQLite's TEXT and
// DATETIME (which the driver reads back as time).
func articleDDL(table string, dialect articleDialect) []string {
	body, ts, def, index := "JSONB", "TIMESTAMPTZ", " DEFAULT CURRENT_TIMESTAMP", `CREATE INDEX IF NOT EXISTS idx_idempotency_created_at ON `+table+` (created_at)`
	switch dialect {
	case articleMySQL:
		body, ts, def, index = "JSON", "DATETIME(6)", "", `CREATE INDEX idx_idempotency_created_at ON `+table+` (created_at)`
	case articleSQLite:
		body, ts, def = "TEXT", "DATETIME", ""
	}
	return []string{`CREATE TABLE IF NOT EXISTS ` + table + ` (
    idempotency_key VARCHAR(255) NOT NULL,
    user_id VARCHAR(64) NOT NULL,
    request_path VARCHAR(255) NOT NULL,
    request_hash CHAR(64) NOT NULL,
    status VARCHAR(32) NOT NULL,
    response_code INT,
    response_body ` + body + `,
    created_at ` + ts + ` NOT NULL` + def + `,
    updated_at ` + ts + ` NOT NULL` + def + `,
    locked_until ` + ts + ` NOT NULL,
    PRIMARY KEY (user_id, idempotency_key)
)`, index}
}

// articleDB is what the article's design needs of a database: pgx on
// PostgreSQL, database/sql on MySQL/MariaDB and SQLite.
type articleDB interface {
	exec(ctx context.Context, q string, args ...any) (int64, error)
	queryRow(ctx context.Context, q string, args ...any) interface{ Scan(...any) error }
}

type pgxArticleDB struct{ *pgxpool.Pool }

func (p pgxArticleDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := p.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (p pgxArticleDB) queryRow(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
	return p.QueryRow(ctx, q, args...)
}

type sqlArticleDB struct{ *sql.DB }

func (d sqlArticleDB) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := d.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (d sqlArticleDB) queryRow(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
	return d.QueryRowContext(ctx, q, args...)
}

type articleStore struct {
	db                            articleDB
	claim, read, takeover, finish string
}

// articleDialect is the database the article's design runs on.
type articleDialect int

const (
	articlePostgres articleDialect = iota
	articleMySQL
	articleSQLite
)

// newArticleStore is the article's design on table t.
func newArticleStore(db articleDB, t string, dialect articleDialect) *articleStore {
	claim := `INSERT INTO ` + t + `
(idempotency_key, user_id, request_path, request_hash, status, locked_until, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (user_id, idempotency_key) DO NOTHING`
	if dialect == articleMySQL {
		claim = `INSERT IGNORE INTO ` + t + `
(idempotency_key, user_id, request_path, request_hash, status, locked_until, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)`
	}
	a := &articleStore{
		db:    db,
		claim: claim,
		read: `SELECT idempotency_key, user_id, request_path, request_hash, status, response_code, response_body, locked_until
FROM ` + t + `
WHERE user_id = ? AND idempotency_key = ?`,
		takeover: `UPDATE ` + t + `
SET locked_until = ?, updated_at = ?
WHERE user_id = ? AND idempotency_key = ? AND status = ?`,
		finish: `UPDATE ` + t + `
SET status = ?, response_code = ?, response_body = ?, updated_at = ?
WHERE user_id = ? AND idempotency_key = ?`,
	}
	if dialect == articlePostgres {
		for _, q := range []*string{&a.claim, &a.read, &a.takeover, &a.finish} {
			*q = numbered(*q)
		}
	}
	return a
}

// numbered turns each "?" of q into $1, $2 … in order.
func numbered(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
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
	inserted, err := a.db.exec(ctx, a.claim, key, userID, path, reqHash, articleProcessing, lockTimeout, now, now)
	if err != nil {
		return http.StatusInternalServerError, nil, false, err
	}
	if inserted == 0 {
		// Step 2: the key exists: read it.
		var (
			k, u, p, h, status string
			respCode           *int32
			respBody           []byte
			lockedUntil        time.Time
		)
		if err := a.db.queryRow(ctx, a.read, userID, key).Scan(&k, &u, &p, &h, &status, &respCode, &respBody, &lockedUntil); err != nil {
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
			if _, err := a.db.exec(ctx, a.takeover, lockTimeout, now, userID, key, articleProcessing); err != nil {
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
	if _, err := a.db.exec(ctx, a.finish, final, code, stored, time.Now().UTC(), userID, key); err != nil {
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

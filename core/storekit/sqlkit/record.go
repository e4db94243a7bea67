package sqlkit

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// Column limits (bytes), as the stores' tables declare them (and pgstore
// keeps). ValidClaim refuses longer values before any statement is sent.
const (
	maxScope       = 1024
	maxKey         = 1024
	maxMethod      = 64
	maxRoute       = 2048
	maxFingerprint = 128
)

// fromMicros is the UTC instant v µs after the Unix epoch (the stores keep
// instants as integers).
func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// NullTime is the instant v, kept as µs since the Unix epoch (the stores
// keep instants as integers), in UTC; the zero time for NULL.
func NullTime(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMicros(v.Int64)
}

// ValidClaim refuses a claim the stores cannot keep as asked: a lease or
// retention under 1µs (the database's precision), or a scope, key, method,
// route or fingerprint longer than its column (1024, 1024, 64, 2048 and
// 128 bytes). Each refusal starts with the field's name.
func ValidClaim(req *storekit.ClaimRequest) error {
	if req.Lease < time.Microsecond {
		return fmt.Errorf("lease %v must be at least 1µs (database precision)", req.Lease)
	}
	if req.Retention < time.Microsecond {
		return fmt.Errorf("retention %v must be at least 1µs (database precision)", req.Retention)
	}
	return errors.Join(
		checkLen("scope", req.Scope, maxScope),
		checkLen("key", req.Key, maxKey),
		checkLen("method", req.Method, maxMethod),
		checkLen("route", req.Route, maxRoute),
		checkLen("fingerprint", req.Fingerprint, maxFingerprint),
	)
}

func checkLen(what string, v string, limit int) error {
	if len(v) > limit {
		return fmt.Errorf("%s is %d bytes, longer than the %d this store keeps", what, len(v), limit)
	}
	return nil
}

// Scanner is a *sql.Row or *sql.Rows (ScanRecord reads either).
type Scanner interface{ Scan(dest ...any) error }

// ScanRecord scans the record columns the stores select, in this order:
// method, route, fingerprint, status, token, locked_until, created_at,
// expires_at (µs), resp_status, resp_header, resp_body, resp_not_retained;
// then the store's own columns into extra. Scope and key are the caller's.
func ScanRecord(row Scanner, extra ...any) (storekit.Record, error) {
	var (
		r                          storekit.Record
		method, route, fp          []byte
		status                     string
		lockedUntil, created, exps int64
		respStatus                 sql.NullInt32
		respHeader, respBody       []byte
		notRetained                bool
	)
	dst := []any{&method, &route, &fp, &status, &r.Token, &lockedUntil, &created, &exps,
		&respStatus, &respHeader, &respBody, &notRetained}
	if err := row.Scan(append(dst, extra...)...); err != nil {
		return storekit.Record{}, err
	}
	r.Method, r.Route, r.Fingerprint = string(method), string(route), string(fp)
	r.Status = storekit.Status(status)
	r.LockedUntil, r.CreatedAt, r.ExpiresAt = fromMicros(lockedUntil), fromMicros(created), fromMicros(exps)
	if r.Status == storekit.StatusCompleted && respStatus.Valid {
		resp := &storekit.StoredResponse{Status: int(respStatus.Int32), Body: respBody, NotRetained: notRetained}
		if len(respHeader) > 0 {
			h, err := parseHeader(respHeader)
			if err != nil {
				return storekit.Record{}, fmt.Errorf("decode stored headers: %w", err)
			}
			resp.Header = h
		}
		r.Response = resp
	}
	return r, nil
}

// ScanStuck reads Stuck's rows: the record columns, then the store's own
// columns into lead, then now (µs), scope and key. The caller closes rows.
func ScanStuck(rows *sql.Rows, lead ...any) ([]storekit.AdminRecord, error) {
	var out []storekit.AdminRecord
	for rows.Next() {
		var (
			now        int64
			scope, key []byte
		)
		r, err := ScanRecord(rows, append(lead[:len(lead):len(lead)], &now, &scope, &key)...)
		if err != nil {
			return nil, err
		}
		r.Scope, r.Key = string(scope), string(key)
		out = append(out, storekit.AdminRecord{Record: r, Now: fromMicros(now)})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// ResponseBlobs are the header and body columns a completion stores: the
// header in AppendHeader's format (NULL when there is none), the body never
// NULL (NULL is kept for "no response").
func ResponseBlobs(resp storekit.StoredResponse) (header, body []byte) {
	if len(resp.Header) > 0 {
		header = AppendHeader(nil, resp.Header)
	}
	body = resp.Body
	if body == nil {
		body = []byte{}
	}
	return header, body
}
